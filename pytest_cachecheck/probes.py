"""Probe conversations: data model, file loading and validation.

A *probe* is a two-turn conversation.  Turn 1 (``messages``) ends with a user
message; the server's answer to it is appended as an assistant message, then the
turn-2 user message (``followup``) is sent twice: once so that it can be served
from the server's prompt/prefix cache and once on a recompute path.

Probe files are UTF-8 (optionally with a BOM), LF or CRLF, and either

* JSONL: one JSON object per line, blank lines ignored, or
* one JSON array of objects (the first non-whitespace character is ``[``).

Each record has one of two forms::

    {"id": "tea", "turn1": "...", "turn2": "..."}
    {"id": "tea", "messages": [{"role": "system", "content": "..."},
                               {"role": "user", "content": "..."}],
     "followup": "..."}

``id`` is optional; the default is ``"<file stem>-<line>"``.  Every problem in a
file raises :class:`ProbeFileError` naming the file, the line on which the
record starts and the offending field, before any probe is used.  Text is kept
exactly as written (no stripping, no normalisation, no newline conversion).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:
    from .outcomes import Expect

__all__ = [
    "MAX_FILE_BYTES",
    "MAX_ID_LENGTH",
    "ROLES",
    "Probe",
    "ProbeFileError",
    "builtin_probes",
    "load_probe_file",
    "load_probes",
    "parse_probe",
    "probe_set_fingerprint",
]

ROLES = ("system", "developer", "user", "assistant")

#: Largest probe file that is read (bytes).
MAX_FILE_BYTES = 64 * 1024 * 1024
#: Longest allowed probe id (characters).
MAX_ID_LENGTH = 200

_SHORT_FORM = ("turn1", "turn2")
_MESSAGES_FORM = ("messages", "followup")
_ALLOWED_FIELDS = ("id", "expect") + _SHORT_FORM + _MESSAGES_FORM
_ALLOWED_FIELDS_TEXT = ("allowed fields are 'id', 'turn1', 'turn2' or 'id', 'messages', 'followup', and 'expect' "
                        "(outcome checks) in either form")
_MESSAGE_KEYS = ("role", "content")
_JSON_WS = " \t\r\n"
_BOM = b"\xef\xbb\xbf"
_BUILTIN_LABEL = "builtin"
_BUILTIN_RESOURCE = "builtin_probes.jsonl"
#: the probe sets that ship with the plugin, by the name ``--cachecheck-probes`` takes instead of a path
NAMED_SETS = {"builtin": _BUILTIN_RESOURCE, "tasks": "tasks_probes.jsonl"}

PathArg = Union[str, "os.PathLike[str]"]


# --------------------------------------------------------------------------- errors


class ProbeFileError(ValueError):
    """A probe file (or one record in it) is invalid.

    ``str(err)`` is ``"{path}:{line}: field '{field}': {problem}"``; the line and
    field parts are left out when they are ``None`` (e.g. ``"x.jsonl: file is empty"``).
    """

    def __init__(self, path: str, line: int | None, field: str | None, problem: str) -> None:
        self.path = path
        self.line = line
        self.field = field
        self.problem = problem
        super().__init__(self._format())

    def _format(self) -> str:
        where = self.path if self.line is None else f"{self.path}:{self.line}"
        if self.field is not None:
            return f"{where}: field '{self.field}': {self.problem}"
        return f"{where}: {self.problem}"

    def __str__(self) -> str:
        return self._format()

    def __reduce__(self) -> Any:  # keep picklable (xdist, multiprocessing)
        return (type(self), (self.path, self.line, self.field, self.problem))


# --------------------------------------------------------------------------- model


def _canonical_json(obj: object) -> bytes:
    text = json.dumps(obj, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    # surrogatepass: a Probe built by hand (not loaded) may hold lone surrogates.
    return text.encode("utf-8", "surrogatepass")


def _sha256(obj: object) -> str:
    return "sha256:" + hashlib.sha256(_canonical_json(obj)).hexdigest()


@dataclass(frozen=True)
class Probe:
    """One two-turn probe conversation."""

    id: str
    #: ``(role, content)`` pairs up to and including the turn-1 user message.
    messages: tuple[tuple[str, str], ...]
    #: The turn-2 user message.
    followup: str
    #: Where the probe came from: ``"path:line"`` or ``"builtin:line"``.
    source: str
    #: The outcome checks of its turn-2 answer (the ``expect`` field), if any; not part of the fingerprint.
    expect: "Expect | None" = None

    def __post_init__(self) -> None:
        msgs = self.messages
        if not (isinstance(msgs, tuple) and all(isinstance(m, tuple) for m in msgs)):
            object.__setattr__(self, "messages", tuple(tuple(m) for m in msgs))

    def turn1_messages(self) -> list[dict[str, str]]:
        """The chat messages of turn 1, as sent to an OpenAI-style chat endpoint."""
        return [{"role": role, "content": content} for role, content in self.messages]

    def turn2_messages(self, answer: str) -> list[dict[str, str]]:
        """Turn-1 messages + the assistant's turn-1 ``answer`` + the follow-up user message."""
        return self.turn1_messages() + [
            {"role": "assistant", "content": answer},
            {"role": "user", "content": self.followup},
        ]

    def _content_dict(self) -> dict[str, Any]:
        return {
            "messages": [{"role": role, "content": content} for role, content in self.messages],
            "followup": self.followup,
        }

    @property
    def fingerprint(self) -> str:
        """``"sha256:<hex>"`` of the conversation text (messages + followup; not id/source)."""
        return _sha256(self._content_dict())

    def to_dict(self) -> dict[str, Any]:
        """``{"id", "messages": [{"role", "content"}, ...], "followup"}`` (JSON-serialisable)."""
        d: dict[str, Any] = {"id": self.id}
        d.update(self._content_dict())
        return d


def probe_set_fingerprint(probes: Iterable[Probe]) -> str:
    """``"sha256:<hex>"`` over the ids and fingerprints of ``probes``, in order."""
    return _sha256([[p.id, p.fingerprint] for p in probes])


# --------------------------------------------------------------------------- JSON helpers


class _JSONNumber:
    """A JSON number kept as text (never converted: avoids huge-int limits and cost)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


class _JSONObject(dict):  # type: ignore[type-arg]
    """A decoded JSON object that remembers keys which appeared more than once."""

    duplicate_keys: tuple[str, ...] = ()


def _object_pairs_hook(pairs: list[tuple[str, Any]]) -> _JSONObject:
    obj = _JSONObject()
    dups: list[str] = []
    for key, value in pairs:
        if key in obj and key not in dups:
            dups.append(key)
        obj[key] = value
    if dups:
        obj.duplicate_keys = tuple(dups)
    return obj


_DECODER = json.JSONDecoder(
    object_pairs_hook=_object_pairs_hook,
    parse_int=_JSONNumber,
    parse_float=_JSONNumber,
    parse_constant=_JSONNumber,
    strict=True,
)


def _describe(value: object) -> str:
    """Short, safe description of a value's JSON type (never recurses into it)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (_JSONNumber, int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"


def _quote(text: str, limit: int = 60) -> str:
    """Quote user text for an error message (escaped, single line, truncated)."""
    if len(text) > limit:
        text = text[:limit] + "..."
    return json.dumps(text, ensure_ascii=True)


def _key_name(key: object) -> str:
    """A field name for an error message; odd keys are shown JSON-quoted."""
    if (
        isinstance(key, str)
        and 0 < len(key) <= 64
        and key.isascii()
        and all(c.isalnum() or c in "_-" for c in key)
    ):
        return key
    return _quote(str(key), 64)


def _has_lone_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _bad_id_char(text: str) -> str | None:
    for ch in text:
        cat = unicodedata.category(ch)
        if cat in ("Cc", "Cs", "Zl", "Zp"):
            return ch
    return None


# --------------------------------------------------------------------------- record validation


class _RecordChecker:
    def __init__(self, path: str, line: int) -> None:
        self.path = path
        self.line = line

    def error(self, field: str | None, problem: str) -> ProbeFileError:
        return ProbeFileError(self.path, self.line, field, problem)

    def text(self, value: object, field: str, *, content: bool = False) -> str:
        if not isinstance(value, str):
            if content and isinstance(value, (list, tuple)):
                raise self.error(
                    field,
                    "only text content is supported: content must be a string, "
                    "not a list of content parts (images and other parts are not supported)",
                )
            raise self.error(field, f"must be a string, got {_describe(value)}")
        if not value:
            raise self.error(field, "must not be empty")
        if not value.strip():
            raise self.error(field, "must not be whitespace-only")
        if _has_lone_surrogate(value):
            raise self.error(
                field, "contains a lone UTF-16 surrogate (e.g. \\ud800), which is not valid text"
            )
        return value

    def ident(self, value: object) -> str:
        field = "id"
        if not isinstance(value, str):
            raise self.error(field, f"must be a string, got {_describe(value)}")
        if not value:
            raise self.error(field, "must not be empty")
        if len(value) > MAX_ID_LENGTH:
            raise self.error(field, f"is {len(value)} characters long; the limit is {MAX_ID_LENGTH}")
        if value.strip() != value:
            raise self.error(field, f"must not have leading or trailing whitespace: {_quote(value)}")
        bad = _bad_id_char(value)
        if bad is not None:
            raise self.error(
                field, f"must not contain control or line-break characters (found U+{ord(bad):04X})"
            )
        return value

    def duplicate_keys(self, obj: object, prefix: str) -> None:
        dups = getattr(obj, "duplicate_keys", ())
        if dups:
            raise self.error(prefix + _key_name(dups[0]), "appears more than once in the same JSON object")

    def messages(self, value: object) -> tuple[tuple[str, str], ...]:
        if not isinstance(value, (list, tuple)):
            raise self.error(
                "messages", f'must be a list of {{"role", "content"}} objects, got {_describe(value)}'
            )
        if not value:
            raise self.error("messages", "must not be empty (it must end with a user message)")
        out: list[tuple[str, str]] = []
        for i, msg in enumerate(value):
            base = f"messages[{i}]"
            if not isinstance(msg, dict):
                raise self.error(base, f"must be an object with 'role' and 'content', got {_describe(msg)}")
            self.duplicate_keys(msg, base + ".")
            for key in msg:
                if key in _MESSAGE_KEYS:
                    continue
                name = f"{base}.{_key_name(key)}"
                if key in ("tool_calls", "tool_call_id", "function_call"):
                    why = "tool calls are not supported"
                elif key in ("images", "image", "image_url", "audio"):
                    why = "images and other non-text inputs are not supported"
                else:
                    why = "unknown key"
                raise self.error(
                    name,
                    f"{why}; a message may only have 'role' and 'content' "
                    "(tool calls, names and images are not supported)",
                )
            for key in _MESSAGE_KEYS:
                if key not in msg:
                    raise self.error(f"{base}.{key}", "missing required key")
            role = msg["role"]
            if not isinstance(role, str):
                raise self.error(f"{base}.role", f"must be a string, got {_describe(role)}")
            if role not in ROLES:
                raise self.error(
                    f"{base}.role", f"unknown role {_quote(role)}; allowed roles are: {', '.join(ROLES)}"
                )
            content = self.text(msg["content"], f"{base}.content", content=True)
            out.append((role, content))
        last_role = out[-1][0]
        if last_role != "user":
            raise self.error(
                f"messages[{len(out) - 1}].role",
                f"the last message must have role 'user' (the turn-1 question), got {_quote(last_role)}",
            )
        return tuple(out)


def parse_probe(obj: object, *, path: str, line: int, default_id: str) -> Probe:
    """Validate one decoded record and build a :class:`Probe`.

    ``path``/``line`` locate the record for error messages and ``Probe.source``;
    ``default_id`` is used when the record has no ``id``.
    """
    chk = _RecordChecker(path, line)
    if not isinstance(obj, dict):
        raise chk.error(None, f"each probe must be a JSON object, got {_describe(obj)}")
    chk.duplicate_keys(obj, "")

    for key in obj:
        if key not in _ALLOWED_FIELDS:
            raise chk.error(_key_name(key), f"unknown field; {_ALLOWED_FIELDS_TEXT}")

    first_short = next((k for k in obj if k in _SHORT_FORM), None)
    first_msgs = next((k for k in obj if k in _MESSAGES_FORM), None)
    if first_short is not None and first_msgs is not None:
        keys = list(obj)
        first, second = sorted((first_short, first_msgs), key=keys.index)
        raise chk.error(
            second,
            f"cannot be combined with '{first}': use either 'turn1'/'turn2' or 'messages'/'followup'",
        )
    if first_short is None and first_msgs is None:
        raise chk.error(
            None,
            "missing fields: a probe needs 'turn1' and 'turn2', or 'messages' and 'followup'",
        )
    form = _SHORT_FORM if first_short is not None else _MESSAGES_FORM
    for key in form:
        if key not in obj:
            raise chk.error(key, "missing required field")

    probe_id = chk.ident(obj["id"]) if "id" in obj else default_id

    if form is _SHORT_FORM:
        turn1 = chk.text(obj["turn1"], "turn1")
        turn2 = chk.text(obj["turn2"], "turn2")
        messages: tuple[tuple[str, str], ...] = (("user", turn1),)
        followup = turn2
    else:
        messages = chk.messages(obj["messages"])
        followup = chk.text(obj["followup"], "followup")

    expect = read_expect(obj, chk, episode=False) if "expect" in obj else None
    return Probe(id=probe_id, messages=messages, followup=followup, source=f"{path}:{line}", expect=expect)


def read_expect(obj: dict, chk: _RecordChecker, *, episode: bool) -> "Expect":  # type: ignore[type-arg]
    """A record's ``expect`` field as outcome checks (:mod:`.outcomes`); errors name the file, line and field."""
    from .outcomes import parse_expect

    _nested_duplicates(obj["expect"], chk, "expect")
    value = plain_json(obj["expect"], path=chk.path, line=chk.line, field="expect")
    return parse_expect(value, chk.error, episode=episode)


def _nested_duplicates(value: object, chk: _RecordChecker, field: str) -> None:
    if isinstance(value, dict):
        chk.duplicate_keys(value, field + ".")
        for k, v in value.items():
            _nested_duplicates(v, chk, f"{field}.{_key_name(k)}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _nested_duplicates(v, chk, f"{field}[{i}]")


# --------------------------------------------------------------------------- file parsing


def _path_str(path: PathArg) -> str:
    return os.fsdecode(path)


def _read_bytes(path: str) -> bytes:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ProbeFileError(path, None, None, "file not found") from None
    except OSError as exc:
        raise ProbeFileError(path, None, None, f"cannot access file: {exc.strerror or exc}") from None
    except ValueError as exc:  # e.g. an embedded NUL character in the path
        raise ProbeFileError(path, None, None, f"invalid path: {exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise ProbeFileError(path, None, None, "is a directory, not a probe file")
    if st.st_size > MAX_FILE_BYTES:
        raise ProbeFileError(
            path, None, None, f"file is too large ({st.st_size} bytes; the limit is {MAX_FILE_BYTES} bytes)"
        )
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ProbeFileError(path, None, None, f"cannot read file: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise ProbeFileError(path, None, None, f"file is too large (the limit is {MAX_FILE_BYTES} bytes)")
    return data


def _decode(data: bytes, path: str) -> str:
    if data.startswith(_BOM):
        data = data[len(_BOM) :]
        offset = len(_BOM)
    else:
        offset = 0
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        line_start = data.rfind(b"\n", 0, exc.start) + 1
        column = exc.start - line_start + 1 + (offset if line == 1 else 0)
        bad = data[exc.start : exc.start + 1].hex()
        raise ProbeFileError(
            path,
            line,
            None,
            f"invalid UTF-8 (byte 0x{bad} at byte column {column}); probe files must be UTF-8 encoded",
        ) from None


def _json_error(path: str, line: int, column: int, msg: str, hint: str = "") -> ProbeFileError:
    return ProbeFileError(path, line, None, f"invalid JSON at column {column}: {msg}{hint}")


def _iter_jsonl(text: str, path: str) -> Iterator[tuple[int, object]]:
    for index, raw in enumerate(text.split("\n")):
        if not raw.strip():
            continue
        line = index + 1
        try:
            obj, end = _DECODER.raw_decode(raw, _skip_ws(raw, 0))
        except json.JSONDecodeError as exc:
            raise _json_error(path, line, exc.colno, exc.msg) from None
        except RecursionError:
            raise ProbeFileError(path, line, None, "invalid JSON: nested too deeply") from None
        except ValueError as exc:
            raise ProbeFileError(path, line, None, f"invalid JSON: {exc}") from None
        rest = _skip_ws(raw, end)
        if rest != len(raw):
            raise _json_error(
                path,
                line,
                rest + 1,
                "extra data after the JSON object",
                " (expected one JSON object per line)",
            )
        yield line, obj


def _skip_ws(text: str, pos: int) -> int:
    n = len(text)
    while pos < n and text[pos] in _JSON_WS:
        pos += 1
    return pos


class _LineCounter:
    """Maps string offsets to 1-based line numbers for increasing offsets."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.line = 1

    def line_at(self, pos: int) -> int:
        if pos > self.pos:
            self.line += self.text.count("\n", self.pos, pos)
            self.pos = pos
        return self.line


def _iter_array(text: str, path: str) -> Iterator[tuple[int, object]]:
    lines = _LineCounter(text)

    def col_of(pos: int) -> int:
        return pos - (text.rfind("\n", 0, pos) + 1) + 1

    def fail(pos: int, msg: str) -> ProbeFileError:
        return _json_error(path, lines.line_at(pos), col_of(pos), msg)

    pos = _skip_ws(text, 0)
    assert text[pos] == "["
    pos = _skip_ws(text, pos + 1)
    if pos < len(text) and text[pos] == "]":
        end = _skip_ws(text, pos + 1)
        if end != len(text):
            raise fail(end, "extra data after the JSON array")
        raise ProbeFileError(path, None, None, "file is empty (the JSON array has no elements)")
    while True:
        line = lines.line_at(pos)
        try:
            obj, pos = _DECODER.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise _json_error(path, exc.lineno, exc.colno, exc.msg) from None
        except RecursionError:
            raise ProbeFileError(path, line, None, "invalid JSON: nested too deeply") from None
        except ValueError as exc:
            raise ProbeFileError(path, line, None, f"invalid JSON: {exc}") from None
        yield line, obj
        pos = _skip_ws(text, pos)
        if pos >= len(text):
            raise fail(pos, "unexpected end of file: the JSON array is not closed with ']'")
        if text[pos] == ",":
            pos = _skip_ws(text, pos + 1)
            continue
        if text[pos] == "]":
            end = _skip_ws(text, pos + 1)
            if end != len(text):
                raise fail(
                    end,
                    "extra data after the JSON array (a file starting with '[' is read as one JSON array)",
                )
            return
        raise fail(pos, "expected ',' or ']' after an array element")


def _parse_text(text: str, path: str, id_stem: str) -> list[Probe]:
    start = _skip_ws(text, 0)
    records = _iter_array(text, path) if start < len(text) and text[start] == "[" else _iter_jsonl(text, path)
    probes: list[Probe] = []
    seen: dict[str, Probe] = {}
    for line, obj in records:
        probe = parse_probe(obj, path=path, line=line, default_id=f"{id_stem}-{line}")
        _check_unique(probe, seen, obj)
        probes.append(probe)
    if not probes:
        raise ProbeFileError(path, None, None, "file is empty (no probes found)")
    return probes


def _source_line(probe: Probe) -> int | None:
    _, _, tail = probe.source.rpartition(":")
    return int(tail) if tail.isdigit() else None


def _check_unique(probe: Probe, seen: dict[str, Probe], obj: object = None) -> None:
    first = seen.get(probe.id)
    if first is None:
        seen[probe.id] = probe
        return
    path, _, _ = probe.source.rpartition(":")
    explicit = obj is None or (isinstance(obj, dict) and "id" in obj)
    how = "" if explicit else " (the default id of a record without 'id'; give it an explicit id)"
    raise ProbeFileError(
        path,
        _source_line(probe),
        "id" if explicit else None,
        f"duplicate id {_quote(probe.id, 200)}{how}; first used at {first.source}",
    )


def _parse_bytes(data: bytes, path: str, id_stem: str) -> list[Probe]:
    return _parse_text(_decode(data, path), path, id_stem)


def load_probe_file(path: PathArg) -> list[Probe]:
    """Load and validate every probe in one file (JSONL or a JSON array)."""
    p = _path_str(path)
    return _parse_bytes(_read_bytes(p), p, Path(p).stem)


def load_probes(paths: Sequence[PathArg]) -> list[Probe]:
    """Load several probe files; ids must be unique across all of them."""
    if isinstance(paths, (str, bytes, os.PathLike)):
        paths = [paths]  # a single path, not a sequence of characters
    probes: list[Probe] = []
    seen: dict[str, Probe] = {}
    for path in paths:
        for probe in named_probes(path) if path in NAMED_SETS else load_probe_file(path):
            first = seen.get(probe.id)
            if first is not None:
                file_path, _, _ = probe.source.rpartition(":")
                line = _source_line(probe)
                if probe.id == f"{Path(file_path).stem}-{line}":
                    field, how = None, " (the default id of a record without 'id'; give it an explicit id)"
                else:
                    field, how = "id", ""
                raise ProbeFileError(
                    file_path,
                    line,
                    field,
                    f"duplicate id {_quote(probe.id, 200)}{how}; already used at {first.source}",
                )
            seen[probe.id] = probe
            probes.append(probe)
    return probes


def _builtin_bytes() -> bytes:
    try:
        from importlib.resources import files

        return files("pytest_cachecheck").joinpath("data").joinpath(_BUILTIN_RESOURCE).read_bytes()
    except (ImportError, TypeError, AttributeError, OSError, ValueError):
        return (Path(__file__).resolve().parent / "data" / _BUILTIN_RESOURCE).read_bytes()


_builtin_cache: tuple[Probe, ...] | None = None


def builtin_probes() -> list[Probe]:
    """The 20 built-in probes shipped in ``data/builtin_probes.jsonl`` (source ``builtin:<line>``)."""
    global _builtin_cache
    if _builtin_cache is None:
        _builtin_cache = tuple(_parse_bytes(_builtin_bytes(), _BUILTIN_LABEL, _BUILTIN_LABEL))
    return list(_builtin_cache)


def named_probes(name: str) -> list[Probe]:
    """A probe set that ships with the plugin (:data:`NAMED_SETS`): ``builtin``, the 20 open-ended
    conversations, or ``tasks``, two-turn tasks whose answers carry outcome checks (source ``<name>:<line>``)."""
    if name == _BUILTIN_LABEL:
        return builtin_probes()
    return _parse_bytes(read_resource(NAMED_SETS[name]), name, name)


def read_records(path: PathArg, data: bytes | None = None) -> Iterator[tuple[str, int, object]]:
    """``(path, line, decoded JSON object)`` of every record in a JSONL or JSON-array file (or of
    ``data``, labelled ``path``), with the checks and error messages of probe files (for other record
    kinds: episodes). Numbers are decoded to int or float."""
    p = _path_str(path)
    text = _decode(_read_bytes(p) if data is None else data, p)
    start = _skip_ws(text, 0)
    records = _iter_array(text, p) if start < len(text) and text[start] == "[" else _iter_jsonl(text, p)
    for line, obj in records:
        yield p, line, obj


def read_resource(name: str) -> bytes:
    """A data file shipped with the package (``pytest_cachecheck/data/<name>``)."""
    try:
        from importlib.resources import files

        return files("pytest_cachecheck").joinpath("data").joinpath(name).read_bytes()
    except (ImportError, TypeError, AttributeError, OSError, ValueError):
        return (Path(__file__).resolve().parent / "data" / name).read_bytes()


def plain_json(obj: object, *, path: str, line: int, field: str) -> Any:
    """A decoded record with its numbers as int or float (at most 30 characters each; NaN and
    Infinity refused) and its objects as plain dicts; ProbeFileError names the field otherwise."""
    if isinstance(obj, _JSONNumber):
        text = obj.text
        if len(text) > 30 or text in ("NaN", "Infinity", "-Infinity") or (
                any(c in text for c in ".eE") and not math.isfinite(float(text))):  # 1e400 is Infinity too
            raise ProbeFileError(path, line, field, f"the number {_quote(text, 30)} is not allowed here")
        return float(text) if any(c in text for c in ".eE") else int(text)
    if isinstance(obj, dict):
        return {k: plain_json(v, path=path, line=line, field=f"{field}.{_key_name(k)}" if field else _key_name(k))
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [plain_json(v, path=path, line=line, field=f"{field}[{i}]") for i, v in enumerate(obj)]
    return obj
