"""Server text made safe to keep and to show.

A server is untrusted: a JSON string of it may hold a lone surrogate (``"\\ud800"``), which no UTF-8 writer
can encode, and any string of it may hold control characters that move the cursor, clear lines or turn the
text right to left in a terminal. :func:`clean_text` makes a string encodable; :func:`printable` makes it
safe to show on one line, :func:`visible` on several.
"""

from __future__ import annotations

import re
from typing import Callable, List

_SURROGATE = re.compile("[\ud800-\udfff]")
# C0 controls, DEL, C1 controls, the bidi marks, embeddings, overrides and isolates, line and paragraph
# separators, and lone surrogates
_CONTROLS = "\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029\ud800-\udfff"
_UNPRINTABLE = re.compile(f"[{_CONTROLS}]")
_UNPRINTABLE_BUT_LINES = re.compile(f"(?![\n\t])[{_CONTROLS}]")  # the same, newline and tab kept
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def clean_text(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD, so it can be encoded as UTF-8.

    (A Python string never holds a surrogate pair: ``json.loads`` joins a valid pair into one code point.)
    """
    return _SURROGATE.sub("\ufffd", text)


def _escape(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: str, limit: int = 200) -> str:
    """``text`` on one line and inert in a terminal: control characters (C0, DEL, C1), bidi controls,
    line separators and lone surrogates escaped (newline as ``\\n``), cut to ``limit`` characters plus
    ``...``; an escape is never cut in half."""
    out: List[str] = []
    room = limit
    pos = 0
    for match in [*_UNPRINTABLE.finditer(text), None]:
        plain = text[pos:match.start() if match else len(text)]
        if len(plain) > room:
            return "".join(out) + plain[:room] + "..."
        out.append(plain)
        room -= len(plain)
        if match is None:
            break
        escaped = _escape(match.group())
        if len(escaped) > room:
            return "".join(out) + "..."
        out.append(escaped)
        room -= len(escaped)
        pos = match.end()
    return "".join(out)


def visible(text: str, mark: Callable[[str], str] = str) -> str:
    """``text`` with each character :func:`printable` escapes, except newline and tab, replaced by its escape
    (``\\x1b``, ``\\u202e``) passed through ``mark`` (which may style it): for text shown on several lines,
    whole."""
    return _UNPRINTABLE_BUT_LINES.sub(lambda m: mark(_escape(m.group())), text)


def counted(n: int, noun: str, plural: str = "") -> str:
    """``n`` and the noun in the right number: ``1 probe``, ``2 probes``, ``0 probes``."""
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"
