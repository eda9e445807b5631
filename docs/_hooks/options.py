"""MkDocs hook: the options page's table, generated from the plugin's own code so it cannot drift.

``<!-- cachecheck:options -->`` in a page becomes ``pytest_cachecheck.settings.options_markdown()``: the
public options of ``settings.OPTIONS``, the one table pytest's registration (``pytest --help``) is made
from too (tests/test_options.py checks that they agree).
"""

from __future__ import annotations

from typing import Any

MARKER = "<!-- cachecheck:options -->"


def options_table() -> str:
    from pytest_cachecheck.settings import options_markdown

    return options_markdown()


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, options_table())
