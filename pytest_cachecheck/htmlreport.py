"""One self-contained HTML page for a JSON report: the run's numbers, setup warnings, an optional
baseline comparison and, per probe, both turn-2 answers side by side with the divergence marked.

A target-matrix report (one with ``targets``, see :func:`~pytest_cachecheck.report.build_matrix_report`)
gets a table of the targets side by side, a section per target (its server, setup warnings, baseline
comparison and comparison with the first target) and its probes grouped by target; there a probe is
named ``<probe id>@<target>``, as among the plugin's records, and every anchor is unique.

The page has inline CSS only: no script, no external resource (a Content-Security-Policy meta tag
forbids both, in case anything slipped through). Every text from the report is escaped with
:func:`html.escape`; conversation text is untrusted and may contain markup. The only URLs shown are
``report["settings"]["url"]`` (one-server reports) and each target's ``url`` (matrix reports), which
the plugin already stripped of credentials (they are passed through
:func:`~pytest_cachecheck.redact.display_url` once more all the same).

This module knows nothing about pytest.
"""

from __future__ import annotations

import html
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence

from .files import write_text_atomic
from .model import RunReport
from .protocol import first_difference
from .redact import display_url, scrub_data
from .stats import format_p

__all__ = ["render_html", "write_html"]

_CSS = """
:root { --ok: #1a7f37; --bad: #cf222e; --warn: #9a6700; --err: #6e40c9; --muted: #57606a; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif;
       margin: 0 auto; padding: 16px 24px 48px; max-width: 1400px; color: #1f2328; background: #fff; }
h1 { font-size: 22px; margin: 8px 0 4px; }
h2 { font-size: 18px; margin: 28px 0 8px; border-bottom: 1px solid #d0d7de; padding-bottom: 4px; }
h3 { font-size: 15px; margin: 0; word-break: break-all; }
table { border-collapse: collapse; margin: 6px 0; }
th, td { text-align: left; padding: 3px 10px 3px 0; vertical-align: top; }
th { color: var(--muted); font-weight: 600; }
table.grid td, table.grid th { border-bottom: 1px solid #eaeef2; padding: 3px 12px 3px 4px; }
.num { font-variant-numeric: tabular-nums; text-align: right; }
.counts { display: flex; flex-wrap: wrap; gap: 10px; margin: 8px 0; }
.count { border: 1px solid #d0d7de; border-radius: 6px; padding: 6px 12px; min-width: 96px; }
.count b { display: block; font-size: 20px; }
.badge { display: inline-block; border-radius: 10px; padding: 0 8px; font-size: 12px; font-weight: 600;
         color: #fff; background: var(--muted); white-space: nowrap; }
.b-same, .b-passed, .b-improved, .b-healed, .b-still-same { background: var(--ok); }
.b-different, .b-diverged, .b-regressed, .b-newly-diverged, .b-still-different { background: var(--bad); }
.b-inconclusive, .b-too-few-valid, .b-newly-inconclusive, .b-still-inconclusive,
.b-interrupted { background: var(--warn); }
.b-error, .b-errors { background: var(--err); }
.why { color: var(--muted); }
.warning { color: var(--warn); }
section.probe { border: 1px solid #d0d7de; border-radius: 6px; padding: 10px 12px; margin: 12px 0; }
section.probe.o-different { border-left: 5px solid var(--bad); }
section.probe.o-same { border-left: 5px solid var(--ok); }
section.probe.o-inconclusive { border-left: 5px solid var(--warn); }
section.probe.o-error { border-left: 5px solid var(--err); }
.probe-head { display: flex; gap: 10px; align-items: center; flex-wrap: wrap; }
.pair { display: grid; grid-template-columns: 1fr 1fr; gap: 12px; margin-top: 8px; }
.pair h4 { margin: 0 0 4px; font-size: 13px; color: var(--muted); }
pre { white-space: pre-wrap; overflow-wrap: anywhere; margin: 0; padding: 8px;
      font: 12.5px/1.45 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
      background: #f6f8fa; border-radius: 6px; }
pre.reason { background: #fff8c5; }
mark { background: #ffc1c0; color: #82071e; border-radius: 2px; }
mark.end { background: #eaeef2; color: var(--muted); font-style: italic; }
.none { color: var(--muted); font-style: italic; }
details { margin-top: 8px; }
summary { cursor: pointer; color: var(--muted); }
a { color: #0969da; }
.footer { margin-top: 32px; color: var(--muted); font-size: 12px; }
.setup-warnings { border: 1px solid #d4a72c; border-left: 5px solid var(--warn); border-radius: 6px;
                  background: #fff8c5; padding: 6px 12px; margin: 8px 0; }
.setup-warnings ul, ul.checks { margin: 4px 0; padding-left: 20px; }
section.target { border: 1px solid #d0d7de; border-radius: 6px; padding: 0 12px 10px; margin: 16px 0; }
section.target h2 { margin-top: 10px; }
section.target h3 { margin: 14px 0 4px; }
table#probe-index a { text-decoration: none; }
.nowrap { white-space: nowrap; }
"""

_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src 'none'; form-action 'none'"


def _e(value: Any) -> str:
    """Escaped text of any value (None becomes an empty string)."""
    return html.escape("" if value is None else str(value), quote=True)


def _slug(value: Any) -> str:
    """A safe CSS class suffix for an outcome or status word."""
    text = str(value or "unknown").lower()
    return "".join(ch if ch.isalnum() else "-" for ch in text)


def _badge(value: Any) -> str:
    return f'<span class="badge b-{_slug(value)}">{_e(value or "?")}</span>'


def _pct(x: Any) -> str:
    return f"{x:.1%}" if isinstance(x, (int, float)) and not isinstance(x, bool) else "n/a"


def _answer_html(text: Optional[str], at: Optional[int]) -> str:
    """The answer in a <pre>: the common prefix plain, everything from ``at`` inside <mark>."""
    if text is None:
        return '<pre><span class="none">(no answer)</span></pre>'
    if at is None or at < 0:
        return f"<pre>{_e(text)}</pre>"
    at = min(at, len(text))
    rest = text[at:]
    marked = f'<mark>{_e(rest)}</mark>' if rest else '<mark class="end">(end of answer)</mark>'
    return f"<pre>{_e(text[:at])}{marked}</pre>"


def _first(seq: Any) -> Optional[str]:
    if isinstance(seq, Sequence) and not isinstance(seq, str) and seq:
        value = seq[0]
        return value if isinstance(value, str) else None
    return None


def _kv_table(rows: Iterable[tuple]) -> str:
    body = "".join(f"<tr><th>{_e(k)}</th><td>{v}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


def _map(obj: Any, key: str) -> Mapping[str, Any]:
    """``obj[key]`` when that is a mapping, else an empty one (reports may be partial)."""
    value = obj.get(key) if isinstance(obj, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def _server_text(server: Any) -> str:
    if not isinstance(server, Mapping):
        return "?"
    parts = [server.get("kind") or "?", server.get("build") or ""]
    text = " ".join(p for p in parts if p)
    if server.get("model"):
        text += f" | model {server['model']}"
    return text


def _run_section(report: Mapping[str, Any]) -> str:
    settings = _map(report, "settings")
    server = _map(report, "server")
    probe_set = _map(report, "probe_set")
    url = settings.get("url")
    rows: List[tuple] = [
        ("mode", _e(report.get("mode") or settings.get("mode") or "?")),
        ("server", _e(_server_text(server))),
    ]
    if isinstance(report.get("nocache_server"), Mapping):
        rows.append(("recompute server", _e(_server_text(report["nocache_server"]))))
    rows.append(("model", _e(server.get("model") or settings.get("model") or "?")))
    if _url_html(url):
        rows.append(("url", _url_html(url)))
    rows.append(("probe set", _probe_set_html(probe_set)))
    rows.append(("settings", _e(_settings_text(settings))))
    rows.append(_written_by(report))
    return ("<h2>Run</h2>" + _setup_warnings(report.get("setup_warnings"))
            + _kv_table(rows + _checks_row(report)))


def _strings(value: Any) -> List[str]:
    """The strings of a list field (reports may be partial: anything else is no entry)."""
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [str(v) for v in value if v is not None]
    return []


def _setup_warnings(warnings: Any, suffix: str = "") -> str:
    """A prominent box listing the setup warnings, or nothing when there are none."""
    items = _strings(warnings)
    if not items:
        return ""
    lis = "".join(f"<li>{_e(w)}</li>" for w in items)
    return (f'<div class="setup-warnings" id="setup-warnings{suffix}"><b class="warning">setup '
            f"warning{'s' if len(items) > 1 else ''} ({len(items)})</b><ul>{lis}</ul></div>")


def _checks_row(obj: Mapping[str, Any]) -> List[tuple]:
    """The "setup checks" row of a run table (the checks run before the first probe), if any ran."""
    checks = _strings(obj.get("setup_checks"))
    if not checks:
        return []
    return [("setup checks", '<ul class="checks">' + "".join(f"<li>{_e(c)}</li>" for c in checks) + "</ul>")]


def _written_by(report: Mapping[str, Any]) -> tuple:
    tool = _map(report, "tool")
    return ("written by", _e(f"{tool.get('name', 'pytest-cachecheck')} {tool.get('version', '')}".strip()
                             + (f", {report['created']}" if report.get("created") else "")))


def _settings_text(settings: Mapping[str, Any]) -> str:
    shown = ("max_tokens", "hit_tolerance", "skip_hit_check", "min_valid", "timeout", "n")
    return " | ".join(f"{k} {settings[k]}" for k in shown if settings.get(k) is not None)


def _probe_set_html(probe_set: Mapping[str, Any]) -> str:
    return (_e(f"{probe_set.get('name', '?')} ({probe_set.get('count', '?')} probes)")
            + f" <code>{_e(probe_set.get('fingerprint') or '')}</code>")


def _url_html(url: Any) -> Optional[str]:
    """A URL as it may be shown (no credentials, query values masked), or None when there is none."""
    if isinstance(url, str) and url:
        return f"<code>{_e(display_url(url))}</code>"
    return None


def _summary_section(report: Mapping[str, Any], matrix: bool = False) -> str:
    s = _map(report, "summary")
    boxes = "".join(
        f'<div class="count" id="count-{key}"><b class="num">{_e(s.get(key, "?"))}</b>{_e(label)}</div>'
        for key, label in (("probes", "probes"), ("valid", "valid"), ("same", "same"),
                           ("different", "different"), ("inconclusive", "inconclusive"),
                           ("errors", "errors"))
    )
    out = ["<h2>Summary</h2>",
           f'<p>{_badge(s.get("status"))} <span class="why">{_e(s.get("why") or "")}</span></p>',
           f'<div class="counts">{boxes}</div>']
    if matrix:
        out.append('<p id="rate">divergence rate: per target (a rate over several servers would mean '
                   'nothing), see <a href="#targets">Targets</a></p>')
    else:
        out.append(f'<p id="rate">{_rate_html(s)}</p>')
    out += _summary_warnings(s)
    return "".join(out)


def _rate_html(s: Mapping[str, Any]) -> str:
    """A summary's divergence rate with its 95% interval, or n/a when no probe was valid."""
    if not isinstance(s.get("rate"), (int, float)):
        return "divergence rate: n/a (no valid probe)"
    line = (f"divergence rate <b>{_pct(s['rate'])}</b> ({_e(s.get('different'))} of "
            f"{_e(s.get('valid'))} valid probes)")
    ci = s.get("rate_ci95")
    if isinstance(ci, Sequence) and len(ci) == 2:
        line += f", 95% Wilson interval {_pct(ci[0])} to {_pct(ci[1])}"
    return line


def _summary_warnings(s: Mapping[str, Any]) -> List[str]:
    """A summary's probes not run and the likely cause of recompute reuse, as warning paragraphs."""
    out = []
    not_run = _strings(s.get("not_run"))
    if not_run:
        out.append(f'<p class="warning">not run: {_e(", ".join(not_run))}</p>')
    if s.get("recompute_reuse_cause"):
        out.append(f'<p class="warning">{_e(s["recompute_reuse_cause"])}</p>')
    return out


def _rate_text(rate: Any) -> str:
    if not isinstance(rate, Mapping):
        return "n/a (no valid probe)"
    text = f"{_pct(rate.get('rate'))} ({rate.get('different')}/{rate.get('valid')}"
    ci = rate.get("ci95")
    if isinstance(ci, Sequence) and len(ci) == 2:
        text += f", 95% CI {_pct(ci[0])} to {_pct(ci[1])}"
    return text + ")"


def _comparison_section(comparison: Mapping[str, Any], anchors: Mapping[str, str], *,
                        title: str = "Baseline comparison", ident: str = "baseline",
                        before: str = "baseline", after: str = "now", heading: str = "h2",
                        note: Optional[str] = None,
                        before_anchors: Optional[Mapping[str, str]] = None) -> str:
    """A comparison (``Comparison.to_dict()``): verdict, McNemar p, rates, notes, counts and the rows.

    ``anchors`` (probe id -> anchor) links each row's id to the probe's section, ``before_anchors``
    its before-outcome to the other run's section (a matrix's reference target). ``ident`` is the
    section's element id (the rows table gets ``<ident>-rows``); ``before`` and ``after`` name the two
    runs (the defaults read as a baseline comparison); ``note`` is shown under the title.
    """
    p = comparison.get("mcnemar_p")
    p_text = format_p(float(p)) if isinstance(p, (int, float)) and not isinstance(p, bool) else "n/a"
    out = [f'<{heading} id="{ident}">{_e(title)}</{heading}>',
           (f'<p>{_badge(comparison.get("verdict"))} <span class="why">{_e(comparison.get("why") or "")}'
            f"</span> | exact McNemar p = {_e(p_text)}</p>")]
    if note:
        out.append(f'<p class="why">{_e(note)}</p>')
    if comparison.get("baseline_created"):
        out.append(f'<p class="why">{_e(before)} written {_e(comparison["baseline_created"])}</p>')
    out.append(f"<p>divergence rate: {_e(before)} {_e(_rate_text(comparison.get('baseline_rate')))} &rarr; "
               f"{_e(after)} {_e(_rate_text(comparison.get('current_rate')))}</p>")
    for w in comparison.get("env_warnings") or []:
        cls = "why" if str(w).startswith("note:") else "warning"
        out.append(f'<p class="{cls}">{_e(w)}</p>')
    counts = comparison.get("counts") or {}
    if isinstance(counts, Mapping) and counts:
        out.append("<p>" + " | ".join(f"{_e(k)} <b>{_e(v)}</b>" for k, v in counts.items() if v) + "</p>")
    rows = comparison.get("rows") or []
    body = []
    for r in rows:
        if not isinstance(r, Mapping):
            continue
        pid = str(r.get("id"))
        link = f'<a href="#{anchors[pid]}">{_e(pid)}</a>' if pid in anchors else _e(pid)
        was = _e(r.get("before") or "-")
        if before_anchors is not None and pid in before_anchors and r.get("before"):
            was = f'<a href="#{before_anchors[pid]}">{was}</a>'
        body.append(f"<tr><td>{link}</td><td>{was}</td>"
                    f"<td>{_e(r.get('after') or '-')}</td><td>{_badge(r.get('status'))}</td></tr>")
    if body:
        head = ("<th>before</th><th>after</th>" if (before, after) == ("baseline", "now")
                else f"<th>{_e(before)}</th><th>{_e(after)}</th>")
        out.append(f'<table class="grid" id="{ident}-rows"><tr><th>id</th>{head}'
                   "<th>status</th></tr>" + "".join(body) + "</table>")
    return "".join(out)


def _probe_index(probes: Sequence[Mapping[str, Any]], anchors: Mapping[str, str]) -> str:
    rows = "".join(
        f'<tr><td><a href="#{anchors[str(p.get("id"))]}">{_e(p.get("id"))}</a></td>'
        f"<td>{_badge(p.get('outcome'))}</td></tr>"
        for p in probes
    )
    return f'<table class="grid"><tr><th>id</th><th>outcome</th></tr>{rows}</table>'


def _probe_section(p: Mapping[str, Any], anchor: str, label: Optional[str] = None) -> str:
    """One probe: its outcome, reason and both turn-2 answers; ``label`` (default: the id) heads it."""
    answers = _map(p, "answers")
    cache, recompute = _first(answers.get("cache")), _first(answers.get("recompute"))
    turn1 = _first(answers.get("turn1"))
    div = p.get("divergence") if isinstance(p.get("divergence"), Mapping) else None
    at: Optional[int] = None
    if div is not None and isinstance(div.get("char"), int) and not isinstance(div.get("char"), bool):
        at = div["char"]
    elif p.get("outcome") == "different" and cache is not None and recompute is not None:
        at = first_difference(cache, recompute)
    outcome = p.get("outcome")
    out = [f'<section class="probe o-{_slug(outcome)}" id="{anchor}">',
           f'<div class="probe-head"><h3>{_e(p.get("id") if label is None else label)}</h3>{_badge(outcome)}']
    if p.get("source"):
        out.append(f'<span class="why">{_e(p["source"])}</span>')
    if isinstance(p.get("duration_s"), (int, float)):
        out.append(f'<span class="why">{p["duration_s"]:.2f} s</span>')
    out.append("</div>")
    if at is not None:
        where = f"first difference at character {at}"
        if div is not None and isinstance(div.get("token"), int):
            where += f" (token {div['token']})"
        out.append(f'<p class="divergence">{_e(where)}</p>')
    if p.get("reason"):
        out.append(f'<pre class="reason">{_e(p["reason"])}</pre>')
    out.append('<div class="pair">'
               f"<div><h4>turn 2, cache path</h4>{_answer_html(cache, at)}</div>"
               f"<div><h4>turn 2, recompute path</h4>{_answer_html(recompute, at)}</div>"
               "</div>")
    if turn1 is not None:
        out.append(f"<details><summary>turn-1 answer</summary>{_answer_html(turn1, None)}</details>")
    out.append("</section>")
    return "".join(out)


# --------------------------------------------------------------------------- target matrix

def _record_key(probe_id: Any, target: Any) -> str:
    """A probe's name in a target matrix: ``<probe id>@<target>`` (as ``plugin.record_key``)."""
    return str(probe_id) if target is None else f"{probe_id}@{target}"


def _target_of(record: Mapping[str, Any]) -> str:
    target = record.get("target")
    return "?" if target is None else str(target)


class _Matrix:
    """The targets of a matrix report, their probes and the page's anchors for them.

    Targets are numbered in report order (``target-0`` is the reference); probes whose ``target``
    names no target of the list come last, in groups of their own. Every probe section is
    ``probe-<i>``, ``i`` its index in the report's probe list, and every target's element ids carry
    its number, so anchors stay unique whatever the probe ids and target names are.
    """

    def __init__(self, report: Mapping[str, Any], probes: Sequence[Mapping[str, Any]]) -> None:
        self.targets: List[Mapping[str, Any]] = [t for t in report.get("targets") or []
                                                 if isinstance(t, Mapping)]
        self.names: List[str] = [str(t.get("name", "?")) for t in self.targets]
        groups: List[str] = list(dict.fromkeys(self.names))
        for p in probes:
            name = _target_of(p)
            if name not in groups:
                groups.append(name)
        self.groups = groups
        #: probe id -> anchor of that probe's section, per target name (the first record of an id wins)
        self.anchors: Dict[str, Dict[str, str]] = {g: {} for g in groups}
        #: (index in the report's probe list, record), per target name
        self.sections: Dict[str, List[tuple]] = {g: [] for g in groups}
        for i, p in enumerate(probes):
            name = _target_of(p)
            self.anchors[name].setdefault(str(p.get("id")), f"probe-{i}")
            self.sections[name].append((i, p))

    def ref(self) -> str:
        return self.names[0] if self.names else "?"

    def probes_id(self, group: str) -> str:
        """The element id of a target's (or unknown target's) probe heading."""
        if group in self.names:
            return f"probes-{self.names.index(group)}"
        return f"probes-other-{self.groups.index(group)}"


def _vs_reference_text(cmp: Any, ref: str) -> str:
    """The "vs the first target" cell: probes that diverged on one target only, and McNemar p."""
    if not isinstance(cmp, Mapping):
        return '<span class="none">n/a</span>'
    p = cmp.get("mcnemar_p")
    p_text = format_p(float(p)) if isinstance(p, (int, float)) and not isinstance(p, bool) else "n/a"
    return (f"{_badge(cmp.get('verdict'))} {_e(cmp.get('newly_diverged_count', 0))} diverged only here, "
            f"{_e(cmp.get('healed_count', 0))} only on {_e(ref)}; McNemar p = {_e(p_text)}")


def _targets_table(m: _Matrix) -> str:
    ref = m.ref()
    head = ("target", "status", "server", "mode", "valid", "same", "different", "inconclusive", "errors",
            "rate", "95% interval", f"vs {ref}")
    nums = {"valid", "same", "different", "inconclusive", "errors", "rate"}
    num, nowrap = ' class="num"', ' class="nowrap"'
    rows = []
    for i, t in enumerate(m.targets):
        s = _map(t, "summary")
        ci = s.get("rate_ci95")
        interval = (f"{_pct(ci[0])} to {_pct(ci[1])}" if isinstance(ci, Sequence) and len(ci) == 2
                    else "n/a")
        vs = ('<span class="why">(reference)</span>' if i == 0
              else _vs_reference_text(t.get("vs_reference"), ref))
        cells = [f'<a href="#target-{i}">{_e(m.names[i])}</a>', _badge(s.get("status")),
                 _e(_server_text(t.get("server"))), _e(t.get("mode") or "?")]
        cells += [_e(s.get(k, "?")) for k in ("valid", "same", "different", "inconclusive", "errors")]
        cells += [_e(_pct(s.get("rate"))), _e(interval), vs]
        rows.append(f'<tr id="targets-row-{i}">'
                    + "".join(f"<td{num if h in nums else nowrap if h == '95% interval' else ''}>{c}</td>"
                              for h, c in zip(head, cells)) + "</tr>")
    header = "".join(f"<th{num if h in nums else ''}>{_e(h)}</th>" for h in head)
    return (f'<h2 id="targets">Targets ({len(m.targets)})</h2>'
            f'<p class="why">Every probe ran on each target; each target is compared probe by probe with '
            f"the first, {_e(ref)}, as with a baseline.</p>"
            f'<table class="grid" id="targets-table"><tr>{header}</tr>{"".join(rows)}</table>')


def _target_summary(t: Mapping[str, Any]) -> str:
    s = _map(t, "summary")
    out = [f'<p>{_badge(s.get("status"))} <span class="why">{_e(s.get("why") or "")}</span></p>',
           "<p>" + " | ".join(f"{_e(k)} <b>{_e(s.get(k, '?'))}</b>"
                              for k in ("probes", "valid", "same", "different", "inconclusive", "errors"))
           + "</p>"]
    out.append(f"<p>{_rate_html(s)}</p>")
    out += _summary_warnings(s)
    return "".join(out)


def _target_section(m: _Matrix, i: int, baseline: Optional[Mapping[str, Any]]) -> str:
    t, name, ref = m.targets[i], m.names[i], m.ref()
    rows: List[tuple] = []
    if _url_html(t.get("url")):
        rows.append(("url", _url_html(t.get("url"))))
    rows.append(("mode", _e(t.get("mode") or "?")))
    rows.append(("server", _e(_server_text(t.get("server")))))
    if isinstance(t.get("nocache_server"), Mapping):
        rows.append(("recompute server", _e(_server_text(t["nocache_server"]))))
    if t.get("hit_tolerance") is not None:
        rows.append(("hit_tolerance", _e(f"raised to {t['hit_tolerance']} for the server's cache blocks")))
    rows += _checks_row(t)
    count = len(m.sections.get(name, []))
    rows.append(("probes", f'<a href="#{m.probes_id(name)}">{_e(f"{count} probe(s) on {name}")}</a>'))
    role = " (reference)" if i == 0 else ""
    out = [f'<section class="target" id="target-{i}">',
           f"<h2>Target {_e(name)}{_e(role)}</h2>",
           _setup_warnings(t.get("setup_warnings"), f"-{i}"),
           _kv_table(rows),
           _target_summary(t)]
    anchors = m.anchors.get(name, {})
    if baseline is not None:
        out.append(_comparison_section(baseline, anchors, title=f"Baseline comparison of {name}",
                                       ident=f"baseline-{i}", heading="h3"))
    vs = t.get("vs_reference")
    if i and isinstance(vs, Mapping):
        vs = {**vs, "baseline_created": None}  # the reference is this run, not an earlier one
        out.append(_comparison_section(
            vs, anchors, title=f"{name} vs {ref} (the first target)", ident=f"vs-reference-{i}",
            before=ref, after=name, heading="h3", before_anchors=m.anchors.get(ref, {}),
            note=(f"{ref} plays the baseline: newly diverged = differed only on {name}, healed = differed "
                  f"only on {ref}.")))
    out.append("</section>")
    return "".join(out)


def _matrix_run_section(report: Mapping[str, Any], m: _Matrix) -> str:
    settings = _map(report, "settings")
    targets = ", ".join(f"{name} ({display_url(str(t['url']))})" if isinstance(t.get("url"), str) and t["url"]
                        else name for name, t in zip(m.names, m.targets))
    rows: List[tuple] = [
        ("targets", _e(targets or "?")),
        ("mode", _e(f"per target (configured {settings.get('mode') or '?'})")),
        ("probe set", _probe_set_html(_map(report, "probe_set"))),
        ("settings", _e(_settings_text(settings))),
        _written_by(report),
    ]
    return ("<h2>Run</h2>" + _setup_warnings(report.get("setup_warnings"))
            + _kv_table(rows + _checks_row(report)))


def _matrix_probe_index(m: _Matrix) -> str:
    """One row per probe id, one column per target: each outcome links to that probe's section."""
    ids: List[str] = list(dict.fromkeys(str(p.get("id")) for g in m.groups for _, p in m.sections[g]))
    outcome = {(g, str(p.get("id"))): p.get("outcome") for g in m.groups for _, p in reversed(m.sections[g])}
    head = "".join(f"<th>{_e(g)}</th>" for g in m.groups)
    body = []
    for pid in ids:
        cells = []
        for g in m.groups:
            anchor = m.anchors[g].get(pid)
            if anchor is None:
                cells.append('<td><span class="none">-</span></td>')
            else:
                cells.append(f'<td><a href="#{anchor}" title="{_e(_record_key(pid, g))}">'
                             f"{_badge(outcome.get((g, pid)))}</a></td>")
        body.append(f"<tr><td>{_e(pid)}</td>{''.join(cells)}</tr>")
    return f'<table class="grid" id="probe-index"><tr><th>id</th>{head}</tr>{"".join(body)}</table>'


def _render_matrix(report: Mapping[str, Any], probes: Sequence[Mapping[str, Any]]) -> List[str]:
    m = _Matrix(report, probes)
    parts = [_summary_section(report, matrix=True), _matrix_run_section(report, m), _targets_table(m)]
    for i, _ in enumerate(m.names):
        baseline = m.targets[i].get("baseline")
        parts.append(_target_section(m, i, baseline if isinstance(baseline, Mapping) else None))
    parts.append(f'<h2 id="probes">Probes ({len(probes)} on {len(m.names)} targets)</h2>')
    if not probes:
        parts.append('<p class="none">no probe ran</p>')
        return parts
    parts.append(_matrix_probe_index(m))
    for g in m.groups:
        known = g in m.names
        parts.append(f'<h2 id="{m.probes_id(g)}">Probes on {_e(g if known else f"unknown target {g}")} '
                     f"({len(m.sections[g])})</h2>")
        for i, p in m.sections[g]:
            parts.append(_probe_section(p, f"probe-{i}", _record_key(p.get("id"), g)))
    return parts


# --------------------------------------------------------------------------- the page

def render_html(report: RunReport, scrub: Optional[Callable[[str], str]] = None) -> str:
    """The whole page for a run report; ``scrub`` (e.g. ``Redactor.scrub``) is applied to every string of
    the report before rendering."""
    data: Mapping[str, Any] = report.to_json()
    if scrub is not None:
        data = scrub_data(data, scrub)
    comparison = data.get("baseline") if isinstance(data.get("baseline"), Mapping) else None
    probes = [p for p in (data.get("probes") or []) if isinstance(p, Mapping)]
    matrix = report.matrix
    summary = _map(data, "summary")
    title = f"pytest-cachecheck: {summary.get('status') or 'report'}"
    intro = ("Each probe is a two-turn conversation; its turn-2 answer is computed once reusing "
             "the server's prompt cache and once recomputed from scratch. A valid probe whose two answers "
             "differ is a divergence: the highlighted text starts at the first differing character.")
    if matrix:
        title += " (target matrix)"
        intro += (" This run is a target matrix: every probe ran on each target, and a probe is named "
                  "&lt;probe id&gt;@&lt;target&gt;.")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>",
        "<h1>pytest-cachecheck report</h1>",
        f'<p class="why">{intro}</p>',
    ]
    if matrix:
        parts += _render_matrix(data, probes)
    else:
        parts += _render_single(data, probes, comparison)
    parts.append('<p class="footer">Self-contained page written by pytest-cachecheck: no scripts, '
                 "no external resources.</p></body></html>")
    return "\n".join(parts) + "\n"


def _render_single(report: Mapping[str, Any], probes: Sequence[Mapping[str, Any]],
                   comparison: Optional[Mapping[str, Any]]) -> List[str]:
    anchors: Dict[str, str] = {}
    for i, p in enumerate(probes):
        anchors.setdefault(str(p.get("id")), f"probe-{i}")
    parts = [_summary_section(report), _run_section(report)]
    if comparison is not None:
        parts.append(_comparison_section(comparison, anchors))
    parts.append(f'<h2 id="probes">Probes ({len(probes)})</h2>')
    if probes:
        parts.append(_probe_index(probes, anchors))
        seen = set()
        for i, p in enumerate(probes):
            ident = str(p.get("id"))
            anchor = anchors[ident] if ident not in seen else f"probe-{i}"
            seen.add(ident)
            parts.append(_probe_section(p, anchor))
    else:
        parts.append('<p class="none">no probe ran</p>')
    return parts


def write_html(path: str, report: RunReport, scrub: Optional[Callable[[str], str]] = None) -> None:
    """Render and write the page atomically: a temporary file beside ``path``, then ``os.replace``."""
    write_text_atomic(path, render_html(report, scrub), ".html.tmp")
