"""Compare a run with an earlier JSON report (the *baseline*), probe by probe.

Each probe of the current run is matched with the baseline probe of the same ``id``. A pair is only
compared when both records carry the same conversation ``fingerprint``; otherwise the row says
"conversation changed". The outcomes ``same`` and ``different`` are *valid*; ``inconclusive`` and
``error`` are *not valid* and are treated alike (a baseline with an outcome this version does not know is
refused when it is loaded, naming the field).

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

Environment changes between the two runs (:func:`env_of`, :func:`env_changes`) are listed: a changed
server build or model is what an upgrade looks like, so those are *notes*; any other change (mode,
max_tokens, hit_tolerance, skip_hit_check, server kind, probe or episode set, the version of this plugin
that wrote the baseline) is a *warning* that the comparison may not be like for like.

A baseline is refused when it is loaded (:func:`load_baseline`) if it cannot be compared honestly: two
records of one target share an id, the run that wrote it was interrupted, or it was recorded with
``--cachecheck-record`` by a run whose verdict did not pass.

This module knows nothing about pytest; it works on the typed records of :mod:`pytest_cachecheck.model`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple, Union

from . import __version__
from .model import (CONVERSATION_CHANGED, HEALED, NEW_PROBE, NEWLY_DIVERGED, NEWLY_INCONCLUSIVE, NEWLY_VALID,
                    NOT_RUN, STATUSES, STILL_DIFFERENT, STILL_INCONCLUSIVE, STILL_SAME, Comparison, EpisodeRecord,
                    Outcome, ProbeRecord, ProbeSet, Rate, ReportError, Row, RunReport, Setup, Status,
                    TargetReport, shown)
from .stats import mcnemar_exact
from .text import counted, printable

_RANK = {s: i for i, s in enumerate(STATUSES)}
POLICIES: Tuple[str, ...] = ("new-divergence", "rate-increase", "never")
DEFAULT_POLICY = "new-divergence"

#: env fields whose change is expected in an upgrade: reported as notes, not warnings.
_NOTE_FIELDS = ("server_build", "model")
_FIELD_LABELS = {
    "server_kind": "server kind",
    "server_build": "server build",
    "model": "model",
    "mode": "mode",
    "max_tokens": "max_tokens",
    "hit_tolerance": "hit_tolerance",
    "skip_hit_check": "skip_hit_check",
    "probe_set": "{unit} set fingerprint",
    "plugin_version": "pytest-cachecheck version",
}
#: the largest baseline file read, so that a broken file cannot exhaust memory
MAX_BASELINE_BYTES = 256 * 1024 * 1024
#: the deepest nesting and the largest whole number a report may hold (a real one nests 6 levels deep)
MAX_DEPTH = 64
MAX_INTEGER = 2 ** 53


class BaselineError(ValueError):
    """The baseline file cannot be used: unreadable, not JSON, not a cachecheck report, a schema version
    this plugin does not read, an id repeated, or the report of an interrupted or failed recording. The
    message names the file."""


@dataclass
class Baseline:
    """One side of a comparison: its records, the environment they were measured in, when; and the
    episodes with theirs (whose set field is the episode set's fingerprint)."""

    records: Sequence[Record]
    env: Mapping[str, Any]
    created: Optional[str] = None
    episodes: Optional[Sequence[EpisodeRecord]] = None  # None: the baseline ran no episodes
    episode_env: Mapping[str, Any] = field(default_factory=dict)  # empty when it ran no episodes


def known_different(baseline: Optional[Baseline], episodes: bool = False) -> Dict[str, str]:
    """id -> conversation fingerprint of the probes (or episodes) that differed in a baseline: the
    divergences ``run.expectation`` expects."""
    if baseline is None:
        return {}
    records = (baseline.episodes or []) if episodes else baseline.records
    return {r.id: r.fingerprint for r in records if r.outcome == Outcome.DIFFERENT}


# --------------------------------------------------------------------------- loading

def load_baseline(path: str) -> RunReport:
    """Read and check a JSON report written by ``--cachecheck-report``.

    Raises :class:`BaselineError` (message starting with the path) when the file cannot be read, is
    not JSON, is not a pytest-cachecheck report, has an unsupported ``schema_version`` or a field of the
    wrong type (named), or cannot be compared honestly (:func:`_refusal`).
    """
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BASELINE_BYTES + 1)
    except OSError as exc:
        raise BaselineError(f"{path}: cannot read the baseline report: {exc.strerror or exc}") from exc
    if len(raw) > MAX_BASELINE_BYTES:
        raise BaselineError(f"{path}: the baseline report is larger than {MAX_BASELINE_BYTES // 2**20} MiB")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise BaselineError(f"{path}: the baseline report is not UTF-8 text ({exc.reason} at byte "
                            f"{exc.start})") from exc
    try:
        data = json.loads(text, parse_int=_bounded_int)
    except json.JSONDecodeError as exc:
        raise BaselineError(f"{path}: the baseline report is not valid JSON (line {exc.lineno} column "
                            f"{exc.colno}: {exc.msg})") from exc
    except ValueError as exc:  # not expected: numbers are read by _bounded_int
        raise BaselineError(f"{path}: the baseline report cannot be read as JSON ({exc})") from None
    except RecursionError:
        line, column = _too_deep(text)
        raise BaselineError(f"{path}: the baseline report is nested more than {MAX_DEPTH} levels deep (line "
                            f"{line} column {column})") from None
    problem = _unreadable_value(data)
    if problem:
        raise BaselineError(f"{path}: {problem}")
    try:
        report = RunReport.from_json(data)
    except ReportError as exc:
        raise BaselineError(f"{path}: {exc}") from None
    except RecursionError:
        raise BaselineError(f"{path}: the baseline report is nested too deeply") from None
    problem = _refusal(report)
    if problem:
        raise BaselineError(f"{path}: {problem}")
    return report


def _refusal(report: RunReport) -> Optional[str]:
    """Why a well-formed report cannot serve as a baseline, or None: an id that two records of one target
    share (the comparison pairs records by id), an interrupted run (it holds only part of the set), or a
    recording (``--cachecheck-record``) whose verdict did not pass."""
    for t in report.targets:
        where = f"target {shown(t.name)!r}: " if report.matrix else ""
        kinds: List[Tuple[str, Sequence[Record]]] = [("probe", t.probes), ("episode", t.episodes or [])]
        for unit, records in kinds:
            seen: Set[str] = set()
            for r in records:
                if r.id in seen:
                    return (f"{where}two {unit}s have the id {shown(r.id)!r}; a comparison pairs {unit}s by "
                            f"id, so each must be unique: record it again")
                seen.add(r.id)
    for s in [report.summary, *(t.summary for t in report.targets)]:
        if s.status == Status.INTERRUPTED:
            return (f"the baseline comes from an interrupted run ({shown(s.why, 200)}) and may lack what did "
                    f"not run: record it again with a run that completes")
    s = report.summary
    if report.settings.get("record") is True and s.status != Status.PASSED:
        return (f"the baseline was recorded (--cachecheck-record) by a run whose verdict was "
                f"{s.status.value!r} ({shown(s.why, 200)}), so its measurement cannot be trusted: fix the "
                f"cause and record it again")
    return None


class _LongNumber:
    """A JSON whole number too long to be a count (Python refuses to convert one of 4,300+ digits)."""

    def __init__(self, digits: str) -> None:
        self.digits = len(digits.lstrip("-"))


def _bounded_int(digits: str) -> Any:
    return int(digits) if len(digits) <= 20 else _LongNumber(digits)


def _unreadable_value(data: Any) -> Optional[str]:
    """The first value no report holds (too deep, a huge or non-finite number), as 'field '...': why'."""
    stack: List[Tuple[Any, str, int]] = [(data, "", 0)]
    while stack:
        value, where, depth = stack.pop()
        field = f"field '{where[:80] + '...' if len(where) > 80 else where or '(the whole report)'}'"
        if depth > MAX_DEPTH:
            return f"{field}: nested more than {MAX_DEPTH} levels deep"
        if isinstance(value, _LongNumber):
            return f"{field}: a number of {value.digits} digits (at most 2^53 is read)"
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INTEGER:
            return f"{field}: a number larger than 2^53"
        if isinstance(value, float) and not math.isfinite(value):
            return f"{field}: {value} is not a finite number"
        if isinstance(value, dict):
            stack.extend((v, f"{where}.{k}" if where else str(k), depth + 1)
                         for k, v in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((v, f"{where}[{i}]", depth + 1) for i, v in reversed(list(enumerate(value))))
    return None


def _too_deep(text: str) -> Tuple[int, int]:
    """Line and column where the JSON text first nests more than MAX_DEPTH levels deep (strings skipped)."""
    depth = 0
    for m in re.finditer(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', text):
        token = m.group()
        if token in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                line = text.count("\n", 0, m.start()) + 1
                return line, m.start() - (text.rfind("\n", 0, m.start()) + 1) + 1
        elif token in "]}":
            depth -= 1
    return 1, 1


def baseline_for(report: RunReport, target: Optional[str], path: str = "baseline") -> Baseline:
    """The part of a loaded baseline report that one target of this run is compared with.

    A one-server report serves every target; a target-matrix report serves the target of the same
    name. Raises :class:`BaselineError` naming the file when there is no such part.
    """
    if not report.matrix:
        return _side(report, report.targets[0])
    names = [str(t.name) for t in report.targets]
    if target is None:
        raise BaselineError(f"{path}: a target-matrix report (targets {', '.join(names)}); compare it with a "
                            f"run given the same --cachecheck-target names, or use a one-server report")
    if target not in names:
        raise BaselineError(f"{path}: the baseline's targets are {', '.join(names)}; it has no target "
                            f"{target!r} to compare with")
    return _side(report, report.target(target))


def _side(report: RunReport, t: TargetReport) -> Baseline:
    version = report.tool_version or None  # None: a report that does not say which version wrote it

    def env(sample: Optional[ProbeSet]) -> Dict[str, Any]:
        return env_of(report.settings, t.setup, sample, version)

    return Baseline(t.probes, env(report.probe_set), report.created or None, t.episodes,
                    env(report.episode_set) if report.episode_set is not None else {})


# --------------------------------------------------------------------------- environment

def env_of(settings: Mapping[str, Any], setup: Optional[Setup], probe_set: Optional[ProbeSet],
           version: Optional[str] = __version__) -> Dict[str, Any]:
    """The environment a run (or one target of it) was measured in.

    Keys: ``server_kind``, ``server_build``, ``model``, ``mode`` (the resolved mode, else the
    configured one), ``max_tokens``, ``hit_tolerance``, ``skip_hit_check``, ``probe_set`` (the
    fingerprint of the set measured: the probe set, or the episode set for episodes) and
    ``plugin_version`` (the pytest-cachecheck version that measured it: this one unless given). Missing
    values are ``None``.
    """
    server = setup.server if setup is not None else None
    return {
        "server_kind": server.kind if server else None,
        "server_build": server.build if server else None,
        "model": server.model if server else None,  # what the server said, never an unchecked option value
        "mode": (setup.mode if setup is not None else None) or settings.get("mode"),
        "max_tokens": settings.get("max_tokens"),
        "hit_tolerance": settings.get("hit_tolerance"),
        "skip_hit_check": settings.get("skip_hit_check"),
        "probe_set": probe_set.fingerprint if probe_set is not None else None,
        "plugin_version": version,
    }


def _show(name: str, value: Any) -> str:
    if value is None:
        return "?"
    if name == "probe_set" and isinstance(value, str):
        return value[:19]
    return str(value)


def env_changes(before: Mapping[str, Any], after: Mapping[str, Any], unit: str = "probe") -> List[str]:
    """One line per differing :func:`env_of` field: notes for build/model, warnings otherwise. ``unit``
    (``probe`` or ``episode``) names what was measured, and so the set whose fingerprint changed."""
    out: List[str] = []
    for name, label in _FIELD_LABELS.items():
        a, b = before.get(name), after.get(name)
        if a == b:
            continue
        label = label.format(unit=unit)
        change = f"{label} changed: {printable(_show(name, a), 120)} -> {printable(_show(name, b), 120)}"
        if name in _NOTE_FIELDS:
            out.append(f"note: {change} (expected in an upgrade)")
        elif name == "probe_set":
            out.append(f"warning: {change}; only {unit}s whose conversation is unchanged are compared")
        else:
            out.append(f"warning: {change}; comparisons may not be like for like")
    return out


# --------------------------------------------------------------------------- comparison

Record = Union[ProbeRecord, EpisodeRecord]


def _status(before: Record, after: Record) -> str:
    if before.fingerprint != after.fingerprint:
        return CONVERSATION_CHANGED
    b_valid, a_valid = before.valid, after.valid
    if b_valid and a_valid:
        if before.outcome == after.outcome:
            return STILL_SAME if after.outcome == Outcome.SAME else STILL_DIFFERENT
        return NEWLY_DIVERGED if after.outcome == Outcome.DIFFERENT else HEALED
    if b_valid:
        return NEWLY_INCONCLUSIVE
    return NEWLY_VALID if a_valid else STILL_INCONCLUSIVE


def _by_id(records: Sequence[Record]) -> Dict[str, Record]:
    out: Dict[str, Record] = {}
    for r in records:
        out.setdefault(r.id, r)  # ids are unique (load_baseline refuses a baseline that repeats one)
    return out


def compare(baseline: Baseline, current: Sequence[Record], current_env: Mapping[str, Any],
            unit: str = "probe") -> Comparison:
    """Compare this run's records (measured in ``current_env``) with a baseline, record by record. See the
    module docstring for statuses and the verdict rule. ``unit`` (``probe`` or ``episode``) names the
    records in the verdict's reason and the environment warnings; for episodes pass the baseline's
    ``episodes`` and ``episode_env``."""
    before = _by_id(baseline.records)
    after = _by_id(current)
    rows: List[Row] = []
    for ident, rec in after.items():
        old = before.get(ident)
        if old is None:
            rows.append(Row(id=ident, before=None, after=rec.outcome.value, status=NEW_PROBE))
        else:
            rows.append(Row(id=ident, before=old.outcome.value, after=rec.outcome.value, status=_status(old, rec)))
    for ident, old in before.items():
        if ident not in after:
            rows.append(Row(id=ident, before=old.outcome.value, after=None, status=NOT_RUN))
    rows.sort(key=lambda r: _RANK[r.status])  # stable: run order within a status

    counts = {s: 0 for s in STATUSES}
    for r in rows:
        counts[r.status] += 1
    paired = sum(n for s, n in counts.items() if s not in (CONVERSATION_CHANGED, NEW_PROBE, NOT_RUN))
    valid_in_both = counts[STILL_SAME] + counts[STILL_DIFFERENT] + counts[NEWLY_DIVERGED] + counts[HEALED]
    b, c = counts[NEWLY_DIVERGED], counts[HEALED]
    newly_inconclusive = counts[NEWLY_INCONCLUSIVE]
    p = mcnemar_exact(b, c)
    tally = f"{b} newly diverged vs {c} healed over {counted(valid_in_both, unit)} valid in both runs"
    if paired == 0:
        verdict, why = "inconclusive", f"no {unit} was measured in both runs with the same conversation"
    elif 2 * valid_in_both < paired:
        verdict, why = "inconclusive", (f"only {valid_in_both} of {paired} paired {unit}s were valid in both "
                                        f"runs, fewer than half")
    elif b > c:
        verdict, why = "regressed", tally
    elif c > b:
        verdict, why = "improved", tally
    elif newly_inconclusive == 0:
        verdict, why = "unchanged", tally
    else:
        verb = "is" if newly_inconclusive == 1 else "are"
        verdict, why = "inconclusive", (f"{tally}, but {counted(newly_inconclusive, unit)} valid in the "
                                        f"baseline {verb} not valid now and could tip it")
    return Comparison(rows=rows, counts=counts, verdict=verdict, why=why, mcnemar_p=p, paired=paired,
                      valid_in_both=valid_in_both, env_warnings=env_changes(baseline.env, current_env, unit),
                      baseline_rate=Rate.of(list(before.values())), current_rate=Rate.of(list(after.values())),
                      baseline_created=baseline.created)


def should_fail(comparison: Comparison, policy: str = DEFAULT_POLICY, unit: str = "probe",
                unexpected: Sequence[str] = ()) -> Tuple[bool, str]:
    """Whether the comparison should fail the run under ``policy``, and why (a sentence). ``unit`` names
    what was compared: ``probe`` (a diverged turn-2 answer) or ``episode`` (a changed trajectory).

    * ``new-divergence``: fail when any probe differed that did not differ in the baseline with the same
      conversation: ``unexpected`` holds their ids, as ``run.expectation`` decided for each record (newly
      diverged, new since the baseline, newly valid, or with a changed conversation);
    * ``rate-increase``: fail when this run's divergence rate is higher than the baseline's (each over
      its own valid probes; no failure when either run has no valid probe);
    * ``never``: never fail.

    Raises ValueError for any other policy.
    """
    diverged = "newly diverged" if unit == "probe" else "newly changed trajectory"
    rate = "divergence rate" if unit == "probe" else "trajectory change rate"
    if policy == "never":
        return False, "baseline policy 'never': the comparison does not decide the outcome"
    if policy == "new-divergence":
        if unexpected:
            shown = ", ".join(unexpected[:10]) + (f" and {len(unexpected) - 10} more" if len(unexpected) > 10 else "")
            return True, f"{counted(len(unexpected), unit)} {diverged} against the baseline: {shown}"
        return False, f"no {unit} {diverged} against the baseline"
    if policy == "rate-increase":
        base, cur = comparison.baseline_rate, comparison.current_rate
        if base is None or cur is None:
            which = "the baseline" if base is None else "this run"
            return False, f"cannot compare {rate}s: {which} has no valid {unit}"
        if cur.different * base.valid > base.different * cur.valid:  # exact: cur.value > base.value
            return True, f"the {rate} rose from {base.text()} to {cur.text()}"
        return False, f"the {rate} did not rise ({base.text()} -> {cur.text()})"
    raise ValueError(f"unknown baseline policy {policy!r}; use one of {', '.join(POLICIES)}")
