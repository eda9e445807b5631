"""The test function behind every probe item (collected by the plugin, not by the user's suite).

The measurement runs in the ``cachecheck_probe_result`` fixture, so a failed request is an error in
setup; the verdict is given here, so a divergence is a failure and an invalid probe a skip.
"""

from __future__ import annotations

import pytest

from .protocol import DIFFERENT, INCONCLUSIVE, ProbeResult


@pytest.mark.cachecheck
def probe(cachecheck_probe: object, cachecheck_probe_result: ProbeResult) -> None:
    result = cachecheck_probe_result
    if result.outcome == INCONCLUSIVE:
        pytest.skip(result.reason)
    if result.outcome == DIFFERENT:
        pytest.fail(result.message(), pytrace=False)
