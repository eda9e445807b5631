"""One self-contained HTML page for a run report (:class:`~pytest_cachecheck.model.RunReport`).

The page reads top down as a user asks: the verdict (PASS or FAIL, its status and why; per target in a
target matrix), the counts and the rate, a chart of where each divergence happened and how close the
two best tokens were there, the baseline comparison, then the probes that matter (new divergences,
expected divergences, inconclusive, errors) with both turn-2 answers side by side and the divergence
marked; probes that gave the same answer are folded. A divergence is *expected* when the probe also
differed in the baseline, or when a gate (``--cachecheck-max-rate``, a baseline policy other than
``new-divergence``) decides about divergences instead of each probe.

A target matrix gets a table of the targets side by side and a section per target; there a probe is
named ``<probe id>@<target>`` and every anchor is unique (``probe-<i>``, ``i`` its index in
``report.probes``; a target's element ids end in ``-<target number>``).

The page has inline CSS and inline SVG only: no script, no external resource (a Content-Security-Policy
meta tag forbids both, in case anything slipped through). Every text from the report is escaped, and its
control and bidi characters shown as visible escapes (``\\x1b``, ``\\u202e``); a ``scrub`` function, when
given, is applied to every string of the report before anything is rendered. A comparison's tables list at
most ``MAX_ROWS`` rows each (the counts stay whole).
The only URLs shown are the report's, which carry no credentials (they pass
:func:`~pytest_cachecheck.redact.display_url` once more all the same).

This module knows nothing about pytest.
"""

from __future__ import annotations

import dataclasses
import html
import math
from enum import Enum
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .files import write_text
from .model import (CONVERSATION_CHANGED, HEALED, NEAR_TIE_NATS, NEW_PROBE, NEWLY_DIVERGED,
                    NEWLY_INCONCLUSIVE, NEWLY_VALID, NOT_RUN, STILL_DIFFERENT, STILL_INCONCLUSIVE, STILL_SAME,
                    Comparison, EpisodeRecord, EpisodeStep, Outcome, ProbeRecord, Rate, RunReport, ServerDescription,
                    Status, Summary, TargetReport)
from .protocol import first_difference
from .redact import display_url
from .stats import format_p
from .text import counted, visible

__all__ = ["render_html", "write_html", "STYLES", "passed"]

#: the verdicts that pass (the others fail the session)
PASSING = (Status.PASSED, Status.NO_PROBES)
NEW, EXPECTED = "new divergence", "expected divergence"

#: the colour of every status word the page shows: outcomes, statuses, comparison rows and verdicts,
#: and the page's own divergence tags. tests/test_htmlreport.py checks that none is missing.
STYLES: Dict[str, str] = {
    "same": "ok", "different": "bad", "inconclusive": "warn", "error": "err",
    "passed": "ok", "diverged": "bad", "gate-failed": "bad", "errors": "err", "too-few-valid": "warn",
    "unreliable": "severe", "interrupted": "warn", "no-probes": "info", "not-measured": "bad",
    "report-not-written": "err",
    STILL_SAME: "ok", HEALED: "ok", NEWLY_DIVERGED: "bad", STILL_DIFFERENT: "exp", NEWLY_INCONCLUSIVE: "warn",
    STILL_INCONCLUSIVE: "warn", NEWLY_VALID: "info", CONVERSATION_CHANGED: "info", NEW_PROBE: "info",
    NOT_RUN: "info",
    "regressed": "bad", "improved": "ok", "unchanged": "info",
    NEW: "bad", EXPECTED: "exp",
}
_COLOURS = {"ok": "var(--ok)", "bad": "var(--bad)", "exp": "var(--exp)", "warn": "var(--warn)",
            "err": "var(--err)", "severe": "var(--severe)", "info": "var(--info)"}


def _slug(word: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in word.lower())


def _badge_css() -> str:
    rules = []
    for family, colour in _COLOURS.items():
        words = sorted(w for w, f in STYLES.items() if f == family)
        rules.append(", ".join(f".b-{_slug(w)}" for w in words) + f" {{ background: {colour}; }}")
    return "\n".join(rules)


_CSS = """
table.trajectory { width: 100%; table-layout: fixed; }
table.trajectory th:first-child { width: 110px; }
table.trajectory tr.parted th, table.trajectory tr.parted td { background: #fff0f0; }
.call { margin: 4px 0; font-size: 12.5px; }
:root { --ok: #1a7f37; --bad: #cf222e; --exp: #bc4c00; --warn: #9a6700; --err: #6e40c9; --severe: #82071e;
        --info: #0969da; --muted: #57606a; --line: #d0d7de; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif;
       margin: 0 auto; padding: 16px 24px 48px; max-width: 1400px; color: #1f2328; background: #fff; }
h1 { font-size: 22px; margin: 8px 0 4px; }
h2 { font-size: 18px; margin: 28px 0 8px; border-bottom: 1px solid var(--line); padding-bottom: 4px; }
h3 { font-size: 15px; margin: 18px 0 6px; }
h4 { font-size: 14px; margin: 0; word-break: break-all; }
table { border-collapse: collapse; margin: 6px 0; }
th, td { text-align: left; padding: 3px 10px 3px 0; vertical-align: top; }
th { color: var(--muted); font-weight: 600; }
table.grid td, table.grid th { border-bottom: 1px solid #eaeef2; padding: 3px 12px 3px 4px; }
.num { font-variant-numeric: tabular-nums; text-align: right; }
.verdict { border: 2px solid; border-radius: 8px; padding: 10px 14px; margin: 12px 0; }
.verdict.pass { border-color: var(--ok); background: #dafbe1; }
.verdict.fail { border-color: var(--bad); background: #ffebe9; }
.word { font-weight: 700; margin-right: 6px; }
.verdict .word { font-size: 22px; margin-right: 10px; }
.badge + .badge { margin-left: 4px; }
.word.pass { color: var(--ok); }
.word.fail { color: var(--bad); }
.verdict p { margin: 6px 0 0; }
.verdict ul { margin: 6px 0 0; padding-left: 0; list-style: none; }
.verdict li { margin: 3px 0; }
.verdict li .word { font-size: 14px; display: inline-block; min-width: 40px; }
td.server { min-width: 120px; }
td.vs { min-width: 200px; }
.wide { overflow-x: auto; }
.counts { display: flex; flex-wrap: wrap; gap: 10px; margin: 8px 0; }
.count { border: 1px solid var(--line); border-radius: 6px; padding: 6px 12px; min-width: 96px; }
.count b { display: block; font-size: 20px; }
.badge { display: inline-block; border-radius: 10px; padding: 0 8px; font-size: 12px; font-weight: 600;
         color: #fff; background: var(--muted); white-space: nowrap; }
@BADGES@
.why { color: var(--muted); }
.warning { color: var(--warn); }
article.probe { border: 1px solid var(--line); border-radius: 6px; padding: 10px 12px; margin: 12px 0;
                border-left-width: 5px; }
article.probe.k-new { border-left-color: var(--bad); }
article.probe.k-expected { border-left-color: var(--exp); border-left-style: dashed; }
article.probe.o-same { border-left-color: var(--ok); }
article.probe.o-inconclusive { border-left-color: var(--warn); }
article.probe.o-error { border-left-color: var(--err); }
.probe-head { display: flex; gap: 10px; align-items: center; flex-wrap: wrap; }
.note { margin: 6px 0; }
.pair { display: grid; grid-template-columns: 1fr 1fr; gap: 12px; margin-top: 8px; }
.pair h5, .single h5 { margin: 0 0 4px; font-size: 13px; color: var(--muted); }
.single { margin-top: 8px; }
pre { white-space: pre-wrap; overflow-wrap: anywhere; margin: 0; padding: 8px;
      font: 12.5px/1.45 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
      background: #f6f8fa; border-radius: 6px; }
pre.reason { background: #fff8c5; }
code { font: 12.5px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; background: #f6f8fa;
       padding: 0 3px; border-radius: 3px; }
mark { background: #ffc1c0; color: #82071e; border-radius: 2px; }
mark.end { background: #eaeef2; color: var(--muted); font-style: italic; }
.none { color: var(--muted); font-style: italic; }
details { margin-top: 8px; }
summary { cursor: pointer; color: var(--muted); }
details.group > summary { font-size: 15px; font-weight: 600; color: #1f2328; margin: 14px 0 6px; }
a { color: #0969da; }
.footer { margin-top: 32px; color: var(--muted); font-size: 12px; }
.setup-warnings { border: 1px solid #d4a72c; border-left: 5px solid var(--warn); border-radius: 6px;
                  background: #fff8c5; padding: 6px 12px; margin: 8px 0; }
.setup-warnings ul, ul.checks { margin: 4px 0; padding-left: 20px; }
section.target { border: 1px solid var(--line); border-radius: 6px; padding: 0 12px 10px; margin: 20px 0; }
section.target > h2 { margin-top: 10px; }
table#probe-index a { text-decoration: none; }
.nowrap { white-space: nowrap; }
figure.chart { margin: 8px 0 4px; }
figure.chart svg { max-width: 100%; height: auto; border: 1px solid #eaeef2; border-radius: 6px; }
figcaption { color: var(--muted); font-size: 12px; }
.chart text { font: 11px system-ui, sans-serif; fill: var(--muted); }
.chart .axis { stroke: #8c959f; stroke-width: 1; }
.chart .grid { stroke: #eaeef2; stroke-width: 1; }
.chart .tie-zone { fill: #fff8c5; }
.chart .tie { stroke: var(--warn); stroke-width: 1.5; stroke-dasharray: 6 4; }
.chart text.tie-label { fill: var(--warn); font-weight: 600; }
.chart .pt-new { fill: var(--bad); stroke: var(--bad); }
.chart .pt-expected { fill: var(--exp); stroke: var(--exp); }
.key { display: inline-block; width: 10px; height: 10px; border-radius: 50%; vertical-align: middle; }
.key.new { background: var(--bad); }
.key.expected { background: var(--exp); }
""".replace("@BADGES@", _badge_css())

_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src 'none'; form-action 'none'"


# --------------------------------------------------------------------------- small pieces

def _control(escape: str) -> str:
    # a style attribute, not a class: the page's stylesheet stays as it is
    return f'<span class="control" style="color: var(--severe); font-weight: 600">{escape}</span>'


def _e(value: Any) -> str:
    """Escaped text of any value (None becomes an empty string); control and bidi characters (a server's
    text may hold any) shown as visible escapes such as ``\\x1b``, as in the terminal
    (:func:`~pytest_cachecheck.text.visible`)."""
    return visible(html.escape("" if value is None else str(value), quote=True), _control)


def _plain(value: Any) -> str:
    """:func:`_e` without markup, for an attribute or a ``<title>``."""
    return html.escape(visible("" if value is None else str(value)), quote=True)


def _badge(word: Any) -> str:
    """A status word as a coloured badge; a word the page has no colour for is shown grey (and its text,
    which may come from a file, never becomes part of a class name)."""
    text = str(word) if word is not None else "?"
    cls = f"b-{_slug(text)}" if text in STYLES else "b-unknown"
    return f'<span class="badge {cls}">{_e(text)}</span>'


def passed(status: Status) -> bool:
    """Whether a verdict with this status passes."""
    return status in PASSING


def _word(status: Status) -> str:
    ok = passed(status)
    return f'<span class="word {"pass" if ok else "fail"}">{"PASS" if ok else "FAIL"}</span>'


def _pct(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _attr(name: str, value: str) -> str:
    """`` name="value"``, or nothing when value is empty."""
    return f' {name}="{value}"' if value else ""


def _kv_table(rows: Sequence[Tuple[str, str]], ident: str = "") -> str:
    body = "".join(f"<tr><th>{_e(k)}</th><td>{v}</td></tr>" for k, v in rows)
    return f"<table{_attr('id', ident)}>{body}</table>"


def _list(items: Sequence[str], cls: str = "") -> str:
    return f"<ul{_attr('class', cls)}>" + "".join(f"<li>{_e(i)}</li>" for i in items) + "</ul>"


def _server_text(server: Optional[ServerDescription]) -> str:
    if server is None:
        return "?"
    text = " ".join(p for p in (server.kind, server.build or "") if p)
    return text + (f" | model {server.model}" if server.model else "")


def _url_html(url: Optional[str]) -> Optional[str]:
    """A URL as it may be shown (no credentials, query values masked), or None when there is none."""
    return f"<code>{_e(display_url(url))}</code>" if url else None


def _rate_html(rate: Optional[Rate], what: str = "divergence rate", unit: str = "probe") -> str:
    """A rate with its 95% interval, or n/a when nothing was valid."""
    if rate is None:
        return f"{what}: n/a (no valid {unit})"
    lo, hi = rate.ci95
    return (f"{what} <b>{rate.value:.1%}</b> ({rate.different} of {rate.valid} valid {unit}s), "
            f"95% Wilson interval {lo:.1%} to {hi:.1%}")


def _answer_html(text: Optional[str], at: Optional[int]) -> str:
    """The answer in a <pre>: the common prefix plain, everything from ``at`` inside <mark>."""
    if text is None:
        return '<pre><span class="none">(no answer)</span></pre>'
    if at is None or at < 0:
        return f"<pre>{_e(text)}</pre>"
    at = min(at, len(text))
    rest = text[at:]
    marked = f"<mark>{_e(rest)}</mark>" if rest else '<mark class="end">(end of answer)</mark>'
    return f"<pre>{_e(text[:at])}{marked}</pre>"


def _setup_warnings(warnings: Sequence[str], suffix: str) -> str:
    """A prominent box listing the setup warnings, or nothing when there are none."""
    if not warnings:
        return ""
    plural = "s" if len(warnings) > 1 else ""
    return (f'<div class="setup-warnings" id="setup-warnings{suffix}"><b class="warning">setup '
            f"warning{plural} ({len(warnings)})</b>{_list(warnings)}</div>")


# --------------------------------------------------------------------------- scrubbing

def _scrubbed(obj: Any, scrub: Callable[[str], str]) -> Any:
    """A copy of a report (dataclasses, lists, dicts) with ``scrub`` applied to every string; the status
    and outcome words (enums) stay as they are, so the copy is still a well-formed report."""
    if isinstance(obj, Enum):
        return obj
    if isinstance(obj, str):
        return scrub(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: _scrubbed(getattr(obj, f.name), scrub)
                                           for f in dataclasses.fields(obj) if f.init})
    if isinstance(obj, dict):
        return {_scrubbed(k, scrub): _scrubbed(v, scrub) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_scrubbed(v, scrub) for v in obj)
    return obj


# --------------------------------------------------------------------------- which divergences matter

def divergence_kind(p: ProbeRecord, target: TargetReport) -> Tuple[str, str]:
    """For a probe whose answers differed: its tag (NEW or EXPECTED) and why. Whether a divergence fails the
    run is the record's own ``expected`` (decided once, by ``run.expectation``); the page only shows it."""
    if p.expected:
        return EXPECTED, "expected: " + p.expected
    row = next((r for r in target.baseline.rows if r.id == p.id), None) if target.baseline else None
    if row is not None and row.status == NEWLY_DIVERGED:
        return NEW, ("new: it gave the same answer in the baseline; the baseline policy new-divergence "
                     "fails the run on it")
    if target.baseline is not None:
        was = f"{row.status}, {row.before or 'absent'} in the baseline" if row else "not in the baseline"
        return NEW, (f"new: it did not differ in the baseline ({was}); the baseline policy new-divergence "
                     f"fails the run on it")
    return NEW, "new: without a baseline or a rate gate, any valid probe whose answers differ fails the run"


_KIND_CLASS = {NEW: "new", EXPECTED: "expected"}


class _Probe:
    """A probe record as the page shows it: its anchor, its label and, when it differed, its tag."""

    def __init__(self, record: ProbeRecord, anchor: str, label: str, kind: Optional[Tuple[str, str]]) -> None:
        self.record, self.anchor, self.label, self.kind = record, anchor, label, kind

    @property
    def group(self) -> str:
        o = self.record.outcome
        if o == Outcome.DIFFERENT:
            return "new" if self.kind is not None and self.kind[0] == NEW else "expected"
        return {Outcome.SAME: "same", Outcome.INCONCLUSIVE: "inconclusive"}.get(o, "errors")


_GROUPS = (("new", "New divergences", "these fail the run"),
           ("expected", "Expected divergences", "they also differed in the baseline, a rate gate or baseline "
                                                "policy decides, or they are recorded as the baseline; they do "
                                                "not fail the run by themselves"),
           ("inconclusive", "Inconclusive", "not valid: the measurement could not be trusted"),
           ("errors", "Errors", "a request or server error"),
           ("same", "Same", "both paths gave the same answer"))


# --------------------------------------------------------------------------- the chart

def _finite(x: Optional[float]) -> Optional[float]:
    return x if x is not None and math.isfinite(x) and x >= 0 else None


def _margins(p: _Probe) -> Tuple[Optional[float], Optional[float]]:
    """A divergence's margins on the cache and recompute paths, each None when missing or not a number."""
    d = p.record.divergence
    return (None, None) if d is None else (_finite(d.cache_margin), _finite(d.recompute_margin))


def _token(p: _Probe) -> Optional[int]:
    d = p.record.divergence
    return None if d is None or d.token is None or d.token < 0 else d.token


def _chart(probes: Sequence[_Probe], max_tokens: Any, suffix: str) -> str:
    """An inline SVG: x = token index of the first difference, y = the two paths' top-1 minus top-2 logprob
    margins added up (the logit shift that swaps their tokens; log scale), the near-tie threshold drawn as a
    line; divergences without margins on a strip below; each mark links to its probe. Empty when no
    divergence has a token index."""
    differed = [p for p in probes if p.record.outcome == Outcome.DIFFERENT]
    placed = [p for p in differed if _token(p) is not None]
    unplaced = [p for p in differed if _token(p) is None]
    if not placed:
        return ""
    needs_strip = any(None in _margins(p) for p in placed)
    w, left, right, top, bottom = 760, 64, 16, 14, 176
    strip = bottom + 24  # the row of divergences without margins, when there are any
    h = (strip if needs_strip else bottom) + 40
    x_max = max([_token(p) or 0 for p in placed] + [1])
    if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens >= x_max:
        x_max = max_tokens
    margins = [sum(ms) for p in placed for ms in [_margins(p)] if None not in ms]  # type: ignore[arg-type]
    lo_exp, hi_exp = -3, 1
    if margins and max(margins) > 0:
        hi_exp = max(1, min(3, math.ceil(math.log10(max(margins)))))

    def x(token: int) -> float:
        return left + (w - left - right) * min(max(token, 0), x_max) / x_max

    def y(margin: float) -> float:
        m = math.log10(max(margin, 10.0 ** lo_exp))
        return top + (bottom - top) * (hi_exp - min(m, hi_exp)) / (hi_exp - lo_exp)

    out = [f'<svg class="chart" id="chart{suffix}" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" '
           f'width="{w}" height="{h}" role="img" '
           'aria-label="token index and logprob margin of each divergence">',
           f'<rect class="tie-zone" x="{left}" y="{y(NEAR_TIE_NATS):.1f}" width="{w - left - right}" '
           f'height="{bottom - y(NEAR_TIE_NATS):.1f}"/>']
    for e in range(lo_exp, hi_exp + 1):
        yy = y(10.0 ** e)
        label = f"{10.0 ** e:g}" if e != lo_exp else f"\u2264{10.0 ** e:g}"
        out.append(f'<line class="grid" x1="{left}" y1="{yy:.1f}" x2="{w - right}" y2="{yy:.1f}"/>'
                   f'<text x="{left - 6}" y="{yy + 4:.1f}" text-anchor="end">{_e(label)}</text>')
    ticks = sorted({round(x_max * i / 4) for i in range(5)})
    for t in ticks:
        out.append(f'<line class="axis" x1="{x(t):.1f}" y1="{bottom}" x2="{x(t):.1f}" y2="{bottom + 4}"/>'
                   f'<text x="{x(t):.1f}" y="{h - 22}" text-anchor="middle">{t}</text>')
    yt = y(NEAR_TIE_NATS)
    out += [f'<line class="axis" x1="{left}" y1="{top}" x2="{left}" y2="{bottom}"/>',
            f'<line class="axis" x1="{left}" y1="{bottom}" x2="{w - right}" y2="{bottom}"/>',
            f'<line class="tie" x1="{left}" y1="{yt:.1f}" x2="{w - right}" y2="{yt:.1f}"/>',
            f'<text class="tie-label" x="{w - right - 4}" y="{yt - 5:.1f}" text-anchor="end">'
            f"near-tie threshold {NEAR_TIE_NATS:g} nats</text>",
            f'<text x="14" y="{(top + bottom) / 2:.0f}" text-anchor="middle" '
            f'transform="rotate(-90 14 {(top + bottom) / 2:.0f})">margins added (nats)</text>',
            f'<text x="{left - 6}" y="{strip + 4}" text-anchor="end">no margin</text>'
            f'<line class="grid" x1="{left}" y1="{strip}" x2="{w - right}" y2="{strip}"/>'
            if needs_strip else "",
            f'<text x="{(left + w - right) / 2:.0f}" y="{h - 4}" text-anchor="middle">'
            f"token index of the first difference (0 to {x_max})</text>"]
    for p in placed:
        token = _token(p) or 0
        cls = f"pt-{_KIND_CLASS[p.kind[0]] if p.kind else 'new'}"
        cm, rm = _margins(p)
        xx = x(token)
        title = f"{p.label}: token {token}"
        d = p.record.divergence
        if cm is not None and rm is not None and d is not None:
            title += f", margin {cm:.4g} (cache) and {rm:.4g} (recompute) nats: {d.kind}"
            marks = f'<circle class="{cls}" cx="{xx:.1f}" cy="{y(cm + rm):.1f}" r="4.5"/>'

        else:
            title += ", no logprob margins"
            marks = (f'<path class="{cls}" d="M{xx:.1f} {strip - 6} l5 6 l-5 6 l-5 -6 z"/>')
        out.append(f'<a href="#{p.anchor}"><title>{_plain(title)}</title>{marks}</a>')
    out.append("</svg>")
    kinds = sorted({p.kind[0] for p in placed if p.kind}, key=list(_KIND_CLASS).index)
    legend = (", ".join(f'<span class="key {_KIND_CLASS[k]}"></span> {_e(k)}' for k in kinds)
              + f". Each mark is one divergence: how far the paths' two best tokens would have to move to swap "
              f"(the top-1 minus top-2 margins of both paths added). On or under the dashed line ("
              f"{NEAR_TIE_NATS:g} nats) they were nearly tied: rounding alone can swap them. Far above it the "
              "paths computed different numbers. Each mark links to its probe.")
    if unplaced:
        legend += " Not placed (no token index): " + ", ".join(
            f'<a href="#{p.anchor}">{_e(p.label)}</a>' for p in unplaced) + "."
    return (f'<figure class="chart"><h3>Where the answers parted</h3>{"".join(out)}'
            f"<figcaption>{legend}</figcaption></figure>")


# --------------------------------------------------------------------------- comparisons

#: the most rows a comparison's table lists (a run of 100,000 probes would make a page of megabytes); the
#: counts stay whole, the JSON report has every row
MAX_ROWS = 500


def _comparison_section(c: Comparison, anchors: Dict[str, str], *, title: str, ident: str,
                        before: str = "baseline", after: str = "now", note: Optional[str] = None,
                        before_anchors: Optional[Dict[str, str]] = None, unit: str = "probe") -> str:
    """A comparison: verdict, McNemar p, rates, notes, counts and the rows ("still same" folded).

    ``anchors`` (probe id -> anchor) links each row's id to the probe, ``before_anchors`` its
    before-outcome to the other run's probe (a matrix's reference target). ``ident`` is the section's
    element id (the rows table gets ``<ident>-rows``)."""
    out = [f'<div class="comparison" id="{ident}"><h3>{_e(title)}</h3>',
           f'<p>{_badge(c.verdict)} <span class="why">{_e(c.why)}</span> | exact McNemar p = '
           f"{_e(format_p(c.mcnemar_p))}</p>"]
    if note:
        out.append(f'<p class="why">{_e(note)}</p>')
    if c.baseline_created:
        out.append(f'<p class="why">baseline written {_e(c.baseline_created)}</p>')
    base = c.baseline_rate.text() if c.baseline_rate else "n/a (no valid probe)"
    cur = c.current_rate.text() if c.current_rate else "n/a (no valid probe)"
    out.append(f"<p>divergence rate: {_e(before)} {_e(base)} &rarr; {_e(after)} {_e(cur)}</p>")
    out += [f'<p class="warning">{_e(w)}</p>' for w in c.env_warnings]
    counts = " | ".join(f"{_e(k)} <b>{v}</b>" for k, v in c.counts.items() if v)
    if counts:
        out.append(f"<p>{counts}</p>")

    def rows_table(rows: Sequence[Any], table_id: str) -> str:
        head = ("<th>before</th><th>after</th>" if (before, after) == ("baseline", "now")
                else f"<th>{_e(before)}</th><th>{_e(after)}</th>")
        body = []
        for r in rows[:MAX_ROWS]:  # the rows come most important first
            link = f'<a href="#{anchors[r.id]}">{_e(r.id)}</a>' if r.id in anchors else _e(r.id)
            was = _e(r.before or "-")
            if before_anchors is not None and r.id in before_anchors and r.before:
                was = f'<a href="#{before_anchors[r.id]}">{was}</a>'
            body.append(f"<tr><td>{link}</td><td>{was}</td><td>{_e(r.after or '-')}</td>"
                        f"<td>{_badge(r.status)}</td></tr>")
        more = len(rows) - len(body)
        tail = (f'<p class="why" id="{table_id}-more">and {counted(more, "more row")}: see the JSON report</p>'
                if more else "")
        return (f'<table class="grid" id="{table_id}"><tr><th>id</th>{head}<th>status</th></tr>'
                + "".join(body) + "</table>" + tail)

    shown = [r for r in c.rows if r.status != STILL_SAME]
    same = [r for r in c.rows if r.status == STILL_SAME]
    if shown:
        out.append(rows_table(shown, f"{ident}-rows"))
    if same:
        out.append(f"<details><summary>{counted(len(same), unit)} still same</summary>"
                   f"{rows_table(same, f'{ident}-same-rows')}</details>")
    if not c.rows:
        out.append('<p class="none">no probes in either run</p>')
    out.append("</div>")
    return "".join(out)


# --------------------------------------------------------------------------- one probe

def _probe_article(p: _Probe) -> str:
    """One probe: its outcome (and tag), where it diverged, its reason and its turn-2 answers."""
    r = p.record
    cache, recompute, turn1 = r.cache_answer, r.recompute_answer, r.content("cache-1/turn-1")
    d = r.divergence
    at: Optional[int] = None
    if r.outcome == Outcome.DIFFERENT and cache is not None and recompute is not None:
        # from the texts shown: a scrubbed secret may have moved the difference
        at = first_difference(cache, recompute)
        if at is None and d is not None:
            at = d.char
    kind_cls = f" k-{_KIND_CLASS[p.kind[0]]}" if p.kind else ""
    out = [f'<article class="probe o-{r.outcome.value}{kind_cls}" id="{p.anchor}">',
           f'<div class="probe-head"><h4>{_e(p.label)}</h4>{_badge(r.outcome.value)}']
    if p.kind:
        out.append(_badge(p.kind[0]))
    if r.source:
        out.append(f'<span class="why">{_e(r.source)}</span>')
    out.append(f'<span class="why">{r.duration_s:.2f} s</span></div>')
    if p.kind:
        out.append(f'<p class="note why">{_e(p.kind[1])}</p>')
    if r.outcome == Outcome.DIFFERENT:
        out.append(f'<p class="divergence">{_divergence_text(r, at)}</p>')
    elif r.reason:
        out.append(f'<pre class="reason">{_e(r.reason)}</pre>')
    if r.outcome == Outcome.SAME and cache == recompute:
        out.append(f'<div class="single"><h5>turn 2, both paths</h5>{_answer_html(cache, None)}</div>')
    else:
        out.append('<div class="pair">'
                   f"<div><h5>turn 2, cache path</h5>{_answer_html(cache, at)}</div>"
                   f"<div><h5>turn 2, recompute path</h5>{_answer_html(recompute, at)}</div></div>")
    if turn1 is not None:
        out.append(f"<details><summary>turn-1 answer</summary>{_answer_html(turn1, None)}</details>")
    out.append("</article>")
    return "".join(out)


def _divergence_text(r: ProbeRecord, at: Optional[int]) -> str:
    d = r.divergence
    where = f"first difference at character {d.char if d is not None else at}"
    if d is None:
        return _e(where)
    if d.token is not None:
        where += f" (token {d.token})"
    text = _e(where)
    if d.cache_token is not None and d.recompute_token is not None:
        text += (f": cache <code>{_e(repr(d.cache_token))}</code> vs recompute "
                 f"<code>{_e(repr(d.recompute_token))}</code>")
    cm, rm = _finite(d.cache_margin), _finite(d.recompute_margin)
    if cm is not None and rm is not None:
        text += f"; top-1 minus top-2 logprob margin {cm:.4f} (cache) and {rm:.4f} (recompute) nats"
        if d.kind:
            text += f": <b>{_e(d.kind)}</b>"
    return text


def _probe_groups(probes: Sequence[_Probe], suffix: str) -> str:
    """The probes that matter, in order of importance, then the same ones folded."""
    if not probes:
        return '<p class="none">no probe ran</p>'
    out = []
    for key, title, why in _GROUPS:
        members = [p for p in probes if p.group == key]
        if not members:
            continue
        body = "".join(_probe_article(p) for p in members)
        if key == "same":
            out.append(f'<details class="group" id="group-same{suffix}"><summary>{title} ({len(members)}): '
                       f'<span class="why">{_e(why)}; click to show</span></summary>{body}</details>')
        else:
            out.append(f'<h3 id="group-{key}{suffix}">{title} ({len(members)}) <span class="why">'
                       f"&ndash; {_e(why)}</span></h3>{body}")
    return "".join(out)


# --------------------------------------------------------------------------- episodes

_EPISODE_GROUPS = (("different", "Changed trajectories", "the cache path and the recompute path took different "
                    "trajectories"),
                   ("inconclusive", "Inconclusive", "not valid: see the reason"),
                   ("error", "Errors", "a request or server error"),
                   ("same", "Same trajectory", "both paths took the same trajectory"))


def _step_cell(step: Optional[EpisodeStep], other: Optional[EpisodeStep], parted: bool) -> str:
    if step is None:
        return '<td><span class="none">(ended)</span></td>'
    at = first_difference(step.content, other.content) if parted and other is not None else None
    calls = "".join(f'<div class="call">&rarr; <code>{_e(c.name)}({_e(c.arguments)})</code></div>'
                    for c in step.tool_calls)
    text = _answer_html(step.content, at) if step.content or not calls else ""
    counts = (f'<div class="why">prompt {step.prompt_tokens}, answer {step.completion_tokens}, cached '
              f"{step.cached_tokens}</div>")
    return f"<td>{text}{calls}{counts}</td>"


def _episode_article(e: EpisodeRecord, anchor: str) -> str:
    out = [f'<article class="probe o-{e.outcome.value}" id="{anchor}">',
           f'<div class="probe-head"><h4>{_e(e.key)}</h4>{_badge(e.outcome.value)}'
           f'<span class="why">{_e(e.source)}</span><span class="why">{e.duration_s:.2f} s</span></div>']
    if e.reason:
        out.append(f'<pre class="reason">{_e(e.reason)}</pre>')
    cache, recompute = e.path("cache-1"), e.path("recompute-1")
    if cache is not None and recompute is not None:
        parted = e.parting.step if e.parting is not None else None
        rows = []
        for i in range(max(len(cache.steps), len(recompute.steps))):
            a = cache.steps[i] if i < len(cache.steps) else None
            b = recompute.steps[i] if i < len(recompute.steps) else None
            mark = i + 1 == parted
            rows.append(f'<tr{_attr("class", "parted" if mark else "")}><th>step {i + 1}'
                        f'{" (parted)" if mark else ""}</th>{_step_cell(a, b, mark)}{_step_cell(b, a, mark)}</tr>')
        out.append('<table class="grid trajectory"><tr><th></th><th>cache path</th><th>recompute path</th></tr>'
                   f'{"".join(rows)}</table>'
                   f'<p class="why">cache path: {_e(cache.ended or "cut short")}; recompute path: '
                   f'{_e(recompute.ended or "cut short")}</p>')
    out.append("</article>")
    return "".join(out)


def _episodes_section(t: TargetReport, suffix: str) -> str:
    """A target's episodes: counts, the rate, where trajectories parted, the baseline comparison and each
    episode's two trajectories side by side, step by step, the parting step marked."""
    if t.episodes is None or t.episode_summary is None:
        return ""
    s = t.episode_summary
    out = [f'<h2 id="episodes{suffix}">Episodes ({len(t.episodes)})</h2>',
           '<p class="why">Each episode is a multi-step conversation, tool calls included; each path feeds its '
           "own answers forward, the cache path reusing the cache step by step, the recompute path computing "
           "every step from scratch.</p>",
           "<p>" + " | ".join(f"{k} <b>{v}</b>" for k, v in (
               ("episodes", s.tally.probes), ("valid", s.tally.valid), ("same", s.tally.same),
               ("changed", s.tally.different), ("inconclusive", s.tally.inconclusive),
               ("errors", s.tally.errors))) + "</p>",
           f"<p>{_rate_html(s.tally.rate, 'trajectory change rate', 'episode')}</p>"]
    if s.parting_steps:
        out.append("<p>first parting step: " + ", ".join(f"step {k}: <b>{v}</b>"
                                                          for k, v in s.parting_steps.items()) + "</p>")
    anchors = {e.id: f"episode-{i}{suffix}" for i, e in enumerate(t.episodes)}
    if t.episode_baseline is not None:
        out.append(_comparison_section(t.episode_baseline, anchors, title="Baseline comparison of the episodes",
                                       ident=f"episode-baseline{suffix}", unit="episode"))
    for outcome, title, why in _EPISODE_GROUPS:
        members = [(i, e) for i, e in enumerate(t.episodes) if e.outcome.value == outcome]
        if not members:
            continue
        body = "".join(_episode_article(e, anchors[e.id]) for _, e in members)
        if outcome == "same":
            out.append(f'<details class="group"><summary>{title} ({len(members)}): <span class="why">{_e(why)}; '
                       f"click to show</span></summary>{body}</details>")
        else:
            out.append(f'<h3>{title} ({len(members)}) <span class="why">&ndash; {_e(why)}</span></h3>{body}')
    return "".join(out)


# --------------------------------------------------------------------------- the page's parts

def _verdict_box(report: RunReport, probes: Dict[Optional[str], List[_Probe]]) -> str:
    s = report.summary
    ok = passed(s.status)
    out = [f'<div class="verdict {"pass" if ok else "fail"}" id="verdict">{_word(s.status)}'
           f'{_badge(s.status.value)} <span class="why-text">{_e(s.why)}</span>']
    if ok and s.exit_status:
        out.append(f'<p class="why">pytest itself exited with status {s.exit_status} (other tests failed or '
                   f"errored)</p>")
    if report.matrix:
        lines = []
        for i, t in enumerate(report.targets):
            lines.append(f'<li id="verdict-{i}">{_word(t.summary.status)}<a href="#target-{i}">'
                         f"{_e(t.name)}</a> {_badge(t.summary.status.value)} "
                         f'<span class="why">{_e(t.summary.why)}</span>{_matter(probes[t.name])}</li>')
        out.append(f"<ul>{''.join(lines)}</ul>")
    else:
        out.append(_matter(probes[None], block=True))
    out.append("</div>")
    return "".join(out)


def _matter(probes: Sequence[_Probe], block: bool = False) -> str:
    """Links to the probes that matter: new divergences, errors, expected divergences, inconclusive."""
    parts = []
    titles = {key: title for key, title, _ in _GROUPS}
    for key in ("new", "errors", "expected", "inconclusive"):
        members = [p for p in probes if p.group == key]
        if members:
            title = titles[key].lower()
            links = ", ".join(f'<a href="#{p.anchor}">{_e(p.label)}</a>' for p in members[:12])
            more = f" and {len(members) - 12} more" if len(members) > 12 else ""
            parts.append(f"{title} ({len(members)}): {links}{more}")
    if not parts:
        return ""
    return f'<p>{"; ".join(parts)}</p>' if block else f'<br><span class="why">{"; ".join(parts)}</span>'


def _counts(summary: Summary, with_ids: bool) -> str:
    t = summary.tally
    values = (("probes", t.probes), ("valid", t.valid), ("same", t.same), ("different", t.different),
              ("inconclusive", t.inconclusive), ("errors", t.errors))
    if with_ids:
        boxes = "".join(f'<div class="count" id="count-{k}"><b class="num">{v}</b>{k}</div>'
                        for k, v in values)
        return f'<div class="counts">{boxes}</div>'
    return "<p>" + " | ".join(f"{k} <b>{v}</b>" for k, v in values) + "</p>"


def _summary_warnings(s: Summary) -> str:
    out = ""
    if s.not_run:
        out += f'<p class="warning">not run: {_e(", ".join(s.not_run))}</p>'
    if s.recompute_reuse_cause:
        out += f'<p class="warning">{_e(s.recompute_reuse_cause)}</p>'
    return out


def _settings_text(settings: Dict[str, Any]) -> str:
    shown = ("n", "max_tokens", "hit_tolerance", "skip_hit_check", "min_valid", "max_rate", "fail_on",
             "logprobs", "timeout")
    return " | ".join(f"{k} {settings[k]}" for k in shown
                      if settings.get(k) is not None and (k != "fail_on" or settings.get("baseline")))


def _written_by(report: RunReport) -> Tuple[str, str]:
    return ("written by", _e(f"pytest-cachecheck {report.tool_version}".strip()
                             + (f", {report.created}" if report.created else "")))


def _probe_set(report: RunReport) -> Tuple[str, str]:
    ps = report.probe_set
    return ("probe set", _e(f"{ps.name} ({ps.count} probes)") + f" <code>{_e(ps.fingerprint)}</code>")


def _setup_rows(t: TargetReport) -> List[Tuple[str, str]]:
    s = t.setup
    rows: List[Tuple[str, str]] = []
    url = _url_html(t.url)
    if url:
        rows.append(("url", url))
    rows += [("mode", _e(s.mode or "?")), ("server", _e(_server_text(s.server)))]
    if s.nocache_server is not None:
        rows.append(("recompute server", _e(_server_text(s.nocache_server))))
    if s.hit_tolerance is not None:
        rows.append(("hit_tolerance", _e(f"raised to {s.hit_tolerance} for the server's cache blocks")))
    if s.setup_checks:
        rows.append(("setup checks", _list(s.setup_checks, "checks")))
    return rows


def _wrap(report: RunReport, probes: List[ProbeRecord], by_target: Dict[Optional[str], List[_Probe]]) -> None:
    """Fill ``by_target`` with every probe of the report, its anchor, label and divergence tag."""
    for i, r in enumerate(probes):
        target = next((t for t in report.targets if t.name == r.target), report.targets[0])
        kind = divergence_kind(r, target) if r.outcome == Outcome.DIFFERENT else None
        by_target.setdefault(target.name, []).append(_Probe(r, f"probe-{i}", r.key, kind))


def _render_single(report: RunReport, probes: List[_Probe]) -> List[str]:
    t = report.targets[0]
    s = report.summary
    anchors: Dict[str, str] = {}
    for p in probes:
        anchors.setdefault(p.record.id, p.anchor)
    only_episodes = not probes and bool(t.episodes)
    parts = [_verdict_box(report, {None: probes})]
    if not only_episodes:
        parts += ["<h2>Summary</h2>", _counts(s, True), f'<p id="rate">{_rate_html(s.rate)}</p>',
                  _summary_warnings(s)]
    parts += [_setup_warnings(t.setup.setup_warnings, ""), _chart(probes, report.settings.get("max_tokens"), "")]
    if t.baseline is not None:
        parts.append(_comparison_section(t.baseline, anchors, title="Baseline comparison", ident="baseline"))
    if not only_episodes:
        parts += [f'<h2 id="probes">Probes ({len(probes)})</h2>', _probe_groups(probes, "")]
    parts.append(_episodes_section(t, ""))
    server = t.setup.server
    rows = [("mode", _e(t.setup.mode or report.settings.get("mode") or "?")),
            ("server", _e(_server_text(server)))]
    if t.setup.nocache_server is not None:
        rows.append(("recompute server", _e(_server_text(t.setup.nocache_server))))
    rows.append(("model", _e((server.model if server else None) or "?")))  # never an unchecked option value
    url = _url_html(report.settings.get("url"))
    if url:
        rows.append(("url", url))
    if t.setup.hit_tolerance is not None:
        rows.append(("hit_tolerance", _e(f"raised to {t.setup.hit_tolerance} for the server's cache blocks")))
    rows += [_probe_set(report), ("settings", _e(_settings_text(report.settings))), _written_by(report)]
    if t.setup.setup_checks:
        rows.append(("setup checks", _list(t.setup.setup_checks, "checks")))
    parts += ["<h2>Run</h2>", _kv_table(rows, "run")]
    return parts


def _targets_table(report: RunReport) -> str:
    ref = str(report.targets[0].name)
    head = ("target", "verdict", "server", "mode", "valid", "same", "different", "inconclusive", "errors",
            "rate", "95% interval", f"vs {ref}")
    nums = {"valid", "same", "different", "inconclusive", "errors", "rate"}
    rows = []
    for i, t in enumerate(report.targets):
        s, rate = t.summary, t.summary.rate
        interval = f"{rate.ci95[0]:.1%} to {rate.ci95[1]:.1%}" if rate else "n/a"
        if i == 0:
            vs = '<span class="why">(reference)</span>'
        elif t.vs_reference is None:
            vs = '<span class="none">n/a</span>'
        else:
            c = t.vs_reference
            vs = (f"{_badge(c.verdict)} {c.b} diverged only here, {c.c} only on {_e(ref)} "
                  f"(McNemar p = {_e(format_p(c.mcnemar_p))})")
        cells = [f'<a href="#target-{i}">{_e(t.name)}</a>', f"{_word(s.status)}{_badge(s.status.value)}",
                 _e(_server_text(t.setup.server)), _e(t.setup.mode or "?")]
        tl = s.tally
        cells += [str(v) for v in (tl.valid, tl.same, tl.different, tl.inconclusive, tl.errors)]
        cells += [_pct(rate.value if rate else None), interval, vs]
        cls = {h: "num" if h in nums else "nowrap" if h == "95% interval" else "" for h in head}
        cls.update({"server": "server", "mode": "nowrap", f"vs {ref}": "vs"})
        rows.append(f'<tr id="targets-row-{i}">'
                    + "".join(f"<td{_attr('class', cls[h])}>{c}</td>" for h, c in zip(head, cells)) + "</tr>")
    header = "".join(f"<th{_attr('class', 'num' if h in nums else '')}>{_e(h)}</th>" for h in head)
    return (f'<h2 id="targets">Targets ({len(report.targets)})</h2>'
            f'<p class="why">Every probe ran on each target; each target is compared probe by probe with '
            f"the first, {_e(ref)}, as with a baseline.</p>"
            f'<div class="wide"><table class="grid" id="targets-table"><tr>{header}</tr>{"".join(rows)}'
            "</table></div>")


def _probe_index(report: RunReport, by_target: Dict[Optional[str], List[_Probe]]) -> str:
    """One row per probe id, one column per target: each outcome links to that probe."""
    names = [t.name for t in report.targets]
    ids = list(dict.fromkeys(p.record.id for n in names for p in by_target.get(n, [])))
    cell: Dict[Tuple[Optional[str], str], _Probe] = {}
    for n in names:
        for p in by_target.get(n, []):
            cell.setdefault((n, p.record.id), p)
    head = "".join(f"<th>{_e(n)}</th>" for n in names)
    body = []
    for pid in ids:
        cells = []
        for n in names:
            hit = cell.get((n, pid))
            if hit is None:
                cells.append('<td><span class="none">-</span></td>')
            else:
                tag = _badge(hit.kind[0]) if hit.kind else ""
                cells.append(f'<td><a href="#{hit.anchor}" title="{_plain(hit.label)}">'
                             f"{_badge(hit.record.outcome.value)}{tag}</a></td>")
        body.append(f"<tr><td>{_e(pid)}</td>{''.join(cells)}</tr>")
    return (f'<h3 id="probe-index-title">Probes side by side</h3><table class="grid" id="probe-index">'
            f'<tr><th>id</th>{head}</tr>{"".join(body)}</table>')


def _target_section(report: RunReport, i: int, by_target: Dict[Optional[str], List[_Probe]]) -> str:
    t, ref = report.targets[i], report.targets[0]
    probes = by_target.get(t.name, [])
    anchors: Dict[str, str] = {}
    for p in probes:
        anchors.setdefault(p.record.id, p.anchor)
    ref_anchors: Dict[str, str] = {}
    for p in by_target.get(ref.name, []):
        ref_anchors.setdefault(p.record.id, p.anchor)
    s = t.summary
    out = [f'<section class="target" id="target-{i}">',
           f"<h2>Target {_e(t.name)}{' (reference)' if i == 0 else ''}</h2>",
           f"<p>{_word(s.status)}{_badge(s.status.value)} <span class=\"why\">{_e(s.why)}</span></p>",
           _counts(s, False), f"<p>{_rate_html(s.rate)}</p>", _summary_warnings(s),
           _setup_warnings(t.setup.setup_warnings, f"-{i}"),
           _chart(probes, report.settings.get("max_tokens"), f"-{i}")]
    if t.baseline is not None:
        out.append(_comparison_section(t.baseline, anchors, title=f"Baseline comparison of {t.name}",
                                       ident=f"baseline-{i}"))
    if i and t.vs_reference is not None:
        vs = dataclasses.replace(t.vs_reference, baseline_created=None)  # the reference is this run
        out.append(_comparison_section(
            vs, anchors, title=f"{t.name} vs {ref.name} (the first target)", ident=f"vs-reference-{i}",
            before=str(ref.name), after=str(t.name), before_anchors=ref_anchors,
            note=(f"{ref.name} plays the baseline: newly diverged = differed only on {t.name}, healed = "
                  f"differed only on {ref.name}.")))
    out += [f'<h3 id="probes-{i}">Probes on {_e(t.name)} ({len(probes)})</h3>',
            _probe_groups(probes, f"-{i}"), _episodes_section(t, f"-{i}"),
            f"<details><summary>setup of {_e(t.name)}</summary>{_kv_table(_setup_rows(t), f'setup-{i}')}"
            "</details></section>"]
    return "".join(out)


def _render_matrix(report: RunReport, by_target: Dict[Optional[str], List[_Probe]]) -> List[str]:
    s = report.summary
    warned = [(i, t) for i, t in enumerate(report.targets) if t.setup.setup_warnings]
    parts = [_verdict_box(report, by_target), "<h2>Summary</h2>", _counts(s, True),
             '<p id="rate">divergence rate: per target (a rate over several servers would mean nothing), see '
             '<a href="#targets">Targets</a></p>', _summary_warnings(s)]
    if warned:
        parts.append('<p class="warning" id="setup-warnings">setup warnings on: ' + ", ".join(
            f'<a href="#setup-warnings-{i}">{_e(t.name)} ({len(t.setup.setup_warnings)})</a>'
            for i, t in warned) + "</p>")
    parts += [_targets_table(report), _probe_index(report, by_target)]
    parts += [_target_section(report, i, by_target) for i in range(len(report.targets))]
    targets = ", ".join(f"{t.name} ({display_url(t.url)})" if t.url else str(t.name) for t in report.targets)
    mode = f"per target (configured {report.settings.get('mode') or '?'})"
    rows = [("targets", _e(targets)), ("mode", _e(mode)),
            _probe_set(report), ("settings", _e(_settings_text(report.settings))), _written_by(report)]
    parts += ["<h2>Run</h2>", _kv_table(rows, "run")]
    return parts


# --------------------------------------------------------------------------- the page

def render_html(report: RunReport, scrub: Optional[Callable[[str], str]] = None) -> str:
    """The whole page for a run report; ``scrub`` (e.g. ``Redactor.scrub``) is applied to every string of
    the report before rendering."""
    if scrub is not None:
        report = _scrubbed(report, scrub)
    by_target: Dict[Optional[str], List[_Probe]] = {t.name: [] for t in report.targets}
    _wrap(report, report.probes, by_target)
    word = "PASS" if passed(report.summary.status) else "FAIL"
    title = f"pytest-cachecheck: {word} ({report.summary.status.value})"
    intro = ("Each probe is a two-turn conversation; its turn-2 answer is computed once reusing "
             "the server's prompt cache and once recomputed from scratch. A valid probe whose two answers "
             "differ is a divergence: the highlighted text starts at the first differing character.")
    if report.matrix:
        title += " (target matrix)"
        intro += (" This run is a target matrix: every probe ran on each target, and a probe is named "
                  "&lt;probe id&gt;@&lt;target&gt;.")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_plain(title)}</title><style>{_CSS}</style></head><body>",
        "<h1>pytest-cachecheck report</h1>",
    ]
    body = (_render_matrix(report, by_target) if report.matrix
            else _render_single(report, by_target[report.targets[0].name]))
    parts += body[:1] + [f'<p class="why" id="intro">{intro}</p>'] + body[1:]
    parts.append('<p class="footer">Self-contained page written by pytest-cachecheck: no scripts, '
                 "no external resources.</p></body></html>")
    return "\n".join(p for p in parts if p) + "\n"


def write_html(path: str, report: RunReport, scrub: Optional[Callable[[str], str]] = None) -> None:
    """Render and write the page (:func:`~pytest_cachecheck.files.write_text`: a regular file atomically)."""
    write_text(path, render_html(report, scrub), ".html.tmp")
