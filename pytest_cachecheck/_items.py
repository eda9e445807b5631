"""The test function behind every probe item (collected by the plugin, not by the user's suite).

The measurement runs in the ``cachecheck_probe_result`` fixture, so a failed request is an error in
setup; the verdict is given here, so a divergence is a failure and an invalid probe a skip.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional

import pytest

from .model import Outcome

if TYPE_CHECKING:
    from .model import EpisodeRecord, ProbeRecord


@pytest.mark.cachecheck
def probe(cachecheck_probe: object, cachecheck_probe_result: ProbeRecord,
          cachecheck_expected_divergence: Callable[[ProbeRecord], Optional[str]]) -> None:
    result = cachecheck_probe_result
    if result.outcome == Outcome.INCONCLUSIVE:
        pytest.skip(result.reason)
    if result.outcome == Outcome.DIFFERENT:
        expected = cachecheck_expected_divergence(result)
        if expected:
            pytest.xfail(f"{expected}: {result.message()}")
        pytest.fail(result.message(), pytrace=False)


@pytest.mark.cachecheck
def episode(cachecheck_episode: object, cachecheck_episode_result: EpisodeRecord,
            cachecheck_expected_divergence: Callable[[EpisodeRecord], Optional[str]]) -> None:
    result = cachecheck_episode_result
    if result.outcome == Outcome.INCONCLUSIVE:
        pytest.skip(result.reason)
    if result.outcome == Outcome.DIFFERENT:
        expected = cachecheck_expected_divergence(result)
        if expected:
            pytest.xfail(f"{expected}: {result.message()}")
        pytest.fail(result.message(), pytrace=False)
