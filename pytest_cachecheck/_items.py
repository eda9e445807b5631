"""The test function behind every probe item (collected by the plugin, not by the user's suite), and the
gate item that carries the session verdict.

The measurement runs in the ``cachecheck_probe_result`` fixture, so a failed request is an error in
setup; the verdict is given here, so a divergence is a failure and an invalid probe a skip.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, List, Optional, Tuple

import pytest

from .model import Outcome
from .text import counted

if TYPE_CHECKING:
    from .model import EpisodeRecord, ProbeRecord, Verdict

GATE = "gate"  # the gate item's name: node id ``cachecheck::gate``


def _verdict(result: "ProbeRecord | EpisodeRecord",
             expected_divergence: Callable[[Any], Optional[str]]) -> None:
    """An invalid measurement is a skip, an expected divergence an xfail, any other divergence a failure."""
    if result.outcome == Outcome.INCONCLUSIVE:
        pytest.skip(result.reason)
    if result.outcome == Outcome.DIFFERENT:
        expected = expected_divergence(result)
        if expected:
            pytest.xfail(f"{expected}: {result.message()}")
        pytest.fail(result.message(), pytrace=False)


@pytest.mark.cachecheck
def probe(cachecheck_probe: object, cachecheck_probe_result: ProbeRecord,
          cachecheck_expected_divergence: Callable[[ProbeRecord], Optional[str]]) -> None:
    _verdict(cachecheck_probe_result, cachecheck_expected_divergence)


@pytest.mark.cachecheck
def episode(cachecheck_episode: object, cachecheck_episode_result: EpisodeRecord,
            cachecheck_expected_divergence: Callable[[EpisodeRecord], Optional[str]]) -> None:
    _verdict(cachecheck_episode_result, cachecheck_expected_divergence)


class GateItem(pytest.Item):
    """``cachecheck::gate``, run after every probe and episode: fails with the session verdict's reason when the verdict
    fails (a rate or baseline gate, too few valid probes, ...), so the failure shows where pytest's own
    results do. ``verdict`` returns the probes and episodes selected that have no result yet, and the verdict so far."""

    def __init__(self, *, verdict: Callable[[], Tuple[List[str], Verdict]], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._verdict = verdict
        self.add_marker("cachecheck")

    def runtest(self) -> None:
        missing, verdict = self._verdict()
        if missing:
            shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
            pytest.fail(f"cachecheck: {counted(len(missing), 'selected probe or episode', 'selected probes or episodes')} had no result when the gate "
                        f"ran ({shown}): a plugin reordered the items or a probe did not run; the summary "
                        f"gives the verdict", pytrace=False)
        if not verdict.ok:
            pytest.fail(f"{verdict.why} (cachecheck verdict: FAIL, {verdict.status})", pytrace=False)

    def reportinfo(self) -> Tuple[Any, Optional[int], str]:
        return self.path, None, GATE
