"""Compare a run with an earlier JSON report (the *baseline*), probe by probe.

Each probe of the current run is matched with the baseline probe of the same ``id``. A pair is only
compared when both records carry the same conversation ``fingerprint``; otherwise the row says
"conversation changed". The outcomes ``same`` and ``different`` are *valid*; ``inconclusive``,
``error`` (and any outcome this version does not know) are *not valid* and are treated alike.

Row status (before -> after):

==========================  ===============================================================
``still same``              same -> same
``still different``         different -> different
``newly diverged``          same -> different
``healed``                  different -> same
``newly inconclusive``      valid -> not valid (inconclusive or error)
``still inconclusive``      not valid -> not valid
``newly valid``             not valid -> valid
``conversation changed``    both runs have the id, but the conversation fingerprints differ
``new probe``               only in the current run
``not run``                 only in the baseline
==========================  ===============================================================

Verdict. Let *paired* be the probes present in both runs with the same fingerprint, *both valid* the
paired probes valid in both runs, ``b`` the number newly diverged and ``c`` the number healed (the
discordant pairs of a McNemar test):

1. ``inconclusive`` when there are no paired probes, or fewer than half of them are valid in both runs
   (too little was measured twice to say anything);
2. ``regressed`` when ``b > c``;
3. ``improved`` when ``c > b``;
4. ``unchanged`` when ``b == c`` and no paired probe became newly inconclusive;
5. ``inconclusive`` otherwise (``b == c``, but probes that were valid are not any more, and any of
   them could have gone either way).

The verdict is a plain direction, not a significance claim: the exact two-sided McNemar p-value on
``b`` and ``c`` is always reported beside it, so a "regressed" on one newly diverged probe (p = 1.0)
reads as what it is. Whether the run *fails* is a separate, explicit policy (:func:`should_fail`):
``new-divergence`` (the default: any newly diverged probe fails), ``rate-increase`` (the current
divergence rate is higher than the baseline's, over each run's own valid probes) or ``never``.

Environment changes between the two runs (:func:`fingerprint_env`) are listed: a changed server build
or model is what an upgrade looks like, so those are *notes*; any other change (mode, max_tokens,
hit_tolerance, skip_hit_check, server kind, probe set) is a *warning* that the comparison may not be
like for like.

This module knows nothing about pytest; it works on report dicts (see :mod:`pytest_cachecheck.report`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from .report import SCHEMA_VERSION, wilson

__all__ = [
    "POLICIES",
    "STATUSES",
    "VERDICTS",
    "BaselineError",
    "Comparison",
    "Rate",
    "Row",
    "compare",
    "fingerprint_env",
    "load_baseline",
    "mcnemar_exact",
    "should_fail",
]

SAME, DIFFERENT = "same", "different"
VALID_OUTCOMES = (SAME, DIFFERENT)

STILL_SAME = "still same"
STILL_DIFFERENT = "still different"
NEWLY_DIVERGED = "newly diverged"
HEALED = "healed"
NEWLY_INCONCLUSIVE = "newly inconclusive"
STILL_INCONCLUSIVE = "still inconclusive"
NEWLY_VALID = "newly valid"
CONVERSATION_CHANGED = "conversation changed"
NEW_PROBE = "new probe"
NOT_RUN = "not run"

#: Every row status, most important first (the order rows are listed in).
STATUSES: Tuple[str, ...] = (
    NEWLY_DIVERGED,
    STILL_DIFFERENT,
    NEWLY_INCONCLUSIVE,
    HEALED,
    CONVERSATION_CHANGED,
    NOT_RUN,
    NEW_PROBE,
    NEWLY_VALID,
    STILL_INCONCLUSIVE,
    STILL_SAME,
)
_RANK = {s: i for i, s in enumerate(STATUSES)}

VERDICTS: Tuple[str, ...] = ("regressed", "improved", "unchanged", "inconclusive")
POLICIES: Tuple[str, ...] = ("new-divergence", "rate-increase", "never")
DEFAULT_POLICY = "new-divergence"

#: fingerprint_env fields whose change is expected in an upgrade: reported as notes, not warnings.
_NOTE_FIELDS = ("server_build", "model")
_FIELD_LABELS = {
    "server_kind": "server kind",
    "server_build": "server build",
    "model": "model",
    "mode": "mode",
    "max_tokens": "max_tokens",
    "hit_tolerance": "hit_tolerance",
    "skip_hit_check": "skip_hit_check",
    "probe_set": "probe set fingerprint",
}


class BaselineError(ValueError):
    """The baseline file cannot be used: unreadable, not JSON, not a cachecheck report, or a schema
    version this plugin does not read. The message names the file."""


# --------------------------------------------------------------------------- loading

def load_baseline(path: str) -> Dict[str, Any]:
    """Read and check a JSON report written by ``--cachecheck-report``.

    Raises :class:`BaselineError` (message starting with the path) when the file cannot be read, is
    not JSON, is not a pytest-cachecheck report or has an unsupported ``schema_version``.
    """
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise BaselineError(f"{path}: cannot read the baseline report: {exc.strerror or exc}") from exc
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise BaselineError(f"{path}: the baseline report is not UTF-8 text ({exc.reason} at byte "
                            f"{exc.start})") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BaselineError(f"{path}: the baseline report is not valid JSON (line {exc.lineno} column "
                            f"{exc.colno}: {exc.msg})") from exc
    check_report(data, path)
    return data


def check_report(data: Any, path: str = "baseline") -> None:
    """Raise :class:`BaselineError` unless ``data`` looks like a schema-1 pytest-cachecheck report."""
    hint = "pass a file written by --cachecheck-report"
    if not isinstance(data, dict):
        raise BaselineError(f"{path}: not a pytest-cachecheck report (the JSON is a "
                            f"{type(data).__name__}, not an object); {hint}")
    tool = data.get("tool")
    if isinstance(tool, dict) and tool.get("name") not in (None, "pytest-cachecheck"):
        raise BaselineError(f"{path}: not a pytest-cachecheck report (written by {tool.get('name')!r}); "
                            f"{hint}")
    if "schema_version" not in data:
        raise BaselineError(f"{path}: not a pytest-cachecheck report (no schema_version); {hint}")
    version = data["schema_version"]
    if version != SCHEMA_VERSION or isinstance(version, bool):
        raise BaselineError(f"{path}: unsupported schema_version {version!r}; this version of "
                            f"pytest-cachecheck reads schema_version {SCHEMA_VERSION}")
    probes = data.get("probes")
    if not isinstance(probes, list):
        raise BaselineError(f"{path}: not a pytest-cachecheck report (no 'probes' list); {hint}")
    for i, p in enumerate(probes):
        if not (isinstance(p, dict) and isinstance(p.get("id"), str) and isinstance(p.get("outcome"), str)):
            raise BaselineError(f"{path}: probe {i} of the baseline report has no string 'id' and "
                                f"'outcome'; the file is damaged or not a pytest-cachecheck report")


def baseline_for(data: Mapping[str, Any], target: Optional[str], path: str = "baseline") -> Dict[str, Any]:
    """The part of a loaded baseline report that one target of this run is compared with.

    A one-server report serves every target; a target-matrix report serves the target of the same
    name. Raises :class:`BaselineError` naming the file when there is no such part.
    """
    from .report import target_view

    targets = data.get("targets")
    if not isinstance(targets, list) or not targets:
        return dict(data)
    names = [str(t.get("name")) for t in targets if isinstance(t, dict)]
    if target is None:
        raise BaselineError(f"{path}: a target-matrix report (targets {', '.join(names)}); compare it with a "
                            f"run given the same --cachecheck-target names, or use a one-server report")
    if target not in names:
        raise BaselineError(f"{path}: the baseline's targets are {', '.join(names)}; it has no target "
                            f"{target!r} to compare with")
    return target_view(data, target)


# --------------------------------------------------------------------------- environment

def _get(obj: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(k)
    return obj


def fingerprint_env(run: Mapping[str, Any]) -> Dict[str, Any]:
    """The environment a report (or the plugin's run dict) was measured in.

    Keys: ``server_kind``, ``server_build``, ``model``, ``mode`` (the resolved mode, else the
    configured one), ``max_tokens``, ``hit_tolerance``, ``skip_hit_check`` and ``probe_set`` (the
    probe set fingerprint). Missing values are ``None``.
    """
    mode = run.get("mode") or _get(run, "settings", "mode")
    return {
        "server_kind": _get(run, "server", "kind"),
        "server_build": _get(run, "server", "build"),
        "model": _get(run, "server", "model") or _get(run, "settings", "model"),
        "mode": mode,
        "max_tokens": _get(run, "settings", "max_tokens"),
        "hit_tolerance": _get(run, "settings", "hit_tolerance"),
        "skip_hit_check": _get(run, "settings", "skip_hit_check"),
        "probe_set": _get(run, "probe_set", "fingerprint"),
    }


def _show(name: str, value: Any) -> str:
    if value is None:
        return "?"
    if name == "probe_set" and isinstance(value, str):
        return value[:19]
    return str(value)


def env_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> List[str]:
    """One line per differing :func:`fingerprint_env` field: notes for build/model, warnings otherwise."""
    out: List[str] = []
    for name, label in _FIELD_LABELS.items():
        a, b = before.get(name), after.get(name)
        if a == b:
            continue
        change = f"{label} changed: {_show(name, a)} -> {_show(name, b)}"
        if name in _NOTE_FIELDS:
            out.append(f"note: {change} (expected in an upgrade)")
        elif name == "probe_set":
            out.append(f"warning: {change}; only probes whose conversation is unchanged are compared")
        else:
            out.append(f"warning: {change}; comparisons may not be like for like")
    return out


# --------------------------------------------------------------------------- statistics

def mcnemar_exact(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value on the discordant pairs ``b`` and ``c``.

    Under the null hypothesis each discordant pair goes either way with probability 1/2, so
    ``p = min(1, 2 * P(X <= min(b, c)))`` with ``X ~ Binomial(b + c, 1/2)``; 1.0 when ``b + c == 0``.
    """
    if b < 0 or c < 0:
        raise ValueError("b and c are counts and cannot be negative")
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1))
    return min(1.0, (2 * tail) / (2 ** n))  # int / int: exact even for large n


def format_p(p: Optional[float]) -> str:
    """A p-value for people: ``0.0625``, ``1.000``, ``3.2e-05``; ``n/a`` for None."""
    if p is None:
        return "n/a"
    if p >= 0.001:
        return f"{p:.4f}" if p < 0.1 else f"{p:.3f}"
    return f"{p:.1e}"


@dataclass(frozen=True)
class Rate:
    """A divergence rate: ``different`` of ``valid`` valid probes, with its 95% Wilson interval."""

    different: int
    valid: int

    @property
    def value(self) -> float:
        """different / valid."""
        return self.different / self.valid

    @property
    def ci95(self) -> Tuple[float, float]:
        """95% Wilson score interval."""
        ci = wilson(self.different, self.valid)
        assert ci is not None
        return ci

    @classmethod
    def of(cls, records: Sequence[Mapping[str, Any]]) -> Optional[Rate]:
        """The rate over the valid records, or None when none is valid."""
        valid = [r for r in records if r.get("outcome") in VALID_OUTCOMES]
        if not valid:
            return None
        return cls(sum(1 for r in valid if r.get("outcome") == DIFFERENT), len(valid))

    def text(self) -> str:
        """e.g. ``10.0% (2/20, 95% CI 2.8% to 30.1%)``."""
        lo, hi = self.ci95
        return f"{self.value:.1%} ({self.different}/{self.valid}, 95% CI {lo:.1%} to {hi:.1%})"

    def to_dict(self) -> Dict[str, Any]:
        """JSON-able form."""
        return {"different": self.different, "valid": self.valid, "rate": self.value, "ci95": list(self.ci95)}


# --------------------------------------------------------------------------- comparison

@dataclass
class Row:
    """One probe of the comparison: outcomes before (baseline) and after (this run), and the status."""

    id: str
    before: Optional[str]
    after: Optional[str]
    status: str

    def to_dict(self) -> Dict[str, Any]:
        """JSON-able form."""
        return {"id": self.id, "before": self.before, "after": self.after, "status": self.status}


@dataclass
class Comparison:
    """The result of :func:`compare`. ``rows`` are sorted most important first."""

    rows: List[Row]
    counts: Dict[str, int]
    verdict: str
    why: str
    mcnemar_p: Optional[float]
    paired: int
    valid_in_both: int
    env_warnings: List[str] = field(default_factory=list)
    baseline_rate: Optional[Rate] = None
    current_rate: Optional[Rate] = None
    baseline_created: Optional[str] = None

    @property
    def baseline_ci95(self) -> Optional[Tuple[float, float]]:
        """95% Wilson interval of the baseline divergence rate (None without valid probes)."""
        return self.baseline_rate.ci95 if self.baseline_rate else None

    @property
    def current_ci95(self) -> Optional[Tuple[float, float]]:
        """95% Wilson interval of this run's divergence rate (None without valid probes)."""
        return self.current_rate.ci95 if self.current_rate else None

    @property
    def b(self) -> int:
        """Discordant pairs same -> different."""
        return self.counts.get(NEWLY_DIVERGED, 0)

    @property
    def c(self) -> int:
        """Discordant pairs different -> same."""
        return self.counts.get(HEALED, 0)

    def newly_diverged(self) -> List[str]:
        """Ids of the probes that were the same in the baseline and differ now."""
        return [r.id for r in self.rows if r.status == NEWLY_DIVERGED]

    def still_different(self) -> Set[str]:
        """Ids of the probes that differed in the baseline and differ now (known divergences)."""
        return {r.id for r in self.rows if r.status == STILL_DIFFERENT}

    def verdict_line(self) -> str:
        """``baseline verdict: regressed (...)``, with the exact McNemar p-value."""
        p = format_p(self.mcnemar_p)
        return f"baseline verdict: {self.verdict} ({self.why}; exact McNemar p = {p})"

    def lines(self, verbose: bool = False) -> List[str]:
        """A terminal table (id, before, after, status), most important first, then the verdict, the
        rates and the environment notes and warnings. Unless ``verbose``, "still same" rows are
        folded into one line."""
        shown = [r for r in self.rows if verbose or r.status != STILL_SAME]
        folded = len(self.rows) - len(shown)
        title = "comparison with the baseline"
        if self.baseline_created:
            title += f" of {self.baseline_created}"
        out = [title]
        if shown:
            w_id = max(2, min(40, max(len(r.id) for r in shown)))
            w_b = max(6, *(len(r.before or "-") for r in shown))
            w_a = max(5, *(len(r.after or "-") for r in shown))
            out.append(f"  {'id':<{w_id}}  {'before':<{w_b}}  {'after':<{w_a}}  status")
            for r in shown:
                ident = r.id if len(r.id) <= w_id else r.id[:w_id - 3] + "..."
                before, after = r.before or "-", r.after or "-"
                out.append(f"  {ident:<{w_id}}  {before:<{w_b}}  {after:<{w_a}}  {r.status}")
        if folded:
            out.append(f"  ({folded} probe(s) still same" + ("" if verbose else "; -v lists them") + ")")
        if not self.rows:
            out.append("  (no probes in either run)")
        out.append("counts: " + " | ".join(f"{s} {n}" for s, n in self.counts.items() if n))
        out.append(self.verdict_line())
        base = self.baseline_rate.text() if self.baseline_rate else "n/a (no valid probes)"
        cur = self.current_rate.text() if self.current_rate else "n/a (no valid probes)"
        out.append(f"divergence rate: baseline {base} -> now {cur}")
        out.extend(self.env_warnings)
        return out

    def to_dict(self) -> Dict[str, Any]:
        """JSON-able form, for the report."""
        return {
            "verdict": self.verdict,
            "why": self.why,
            "mcnemar_p": self.mcnemar_p,
            "paired": self.paired,
            "valid_in_both": self.valid_in_both,
            "newly_diverged_count": self.b,
            "healed_count": self.c,
            "counts": dict(self.counts),
            "baseline_rate": self.baseline_rate.to_dict() if self.baseline_rate else None,
            "current_rate": self.current_rate.to_dict() if self.current_rate else None,
            "baseline_created": self.baseline_created,
            "env_warnings": list(self.env_warnings),
            "newly_diverged": self.newly_diverged(),
            "still_different": sorted(self.still_different()),
            "rows": [r.to_dict() for r in self.rows],
        }


def _status(before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    if before.get("fingerprint") != after.get("fingerprint"):
        return CONVERSATION_CHANGED
    b, a = before.get("outcome"), after.get("outcome")
    b_valid, a_valid = b in VALID_OUTCOMES, a in VALID_OUTCOMES
    if b_valid and a_valid:
        if b == a:
            return STILL_SAME if a == SAME else STILL_DIFFERENT
        return NEWLY_DIVERGED if a == DIFFERENT else HEALED
    if b_valid:
        return NEWLY_INCONCLUSIVE
    return NEWLY_VALID if a_valid else STILL_INCONCLUSIVE


def _by_id(records: Sequence[Mapping[str, Any]]) -> Dict[str, Mapping[str, Any]]:
    out: Dict[str, Mapping[str, Any]] = {}
    for r in records:
        ident = r.get("id")
        if isinstance(ident, str) and ident not in out:  # ids are unique; keep the first if not
            out[ident] = r
    return out


def compare(baseline: Mapping[str, Any], current_run: Mapping[str, Any],
            current_records: Sequence[Mapping[str, Any]]) -> Comparison:
    """Compare this run (its run/report dict and per-probe records) with a loaded baseline report.

    ``current_run`` needs the report layout's ``settings``, ``mode``, ``server`` and ``probe_set``
    (the plugin's run dict or a whole report); ``current_records`` are the per-probe dicts of
    ``ProbeResult.to_dict``. See the module docstring for statuses and the verdict rule.
    """
    before = _by_id(baseline.get("probes") or [])
    after = _by_id(current_records)
    rows: List[Row] = []
    for ident, rec in after.items():
        old = before.get(ident)
        if old is None:
            rows.append(Row(ident, None, rec.get("outcome"), NEW_PROBE))
        else:
            rows.append(Row(ident, old.get("outcome"), rec.get("outcome"), _status(old, rec)))
    for ident, old in before.items():
        if ident not in after:
            rows.append(Row(ident, old.get("outcome"), None, NOT_RUN))
    rows.sort(key=lambda r: _RANK[r.status])  # stable: run order within a status

    counts = {s: 0 for s in STATUSES}
    for r in rows:
        counts[r.status] += 1
    paired = sum(n for s, n in counts.items() if s not in (CONVERSATION_CHANGED, NEW_PROBE, NOT_RUN))
    valid_in_both = counts[STILL_SAME] + counts[STILL_DIFFERENT] + counts[NEWLY_DIVERGED] + counts[HEALED]
    b, c = counts[NEWLY_DIVERGED], counts[HEALED]
    newly_inconclusive = counts[NEWLY_INCONCLUSIVE]
    p = mcnemar_exact(b, c)
    tally = f"{b} newly diverged vs {c} healed over {valid_in_both} probe(s) valid in both runs"
    if paired == 0:
        verdict, why = "inconclusive", "no probe was measured in both runs with the same conversation"
    elif 2 * valid_in_both < paired:
        verdict, why = "inconclusive", (f"only {valid_in_both} of {paired} paired probes were valid in both "
                                        f"runs, fewer than half")
    elif b > c:
        verdict, why = "regressed", tally
    elif c > b:
        verdict, why = "improved", tally
    elif newly_inconclusive == 0:
        verdict, why = "unchanged", tally
    else:
        verdict, why = "inconclusive", (f"{tally}, but {newly_inconclusive} probe(s) valid in the baseline "
                                        f"are not valid now and could tip it")

    return Comparison(
        rows=rows,
        counts=counts,
        verdict=verdict,
        why=why,
        mcnemar_p=p,
        paired=paired,
        valid_in_both=valid_in_both,
        env_warnings=env_changes(fingerprint_env(baseline), fingerprint_env(current_run)),
        baseline_rate=Rate.of(list(before.values())),
        current_rate=Rate.of(list(after.values())),
        baseline_created=baseline.get("created") if isinstance(baseline.get("created"), str) else None,
    )


def should_fail(comparison: Comparison, policy: str = DEFAULT_POLICY) -> Tuple[bool, str]:
    """Whether the comparison should fail the run under ``policy``, and why (a sentence).

    * ``new-divergence``: fail when any probe newly diverged (same in the baseline, different now);
    * ``rate-increase``: fail when this run's divergence rate is higher than the baseline's (each over
      its own valid probes; no failure when either run has no valid probe);
    * ``never``: never fail.

    Raises ValueError for any other policy.
    """
    if policy == "never":
        return False, "baseline policy 'never': the comparison does not decide the outcome"
    if policy == "new-divergence":
        ids = comparison.newly_diverged()
        if ids:
            shown = ", ".join(ids[:10]) + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")
            return True, f"{len(ids)} probe(s) newly diverged against the baseline: {shown}"
        return False, "no probe newly diverged against the baseline"
    if policy == "rate-increase":
        base, cur = comparison.baseline_rate, comparison.current_rate
        if base is None or cur is None:
            which = "the baseline" if base is None else "this run"
            return False, f"cannot compare divergence rates: {which} has no valid probe"
        if cur.different * base.valid > base.different * cur.valid:  # exact: cur.value > base.value
            return True, f"the divergence rate rose from {base.text()} to {cur.text()}"
        return False, f"the divergence rate did not rise ({base.text()} -> {cur.text()})"
    raise ValueError(f"unknown baseline policy {policy!r}; use one of {', '.join(POLICIES)}")
