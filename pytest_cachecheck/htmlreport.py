"""One self-contained HTML page for a JSON report: the run's numbers, an optional baseline comparison
and, per probe, both turn-2 answers side by side with the divergence marked.

The page has inline CSS only: no script, no external resource (a Content-Security-Policy meta tag
forbids both, in case anything slipped through). Every text from the report is escaped with
:func:`html.escape`; conversation text is untrusted and may contain markup. The only URL shown is
``report["settings"]["url"]``, which the plugin already stripped of credentials (it is passed through
:func:`~pytest_cachecheck.redact.display_url` once more all the same).

This module knows nothing about pytest.
"""

from __future__ import annotations

import html
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Union

from .baseline import Comparison, format_p
from .redact import display_url
from .report import first_difference, write_text_atomic

__all__ = ["render_html", "write_html"]

#: What the comparison arguments take: ``Comparison.to_dict()`` or the Comparison itself.
ComparisonLike = Union[Mapping[str, Any], Comparison]

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
    if isinstance(url, str) and url:
        rows.append(("url", f"<code>{_e(display_url(url))}</code>"))
    rows.append(("probe set", _e(f"{probe_set.get('name', '?')} ({probe_set.get('count', '?')} probes)")
                 + f" <code>{_e(probe_set.get('fingerprint') or '')}</code>"))
    shown = ("max_tokens", "hit_tolerance", "skip_hit_check", "min_valid", "timeout", "n")
    chosen = " | ".join(f"{k} {settings[k]}" for k in shown if settings.get(k) is not None)
    rows.append(("settings", _e(chosen)))
    tool = _map(report, "tool")
    rows.append(("written by", _e(f"{tool.get('name', 'pytest-cachecheck')} {tool.get('version', '')}".strip()
                                  + (f", {report['created']}" if report.get("created") else ""))))
    return "<h2>Run</h2>" + _kv_table(rows)


def _summary_section(report: Mapping[str, Any]) -> str:
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
    ci = s.get("rate_ci95")
    if isinstance(s.get("rate"), (int, float)):
        line = (f"divergence rate <b>{_pct(s['rate'])}</b> ({_e(s.get('different'))} of "
                f"{_e(s.get('valid'))} valid probes)")
        if isinstance(ci, Sequence) and len(ci) == 2:
            line += f", 95% Wilson interval {_pct(ci[0])} to {_pct(ci[1])}"
        out.append(f'<p id="rate">{line}</p>')
    else:
        out.append('<p id="rate">divergence rate: n/a (no valid probe)</p>')
    not_run = s.get("not_run")
    if isinstance(not_run, Sequence) and not isinstance(not_run, str) and not_run:
        out.append(f'<p class="warning">not run: {_e(", ".join(map(str, not_run)))}</p>')
    if s.get("recompute_reuse_cause"):
        out.append(f'<p class="warning">{_e(s["recompute_reuse_cause"])}</p>')
    return "".join(out)


def _rate_text(rate: Any) -> str:
    if not isinstance(rate, Mapping):
        return "n/a (no valid probe)"
    text = f"{_pct(rate.get('rate'))} ({rate.get('different')}/{rate.get('valid')}"
    ci = rate.get("ci95")
    if isinstance(ci, Sequence) and len(ci) == 2:
        text += f", 95% CI {_pct(ci[0])} to {_pct(ci[1])}"
    return text + ")"


def _comparison_section(comparison: Mapping[str, Any], anchors: Mapping[str, str]) -> str:
    p = comparison.get("mcnemar_p")
    p_text = format_p(float(p)) if isinstance(p, (int, float)) and not isinstance(p, bool) else "n/a"
    out = ['<h2 id="baseline">Baseline comparison</h2>',
           (f'<p>{_badge(comparison.get("verdict"))} <span class="why">{_e(comparison.get("why") or "")}'
            f"</span> | exact McNemar p = {_e(p_text)}</p>")]
    if comparison.get("baseline_created"):
        out.append(f'<p class="why">baseline written {_e(comparison["baseline_created"])}</p>')
    out.append(f"<p>divergence rate: baseline {_e(_rate_text(comparison.get('baseline_rate')))} &rarr; "
               f"now {_e(_rate_text(comparison.get('current_rate')))}</p>")
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
        ident = str(r.get("id"))
        link = f'<a href="#{anchors[ident]}">{_e(ident)}</a>' if ident in anchors else _e(ident)
        body.append(f"<tr><td>{link}</td><td>{_e(r.get('before') or '-')}</td>"
                    f"<td>{_e(r.get('after') or '-')}</td><td>{_badge(r.get('status'))}</td></tr>")
    if body:
        out.append('<table class="grid" id="baseline-rows"><tr><th>id</th><th>before</th><th>after</th>'
                   "<th>status</th></tr>" + "".join(body) + "</table>")
    return "".join(out)


def _probe_index(probes: Sequence[Mapping[str, Any]], anchors: Mapping[str, str]) -> str:
    rows = "".join(
        f'<tr><td><a href="#{anchors[str(p.get("id"))]}">{_e(p.get("id"))}</a></td>'
        f"<td>{_badge(p.get('outcome'))}</td></tr>"
        for p in probes
    )
    return f'<table class="grid"><tr><th>id</th><th>outcome</th></tr>{rows}</table>'


def _probe_section(p: Mapping[str, Any], anchor: str) -> str:
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
           f'<div class="probe-head"><h3>{_e(p.get("id"))}</h3>{_badge(outcome)}']
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


def _scrub_deep(obj: Any, scrub: Callable[[str], str]) -> Any:
    if isinstance(obj, str):
        return scrub(obj)
    if isinstance(obj, Mapping):
        return {k: _scrub_deep(v, scrub) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_scrub_deep(v, scrub) for v in obj]
    return obj


def _comparison_dict(comparison: Optional[ComparisonLike]) -> Optional[Mapping[str, Any]]:
    if isinstance(comparison, Comparison):
        return comparison.to_dict()
    return comparison


def render_html(report: Mapping[str, Any], comparison: Optional[ComparisonLike] = None) -> str:
    """The whole page for a report dict (the layout of ``build_report``).

    ``comparison`` is the ``to_dict()`` of a :class:`~pytest_cachecheck.baseline.Comparison` (a
    Comparison object is accepted too). Missing report fields are shown as ``?``, not an error.
    """
    comparison = _comparison_dict(comparison)
    probes = [p for p in (report.get("probes") or []) if isinstance(p, Mapping)]
    anchors: Dict[str, str] = {}
    for i, p in enumerate(probes):
        anchors.setdefault(str(p.get("id")), f"probe-{i}")
    summary = _map(report, "summary")
    title = f"pytest-cachecheck: {summary.get('status') or 'report'}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>",
        "<h1>pytest-cachecheck report</h1>",
        ('<p class="why">Each probe is a two-turn conversation; its turn-2 answer is computed once reusing '
         "the server's prompt cache and once recomputed from scratch. A valid probe whose two answers "
         "differ is a divergence: the highlighted text starts at the first differing character.</p>"),
        _summary_section(report),
        _run_section(report),
    ]
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
    parts.append('<p class="footer">Self-contained page written by pytest-cachecheck: no scripts, '
                 "no external resources.</p></body></html>")
    return "\n".join(parts) + "\n"


def write_html(path: str, report: Mapping[str, Any], comparison: Optional[ComparisonLike] = None,
               scrub: Optional[Callable[[str], str]] = None) -> None:
    """Render and write the page atomically: a temporary file beside ``path``, then ``os.replace``.

    ``scrub`` (e.g. ``Redactor.scrub``) is applied to every string of the report and comparison before
    rendering, and to the finished page.
    """
    if scrub is not None:
        report = _scrub_deep(report, scrub)
        comparison = _scrub_deep(_comparison_dict(comparison), scrub)
    text = render_html(report, comparison)
    if scrub is not None:
        text = scrub(text)
    write_text_atomic(path, text, ".html.tmp")
