"""Tests for pytest_cachecheck.probes: data model, file format rules, built-ins, fuzzing."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_cachecheck.probes import (
    MAX_FILE_BYTES,
    ROLES,
    Probe,
    ProbeFileError,
    builtin_probes,
    load_probe_file,
    load_probes,
    parse_probe,
    probe_set_fingerprint,
)

REPO = Path(__file__).resolve().parents[1]

SHORT = {"turn1": "Explain tides in four sentences.", "turn2": "Now one sentence."}
MSGS = {
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Explain tides in four sentences."},
    ],
    "followup": "Now one sentence.",
}


def write(tmp_path: Path, content: str | bytes, name: str = "probes.jsonl") -> str:
    p = tmp_path / name
    if isinstance(content, str):
        content = content.encode("utf-8")
    p.write_bytes(content)
    return str(p)


def jsonl(*records: Any) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def load_error(tmp_path: Path, content: str | bytes, name: str = "probes.jsonl") -> ProbeFileError:
    path = write(tmp_path, content, name)
    with pytest.raises(ProbeFileError) as info:
        load_probe_file(path)
    err = info.value
    assert str(err).startswith(path)
    assert err.path == path
    return err


def record_error(tmp_path: Path, record: Any, line: int = 1) -> ProbeFileError:
    """Put `record` on line `line` (after valid records) and return the error."""
    before = [dict(SHORT, id=f"ok-{i}") for i in range(line - 1)]
    return load_error(tmp_path, jsonl(*before, record))


# --------------------------------------------------------------------------- model


class TestProbeModel:
    def test_short_form(self, tmp_path: Path) -> None:
        path = write(tmp_path, jsonl(dict(SHORT, id="tides")))
        [p] = load_probe_file(path)
        assert p == Probe(
            id="tides",
            messages=(("user", "Explain tides in four sentences."),),
            followup="Now one sentence.",
            source=f"{path}:1",
        )
        assert p.turn1_messages() == [{"role": "user", "content": "Explain tides in four sentences."}]
        assert p.turn2_messages("Tides come from the Moon.") == [
            {"role": "user", "content": "Explain tides in four sentences."},
            {"role": "assistant", "content": "Tides come from the Moon."},
            {"role": "user", "content": "Now one sentence."},
        ]

    def test_messages_form(self, tmp_path: Path) -> None:
        path = write(tmp_path, jsonl(dict(MSGS, id="m")))
        [p] = load_probe_file(path)
        assert p.messages == (("system", "Be brief."), ("user", "Explain tides in four sentences."))
        assert p.followup == "Now one sentence."
        assert p.to_dict() == {"id": "m", **MSGS}
        json.dumps(p.to_dict())  # serialisable
        assert p.turn2_messages("A")[-2:] == [
            {"role": "assistant", "content": "A"},
            {"role": "user", "content": "Now one sentence."},
        ]

    def test_turn_messages_are_fresh_lists(self) -> None:
        p = Probe("x", (("user", "q"),), "f", "s:1")
        a = p.turn1_messages()
        a[0]["content"] = "changed"
        assert p.turn1_messages()[0]["content"] == "q"

    def test_messages_normalised_to_tuples(self) -> None:
        p = Probe("x", [["user", "q"]], "f", "s:1")  # type: ignore[arg-type]
        assert p.messages == (("user", "q"),)
        hash(p)

    def test_fingerprint(self) -> None:
        a = Probe("a", (("user", "q"),), "f", "x:1")
        b = Probe("b", (("user", "q"),), "f", "y:9")
        assert a.fingerprint == b.fingerprint  # id/source are not part of it
        assert a.fingerprint.startswith("sha256:") and len(a.fingerprint) == 7 + 64
        assert Probe("a", (("user", "q "),), "f", "x:1").fingerprint != a.fingerprint
        assert Probe("a", (("user", "q"),), "f\r\n", "x:1").fingerprint != a.fingerprint
        assert Probe("a", (("system", "q"), ("user", "q")), "f", "x:1").fingerprint != a.fingerprint
        # the short form and the equivalent messages form are the same conversation
        assert Probe("a", (("user", "q"),), "f", "x:1").fingerprint == a.fingerprint

    def test_fingerprint_short_form_equals_messages_form(self, tmp_path: Path) -> None:
        path = write(
            tmp_path,
            jsonl(
                {"id": "a", "turn1": "q", "turn2": "f"},
                {"id": "b", "messages": [{"role": "user", "content": "q"}], "followup": "f"},
            ),
        )
        a, b = load_probe_file(path)
        assert a.fingerprint == b.fingerprint

    def test_probe_set_fingerprint(self) -> None:
        a = Probe("a", (("user", "q"),), "f", "x:1")
        b = Probe("b", (("user", "r"),), "f", "x:2")
        fp = probe_set_fingerprint([a, b])
        assert fp.startswith("sha256:")
        assert fp == probe_set_fingerprint((a, b))
        assert fp != probe_set_fingerprint([b, a])
        assert fp != probe_set_fingerprint([a])
        assert fp != probe_set_fingerprint([Probe("c", a.messages, a.followup, a.source), b])
        assert fp == probe_set_fingerprint([Probe("a", a.messages, a.followup, "elsewhere:5"), b])

    def test_probe_is_frozen_and_hashable(self) -> None:
        p = Probe("a", (("user", "q"),), "f", "x:1")
        with pytest.raises(dataclasses.FrozenInstanceError):
            p.id = "b"  # type: ignore[misc]
        assert len({p, Probe("a", (("user", "q"),), "f", "x:1")}) == 1

    def test_roles(self) -> None:
        assert ROLES == ("system", "developer", "user", "assistant")

    def test_error_str_and_attributes(self) -> None:
        e = ProbeFileError("f.jsonl", 3, "messages[0].role", "bad")
        assert str(e) == "f.jsonl:3: field 'messages[0].role': bad"
        assert (e.path, e.line, e.field, e.problem) == ("f.jsonl", 3, "messages[0].role", "bad")
        assert isinstance(e, ValueError)
        assert str(ProbeFileError("f.jsonl", None, None, "file is empty")) == "f.jsonl: file is empty"
        assert str(ProbeFileError("f.jsonl", 2, None, "x")) == "f.jsonl:2: x"
        assert str(ProbeFileError("f.jsonl", None, "id", "x")) == "f.jsonl: field 'id': x"
        again = pickle.loads(pickle.dumps(e))
        assert str(again) == str(e) and again.field == e.field

    def test_parse_probe_directly(self) -> None:
        p = parse_probe(dict(SHORT), path="mem", line=7, default_id="mem-7")
        assert p.id == "mem-7" and p.source == "mem:7"
        with pytest.raises(ProbeFileError) as info:
            parse_probe(["x"], path="mem", line=7, default_id="mem-7")
        assert str(info.value) == "mem:7: each probe must be a JSON object, got a list"
        with pytest.raises(ProbeFileError) as info:
            parse_probe({"turn1": 5, "turn2": "x"}, path="mem", line=2, default_id="d")
        assert str(info.value) == "mem:2: field 'turn1': must be a string, got a number"


# --------------------------------------------------------------------------- file-level rules


class TestFileLevel:
    def test_missing_file(self, tmp_path: Path) -> None:
        path = str(tmp_path / "nope.jsonl")
        with pytest.raises(ProbeFileError) as info:
            load_probe_file(path)
        assert str(info.value) == f"{path}: file not found"
        assert info.value.line is None and info.value.field is None

    def test_directory(self, tmp_path: Path) -> None:
        with pytest.raises(ProbeFileError) as info:
            load_probe_file(tmp_path)
        assert str(info.value) == f"{tmp_path}: is a directory, not a probe file"

    @pytest.mark.skipif(
        sys.platform == "win32" or (hasattr(os, "geteuid") and os.geteuid() == 0),
        reason="permissions are not enforced for root / on Windows",
    )
    def test_unreadable(self, tmp_path: Path) -> None:
        path = write(tmp_path, jsonl(SHORT))
        os.chmod(path, 0)
        try:
            with pytest.raises(ProbeFileError) as info:
                load_probe_file(path)
            assert str(info.value).startswith(f"{path}: cannot read file")
        finally:
            os.chmod(path, 0o644)

    def test_unreadable_simulated(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        path = write(tmp_path, jsonl(SHORT))
        import builtins

        real_open = builtins.open

        def fake_open(file: Any, *args: Any, **kwargs: Any) -> Any:
            if str(file) == path:
                raise PermissionError(13, "Permission denied", path)
            return real_open(file, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", fake_open)
        with pytest.raises(ProbeFileError) as info:
            load_probe_file(path)
        assert str(info.value) == f"{path}: cannot read file: Permission denied"

    @pytest.mark.parametrize(
        "content",
        [b"", b"\n\n  \n", b"\r\n\t\r\n", b"\xef\xbb\xbf", b"\xef\xbb\xbf\n \n"],
        ids=["empty", "blank-lines", "crlf-blank", "bom-only", "bom-blank"],
    )
    def test_empty_file(self, tmp_path: Path, content: bytes) -> None:
        err = load_error(tmp_path, content)
        assert str(err) == f"{err.path}: file is empty (no probes found)"

    @pytest.mark.parametrize("content", ["[]", "[ ]\n", "\n [\n\n]\n", "\ufeff[]"])
    def test_empty_array(self, tmp_path: Path, content: str) -> None:
        err = load_error(tmp_path, content)
        assert str(err) == f"{err.path}: file is empty (the JSON array has no elements)"

    def test_too_large(self, tmp_path: Path) -> None:
        path = tmp_path / "big.jsonl"
        with open(path, "wb") as fh:
            fh.truncate(MAX_FILE_BYTES + 1)  # sparse file
        with pytest.raises(ProbeFileError) as info:
            load_probe_file(path)
        assert str(info.value) == (
            f"{path}: file is too large ({MAX_FILE_BYTES + 1} bytes; the limit is {MAX_FILE_BYTES} bytes)"
        )

    def test_nul_in_path(self, tmp_path: Path) -> None:
        path = str(tmp_path / "a\x00b.jsonl")
        with pytest.raises(ProbeFileError) as info:
            load_probe_file(path)
        assert str(info.value) == f"{path}: invalid path: embedded null byte"

    def test_pathlike_accepted(self, tmp_path: Path) -> None:
        path = Path(write(tmp_path, jsonl(SHORT)))
        [p] = load_probe_file(path)
        assert p.source == f"{path}:1"

    def test_invalid_utf8_names_line(self, tmp_path: Path) -> None:
        content = jsonl(dict(SHORT, id="a")).encode() + b'{"turn1": "caf\xe9", "turn2": "x"}\n'
        err = load_error(tmp_path, content)
        assert err.line == 2 and err.field is None
        assert str(err) == (
            f"{err.path}:2: invalid UTF-8 (byte 0xe9 at byte column 15); probe files must be UTF-8 encoded"
        )

    def test_utf16_file_rejected(self, tmp_path: Path) -> None:
        err = load_error(tmp_path, jsonl(SHORT).encode("utf-16"))
        assert err.line == 1 and "invalid UTF-8" in err.problem

    def test_bad_json_names_line_and_column(self, tmp_path: Path) -> None:
        err = load_error(tmp_path, jsonl(SHORT) + '{"turn1": "a", "turn2": }\n')
        assert str(err) == f"{err.path}:2: invalid JSON at column 25: Expecting value"

    def test_bad_json_unterminated_string(self, tmp_path: Path) -> None:
        err = load_error(tmp_path, '\n\n{"turn1": "a\n')
        assert err.line == 3 and err.problem.startswith("invalid JSON at column 11: Unterminated string")

    def test_raw_control_character_in_string_is_bad_json(self, tmp_path: Path) -> None:
        err = load_error(tmp_path, '{"turn1": "a\tb", "turn2": "x"}\n')
        assert err.line == 1 and "Invalid control character" in err.problem

    def test_two_objects_on_one_line(self, tmp_path: Path) -> None:
        err = load_error(tmp_path, json.dumps(SHORT) + " " + json.dumps(SHORT) + "\n")
        col = len(json.dumps(SHORT)) + 2
        assert str(err) == (
            f"{err.path}:1: invalid JSON at column {col}: extra data after the JSON object "
            "(expected one JSON object per line)"
        )

    def test_pretty_printed_object_is_not_jsonl(self, tmp_path: Path) -> None:
        err = load_error(tmp_path, json.dumps(SHORT, indent=2))
        assert err.line == 1 and err.problem.startswith("invalid JSON at column 2:")

    @pytest.mark.parametrize(
        "line, kind",
        [
            ("42", "a number"),
            ('"text"', "a string"),
            ("null", "null"),
            ("true", "a boolean"),
            ("[1, 2]", "a list"),
        ],
    )
    def test_non_object_values(self, tmp_path: Path, line: str, kind: str) -> None:
        # "[1, 2]" on line 2 is a nested list inside JSONL (the file does not start with '[')
        err = load_error(tmp_path, jsonl(SHORT) + line + "\n")
        assert str(err) == f"{err.path}:2: each probe must be a JSON object, got {kind}"

    def test_deep_nesting(self, tmp_path: Path) -> None:
        err = load_error(tmp_path, jsonl(SHORT) + "[" * 200_000 + "]" * 200_000 + "\n")
        assert str(err) == f"{err.path}:2: invalid JSON: nested too deeply"

    def test_deep_nesting_inside_field(self, tmp_path: Path) -> None:
        deep = '{"a":' * 100_000 + "1" + "}" * 100_000
        err = load_error(tmp_path, '{"turn1": ' + deep + ', "turn2": "x"}\n')
        assert str(err) == f"{err.path}:1: invalid JSON: nested too deeply"

    def test_moderately_deep_value_is_a_type_error(self, tmp_path: Path) -> None:
        deep = "[" * 500 + "]" * 500
        err = load_error(tmp_path, '{"turn1": ' + deep + ', "turn2": "x"}\n')
        assert str(err) == f"{err.path}:1: field 'turn1': must be a string, got a list"

    @pytest.mark.parametrize("number", ["9" * 100_000, "1e999999", "-0.5e-99999", "NaN", "-Infinity"])
    def test_huge_numbers(self, tmp_path: Path, number: str) -> None:
        err = load_error(tmp_path, '{"turn1": ' + number + ', "turn2": "x"}\n')
        assert str(err) == f"{err.path}:1: field 'turn1': must be a string, got a number"

    def test_huge_number_as_record(self, tmp_path: Path) -> None:
        err = load_error(tmp_path, "9" * 100_000 + "\n")
        assert str(err) == f"{err.path}:1: each probe must be a JSON object, got a number"

    def test_very_long_line(self, tmp_path: Path) -> None:
        text = "word " * 400_000 + "end?"
        [p] = load_probe_file(write(tmp_path, jsonl({"turn1": text, "turn2": "ok"})))
        assert p.messages[0][1] == text


# --------------------------------------------------------------------------- encodings / layout


class TestLayout:
    def test_bom(self, tmp_path: Path) -> None:
        path = write(tmp_path, b"\xef\xbb\xbf" + jsonl(dict(SHORT, id="a"), dict(SHORT, id="b")).encode())
        assert [p.id for p in load_probe_file(path)] == ["a", "b"]

    def test_bom_error_columns(self, tmp_path: Path) -> None:
        err = load_error(tmp_path, b'\xef\xbb\xbf{"turn1": }\n')
        assert str(err) == f"{err.path}:1: invalid JSON at column 11: Expecting value"

    def test_crlf(self, tmp_path: Path) -> None:
        content = jsonl(dict(SHORT, id="a"), dict(MSGS, id="b")).replace("\n", "\r\n")
        a, b = load_probe_file(write(tmp_path, content))
        assert a.messages[0][1] == SHORT["turn1"] and a.followup == SHORT["turn2"]
        assert b.source.endswith(":2")

    def test_mixed_line_endings_and_blank_lines(self, tmp_path: Path) -> None:
        content = (
            "\r\n  \n"
            + json.dumps(dict(SHORT, id="a"))
            + "\r\n\t\r\n\n"
            + json.dumps(dict(SHORT, id="b"))
            + "\n   \n"
            + json.dumps(SHORT)
        )  # no newline at end of file
        probes = load_probe_file(write(tmp_path, b"\xef\xbb\xbf" + content.encode(), "mix.jsonl"))
        assert [(p.id, p.source.rsplit(":", 1)[1]) for p in probes] == [
            ("a", "3"),
            ("b", "6"),
            ("mix-8", "8"),
        ]

    def test_error_line_counts_blank_lines(self, tmp_path: Path) -> None:
        err = load_error(tmp_path, "\n\r\n" + json.dumps(SHORT) + "\r\n\n" + '{"turn1": "x"}\r\n')
        assert str(err) == f"{err.path}:5: field 'turn2': missing required field"

    def test_array_form(self, tmp_path: Path) -> None:
        content = (
            "\ufeff  [\r\n"
            + "  "
            + json.dumps(dict(SHORT, id="a"))
            + ",\r\n"
            + "\r\n"
            + json.dumps(dict(MSGS, id="b"), indent=2).replace("\n", "\r\n")
            + ",\n"
            + "  "
            + json.dumps(SHORT)
            + "\n"
            + "]\n\n"
        )
        path = write(tmp_path, content, "arr.json")
        probes = load_probe_file(path)
        assert [p.id for p in probes] == ["a", "b", "arr-18"]
        assert [p.source for p in probes] == [f"{path}:2", f"{path}:4", f"{path}:18"]

    def test_array_form_error_names_element_start_line(self, tmp_path: Path) -> None:
        bad = {
            "id": "c",
            "messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "x"}],
            "followup": "f",
        }
        elements = [dict(SHORT, id="a"), dict(SHORT, id="b"), bad]
        content = "[\n" + ",\n".join(json.dumps(e, indent=2) for e in elements) + "\n]\n"
        expected_line = content.split(json.dumps(bad, indent=2))[0].count("\n") + 1
        assert expected_line == 12
        err = load_error(tmp_path, content, "arr.json")
        assert str(err) == (
            f"{err.path}:12: field 'messages[1].role': unknown role \"tool\"; "
            "allowed roles are: system, developer, user, assistant"
        )

    def test_array_form_one_line(self, tmp_path: Path) -> None:
        content = json.dumps([dict(SHORT, id="a"), dict(SHORT, id="b")])
        assert [p.source.rsplit(":", 1)[1] for p in load_probe_file(write(tmp_path, content))] == ["1", "1"]

    def test_array_form_default_ids_use_start_line(self, tmp_path: Path) -> None:
        content = "[\n" + json.dumps(SHORT) + ",\n\n" + json.dumps(SHORT) + "]"
        probes = load_probe_file(write(tmp_path, content, "set.json"))
        assert [p.id for p in probes] == ["set-2", "set-4"]

    def test_array_bad_json_element(self, tmp_path: Path) -> None:
        err = load_error(tmp_path, "[\n" + json.dumps(SHORT) + ',\n\n  {"turn1": x}\n]')
        assert str(err) == f"{err.path}:4: invalid JSON at column 13: Expecting value"

    def test_array_trailing_comma(self, tmp_path: Path) -> None:
        err = load_error(tmp_path, "[\n" + json.dumps(SHORT) + ",\n]\n")
        assert str(err) == f"{err.path}:3: invalid JSON at column 1: Expecting value"

    def test_array_not_closed(self, tmp_path: Path) -> None:
        err = load_error(tmp_path, "[\n" + json.dumps(SHORT) + "\n")
        assert str(err) == (
            f"{err.path}:3: invalid JSON at column 1: unexpected end of file: the JSON array is not closed with ']'"
        )

    def test_array_missing_comma(self, tmp_path: Path) -> None:
        err = load_error(tmp_path, "[\n" + json.dumps(SHORT) + "\n" + json.dumps(SHORT) + "]")
        assert (
            str(err) == f"{err.path}:3: invalid JSON at column 1: expected ',' or ']' after an array element"
        )

    def test_array_followed_by_more_data(self, tmp_path: Path) -> None:
        err = load_error(tmp_path, json.dumps([SHORT]) + "\n" + json.dumps(SHORT) + "\n")
        assert err.line == 2 and err.problem.startswith(
            "invalid JSON at column 1: extra data after the JSON array"
        )

    def test_array_of_non_objects(self, tmp_path: Path) -> None:
        err = load_error(tmp_path, "[\n" + json.dumps(SHORT) + ",\n  [" + json.dumps(SHORT) + "]\n]")
        assert str(err) == f"{err.path}:3: each probe must be a JSON object, got a list"

    def test_array_deep_nesting(self, tmp_path: Path) -> None:
        err = load_error(tmp_path, "[\n" + json.dumps(SHORT) + ",\n" + "[" * 100_000 + "]" * 100_000 + "]")
        assert str(err) == f"{err.path}:3: invalid JSON: nested too deeply"


# --------------------------------------------------------------------------- exact text


class TestExactText:
    @pytest.mark.parametrize(
        "text",
        [
            "  leading and trailing spaces  ",
            "\ttab first",
            "carriage\rreturn inside",
            "windows\r\nline end inside\r\n",
            "trailing newline\n",
            "e\u0301 decomposed vs \u00e9 composed",  # no NFC/NFD normalisation
            "\ufb01 ligature, \u212b angstrom sign, \uff21 fullwidth",
            "emoji \U0001f375\U0001f6b2 and ZWJ \U0001f469\u200d\U0001f52c",
            "\u05e9\u05dc\u05d5\u05dd RTL \u202bembedded\u202c \u0645\u0631\u062d\u0628\u0627",
            "line\u2028separator and\u2029paragraph and \x85 NEL and \x0b VT \x0c FF",
            "zero\u200bwidth \ufeff BOM inside \u00a0nbsp",
            "nul \x00 byte and \x7f del",
            'quotes " and backslash \\ and slash /',
        ],
    )
    def test_preserved(self, tmp_path: Path, text: str) -> None:
        rec = {
            "id": "x",
            "messages": [{"role": "system", "content": text}, {"role": "user", "content": text}],
            "followup": text,
        }
        for ensure_ascii in (True, False):
            content = json.dumps(rec, ensure_ascii=ensure_ascii) + "\r\n"
            [p] = load_probe_file(write(tmp_path, content))
            assert p.messages == (("system", text), ("user", text))
            assert p.followup == text
            [q] = load_probe_file(write(tmp_path, jsonl({"turn1": text, "turn2": text})))
            assert q.messages == (("user", text),) and q.followup == text
            assert p.to_dict()["followup"] == text

    def test_escaped_crlf_not_converted(self, tmp_path: Path) -> None:
        content = '{"turn1": "a\\r\\nb\\rc\\n", "turn2": " x "}\r\n'
        [p] = load_probe_file(write(tmp_path, content))
        assert p.messages[0][1] == "a\r\nb\rc\n" and p.followup == " x "


# --------------------------------------------------------------------------- record rules


class TestRecordRules:
    def test_unknown_field(self, tmp_path: Path) -> None:
        err = record_error(tmp_path, dict(SHORT, temperature=0), line=3)
        assert str(err) == (
            f"{err.path}:3: field 'temperature': unknown field; "
            "allowed fields are 'id', 'turn1', 'turn2' or 'id', 'messages', 'followup', and 'expect' "
            "(outcome checks) in either form"
        )
        assert (err.line, err.field) == (3, "temperature")

    def test_unknown_field_odd_name_is_quoted(self, tmp_path: Path) -> None:
        err = record_error(tmp_path, dict(SHORT, **{"we'ird\nkey": 1}))
        assert err.field == '"we\'ird\\nkey"'

    @pytest.mark.parametrize(
        "record, field, other",
        [
            (
                {"turn1": "a", "messages": [{"role": "user", "content": "q"}], "followup": "f"},
                "messages",
                "turn1",
            ),
            (
                {"messages": [{"role": "user", "content": "q"}], "turn2": "a", "followup": "f"},
                "turn2",
                "messages",
            ),
            ({"turn1": "a", "turn2": "b", "followup": "f"}, "followup", "turn1"),
        ],
    )
    def test_mixed_forms(self, tmp_path: Path, record: dict, field: str, other: str) -> None:
        err = record_error(tmp_path, record, line=2)
        assert str(err) == (
            f"{err.path}:2: field '{field}': cannot be combined with '{other}': "
            "use either 'turn1'/'turn2' or 'messages'/'followup'"
        )

    @pytest.mark.parametrize(
        "record, field",
        [
            ({"turn1": "a"}, "turn2"),
            ({"turn2": "a"}, "turn1"),
            ({"id": "x", "messages": [{"role": "user", "content": "q"}]}, "followup"),
            ({"followup": "f"}, "messages"),
        ],
    )
    def test_missing_field(self, tmp_path: Path, record: dict, field: str) -> None:
        err = record_error(tmp_path, record, line=2)
        assert str(err) == f"{err.path}:2: field '{field}': missing required field"

    def test_no_form_fields(self, tmp_path: Path) -> None:
        for rec in ({"id": "x"}, {}):
            err = record_error(tmp_path, rec)
            assert str(err) == (
                f"{err.path}:1: missing fields: a probe needs 'turn1' and 'turn2', or 'messages' and 'followup'"
            )

    def test_duplicate_json_key(self, tmp_path: Path) -> None:
        err = load_error(tmp_path, '{"turn1": "a", "turn2": "b", "turn1": "c"}\n')
        assert str(err) == f"{err.path}:1: field 'turn1': appears more than once in the same JSON object"
        err = load_error(
            tmp_path, '{"messages": [{"role": "user", "role": "user", "content": "q"}], "followup": "f"}\n'
        )
        assert (
            str(err)
            == f"{err.path}:1: field 'messages[0].role': appears more than once in the same JSON object"
        )

    @pytest.mark.parametrize("field", ["turn1", "turn2"])
    @pytest.mark.parametrize(
        "value, problem",
        [
            ("", "must not be empty"),
            (" \r\n\t\u3000", "must not be whitespace-only"),
            (None, "must be a string, got null"),
            (3, "must be a string, got a number"),
            (1.5, "must be a string, got a number"),
            (False, "must be a string, got a boolean"),
            (["a"], "must be a string, got a list"),
            ({"a": 1}, "must be a string, got an object"),
        ],
    )
    def test_short_form_text_fields(self, tmp_path: Path, field: str, value: Any, problem: str) -> None:
        err = record_error(tmp_path, dict(SHORT, **{field: value}), line=2)
        assert str(err) == f"{err.path}:2: field '{field}': {problem}"

    @pytest.mark.parametrize(
        "value, problem",
        [
            ("", "must not be empty"),
            ("  ", "must not be whitespace-only"),
            (7, "must be a string, got a number"),
        ],
    )
    def test_followup(self, tmp_path: Path, value: Any, problem: str) -> None:
        err = record_error(tmp_path, dict(MSGS, followup=value))
        assert str(err) == f"{err.path}:1: field 'followup': {problem}"

    def test_lone_surrogate_rejected(self, tmp_path: Path) -> None:
        err = load_error(tmp_path, '{"turn1": "a\\ud800b", "turn2": "x"}\n')
        assert err.field == "turn1" and "lone UTF-16 surrogate" in err.problem
        # a properly escaped surrogate pair is fine
        [p] = load_probe_file(write(tmp_path, '{"turn1": "tea \\ud83c\\udf75", "turn2": "x"}\n'))
        assert p.messages[0][1] == "tea \U0001f375"

    # ---- id

    @pytest.mark.parametrize(
        "value, problem",
        [
            ("", "must not be empty"),
            (" tea", 'must not have leading or trailing whitespace: " tea"'),
            ("tea\t", 'must not have leading or trailing whitespace: "tea\\t"'),
            ("a" * 201, "is 201 characters long; the limit is 200"),
            ("te\x00a", "must not contain control or line-break characters (found U+0000)"),
            ("te\na", "must not contain control or line-break characters (found U+000A)"),
            ("te\x7fa", "must not contain control or line-break characters (found U+007F)"),
            ("te\u2028a", "must not contain control or line-break characters (found U+2028)"),
            (12, "must be a string, got a number"),
            (None, "must be a string, got null"),
            (["a"], "must be a string, got a list"),
        ],
    )
    def test_bad_id(self, tmp_path: Path, value: Any, problem: str) -> None:
        err = record_error(tmp_path, dict(SHORT, id=value), line=4)
        assert str(err) == f"{err.path}:4: field 'id': {problem}"

    @pytest.mark.parametrize("value", ["a", "a" * 200, "tea steeping", "th\u00e9-\U0001f375", "x/y:z"])
    def test_good_id(self, tmp_path: Path, value: str) -> None:
        [p] = load_probe_file(write(tmp_path, jsonl(dict(SHORT, id=value))))
        assert p.id == value

    def test_default_ids(self, tmp_path: Path) -> None:
        content = "\n" + jsonl(SHORT, dict(SHORT, id="named")) + "\n\n" + jsonl(MSGS)
        probes = load_probe_file(write(tmp_path, content, "my.probes.jsonl"))
        assert [p.id for p in probes] == ["my.probes-2", "named", "my.probes-6"]

    def test_duplicate_id_within_file(self, tmp_path: Path) -> None:
        err = load_error(tmp_path, jsonl(dict(SHORT, id="a"), dict(SHORT, id="b"), dict(MSGS, id="a")))
        assert str(err) == f"{err.path}:3: field 'id': duplicate id \"a\"; first used at {err.path}:1"

    def test_explicit_id_clashes_with_default_id(self, tmp_path: Path) -> None:
        err = load_error(tmp_path, jsonl(SHORT, dict(SHORT, id="p-1")), "p.jsonl")
        assert str(err) == f"{err.path}:2: field 'id': duplicate id \"p-1\"; first used at {err.path}:1"
        err = load_error(tmp_path, jsonl(dict(SHORT, id="p-2"), SHORT), "p.jsonl")
        assert str(err) == (
            f"{err.path}:2: duplicate id \"p-2\" (the default id of a record without 'id'; "
            f"give it an explicit id); first used at {err.path}:1"
        )

    # ---- messages

    @pytest.mark.parametrize(
        "value, problem",
        [
            ([], "must not be empty (it must end with a user message)"),
            ("hello", 'must be a list of {"role", "content"} objects, got a string'),
            (
                {"role": "user", "content": "q"},
                'must be a list of {"role", "content"} objects, got an object',
            ),
            (None, 'must be a list of {"role", "content"} objects, got null'),
        ],
    )
    def test_messages_container(self, tmp_path: Path, value: Any, problem: str) -> None:
        err = record_error(tmp_path, dict(MSGS, messages=value), line=2)
        assert str(err) == f"{err.path}:2: field 'messages': {problem}"

    def test_message_not_object(self, tmp_path: Path) -> None:
        err = record_error(tmp_path, dict(MSGS, messages=[{"role": "user", "content": "q"}, "hi"]))
        assert str(err) == (
            f"{err.path}:1: field 'messages[1]': must be an object with 'role' and 'content', got a string"
        )

    @pytest.mark.parametrize(
        "key, why",
        [
            ("tool_calls", "tool calls are not supported"),
            ("tool_call_id", "tool calls are not supported"),
            ("images", "images and other non-text inputs are not supported"),
            ("name", "unknown key"),
            ("weight", "unknown key"),
        ],
    )
    def test_message_unknown_key(self, tmp_path: Path, key: str, why: str) -> None:
        msgs = [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a", key: []},
            {"role": "user", "content": "q2"},
        ]
        err = record_error(tmp_path, dict(MSGS, messages=msgs), line=2)
        assert str(err) == (
            f"{err.path}:2: field 'messages[2].{key}': {why}; a message may only have 'role' and 'content' "
            "(tool calls, names and images are not supported)"
        )

    @pytest.mark.parametrize("missing", ["role", "content"])
    def test_message_missing_key(self, tmp_path: Path, missing: str) -> None:
        msg = {"role": "user", "content": "q"}
        del msg[missing]
        err = record_error(tmp_path, dict(MSGS, messages=[msg]))
        assert str(err) == f"{err.path}:1: field 'messages[0].{missing}': missing required key"

    @pytest.mark.parametrize("role", ["tool", "function", "User", " user", ""])
    def test_unknown_role(self, tmp_path: Path, role: str) -> None:
        err = record_error(tmp_path, dict(MSGS, messages=[{"role": role, "content": "q"}]))
        assert str(err) == (
            f"{err.path}:1: field 'messages[0].role': unknown role {json.dumps(role)}; "
            "allowed roles are: system, developer, user, assistant"
        )

    def test_role_not_string(self, tmp_path: Path) -> None:
        err = record_error(tmp_path, dict(MSGS, messages=[{"role": 1, "content": "q"}]))
        assert str(err) == f"{err.path}:1: field 'messages[0].role': must be a string, got a number"

    def test_content_parts_rejected(self, tmp_path: Path) -> None:
        content = [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "data:"}}]
        msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": content}]
        err = record_error(tmp_path, dict(MSGS, messages=msgs), line=3)
        assert str(err) == (
            f"{err.path}:3: field 'messages[1].content': only text content is supported: content must be a "
            "string, not a list of content parts (images and other parts are not supported)"
        )

    @pytest.mark.parametrize(
        "value, problem",
        [
            ("", "must not be empty"),
            ("\n\n", "must not be whitespace-only"),
            (None, "must be a string, got null"),
            ({"text": "x"}, "must be a string, got an object"),
        ],
    )
    def test_content_text(self, tmp_path: Path, value: Any, problem: str) -> None:
        msgs = [{"role": "system", "content": value}, {"role": "user", "content": "q"}]
        err = record_error(tmp_path, dict(MSGS, messages=msgs))
        assert str(err) == f"{err.path}:1: field 'messages[0].content': {problem}"

    @pytest.mark.parametrize("last", ["assistant", "system", "developer"])
    def test_last_message_must_be_user(self, tmp_path: Path, last: str) -> None:
        msgs = [{"role": "user", "content": "q"}, {"role": last, "content": "a"}]
        err = record_error(tmp_path, dict(MSGS, messages=msgs), line=2)
        assert str(err) == (
            f"{err.path}:2: field 'messages[1].role': the last message must have role 'user' "
            f'(the turn-1 question), got "{last}"'
        )

    @pytest.mark.parametrize("role", ROLES)
    def test_all_roles_allowed_before_last(self, tmp_path: Path, role: str) -> None:
        msgs = [{"role": role, "content": "x"}, {"role": "user", "content": "q"}]
        [p] = load_probe_file(write(tmp_path, jsonl(dict(MSGS, messages=msgs))))
        assert p.messages[0] == (role, "x")

    def test_first_error_wins(self, tmp_path: Path) -> None:
        err = load_error(tmp_path, jsonl(dict(SHORT, turn1=""), dict(SHORT, bogus=1)))
        assert (err.line, err.field) == (1, "turn1")


# --------------------------------------------------------------------------- several files


class TestLoadProbes:
    def test_concatenates_in_order(self, tmp_path: Path) -> None:
        a = write(tmp_path, jsonl(dict(SHORT, id="a1"), SHORT), "a.jsonl")
        b = write(tmp_path, "[" + json.dumps(dict(MSGS, id="b1")) + "]", "b.json")
        probes = load_probes([a, Path(b)])
        assert [p.id for p in probes] == ["a1", "a-2", "b1"]
        assert [p.source for p in probes] == [f"{a}:1", f"{a}:2", f"{b}:1"]

    def test_empty_sequence(self) -> None:
        assert load_probes([]) == []

    def test_single_path_not_iterated_as_characters(self, tmp_path: Path) -> None:
        a = write(tmp_path, jsonl(SHORT), "a.jsonl")
        assert [p.id for p in load_probes(a)] == ["a-1"]  # type: ignore[arg-type]

    def test_duplicate_across_files(self, tmp_path: Path) -> None:
        a = write(tmp_path, jsonl(dict(SHORT, id="x"), dict(SHORT, id="shared")), "a.jsonl")
        b = write(tmp_path, "\n\n" + jsonl(dict(SHORT, id="y"), dict(MSGS, id="shared")), "b.jsonl")
        with pytest.raises(ProbeFileError) as info:
            load_probes([a, b])
        assert str(info.value) == f"{b}:4: field 'id': duplicate id \"shared\"; already used at {a}:2"
        assert (info.value.path, info.value.line, info.value.field) == (b, 4, "id")

    def test_same_file_twice(self, tmp_path: Path) -> None:
        a = write(tmp_path, jsonl(dict(SHORT, id="x")), "a.jsonl")
        with pytest.raises(ProbeFileError) as info:
            load_probes([a, a])
        assert str(info.value) == f"{a}:1: field 'id': duplicate id \"x\"; already used at {a}:1"

    def test_default_ids_clash_across_same_stem(self, tmp_path: Path) -> None:
        (tmp_path / "one").mkdir()
        (tmp_path / "two").mkdir()
        a = write(tmp_path / "one", jsonl(SHORT), "p.jsonl")
        b = write(tmp_path / "two", jsonl(SHORT), "p.jsonl")
        with pytest.raises(ProbeFileError) as info:
            load_probes([a, b])
        assert str(info.value) == (
            f"{b}:1: duplicate id \"p-1\" (the default id of a record without 'id'; give it an explicit id); "
            f"already used at {a}:1"
        )

    def test_error_in_second_file(self, tmp_path: Path) -> None:
        a = write(tmp_path, jsonl(SHORT), "a.jsonl")
        with pytest.raises(ProbeFileError) as info:
            load_probes([a, tmp_path / "missing.jsonl"])
        assert str(info.value) == f"{tmp_path / 'missing.jsonl'}: file not found"


# --------------------------------------------------------------------------- built-ins and example


class TestBuiltins:
    def test_twenty_builtins(self) -> None:
        probes = builtin_probes()
        assert len(probes) == 20
        ids = [p.id for p in probes]
        assert len(set(ids)) == 20
        assert len({p.fingerprint for p in probes}) == 20
        for i, p in enumerate(probes, start=1):
            assert p.source == f"builtin:{i}"
            assert all(part.isalnum() and part.islower() for part in p.id.split("-")), p.id
            assert len(p.id) <= 24
            assert len(p.messages) == 1 and p.messages[0][0] == "user"
            turn1 = p.messages[0][1]
            assert 45 <= len(turn1) <= 200, p.id
            assert "sentences" in turn1, p.id  # asks for a multi-sentence answer
            assert turn1 == turn1.strip() and p.followup == p.followup.strip()
            assert 20 <= len(p.followup) <= 160, p.id
        assert ids[:2] == ["tea-steeping", "bike-chain"]

    def test_builtins_are_copies(self) -> None:
        a = builtin_probes()
        a.clear()
        assert len(builtin_probes()) == 20

    def test_builtin_file_is_strict_short_form(self) -> None:
        path = REPO / "pytest_cachecheck" / "data" / "builtin_probes.jsonl"
        raw = path.read_bytes()
        assert not raw.startswith(b"\xef\xbb\xbf") and b"\r" not in raw and raw.endswith(b"\n")
        lines = raw.decode("utf-8").splitlines()
        assert len(lines) == 20
        for line in lines:
            assert list(json.loads(line)) == ["id", "turn1", "turn2"]
        assert [p.id for p in load_probe_file(path)] == [p.id for p in builtin_probes()]

    def test_builtin_set_fingerprint_stable(self) -> None:
        assert probe_set_fingerprint(builtin_probes()) == probe_set_fingerprint(builtin_probes())

    def test_example_file_loads(self) -> None:
        path = REPO / "examples" / "conversations_example.jsonl"
        probes = load_probe_file(path)
        assert 4 <= len(probes) <= 6
        raw = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        assert any("turn1" in r for r in raw) and any("messages" in r for r in raw)
        assert any(p.messages[0][0] == "system" for p in probes)
        assert any(any(role == "assistant" for role, _ in p.messages) for p in probes)
        assert any("id" not in r for r in raw)
        assert any(p.id == f"conversations_example-{i}" for i, p in enumerate(probes, start=1))
        # example ids do not clash with the built-ins
        load_probes([path])
        assert not {p.id for p in probes} & {p.id for p in builtin_probes()}


# --------------------------------------------------------------------------- fuzzing


@pytest.fixture(scope="module")
def fuzz_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("fuzz") / "fuzz.jsonl")


odd_text = st.text(max_size=40) | st.sampled_from(  # st.text: controls, RTL, emoji, combining marks...
    [
        "",
        " ",
        "\r",
        "\r\n",
        "\ufeff",
        "\u2028",
        "\U0001f375",
        "\u05e9\u05dc\u05d5\u05dd",
        "user",
        "tool",
        "lone \ud800 surrogate",
        "\udfff",
        "\u202e RTL override",
        "e\u0301",
        "\x00",
    ]
)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=True, allow_infinity=True)
    | odd_text
)
json_trees = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(odd_text, children, max_size=3),
    max_leaves=8,
)

message = st.fixed_dictionaries(
    {"role": st.sampled_from(ROLES + ("tool",)) | json_trees, "content": odd_text | json_trees},
    optional={"tool_calls": json_trees, "name": odd_text},
)
record = (
    st.fixed_dictionaries({"turn1": odd_text, "turn2": odd_text}, optional={"id": odd_text | json_trees})
    | st.fixed_dictionaries(
        {"messages": st.lists(message, max_size=4) | json_trees, "followup": odd_text},
        optional={"id": odd_text, "turn1": odd_text},
    )
    | st.dictionaries(st.sampled_from(["id", "turn1", "turn2", "messages", "followup", "x"]), json_trees)
    | json_trees
)


def _dump(obj: Any, ensure_ascii: bool) -> str:
    return json.dumps(obj, ensure_ascii=ensure_ascii)


@st.composite
def probe_file_bytes(draw: Any) -> bytes:
    kind = draw(st.sampled_from(["jsonl", "array", "bytes", "deep", "huge-number", "long-line", "mangled"]))
    ensure_ascii = draw(st.booleans())
    if kind == "bytes":
        return draw(st.binary(max_size=300))
    if kind == "deep":
        depth = draw(st.integers(min_value=1, max_value=50_000))
        opener = draw(st.sampled_from(["[", '{"a":', '{"turn1":', '{"messages":[']))
        return (opener * depth).encode()
    if kind == "huge-number":
        return ('{"turn1": ' + "9" * draw(st.integers(1, 20_000)) + ', "turn2": "x"}').encode()
    if kind == "long-line":
        return _dump({"turn1": "x" * draw(st.integers(1, 300_000)), "turn2": "y"}, ensure_ascii).encode()
    records = draw(st.lists(record, min_size=0, max_size=4))
    if kind == "array":
        text = "[" + ",\n".join(_dump(r, ensure_ascii) for r in records) + "]"
    else:
        sep = draw(st.sampled_from(["\n", "\r\n", "\n\n", "\r\n \r\n", "\r"]))
        text = sep.join(_dump(r, ensure_ascii) for r in records)
    data = text.encode("utf-8", "surrogatepass")
    if kind == "mangled" and data:
        i = draw(st.integers(0, len(data) - 1))
        data = data[:i] + draw(st.binary(max_size=4)) + data[i + 1 :]
    if draw(st.booleans()):
        data = b"\xef\xbb\xbf" + data
    return data


def _check_load(path: str, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)
    try:
        probes = load_probe_file(path)
    except ProbeFileError as exc:
        assert str(exc).startswith(path)
        assert exc.path == path
        return
    assert probes
    for p in probes:
        assert isinstance(p, Probe) and p.messages[-1][0] == "user"
        json.dumps(p.to_dict())
        p.fingerprint  # noqa: B018
    probe_set_fingerprint(probes)


_FUZZ_SETTINGS = settings(
    max_examples=180,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)


@_FUZZ_SETTINGS
@given(probe_file_bytes())
def test_fuzz_structured(fuzz_path: str, data: bytes) -> None:
    _check_load(fuzz_path, data)


@settings(max_examples=120, deadline=None, database=None)
@given(
    st.lists(record, min_size=1, max_size=3),
    st.booleans(),
    st.sampled_from(["\n", "\r\n"]),
    st.sampled_from([b"", b"\xef\xbb\xbf"]),
)
def test_fuzz_valid_records_round_trip(
    fuzz_path: str, records: list, ensure_ascii: bool, sep: str, bom: bytes
) -> None:
    """Records that parse_probe accepts load from a file with exactly the same text."""
    text = sep.join(_dump(r, ensure_ascii) for r in records) + sep
    data = bom + text.encode("utf-8", "surrogatepass")
    _check_load(fuzz_path, data)
    try:
        expected = [
            parse_probe(r, path=fuzz_path, line=i * (sep.count("\n")) + 1, default_id="d")
            for i, r in enumerate(records)
        ]
    except ProbeFileError:
        return
    try:
        loaded = load_probe_file(fuzz_path)
    except ProbeFileError as exc:
        assert "duplicate id" in exc.problem
        return
    assert [(p.messages, p.followup) for p in loaded] == [(p.messages, p.followup) for p in expected]
