"""The test function behind every probe item (collected by the plugin, not by the user's suite), and the
gate item that carries the session verdict.

The measurement runs in the ``cachecheck_probe_result`` fixture, so a failed request is an error in
setup; the verdict is given here, so a divergence is a failure and an invalid probe a skip.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional, Tuple

import pytest

from .model import Outcome

if TYPE_CHECKING:
    from .model import BatchRecord, EpisodeRecord, LoadedRecord, OrderRecord, ProbeRecord, Verdict

GATE = "gate"  # the gate item's name: node id ``cachecheck::gate``


def _verdict(result: "ProbeRecord | EpisodeRecord | BatchRecord | OrderRecord",
             reason: Optional[str] = None) -> None:
    """An invalid measurement is a skip (with ``reason``, default the record's), an expected divergence
    (``result.expected``, decided once where the record was made) an xfail, any other divergence a failure."""
    if result.outcome == Outcome.INCONCLUSIVE:
        pytest.skip(result.reason if reason is None else reason)
    if result.outcome == Outcome.DIFFERENT:
        if result.expected:
            pytest.xfail(f"{result.expected}: {result.message()}")
        pytest.fail(result.message(), pytrace=False)


@pytest.mark.cachecheck
def probe(cachecheck_probe: object, cachecheck_probe_result: ProbeRecord) -> None:
    _verdict(cachecheck_probe_result)


@pytest.mark.cachecheck
def episode(cachecheck_episode: object, cachecheck_episode_result: EpisodeRecord) -> None:
    _verdict(cachecheck_episode_result)


@pytest.mark.cachecheck
def batch(cachecheck_batch: object, cachecheck_batch_result: BatchRecord) -> None:
    _verdict(cachecheck_batch_result, cachecheck_batch_result.message())  # each message names the conditions


@pytest.mark.cachecheck
def loaded(cachecheck_loaded: object, cachecheck_loaded_result: LoadedRecord) -> None:
    # after ``batch`` (the items run in this order): its record says what the load alone did
    _verdict(cachecheck_loaded_result, cachecheck_loaded_result.message())


@pytest.mark.cachecheck
def order(cachecheck_order: object, cachecheck_order_result: OrderRecord) -> None:
    _verdict(cachecheck_order_result, cachecheck_order_result.message())  # each message names the conditions


class GateItem(pytest.Item):
    """``cachecheck::gate``, run after every probe and episode: fails with the session verdict's reason when
    the verdict fails (a divergence, a rate or baseline gate, too few valid probes, a selected probe without
    a measurement, ...), so the failure shows where pytest's
    own results do. ``verdict`` gives the session verdict on what was measured so far."""

    def __init__(self, *, verdict: Callable[[], Verdict], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._verdict = verdict
        self.add_marker("cachecheck")

    def runtest(self) -> None:
        verdict = self._verdict()
        if not verdict.ok:
            pytest.fail(f"{verdict.why} (cachecheck verdict: FAIL, {verdict.status})", pytrace=False)

    def reportinfo(self) -> Tuple[Any, Optional[int], str]:
        return self.path, None, GATE
