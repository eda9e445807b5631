"""Session summary, exit verdict, the shareable result block and the JSON report.

Works on plain per-probe records (the dicts of :meth:`ProbeResult.to_dict`), so the controller of an
xdist run can aggregate what its workers measured.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from . import __version__
from .redact import scrub_data

SCHEMA_VERSION = 1


def first_difference(a: str, b: str) -> Optional[int]:
    """Index of the first character where a and b differ (the shorter length if one is a prefix)."""
    if a == b:
        return None
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


@dataclass
class Tally:
    probes: int = 0
    same: int = 0
    different: int = 0
    inconclusive: int = 0
    errors: int = 0

    @property
    def valid(self) -> int:
        return self.same + self.different

    @classmethod
    def of(cls, records: Sequence[Mapping[str, Any]]) -> "Tally":
        t = cls(probes=len(records))
        for r in records:
            if r["outcome"] == "same":
                t.same += 1
            elif r["outcome"] == "different":
                t.different += 1
            elif r["outcome"] == "inconclusive":
                t.inconclusive += 1
            else:
                t.errors += 1
        return t

    def to_dict(self) -> Dict[str, int]:
        return {"probes": self.probes, "valid": self.valid, "same": self.same, "different": self.different,
                "inconclusive": self.inconclusive, "errors": self.errors}


def wilson(k: int, n: int, z: float = 1.959964) -> Optional[Tuple[float, float]]:
    """95% Wilson score interval for k successes of n."""
    if n <= 0:
        return None
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass
class Verdict:
    status: str  # passed | diverged | errors | too-few-valid | interrupted | no-probes
    ok: bool
    why: str


def max_rate_gate(t: Tally, max_rate: float) -> Tuple[bool, str]:
    """(fail?, why) for --cachecheck-max-rate: fail when different / valid exceeds max_rate."""
    if not t.valid:
        return False, "no valid probe to measure a rate on"
    rate = t.different / t.valid
    if rate > max_rate:
        return True, (f"divergence rate {rate:.1%} ({t.different} of {t.valid}) exceeds "
                      f"--cachecheck-max-rate {max_rate:g}")
    return False, f"divergence rate {rate:.1%} is within --cachecheck-max-rate {max_rate:g}"


def judge(t: Tally, min_valid: float, interrupted: bool = False,
          gates: Optional[Sequence[Tuple[bool, str]]] = None) -> Verdict:
    """The session verdict. ``gates`` (max rate, baseline policy), when given, decide about divergences
    in place of the default rule that any valid probe that differed fails the session."""
    if interrupted:
        return Verdict("interrupted", False, "the run was interrupted; the report holds what was measured")
    if t.probes == 0:
        return Verdict("no-probes", True, "no probe ran")
    if gates:
        failing = [why for fail, why in gates if fail]
        if failing:
            return Verdict("gate-failed", False, "; ".join(failing))
    elif t.different:
        return Verdict("diverged", False, f"{t.different} valid probe(s) gave a different turn-2 answer")
    if t.errors:
        return Verdict("errors", False, f"{t.errors} probe(s) failed with a request or server error")
    if t.valid < min_valid * t.probes:
        return Verdict("too-few-valid", False,
                       f"only {t.valid} of {t.probes} probes were valid, fewer than --cachecheck-min-valid "
                       f"{min_valid:g} requires; see the inconclusive reasons")
    if gates:
        return Verdict("passed", True, "; ".join(why for _, why in gates))
    return Verdict("passed", True, "no valid probe differed")


def combine_verdicts(named: Sequence[Tuple[str, Verdict]]) -> Verdict:
    """The session verdict of a target matrix: it passes when every target passes; otherwise it takes the
    first failing target's status and names every failing target with its reason."""
    failing = [(name, v) for name, v in named if not v.ok]
    if not failing:
        ran = [(name, v) for name, v in named if v.status != "no-probes"]
        if not ran:
            return Verdict("no-probes", True, "no probe ran")
        return Verdict("passed", True, "; ".join(f"{name}: {v.why}" for name, v in ran))
    if all(v.status == "interrupted" for _, v in failing):
        return failing[0][1]
    return Verdict(failing[0][1].status, False, "; ".join(f"{name}: {v.why}" for name, v in failing))


def divergence_line(t: Tally) -> str:
    return f"{t.different} of {t.valid} valid probes gave a different turn-2 answer on the cache path."


def rate_line(t: Tally) -> Optional[str]:
    ci = wilson(t.different, t.valid)
    if ci is None:
        return None
    return (f"divergence rate {t.different / t.valid:.1%} (95% Wilson interval {ci[0]:.1%} to {ci[1]:.1%}, "
            f"{t.valid} valid probes)")


def recompute_reuse_cause(records: Sequence[Mapping[str, Any]], mode: Optional[str]) -> Optional[str]:
    """When the recompute path reused cached tokens on every measured probe, name the likely causes."""
    measured = [r for r in records if r["outcome"] != "error" and "recompute_reused" in r.get("checks", {})]
    if not measured or not all(r["checks"]["recompute_reused"] for r in measured):
        return None
    causes = {
        "one-server": "the server ignores cache_salt (a build or fork without salt support); use "
                      "two-servers mode with a second server that has prefix caching off",
        "two-servers": "both URLs reach the same server (a proxy or port forward answering for the second "
                       "port), or the nocache server was started with prefix caching on",
        "llama.cpp": "the server ignores cache_prompt: false (not a stock llama-server?)",
    }
    return ("the recompute path reused cached tokens on every probe: likely "
            + causes.get(mode or "", "the server does not honour the cache controls"))


def result_block(t: Tally, run: Mapping[str, Any]) -> List[str]:
    """Lines meant for sharing: counts and settings, no URL, no key, no conversation text."""
    server = run.get("server") or {}
    s = run.get("settings") or {}
    lines = [
        f"pytest-cachecheck {__version__} | mode {run.get('mode') or '?'} | server {server.get('kind') or '?'}"
        f" {server.get('build') or ''}".rstrip() + f" | model {server.get('model') or '?'}",
        f"probe set {run.get('probe_set', {}).get('name', '?')} ({run.get('probe_set', {}).get('fingerprint', '?')[:19]})"
        f" | max_tokens {s.get('max_tokens')} | hit_tolerance "
        f"{run['hit_tolerance'] if run.get('hit_tolerance') is not None else s.get('hit_tolerance')}"
        + (" | skip_hit_check" if s.get("skip_hit_check") else ""),
        f"probes {t.probes} | valid {t.valid} | same {t.same} | different {t.different} | "
        f"inconclusive {t.inconclusive} | errors {t.errors}",
        divergence_line(t),
    ]
    rate = rate_line(t)
    if rate:
        lines.append(rate)
    return lines


def build_report(run: Mapping[str, Any], records: Sequence[Mapping[str, Any]], selected: Sequence[str],
                 verdict: Verdict, exit_status: Optional[int]) -> Dict[str, Any]:
    t = Tally.of(records)
    ci = wilson(t.different, t.valid)
    done = {r["id"] for r in records}
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "pytest-cachecheck", "version": __version__},
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **{k: run.get(k) for k in ("settings", "mode", "server", "nocache_server", "probe_set", "served",
                                   "hit_tolerance")},
        "setup_warnings": list(run.get("setup_warnings") or []),
        "setup_checks": list(run.get("setup_checks") or []),
        "summary": {
            **t.to_dict(),
            "rate": (t.different / t.valid) if t.valid else None,
            "rate_ci95": list(ci) if ci else None,
            "status": verdict.status,
            "why": verdict.why,
            "exit_status": exit_status,
            "not_run": [pid for pid in selected if pid not in done],
            "recompute_reuse_cause": recompute_reuse_cause(records, run.get("mode")),
        },
        "probes": list(records),
    }


REPORT_TOP_KEYS = ("schema_version", "tool", "created", "settings", "probe_set")


def build_matrix_report(targets: Sequence[Mapping[str, Any]], verdict: Verdict,
                        exit_status: Optional[int]) -> Dict[str, Any]:
    """The report of a target-matrix run from each target's own report (the layout of ``build_report``,
    with ``name``, ``url`` and, but for the first, ``vs_reference`` added).

    Top level: the common keys, an overall ``summary`` (counts summed over the targets; ``rate`` is
    per target only), ``targets`` (each target's run, summary and comparison with the first target) and
    ``probes`` (every record, each with its ``target``).
    """
    first = targets[0]
    totals = Tally()
    for t in targets:
        s = t["summary"]
        totals.probes += s["probes"]
        totals.same += s["same"]
        totals.different += s["different"]
        totals.inconclusive += s["inconclusive"]
        totals.errors += s["errors"]
    return {
        **{k: first.get(k) for k in REPORT_TOP_KEYS},
        "mode": None, "server": None, "nocache_server": None, "served": None, "hit_tolerance": None,
        "setup_warnings": [f"{t['name']}: {w}" for t in targets for w in t.get("setup_warnings") or []],
        "setup_checks": [],
        "summary": {**totals.to_dict(), "rate": None, "rate_ci95": None, "status": verdict.status,
                    "why": verdict.why, "exit_status": exit_status,
                    "not_run": [f"{pid}@{t['name']}" for t in targets for pid in t["summary"]["not_run"]],
                    "recompute_reuse_cause": None},
        "targets": [{k: v for k, v in t.items() if k not in REPORT_TOP_KEYS and k != "probes"}
                    for t in targets],
        "probes": [dict(p, target=t["name"]) for t in targets for p in t["probes"]],
    }


def target_view(report: Mapping[str, Any], name: str) -> Dict[str, Any]:
    """One target's part of a target-matrix report, in the layout of a one-server report."""
    for t in report.get("targets") or []:
        if isinstance(t, Mapping) and t.get("name") == name:
            return {**{k: report.get(k) for k in REPORT_TOP_KEYS}, **t,
                    "probes": [p for p in report.get("probes") or []
                               if isinstance(p, Mapping) and p.get("target") == name]}
    raise KeyError(name)


def matrix_lines(targets: Sequence[Mapping[str, Any]]) -> List[str]:
    """The side-by-side table of a target matrix: counts, rate with its 95% interval, and the paired
    comparison of each target with the first (probes that diverged on one only, exact McNemar p)."""
    from .baseline import format_p

    header = ("target", "server", "valid", "same", "diff", "inconcl", "errors", "rate", "95% interval",
              f"vs {targets[0]['name']}")
    rows = [header]
    for i, t in enumerate(targets):
        s, server = t["summary"], t.get("server") or {}
        ci = s.get("rate_ci95")
        vs = "(reference)"
        cmp = t.get("vs_reference")
        if not s["probes"]:
            vs = "not run (no probe of this target was selected)"
        elif i and not targets[0]["summary"]["probes"]:
            vs = f"n/a ({targets[0]['name']} ran no probe)"
        elif i and isinstance(cmp, Mapping):
            vs = (f"{cmp.get('newly_diverged_count', 0)} diverged only here, {cmp.get('healed_count', 0)} only on "
                  f"{targets[0]['name']}; McNemar p = {format_p(cmp.get('mcnemar_p'))}")
        rows.append((
            str(t["name"]),
            " ".join(str(x) for x in (server.get("kind"), server.get("build"), server.get("model")) if x) or "?",
            str(s["valid"]), str(s["same"]), str(s["different"]), str(s["inconclusive"]), str(s["errors"]),
            f"{s['rate']:.1%}" if isinstance(s.get("rate"), float) else "n/a",
            f"{ci[0]:.1%} to {ci[1]:.1%}" if ci else "n/a",
            vs,
        ))
    widths = [min(48, max(len(r[c]) for r in rows)) for c in range(len(header) - 1)]
    out = []
    for r in rows:
        cells = [(r[c] if len(r[c]) <= widths[c] else r[c][:widths[c] - 3] + "...").ljust(widths[c])
                 for c in range(len(widths))]
        out.append("  ".join(cells + [r[-1]]).rstrip())
    return out


def write_text_atomic(path: str, text: str, suffix: str = ".tmp") -> None:
    """Write text to a temporary file beside ``path``, then rename it into place."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".cachecheck-", suffix=suffix, dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_json_atomic(path: str, data: Mapping[str, Any], scrub: Any = None) -> None:
    """Write the JSON report atomically, with ``scrub`` (e.g. ``Redactor.scrub``) applied to every string
    value first (and to keys that hold a secret): scrubbing the JSON text instead would miss a secret JSON
    escapes, and a secret that is a JSON word (``true``, ``null``) would break the syntax."""
    if scrub is not None:
        data = scrub_data(data, scrub)
    text = json.dumps(data, indent=2, ensure_ascii=False)
    write_text_atomic(path, text + "\n", ".json.tmp")
