"""The attribution: each cause of a changed greedy answer that the run measured, side by side.

The probes measure the cache on a quiet server; the as-deployed kinds measure what else a deployed server does
to an answer (the batch, the order and state, ...), each on the same probes and with its own controls. This
module puts what was measured next to each other, one row per cause, each under the conditions it ran in, and
names the probes that differed under any cause with how they fared under each of the others. It reads a
target's report and adds no figure of its own: every number is its kind's summary. The terminal and the HTML
page show it when the run measured more than one cause. Knows nothing about pytest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .kinds import BATCH, LOADED, ORDER, PROBE, Kind
from .model import Outcome, Tally, TargetReport
from .text import counted


@dataclass(frozen=True)
class Cause:
    """One measured cause: its kind, what it is called here, the conditions it ran in, and its counts."""

    kind: Kind
    name: str
    conditions: str
    tally: Tally
    outcomes: Dict[str, Outcome]  # probe id -> this cause's outcome for it


def _probe(t: TargetReport) -> Optional[Cause]:
    if not t.probes:
        return None
    return Cause(PROBE, "cache", "a quiet server, one request at a time: a cache hit against a recompute",
                 t.summary.tally, {r.id: r.outcome for r in t.probes})


def _conditioned(kind: Kind, name: str, records: str, summary: str) -> Callable[[TargetReport], Optional[Cause]]:
    """The reader of a kind measured under conditions: its records and summary are the target's attributes
    ``records`` and ``summary``; the conditions are the summary's label without the kind's own name."""
    def read(t: TargetReport) -> Optional[Cause]:
        items, s = getattr(t, records), getattr(t, summary)
        if not items or s is None:
            return None
        label = s.label()
        return Cause(kind, name, label[len(name) + 2:] if label.startswith(name + ": ") else label, s.tally,
                     {r.id: r.outcome for r in items})
    return read


#: the causes, in the order they are listed: the controlled measurement first
READERS: Sequence[Callable[[TargetReport], Optional[Cause]]] = (
    _probe, _conditioned(BATCH, "batch", "batches", "batch_summary"),
    _conditioned(LOADED, "cache under load", "loaded", "loaded_summary"),
    _conditioned(ORDER, "order", "orders", "order_summary"))


def causes(t: TargetReport) -> List[Cause]:
    """The causes this target measured (at least one item ran), in the order of :data:`READERS`."""
    return [c for c in (read(t) for read in READERS) if c is not None]


def told_apart(found: Sequence[Cause]) -> List[Tuple[str, List[Tuple[Cause, Outcome]]]]:
    """The probes that differed under at least one cause, in the first cause's order, each with its outcome
    under every cause that measured it."""
    ids: List[str] = []
    for c in found:
        ids += [i for i, o in c.outcomes.items() if o == Outcome.DIFFERENT and i not in ids]
    return [(i, [(c, c.outcomes[i]) for c in found if i in c.outcomes]) for i in ids]


def _said(c: Cause) -> str:
    """``2 of 20 valid probes differed, 10.0% (95% interval 2.8% to 30.1%)``, or ``no valid probe``."""
    t, rate = c.tally, c.tally.rate
    if rate is None:
        return f"no valid {c.kind.unit}"
    lo, hi = rate.ci95
    return (f"{t.different} of {counted(t.valid, 'valid ' + c.kind.unit)} {c.kind.changed}, {rate.value:.1%} "
            f"(95% interval {lo:.1%} to {hi:.1%})")


def lines(t: TargetReport, limit: Optional[int] = 10) -> List[str]:
    """The attribution in the terminal: one line per cause (its counts, rate and conditions), then the probes
    that differed with their outcome under each cause (``limit`` of them; None: all). Nothing when the run
    measured fewer than two causes."""
    found = causes(t)
    if len(found) < 2:
        return []
    out = [f"{c.name}: {_said(c)}; {c.tally.inconclusive} inconclusive, {c.tally.errors} errors [{c.conditions}]"
           for c in found]
    parted = told_apart(found)
    if not parted:
        return out + ["no probe differed under any cause"]
    shown = parted if limit is None else parted[:limit]
    out += [f"{i}: " + ", ".join(f"{c.name} {o.value}" for c, o in each) for i, each in shown]
    if len(shown) < len(parted):
        out.append(f"... and {len(parted) - len(shown)} more probes that differed (-v shows all)")
    return out
