"""MkDocs hook: the options page's table, generated from the plugin's own code so it cannot drift.

``<!-- cachecheck:options -->`` in a page becomes the table of every option. The table comes from
``pytest_cachecheck.settings.options_markdown()`` where the package has it; otherwise from pytest's own
registration: a ``Parser`` on which the plugin's ``pytest_addoption`` registers its options and ini keys,
rendered from the ``cachecheck`` group (what ``pytest --help`` shows).
"""

from __future__ import annotations

import re
from typing import Any, List

MARKER = "<!-- cachecheck:options -->"
_INI = re.compile(r"\s*\[ini (\w+)\]")
_ENV = re.compile(r"\s*\[env (\w+)\]")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def from_registration() -> str:
    from _pytest.config.argparsing import Parser

    from pytest_cachecheck import plugin

    parser = Parser(_ispytest=True)
    plugin.pytest_addoption(parser)
    group = parser.getgroup("cachecheck")
    inis = {name: spec for name, spec in parser._inidict.items()}  # name -> (help, type, default)
    rows: List[str] = ["| option | ini key | environment | meaning |", "|---|---|---|---|"]
    for opt in group.options:
        attrs = opt.attrs()
        text = str(attrs.get("help") or "")
        ini = _INI.search(text)
        env = _ENV.search(text)
        text = _ENV.sub("", _INI.sub("", text)).strip()
        metavar = attrs.get("metavar")
        flag = " ".join(opt.names()) + (f" {metavar}" if metavar else "")
        if ini is None or ini.group(1) not in inis:
            raise RuntimeError(f"option {opt.names()} names no ini key the plugin registers")
        kind = inis[ini.group(1)][1]
        ini_cell = f"`{ini.group(1)}`" + (" (one per line)" if kind == "linelist" else "")
        repeat = ", repeatable" if kind == "linelist" else ""
        rows.append(f"| `{_cell(flag)}`{repeat} | {ini_cell} | {f'`{env.group(1)}`' if env else ''} | "
                    f"{_cell(text)} |")
    return "\n".join(rows) + "\n"


def options_table() -> str:
    from pytest_cachecheck import settings

    own = getattr(settings, "options_markdown", None)
    return own() if callable(own) else from_registration()


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, options_table())
