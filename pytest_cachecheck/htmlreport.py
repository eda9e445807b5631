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

The page has inline CSS (the package file ``data/report.css``, its badge colours written from
:data:`STYLES`) and inline SVG only: no script, no external resource (a Content-Security-Policy meta tag
forbids both, in case anything slipped through). It is built with :func:`h` (an element) and :func:`join`
(a fragment), which escape every value unless it is :class:`Markup` (this module's own HTML), so every text
from the report is escaped by construction, and its control and bidi characters shown as visible escapes
(``\\x1b``, ``\\u202e``); a ``scrub`` function, when given, is applied to every string of the report before
anything is rendered. A comparison's tables list at most ``MAX_ROWS`` rows each (the counts stay whole).
The only URLs shown are the report's, which carry no credentials (they pass
:func:`~pytest_cachecheck.redact.display_url` once more all the same).

This module knows nothing about pytest.
"""

from __future__ import annotations

import dataclasses
import html
import math
import re
from enum import Enum
from types import GeneratorType
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from . import attribution
from .files import write_text
from .kinds import BATCH, LOADED, ORDER, Kind
from .model import (CACHE_FAILS, CACHE_PASSES, CONVERSATION_CHANGED, HEALED, NEAR_TIE_NATS, NEW_PROBE,
                    NEWLY_DIVERGED, NEWLY_INCONCLUSIVE, NEWLY_VALID, NOT_RUN, STILL_DIFFERENT, STILL_INCONCLUSIVE,
                    STILL_SAME, BatchRecord, CheckResult, CheckResults, CheckTally, Comparison, EpisodeRecord,
                    EpisodeStep, LOADED_STEPS, LoadedRecord, OrderRecord, Outcome,
                    ProbeRecord, Rate, RunReport, ServerDescription, Status, Summary, TargetReport)
from .probes import read_resource
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
    # the outcome checks (``expect``): each path's result, and a flip
    "check passed": "ok", "check failed": "warn", "check error": "err", "flipped": "bad", CACHE_FAILS: "bad",
    CACHE_PASSES: "bad",
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


# --------------------------------------------------------------------------- the builder

class Markup(str):
    """HTML as it is: this module's own (built by :func:`h` and :func:`join`, or a literal of it). The
    builder passes it through and escapes every other value."""

    __slots__ = ()


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


def _flat(children: Iterable[Any], escape: Callable[[Any], str]) -> str:
    out = []
    for child in children:
        if isinstance(child, Markup):
            out.append(child)
        elif isinstance(child, (list, tuple, GeneratorType)):
            out.append(_flat(child, escape))
        else:
            out.append(escape(child))
    return "".join(out)


def join(children: Iterable[Any], sep: str = "") -> Markup:
    """The children as one fragment, ``sep`` between them: :class:`Markup` as it is, lists and generators
    flattened, every other value escaped (:func:`_e`; None is nothing)."""
    return Markup(_flat([sep], _e).join(_flat([child], _e) for child in children))


#: the elements without content, and how their tag ends
_EMPTY = {"br": ">", "meta": ">", "rect": "/>", "line": "/>", "circle": "/>", "path": "/>"}


def h(tag: str, attrs: Optional[Dict[str, Any]] = None, *children: Any) -> Markup:
    """An element: its attributes in order (one whose value is None or empty is left out), each value
    escaped (:func:`_plain`) unless it is :class:`Markup`, then its children as :func:`join` gives them (a
    ``<title>``'s as :func:`_plain`: no markup there)."""
    names = "".join(f' {k}="{v if isinstance(v, Markup) else _plain(v)}"' for k, v in (attrs or {}).items()
                    if v is not None and v != "")
    if tag in _EMPTY:
        return Markup(f"<{tag}{names}{_EMPTY[tag]}")
    return Markup(f"<{tag}{names}>{_flat(children, _plain if tag == 'title' else _e)}</{tag}>")


_RARR, _NDASH = Markup("&rarr;"), Markup("&ndash;")
_CSS = Markup("\n" + re.sub(r"/\* @BADGES@[^*]*\*/", lambda _: _badge_css(),
                            read_resource("report.css").decode("utf-8")))
# Markup: its quotes stay as they are
_CSP = Markup("default-src 'none'; style-src 'unsafe-inline'; img-src 'none'; form-action 'none'")


# --------------------------------------------------------------------------- small pieces

def _badge(word: Any) -> Markup:
    """A status word as a coloured badge; a word the page has no colour for is shown grey (and its text,
    which may come from a file, never becomes part of a class name)."""
    text = str(word) if word is not None else "?"
    cls = f"b-{_slug(text)}" if text in STYLES else "b-unknown"
    return h("span", {"class": f"badge {cls}"}, text)


def passed(status: Status) -> bool:
    """Whether a verdict with this status passes."""
    return status in PASSING


def _word(status: Status) -> Markup:
    ok = passed(status)
    return h("span", {"class": f"word {'pass' if ok else 'fail'}"}, "PASS" if ok else "FAIL")


def _pct(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _kv_table(rows: Sequence[Tuple[str, Any]], ident: str = "") -> Markup:
    return h("table", {"id": ident}, (h("tr", {}, h("th", {}, k), h("td", {}, v)) for k, v in rows))


def _list(items: Sequence[str], cls: str = "") -> Markup:
    return h("ul", {"class": cls}, (h("li", {}, i) for i in items))


def _figures(pairs: Iterable[Tuple[str, Any]], sep: str = " | ") -> Markup:
    """``name <b>number</b>`` for each pair, ``sep`` between."""
    return join((join([f"{k} ", h("b", {}, v)]) for k, v in pairs), sep)


def _server_text(server: Optional[ServerDescription]) -> str:
    if server is None:
        return "?"
    text = " ".join(p for p in (server.kind, server.build or "") if p)
    return text + (f" | model {server.model}" if server.model else "")


def _url_html(url: Optional[str]) -> Optional[Markup]:
    """A URL as it may be shown (no credentials, query values masked), or None when there is none."""
    return h("code", {}, display_url(url)) if url else None


def _rate_html(rate: Optional[Rate], what: str = "divergence rate", unit: str = "probe") -> Markup:
    """A rate with its 95% interval, or n/a when nothing was valid."""
    if rate is None:
        return join([f"{what}: n/a (no valid {unit})"])
    lo, hi = rate.ci95
    return join([f"{what} ", h("b", {}, f"{rate.value:.1%}"), f" ({rate.different} of {rate.valid} valid "
                 f"{unit}s), 95% Wilson interval {lo:.1%} to {hi:.1%}"])


def _answer_html(text: Optional[str], at: Optional[int]) -> Markup:
    """The answer in a <pre>: the common prefix plain, everything from ``at`` inside <mark>."""
    if text is None:
        return h("pre", {}, h("span", {"class": "none"}, "(no answer)"))
    if at is None or at < 0:
        return h("pre", {}, text)
    at = min(at, len(text))
    rest = text[at:]
    marked = h("mark", {}, rest) if rest else h("mark", {"class": "end"}, "(end of answer)")
    return h("pre", {}, text[:at], marked)


def _setup_warnings(warnings: Sequence[str], suffix: str) -> Markup:
    """A prominent box listing the setup warnings, or nothing when there are none."""
    if not warnings:
        return Markup()
    plural = "s" if len(warnings) > 1 else ""
    return h("div", {"class": "setup-warnings", "id": f"setup-warnings{suffix}"},
             h("b", {"class": "warning"}, f"setup warning{plural} ({len(warnings)})"), _list(warnings))


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


def _chart(probes: Sequence[_Probe], max_tokens: Any, suffix: str) -> Markup:
    """An inline SVG: x = token index of the first difference, y = the two paths' top-1 minus top-2 logprob
    margins added up (the logit shift that swaps their tokens; log scale), the near-tie threshold drawn as a
    line; divergences without margins on a strip below; each mark links to its probe. Empty when no
    divergence has a token index."""
    differed = [p for p in probes if p.record.outcome == Outcome.DIFFERENT]
    placed = [p for p in differed if _token(p) is not None]
    unplaced = [p for p in differed if _token(p) is None]
    if not placed:
        return Markup()
    needs_strip = any(None in _margins(p) for p in placed)
    w, left, right, top, bottom = 760, 64, 16, 14, 176
    strip = bottom + 24  # the row of divergences without margins, when there are any
    height = (strip if needs_strip else bottom) + 40
    x_max = max([_token(p) or 0 for p in placed] + [1])
    if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens >= x_max:
        x_max = max_tokens
    margins = [sum(ms) for p in placed for ms in [_margins(p)] if None not in ms]  # type: ignore[arg-type]
    lo_exp, hi_exp = -3, 1
    if margins and max(margins) > 0:
        hi_exp = max(1, min(3, math.ceil(math.log10(max(margins)))))

    def x(token: int) -> str:
        return f"{left + (w - left - right) * min(max(token, 0), x_max) / x_max:.1f}"

    def y(margin: float) -> float:
        m = math.log10(max(margin, 10.0 ** lo_exp))
        return top + (bottom - top) * (hi_exp - min(m, hi_exp)) / (hi_exp - lo_exp)

    def line(cls: str, x1: Any, y1: Any, x2: Any, y2: Any) -> Markup:
        return h("line", {"class": cls, "x1": x1, "y1": y1, "x2": x2, "y2": y2})

    def text(xx: Any, yy: Any, anchor: str, child: Any, cls: Optional[str] = None,
             transform: Optional[str] = None) -> Markup:
        return h("text", {"class": cls, "x": xx, "y": yy, "text-anchor": anchor, "transform": transform},
                 child)

    yt, mid = f"{y(NEAR_TIE_NATS):.1f}", f"{(top + bottom) / 2:.0f}"
    out = [h("rect", {"class": "tie-zone", "x": left, "y": yt, "width": w - left - right,
                      "height": f"{bottom - y(NEAR_TIE_NATS):.1f}"})]
    for e in range(lo_exp, hi_exp + 1):
        yy = y(10.0 ** e)
        label = f"{10.0 ** e:g}" if e != lo_exp else f"\u2264{10.0 ** e:g}"
        out += [line("grid", left, f"{yy:.1f}", w - right, f"{yy:.1f}"),
                text(left - 6, f"{yy + 4:.1f}", "end", label)]
    for t in sorted({round(x_max * i / 4) for i in range(5)}):
        out += [line("axis", x(t), bottom, x(t), bottom + 4), text(x(t), height - 22, "middle", t)]
    out += [line("axis", left, top, left, bottom), line("axis", left, bottom, w - right, bottom),
            line("tie", left, yt, w - right, yt),
            text(w - right - 4, f"{y(NEAR_TIE_NATS) - 5:.1f}", "end",
                 f"near-tie threshold {NEAR_TIE_NATS:g} nats", "tie-label"),
            text(14, mid, "middle", "margins added (nats)", transform=f"rotate(-90 14 {mid})")]
    if needs_strip:
        out += [text(left - 6, strip + 4, "end", "no margin"), line("grid", left, strip, w - right, strip)]
    out.append(text(f"{(left + w - right) / 2:.0f}", height - 4, "middle",
                    f"token index of the first difference (0 to {x_max})"))
    for p in placed:
        token = _token(p) or 0
        cls = f"pt-{_KIND_CLASS[p.kind[0]] if p.kind else 'new'}"
        cm, rm = _margins(p)
        title = f"{p.label}: token {token}"
        d = p.record.divergence
        if cm is not None and rm is not None and d is not None:
            title += f", margin {cm:.4g} (cache) and {rm:.4g} (recompute) nats: {d.kind}"
            mark = h("circle", {"class": cls, "cx": x(token), "cy": f"{y(cm + rm):.1f}", "r": "4.5"})
        else:
            title += ", no logprob margins"
            mark = h("path", {"class": cls, "d": f"M{x(token)} {strip - 6} l5 6 l-5 6 l-5 -6 z"})
        out.append(h("a", {"href": f"#{p.anchor}"}, h("title", {}, title), mark))
    svg = h("svg", {"class": "chart", "id": f"chart{suffix}", "xmlns": "http://www.w3.org/2000/svg",
                    "viewBox": f"0 0 {w} {height}", "width": w, "height": height, "role": "img",
                    "aria-label": "token index and logprob margin of each divergence"}, out)
    kinds = sorted({p.kind[0] for p in placed if p.kind}, key=list(_KIND_CLASS).index)
    legend = [join((join([h("span", {"class": f"key {_KIND_CLASS[k]}"}), f" {k}"]) for k in kinds), ", "),
              # Markup: the page has always carried its apostrophe unescaped
              Markup(". Each mark is one divergence: how far the paths' two best tokens would have to "
                     "move to swap (the top-1 minus top-2 margins of both paths added). On or under the "
                     f"dashed line ({NEAR_TIE_NATS:g} nats) they were nearly tied: rounding alone can swap "
                     "them. Far above it the paths computed different numbers. Each mark links to its "
                     "probe.")]
    if unplaced:
        legend += [" Not placed (no token index): ",
                   join((h("a", {"href": f"#{p.anchor}"}, p.label) for p in unplaced), ", "), "."]
    return h("figure", {"class": "chart"}, h("h3", {}, "Where the answers parted"), svg,
             h("figcaption", {}, legend))


# --------------------------------------------------------------------------- comparisons

#: the most rows a comparison's table lists (a run of 100,000 probes would make a page of megabytes); the
#: counts stay whole, the JSON report has every row
MAX_ROWS = 500


def _comparison_section(c: Comparison, anchors: Dict[str, str], *, title: str, ident: str,
                        before: str = "baseline", after: str = "now", note: Optional[str] = None,
                        before_anchors: Optional[Dict[str, str]] = None, unit: str = "probe") -> Markup:
    """A comparison: verdict, McNemar p, rates, notes, counts and the rows ("still same" folded).

    ``anchors`` (probe id -> anchor) links each row's id to the probe, ``before_anchors`` its
    before-outcome to the other run's probe (a matrix's reference target). ``ident`` is the section's
    element id (the rows table gets ``<ident>-rows``)."""
    out = [h("h3", {}, title),
           h("p", {}, _badge(c.verdict), " ", h("span", {"class": "why"}, c.why),
             f" | exact McNemar p = {format_p(c.mcnemar_p)}")]
    if note:
        out.append(h("p", {"class": "why"}, note))
    if c.baseline_created:
        out.append(h("p", {"class": "why"}, f"baseline written {c.baseline_created}"))
    base = c.baseline_rate.text() if c.baseline_rate else "n/a (no valid probe)"
    cur = c.current_rate.text() if c.current_rate else "n/a (no valid probe)"
    out.append(h("p", {}, f"divergence rate: {before} {base} ", _RARR, f" {after} {cur}"))
    out += [h("p", {"class": "warning"}, w) for w in c.env_warnings]
    counts = _figures((k, v) for k, v in c.counts.items() if v)
    if counts:
        out.append(h("p", {}, counts))

    def rows_table(rows: Sequence[Any], table_id: str) -> Markup:
        labels = ("before", "after") if (before, after) == ("baseline", "now") else (before, after)
        body = []
        for r in rows[:MAX_ROWS]:  # the rows come most important first
            link = h("a", {"href": f"#{anchors[r.id]}"}, r.id) if r.id in anchors else r.id
            was = r.before or "-"
            if before_anchors is not None and r.id in before_anchors and r.before:
                was = h("a", {"href": f"#{before_anchors[r.id]}"}, was)
            body.append(h("tr", {}, h("td", {}, link), h("td", {}, was), h("td", {}, r.after or "-"),
                          h("td", {}, _badge(r.status))))
        more = len(rows) - len(body)
        tail = (h("p", {"class": "why", "id": f"{table_id}-more"},
                  f"and {counted(more, 'more row')}: see the JSON report") if more else "")
        head = h("tr", {}, h("th", {}, "id"), [h("th", {}, label) for label in labels], h("th", {}, "status"))
        return join([h("table", {"class": "grid", "id": table_id}, head, body), tail])

    shown = [r for r in c.rows if r.status != STILL_SAME]
    same = [r for r in c.rows if r.status == STILL_SAME]
    if shown:
        out.append(rows_table(shown, f"{ident}-rows"))
    if same:
        out.append(h("details", {}, h("summary", {}, f"{counted(len(same), unit)} still same"),
                     rows_table(same, f"{ident}-same-rows")))
    if not c.rows:
        out.append(h("p", {"class": "none"}, "no probes in either run"))
    return h("div", {"class": "comparison", "id": ident}, out)


# --------------------------------------------------------------------------- one probe

def _probe_article(p: _Probe) -> Markup:
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
    head = [h("h4", {}, p.label), _badge(r.outcome.value), _badge(p.kind[0]) if p.kind else None,
            _badge("flipped") if r.flip else None,
            h("span", {"class": "why"}, r.source) if r.source else None,
            h("span", {"class": "why"}, f"{r.duration_s:.2f} s")]
    out = [h("div", {"class": "probe-head"}, head)]
    if p.kind:
        out.append(h("p", {"class": "note why"}, p.kind[1]))
    out.append(_checks_html(r.check_results))
    if r.outcome == Outcome.DIFFERENT:
        out.append(h("p", {"class": "divergence"}, _divergence_text(r, at)))
    elif r.reason:
        out.append(h("pre", {"class": "reason"}, r.reason))
    if r.outcome == Outcome.SAME and cache == recompute:
        out.append(h("div", {"class": "single"}, h("h5", {}, "turn 2, both paths"),
                     _answer_html(cache, None)))
    else:
        out.append(h("div", {"class": "pair"},
                     h("div", {}, h("h5", {}, "turn 2, cache path"), _answer_html(cache, at)),
                     h("div", {}, h("h5", {}, "turn 2, recompute path"), _answer_html(recompute, at))))
    if turn1 is not None:
        out.append(h("details", {}, h("summary", {}, "turn-1 answer"), _answer_html(turn1, None)))
    kind_cls = f" k-{_KIND_CLASS[p.kind[0]]}" if p.kind else ""
    return h("article", {"class": f"probe o-{r.outcome.value}{kind_cls}", "id": p.anchor}, out)


def _check_cell(r: Optional[CheckResult]) -> Markup:
    if r is None:
        return h("td", {}, h("span", {"class": "none"}, "not evaluated (the item is not valid)"))
    word = "check error" if r.passed is None else "check passed" if r.passed else "check failed"
    return h("td", {}, _badge(word), " " if r.reason else None, h("span", {"class": "why"}, r.reason or None))


def _checks_html(c: Optional[CheckResults]) -> Markup:
    """An item's outcome checks: the flip first (when the cache flipped the outcome), then each path's result."""
    if c is None:
        return Markup()
    flip = c.flip_text()
    rows = [h("tr", {}, h("th", {}, "checks"), h("td", {}, "; ".join(c.checks))),
            h("tr", {}, h("th", {}, "cache path"), _check_cell(c.cache)),
            h("tr", {}, h("th", {}, "recompute path"), _check_cell(c.recompute))]
    return h("div", {"class": "outcome-checks"},
             h("p", {"class": "flip"}, _badge("flipped"), " ", _badge(c.flip), " ", flip) if flip else None,
             h("table", {"class": "grid checks"}, rows))


def _check_summary_html(t: Optional[CheckTally], unit: str, ident: str) -> Markup:
    """The outcome checks' accuracy on each path and the flips (the terminal's lines), when any item had any."""
    from .terminal import check_lines

    lines = check_lines(t, unit)
    return h("p", {"id": ident}, join(lines, Markup("<br>"))) if lines else Markup()


def _own_section(report: RunReport) -> Markup:
    """The tests' own measurements (``cachecheck.check()``, ``.episode()``): the summary's lines, when any."""
    from .terminal import own_lines

    lines = [o.text for o in own_lines(report) if hasattr(o, "text")]
    if not lines:
        return Markup()
    return join([h("h2", {"id": "own"}, "Tests' own measurements"), h("p", {}, join(lines, Markup("<br>")))])


def _divergence_text(r: ProbeRecord, at: Optional[int]) -> Markup:
    d = r.divergence
    where = f"first difference at character {d.char if d is not None else at}"
    if d is None:
        return join([where])
    if d.token is not None:
        where += f" (token {d.token})"
    text: List[Any] = [where]
    if d.cache_token is not None and d.recompute_token is not None:
        text += [": cache ", h("code", {}, repr(d.cache_token)), " vs recompute ",
                 h("code", {}, repr(d.recompute_token))]
    cm, rm = _finite(d.cache_margin), _finite(d.recompute_margin)
    if cm is not None and rm is not None:
        text.append(f"; top-1 minus top-2 logprob margin {cm:.4f} (cache) and {rm:.4f} (recompute) nats")
        if d.kind:
            text += [": ", h("b", {}, d.kind)]
    return join(text)


def _group(title: str, why: str, body: Sequence[Markup], folded: bool, ident: str = "") -> Markup:
    """A group of probes or episodes: folded (the same ones) or under its heading."""
    count = f"{title} ({len(body)})"
    if folded:
        return h("details", {"class": "group", "id": ident},
                 h("summary", {}, f"{count}: ", h("span", {"class": "why"}, f"{why}; click to show")), body)
    return join([h("h3", {"id": ident}, f"{count} ", h("span", {"class": "why"}, _NDASH, f" {why}")), body])


def _probe_groups(probes: Sequence[_Probe], suffix: str) -> Markup:
    """The probes that matter, in order of importance, then the same ones folded."""
    if not probes:
        return h("p", {"class": "none"}, "no probe ran")
    out = []
    for key, title, why in _GROUPS:
        members = [_probe_article(p) for p in probes if p.group == key]
        if members:
            out.append(_group(title, why, members, key == "same", f"group-{key}{suffix}"))
    return join(out)


# --------------------------------------------------------------------------- episodes

_EPISODE_GROUPS = (("different", "Changed trajectories", "the cache path and the recompute path took different "
                    "trajectories"),
                   ("inconclusive", "Inconclusive", "not valid: see the reason"),
                   ("error", "Errors", "a request or server error"),
                   ("same", "Same trajectory", "both paths took the same trajectory"))


def _step_cell(step: Optional[EpisodeStep], other: Optional[EpisodeStep], parted: bool) -> Markup:
    if step is None:
        return h("td", {}, h("span", {"class": "none"}, "(ended)"))
    at = first_difference(step.content, other.content) if parted and other is not None else None
    calls = [h("div", {"class": "call"}, _RARR, " ", h("code", {}, f"{c.name}({c.arguments})"))
             for c in step.tool_calls]
    text = _answer_html(step.content, at) if step.content or not calls else None
    return h("td", {}, text, calls, h("div", {"class": "why"}, f"prompt {step.prompt_tokens}, answer "
                                      f"{step.completion_tokens}, cached {step.cached_tokens}"))


def _episode_article(e: EpisodeRecord, anchor: str) -> Markup:
    out = [h("div", {"class": "probe-head"}, h("h4", {}, e.key), _badge(e.outcome.value),
             _badge("flipped") if e.flip else None,
             h("span", {"class": "why"}, e.source), h("span", {"class": "why"}, f"{e.duration_s:.2f} s"))]
    if e.reason:
        out.append(h("pre", {"class": "reason"}, e.reason))
    out.append(_checks_html(e.check_results))
    cache, recompute = e.path("cache-1"), e.path("recompute-1")
    if cache is not None and recompute is not None:
        parted = e.parting.step if e.parting is not None else None
        rows = [h("tr", {}, h("th", {}), h("th", {}, "cache path"), h("th", {}, "recompute path"))]
        for i in range(max(len(cache.steps), len(recompute.steps))):
            a = cache.steps[i] if i < len(cache.steps) else None
            b = recompute.steps[i] if i < len(recompute.steps) else None
            mark = i + 1 == parted
            rows.append(h("tr", {"class": "parted" if mark else None},
                          h("th", {}, f"step {i + 1}{' (parted)' if mark else ''}"),
                          _step_cell(a, b, mark), _step_cell(b, a, mark)))
        out += [h("table", {"class": "grid trajectory"}, rows),
                h("p", {"class": "why"}, f"cache path: {cache.ended or 'cut short'}; recompute path: "
                                         f"{recompute.ended or 'cut short'}")]
    return h("article", {"class": f"probe o-{e.outcome.value}", "id": anchor}, out)


def _episodes_section(t: TargetReport, suffix: str) -> Markup:
    """A target's episodes: counts, the rate, where trajectories parted, the baseline comparison and each
    episode's two trajectories side by side, step by step, the parting step marked."""
    if t.episodes is None or t.episode_summary is None:
        return Markup()
    s = t.episode_summary
    out = [h("h2", {"id": f"episodes{suffix}"}, f"Episodes ({len(t.episodes)})"),
           h("p", {"class": "why"}, "Each episode is a multi-step conversation, tool calls included; each "
             "path feeds its own answers forward, the cache path reusing the cache step by step, the "
             "recompute path computing every step from scratch."),
           h("p", {}, _figures((("episodes", s.tally.probes), ("valid", s.tally.valid),
                                ("same", s.tally.same), ("changed", s.tally.different),
                                ("inconclusive", s.tally.inconclusive), ("errors", s.tally.errors)))),
           h("p", {}, _rate_html(s.tally.rate, "trajectory change rate", "episode"))]
    if s.parting_steps:
        out.append(h("p", {}, "first parting step: ",
                     _figures(((f"step {k}:", v) for k, v in s.parting_steps.items()), ", ")))
    out.append(_check_summary_html(t.check_tallies()[1], "episode", f"episode-checks{suffix}"))
    anchors = {e.id: f"episode-{i}{suffix}" for i, e in enumerate(t.episodes)}
    if t.episode_baseline is not None:
        out.append(_comparison_section(t.episode_baseline, anchors, title="Baseline comparison of the episodes",
                                       ident=f"episode-baseline{suffix}", unit="episode"))
    for outcome, title, why in _EPISODE_GROUPS:
        members = [_episode_article(e, anchors[e.id]) for e in t.episodes if e.outcome.value == outcome]
        if members:
            out.append(_group(title, why, members, outcome == "same"))
    return join(out)


# --------------------------------------------------------------------------- kinds measured under conditions

def _conditioned_head(r: Any, label: str) -> List[Markup]:
    """The head of a batch, loaded or order probe's article: key, outcome, source, seconds, the conditions it
    ran under and its reason."""
    out = [h("div", {"class": "probe-head"}, h("h4", {}, r.key), _badge(r.outcome.value),
             h("span", {"class": "why"}, r.source), h("span", {"class": "why"}, f"{r.duration_s:.2f} s")),
           h("p", {"class": "why"}, label)]
    if r.reason:
        out.append(h("pre", {"class": "reason"}, r.reason))
    return out


def _conditioned_section(kind: Kind, records: Optional[Sequence[Any]], s: Any, suffix: str, title: str,
                         why: str, groups: Sequence[Tuple[str, str, str]], article: Callable[[Any, str], Markup],
                         said: str = "") -> Markup:
    """A target's items of a kind measured under conditions (batch, loaded, order): the conditions, counts,
    what the summary says (``said``), the rate, and each item's article under its outcome's group."""
    if records is None or s is None:
        return Markup()
    plural = "batches" if kind == BATCH else "orders" if kind == ORDER else kind.name  # the section's id
    out = [h("h2", {"id": f"{plural}{suffix}"}, f"{title} ({len(records)})"), h("p", {"class": "why"}, why),
           h("p", {"id": f"{kind.name}-conditions{suffix}"}, h("b", {}, s.label())),
           h("p", {}, _figures(((kind.plural, s.tally.probes), ("valid", s.tally.valid), ("same", s.tally.same),
                                ("different", s.tally.different), ("inconclusive", s.tally.inconclusive),
                                ("errors", s.tally.errors))))]
    if said:
        out.append(h("p", {"id": f"{kind.name}-attribution{suffix}"}, said))
    out.append(h("p", {}, _rate_html(s.tally.rate, kind.rate_name, kind.unit)))
    anchors = {r.id: f"{kind.name}-{i}{suffix}" for i, r in enumerate(records)}
    for outcome, heading, reason in groups:
        members = [article(r, anchors[r.id]) for r in records if r.outcome.value == outcome]
        if members:
            out.append(_group(heading, reason, members, outcome == "same"))
    return join(out)


# --------------------------------------------------------------------------- batch probes

_BATCH_GROUPS = (("different", "Answered differently amid other requests", "the turn-2 answer under load "
                  "differed from the answer alone"),
                 ("inconclusive", "Inconclusive", "not valid: see the reason"),
                 ("error", "Errors", "a request or server error, background requests included"),
                 ("same", "Same answer", "the answer alone and amid other requests were the same"))


def _batch_article(b: BatchRecord, anchor: str) -> Markup:
    out = _conditioned_head(b, b.shape.label())
    answers = {r.step: r.content for r in b.requests}
    run = b.parted_run or 1
    alone, load = answers.get(f"alone-{run}/turn-2"), answers.get(f"load-{run}/turn-2")
    if alone is not None or load is not None:
        at = b.divergence.char if b.divergence is not None else None
        out.append(h("table", {"class": "grid"},
                     h("tr", {}, h("th", {}, f"alone (run {run})"),
                       h("th", {}, f"amid other requests (run {run})")),
                     h("tr", {}, h("td", {}, _answer_html(alone, at)), h("td", {}, _answer_html(load, at)))))
    if b.loads:
        out.append(h("p", {"class": "why"}, "; ".join(
            f"load run {x.run}: {x.in_flight_at_send} of {x.background} background requests in flight when "
            f"sent, {x.in_flight_at_answer} when answered ({x.measured_s:.2f} s)" for x in b.loads)))
    return h("article", {"class": f"probe o-{b.outcome.value}", "id": anchor}, out)


def _batches_section(t: TargetReport, suffix: str) -> Markup:
    """A target's batch probes, under their conditions: counts, the rate, and each probe's answer alone and
    amid other requests side by side."""
    return _conditioned_section(
        BATCH, t.batches, t.batch_summary, suffix, "Batch probes",
        "Each probe's turn 2, the cache off, sent alone and amid background requests in flight (twice each): does "
        "the answer change when the server has other work?", _BATCH_GROUPS, _batch_article)


# --------------------------------------------------------------------------- the cache under load

_LOADED_GROUPS = (("different", "Diverged under load", "the cache path and the recompute path gave different "
                   "turn-2 answers, every turn 2 amid other requests"),
                  ("inconclusive", "Inconclusive", "not valid: see the reason"),
                  ("error", "Errors", "a request or server error, background requests included"),
                  ("same", "Same answer", "both paths gave the same turn-2 answer under load"))


def _loaded_article(x: LoadedRecord, anchor: str) -> Markup:
    out = _conditioned_head(x, x.shape.load_label())
    if x.outcome.value == "different":
        out.append(h("p", {"class": "why"}, f"the load alone (batch kind, cache off): {x.load_alone}"))
    cache, recompute = x.content("cache-2/turn-2"), x.content("recompute-2/turn-2")
    if cache is not None or recompute is not None:
        at = x.divergence.char if x.divergence is not None else None
        out.append(h("table", {"class": "grid"},
                     h("tr", {}, h("th", {}, "cache path under load (run 2)"),
                       h("th", {}, "recompute path under load (run 2)")),
                     h("tr", {}, h("td", {}, _answer_html(cache, at)), h("td", {}, _answer_html(recompute, at)))))
    if x.loads:
        out.append(h("p", {"class": "why"}, "; ".join(
            f"{step}: {r.in_flight_at_send} of {r.background} background requests in flight when sent, "
            f"{r.in_flight_at_answer} when answered ({r.measured_s:.2f} s)"
            for step, r in zip(LOADED_STEPS, x.loads))))
    return h("article", {"class": f"probe o-{x.outcome.value}", "id": anchor}, out)


def _loaded_section(t: TargetReport, suffix: str) -> Markup:
    """A target's cache probes under load, under their conditions: counts, how many the load alone explains,
    the rate, and each probe's cache and recompute answers under load side by side."""
    s = t.loaded_summary
    return _conditioned_section(
        LOADED, t.loaded, s, suffix, "Cache under load",
        "Each probe's cache path and recompute path (twice each), every turn 2 sent amid background requests in "
        "flight: does the cache change the answer when the server has other work?", _LOADED_GROUPS,
        _loaded_article, said=s.attribution() if s is not None else "")


# --------------------------------------------------------------------------- order probes

_ORDER_GROUPS = (("different", "Answered differently in another order and state", "pass B (reversed, other "
                  "conversations between) gave another answer than pass A"),
                 ("inconclusive", "Inconclusive", "not valid: see the reason"),
                 ("error", "Errors", "a request or server error, the other conversations' included"),
                 ("same", "Same answer", "both passes gave the same turn-1 and turn-2 answers"))


def _order_article(o: OrderRecord, anchor: str) -> Markup:
    out = _conditioned_head(o, o.conditions.label())
    answers = {r.step: r.content for r in o.requests}
    turn = o.parted_turn or 2
    a, b = answers.get(f"A/turn-{turn}"), answers.get(f"B/turn-{turn}")
    if a is not None or b is not None:
        at = o.divergence.char if o.divergence is not None else None
        places = o.positions + [0] * (2 - len(o.positions))
        out.append(h("table", {"class": "grid"},
                     h("tr", {}, h("th", {}, f"pass A, turn {turn} (position {places[0]})"),
                       h("th", {}, f"pass B, turn {turn} (position {places[1]})")),
                     h("tr", {}, h("td", {}, _answer_html(a, at)), h("td", {}, _answer_html(b, at)))))
    if o.requests:
        out.append(h("p", {"class": "why"}, "cached tokens: " + "; ".join(
            f"{r.step} {r.cached_tokens} of {r.prompt_tokens}" for r in o.requests)))
    return h("article", {"class": f"probe o-{o.outcome.value}", "id": anchor}, out)


def _orders_section(t: TargetReport, suffix: str) -> Markup:
    """A target's order probes, under their conditions: counts, the rate, and each probe's answers of the two
    passes side by side, with the state each request reused."""
    return _conditioned_section(
        ORDER, t.orders, t.order_summary, suffix, "Order probes",
        "The probe set sent as an application would (the server's own cache defaults), twice: in file order, "
        "then reversed with other conversations between. Does an answer change with the order and the state "
        "earlier conversations left?", _ORDER_GROUPS, _order_article)


# --------------------------------------------------------------------------- the attribution

def _attribution_section(t: TargetReport, suffix: str) -> Markup:
    """Each cause the target measured, side by side (attribution.py), and the probes that differed under any
    of them with their outcome under each; nothing when it measured fewer than two causes."""
    found = attribution.causes(t)
    if len(found) < 2:
        return Markup()
    rows = [h("tr", {}, [h("th", {}, x) for x in ("cause", "conditions", "valid", "differed", "rate",
                                                    "inconclusive", "errors")])]
    for c in found:
        rows.append(h("tr", {}, h("td", {}, c.name), h("td", {}, c.conditions), h("td", {}, c.tally.valid),
                      h("td", {}, c.tally.different), h("td", {}, _rate_html(c.tally.rate, "", c.kind.unit)),
                      h("td", {}, c.tally.inconclusive), h("td", {}, c.tally.errors)))
    out = [h("h2", {"id": f"attribution{suffix}"}, "Attribution"),
           h("p", {"class": "why"}, "Each cause measured apart, on the same probes: a probe that differs under "
             "one cause and not another points at that cause."),
           h("table", {"class": "grid"}, rows)]
    parted = attribution.told_apart(found)
    if parted:
        grid = [h("tr", {}, h("th", {}, "probe"), [h("th", {}, c.name) for c in found])]
        for i, each in parted:
            by = {c.name: o for c, o in each}
            grid.append(h("tr", {}, h("td", {}, i), [h("td", {}, _badge(by[c.name].value) if c.name in by
                                                     else "not measured") for c in found]))
        out += [h("h3", {}, f"Probes that differed under any cause ({len(parted)})"), h("table", {"class": "grid"}, grid)]
    else:
        out.append(h("p", {}, "No probe differed under any cause."))
    return join(out)


# --------------------------------------------------------------------------- the page's parts

def _verdict_box(report: RunReport, probes: Dict[Optional[str], List[_Probe]]) -> Markup:
    s = report.summary
    ok = passed(s.status)
    out = [_word(s.status), _badge(s.status.value), " ", h("span", {"class": "why-text"}, s.why)]
    if ok and s.exit_status:
        out.append(h("p", {"class": "why"}, f"pytest itself exited with status {s.exit_status} (other tests "
                                            "failed or errored)"))
    if report.matrix:
        out.append(h("ul", {}, (h("li", {"id": f"verdict-{i}"}, _word(t.summary.status),
                                  h("a", {"href": f"#target-{i}"}, t.name), " ",
                                  _badge(t.summary.status.value), " ",
                                  h("span", {"class": "why"}, t.summary.why), _matter(probes[t.name]))
                                for i, t in enumerate(report.targets))))
    else:
        out.append(_matter(probes[None], block=True))
    return h("div", {"class": f"verdict {'pass' if ok else 'fail'}", "id": "verdict"}, out)


def _matter(probes: Sequence[_Probe], block: bool = False) -> Markup:
    """Links to the probes that matter: new divergences, errors, expected divergences, inconclusive."""
    parts = []
    flipped = [p for p in probes if p.record.flip]
    if flipped:
        parts.append(join([f"flipped outcomes ({len(flipped)}): ",
                           join((h("a", {"href": f"#{p.anchor}"}, p.label) for p in flipped[:12]), ", ")]))
    titles = {key: title for key, title, _ in _GROUPS}
    for key in ("new", "errors", "expected", "inconclusive"):
        members = [p for p in probes if p.group == key]
        if members:
            links = join((h("a", {"href": f"#{p.anchor}"}, p.label) for p in members[:12]), ", ")
            more = f" and {len(members) - 12} more" if len(members) > 12 else ""
            parts.append(join([f"{titles[key].lower()} ({len(members)}): ", links, more]))
    if not parts:
        return Markup()
    text = join(parts, "; ")
    return h("p", {}, text) if block else join([h("br"), h("span", {"class": "why"}, text)])


def _counts(summary: Summary, with_ids: bool) -> Markup:
    t = summary.tally
    values = (("probes", t.probes), ("valid", t.valid), ("same", t.same), ("different", t.different),
              ("inconclusive", t.inconclusive), ("errors", t.errors))
    if with_ids:
        return h("div", {"class": "counts"}, (h("div", {"class": "count", "id": f"count-{k}"},
                                                h("b", {"class": "num"}, v), k) for k, v in values))
    return h("p", {}, _figures(values))


def _summary_warnings(s: Summary) -> Markup:
    return join([h("p", {"class": "warning"}, "not run: " + ", ".join(s.not_run)) if s.not_run else None,
                 h("p", {"class": "warning"}, s.recompute_reuse_cause) if s.recompute_reuse_cause else None])


def _settings_text(settings: Dict[str, Any]) -> str:
    shown = ("n", "max_tokens", "hit_tolerance", "skip_hit_check", "min_valid", "max_rate", "fail_on",
             "logprobs", "timeout")
    return " | ".join(f"{k} {settings[k]}" for k in shown
                      if settings.get(k) is not None and (k != "fail_on" or settings.get("baseline")))


def _written_by(report: RunReport) -> Tuple[str, str]:
    return ("written by", f"pytest-cachecheck {report.tool_version}".strip()
            + (f", {report.created}" if report.created else ""))


def _probe_set(report: RunReport) -> Tuple[str, Markup]:
    ps = report.probe_set
    return ("probe set", join([f"{ps.name} ({ps.count} probes) ", h("code", {}, ps.fingerprint)]))


def _setup_rows(t: TargetReport) -> List[Tuple[str, Any]]:
    s = t.setup
    rows: List[Tuple[str, Any]] = []
    url = _url_html(t.url) if t.name is not None else None  # one server: the settings name it
    if url:
        rows.append(("url", url))
    rows += [("mode", s.mode or "?"), ("server", _server_text(s.server))]
    if s.nocache_server is not None:
        rows.append(("recompute server", _server_text(s.nocache_server)))
    if s.hit_tolerance is not None:
        rows.append(("hit_tolerance", f"raised to {s.hit_tolerance} for the server's cache blocks"))
    if s.setup_checks:
        rows.append(("setup checks", _list(s.setup_checks, "checks")))
    return rows


def _wrap(report: RunReport, probes: List[ProbeRecord], by_target: Dict[Optional[str], List[_Probe]]) -> None:
    """Fill ``by_target`` with every probe of the report, its anchor, label and divergence tag."""
    for i, r in enumerate(probes):
        target = next((t for t in report.targets if t.name == r.target), report.targets[0])
        kind = divergence_kind(r, target) if r.outcome == Outcome.DIFFERENT else None
        by_target.setdefault(target.name, []).append(_Probe(r, f"probe-{i}", r.key, kind))


def _render_single(report: RunReport, probes: List[_Probe]) -> List[Markup]:
    t = report.targets[0]
    s = report.summary
    anchors: Dict[str, str] = {}
    for p in probes:
        anchors.setdefault(p.record.id, p.anchor)
    only_episodes = not probes and bool(t.episodes or t.batches or t.loaded or t.orders)
    parts = [_verdict_box(report, {None: probes})]
    if not only_episodes:
        parts += [h("h2", {}, "Summary"), _counts(s, True), h("p", {"id": "rate"}, _rate_html(s.rate)),
                  _check_summary_html(t.check_tallies()[0], "probe", "checks"), _summary_warnings(s)]
    parts += [_setup_warnings(t.setup.setup_warnings, ""), _chart(probes, report.settings.get("max_tokens"), "")]
    if t.baseline is not None:
        parts.append(_comparison_section(t.baseline, anchors, title="Baseline comparison", ident="baseline"))
    if not only_episodes:
        parts += [h("h2", {"id": "probes"}, f"Probes ({len(probes)})"), _probe_groups(probes, "")]
    parts += [_episodes_section(t, ""), _batches_section(t, ""), _loaded_section(t, ""), _orders_section(t, ""),
              _attribution_section(t, "")]
    server = t.setup.server
    rows: List[Tuple[str, Any]] = [("mode", t.setup.mode or report.settings.get("mode") or "?"),
                                   ("server", _server_text(server))]
    if t.setup.nocache_server is not None:
        rows.append(("recompute server", _server_text(t.setup.nocache_server)))
    rows.append(("model", (server.model if server else None) or "?"))  # never an unchecked option value
    url = _url_html(report.settings.get("url"))
    if url:
        rows.append(("url", url))
    if t.setup.hit_tolerance is not None:
        rows.append(("hit_tolerance", f"raised to {t.setup.hit_tolerance} for the server's cache blocks"))
    rows += [_probe_set(report), ("settings", _settings_text(report.settings)), _written_by(report)]
    if t.setup.setup_checks:
        rows.append(("setup checks", _list(t.setup.setup_checks, "checks")))
    parts += [h("h2", {}, "Run"), _kv_table(rows, "run")]
    return parts


def _targets_table(report: RunReport) -> Markup:
    ref = str(report.targets[0].name)
    head = ("target", "verdict", "server", "mode", "valid", "same", "different", "inconclusive", "errors",
            "rate", "95% interval", f"vs {ref}")
    nums = {"valid", "same", "different", "inconclusive", "errors", "rate"}
    cls = {col: "num" if col in nums else "nowrap" if col == "95% interval" else "" for col in head}
    cls.update({"server": "server", "mode": "nowrap", f"vs {ref}": "vs"})
    rows = []
    for i, t in enumerate(report.targets):
        s, rate = t.summary, t.summary.rate
        interval = f"{rate.ci95[0]:.1%} to {rate.ci95[1]:.1%}" if rate else "n/a"
        if i == 0:
            vs = h("span", {"class": "why"}, "(reference)")
        elif t.vs_reference is None:
            vs = h("span", {"class": "none"}, "n/a")
        else:
            c = t.vs_reference
            vs = join([_badge(c.verdict), f" {c.b} diverged only here, {c.c} only on {ref} "
                                          f"(McNemar p = {format_p(c.mcnemar_p)})"])
        tl = s.tally
        cells = [h("a", {"href": f"#target-{i}"}, t.name), join([_word(s.status), _badge(s.status.value)]),
                 _server_text(t.setup.server), t.setup.mode or "?", tl.valid, tl.same, tl.different,
                 tl.inconclusive, tl.errors, _pct(rate.value if rate else None), interval, vs]
        rows.append(h("tr", {"id": f"targets-row-{i}"}, (h("td", {"class": cls[col]}, c)
                                                       for col, c in zip(head, cells))))
    header = h("tr", {}, (h("th", {"class": "num" if col in nums else ""}, col) for col in head))
    return join([h("h2", {"id": "targets"}, f"Targets ({len(report.targets)})"),
                 h("p", {"class": "why"}, "Every probe ran on each target; each target is compared probe by "
                   f"probe with the first, {ref}, as with a baseline."),
                 h("div", {"class": "wide"},
                   h("table", {"class": "grid", "id": "targets-table"}, header, rows))])


def _probe_index(report: RunReport, by_target: Dict[Optional[str], List[_Probe]]) -> Markup:
    """One row per probe id, one column per target: each outcome links to that probe."""
    names = [t.name for t in report.targets]
    ids = list(dict.fromkeys(p.record.id for n in names for p in by_target.get(n, [])))
    cell: Dict[Tuple[Optional[str], str], _Probe] = {}
    for n in names:
        for p in by_target.get(n, []):
            cell.setdefault((n, p.record.id), p)

    def td(hit: Optional[_Probe]) -> Markup:
        if hit is None:
            return h("td", {}, h("span", {"class": "none"}, "-"))
        return h("td", {}, h("a", {"href": f"#{hit.anchor}", "title": hit.label},
                             _badge(hit.record.outcome.value), _badge(hit.kind[0]) if hit.kind else None))

    rows = [h("tr", {}, h("td", {}, pid), (td(cell.get((n, pid))) for n in names)) for pid in ids]
    return join([h("h3", {"id": "probe-index-title"}, "Probes side by side"),
                 h("table", {"class": "grid", "id": "probe-index"},
                   h("tr", {}, h("th", {}, "id"), (h("th", {}, n) for n in names)), rows)])


def _target_section(report: RunReport, i: int, by_target: Dict[Optional[str], List[_Probe]]) -> Markup:
    t, ref = report.targets[i], report.targets[0]
    probes = by_target.get(t.name, [])
    anchors: Dict[str, str] = {}
    for p in probes:
        anchors.setdefault(p.record.id, p.anchor)
    ref_anchors: Dict[str, str] = {}
    for p in by_target.get(ref.name, []):
        ref_anchors.setdefault(p.record.id, p.anchor)
    s = t.summary
    out = [h("h2", {}, f"Target {t.name}{' (reference)' if i == 0 else ''}"),
           h("p", {}, _word(s.status), _badge(s.status.value), " ", h("span", {"class": "why"}, s.why)),
           _counts(s, False), h("p", {}, _rate_html(s.rate)),
           _check_summary_html(t.check_tallies()[0], "probe", f"checks-{i}"), _summary_warnings(s),
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
    out += [h("h3", {"id": f"probes-{i}"}, f"Probes on {t.name} ({len(probes)})"),
            _probe_groups(probes, f"-{i}"), _episodes_section(t, f"-{i}"), _batches_section(t, f"-{i}"),
            _loaded_section(t, f"-{i}"), _orders_section(t, f"-{i}"),
            _attribution_section(t, f"-{i}"),
            h("details", {}, h("summary", {}, f"setup of {t.name}"), _kv_table(_setup_rows(t), f"setup-{i}"))]
    return h("section", {"class": "target", "id": f"target-{i}"}, out)


def _render_matrix(report: RunReport, by_target: Dict[Optional[str], List[_Probe]]) -> List[Markup]:
    s = report.summary
    warned = [(i, t) for i, t in enumerate(report.targets) if t.setup.setup_warnings]
    parts = [_verdict_box(report, by_target), h("h2", {}, "Summary"), _counts(s, True),
             h("p", {"id": "rate"}, "divergence rate: per target (a rate over several servers would mean "
               "nothing), see ", h("a", {"href": "#targets"}, "Targets")), _summary_warnings(s)]
    if warned:
        parts.append(h("p", {"class": "warning", "id": "setup-warnings"}, "setup warnings on: ", join(
            (h("a", {"href": f"#setup-warnings-{i}"}, f"{t.name} ({len(t.setup.setup_warnings)})")
             for i, t in warned), ", ")))
    parts += [_targets_table(report), _probe_index(report, by_target)]
    parts += [_target_section(report, i, by_target) for i in range(len(report.targets))]
    targets = ", ".join(f"{t.name} ({display_url(t.url)})" if t.url else str(t.name) for t in report.targets)
    mode = f"per target (configured {report.settings.get('mode') or '?'})"
    rows = [("targets", targets), ("mode", mode),
            _probe_set(report), ("settings", _settings_text(report.settings)), _written_by(report)]
    parts += [h("h2", {}, "Run"), _kv_table(rows, "run")]
    return parts


# --------------------------------------------------------------------------- the page

# Markup: the page has always carried their apostrophe unescaped
_INTRO = Markup("Each probe is a two-turn conversation; its turn-2 answer is computed once reusing the "
                "server's prompt cache and once recomputed from scratch. A valid probe whose two answers "
                "differ is a divergence: the highlighted text starts at the first differing character.")
_INTRO_MATRIX = Markup(" This run is a target matrix: every probe ran on each target, and a probe is named "
                       "&lt;probe id&gt;@&lt;target&gt;.")


def render_html(report: RunReport, scrub: Optional[Callable[[str], str]] = None) -> str:
    """The whole page for a run report; ``scrub`` (e.g. ``Redactor.scrub``) is applied to every string of
    the report before rendering."""
    if scrub is not None:
        report = _scrubbed(report, scrub)
    by_target: Dict[Optional[str], List[_Probe]] = {t.name: [] for t in report.targets}
    _wrap(report, report.probes, by_target)
    word = "PASS" if passed(report.summary.status) else "FAIL"
    title = f"pytest-cachecheck: {word} ({report.summary.status.value})"
    title += " (target matrix)" if report.matrix else ""
    parts = [
        Markup("<!DOCTYPE html>"),
        Markup('<html lang="en"><head><meta charset="utf-8">'),
        h("meta", {"http-equiv": "Content-Security-Policy", "content": _CSP}),
        h("meta", {"name": "viewport", "content": "width=device-width, initial-scale=1"}),
        join([h("title", {}, title), h("style", {}, _CSS), Markup("</head><body>")]),
        h("h1", {}, "pytest-cachecheck report"),
    ]
    body = (_render_matrix(report, by_target) if report.matrix
            else _render_single(report, by_target[report.targets[0].name]))
    intro = h("p", {"class": "why", "id": "intro"}, _INTRO, _INTRO_MATRIX if report.matrix else None)
    parts += body[:1] + [intro] + body[1:] + [_own_section(report)]
    parts.append(join([h("p", {"class": "footer"}, "Self-contained page written by pytest-cachecheck: no "
                           "scripts, no external resources."), Markup("</body></html>")]))
    return "\n".join(p for p in parts if p) + "\n"


def write_html(path: str, report: RunReport, scrub: Optional[Callable[[str], str]] = None) -> None:
    """Render and write the page (:func:`~pytest_cachecheck.files.write_text`: a regular file atomically)."""
    write_text(path, render_html(report, scrub), ".html.tmp")
