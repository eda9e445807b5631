"""Options declared once (settings.OPTIONS): what pytest registers, the Settings fields, the README's options
table and the docs table all agree with the table; every cross-option rule can fire; the reproduce line
resolves back to the run's reproduced settings."""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path
from typing import Any, Dict, List

import pytest

from pytest_cachecheck import settings
from pytest_cachecheck.errors import ConfigError
from pytest_cachecheck.settings import OPTIONS, RULES, SPECS, Settings, options_markdown, reproduce_args, resolve

README = Path(__file__).resolve().parents[1] / "README.md"
PUBLIC = [spec for spec in OPTIONS if spec.public]


def _help(pytester: pytest.Pytester) -> str:
    return pytester.runpytest("--help", "-p", "no:randomly").stdout.str()


def test_pytest_registers_exactly_the_table(pytester, pytestconfig):
    dests = {name for name in vars(pytestconfig.option) if name.startswith("cachecheck_")}
    assert dests == {spec.ini for spec in OPTIONS}
    out = _help(pytester)
    flags = set(re.findall(r"(?m)^\s+(--cachecheck-[a-z0-9-]+)", out))
    assert flags == {spec.flag for spec in PUBLIC}
    inis = set(re.findall(r"(?m)^\s+(cachecheck_[a-z0-9_]+) \(", out))
    assert inis == {spec.ini for spec in OPTIONS}
    for spec in OPTIONS:
        assert spec.flag == "--cachecheck-" + spec.name.replace("_", "-")
        assert spec.env is None or f"[env {spec.env}]" in " ".join(out.split())


def test_every_option_fills_a_settings_field():
    fields = {f.name for f in dataclasses.fields(Settings)}
    assert len(SPECS) == len(OPTIONS)
    for spec in OPTIONS:
        assert spec.field in fields, spec.name
        assert spec.kind in ("str", "bool", "list"), spec.name
        assert spec.default is not dataclasses.MISSING, spec.name  # the option's default is the field's


def test_readme_has_a_row_for_every_public_option():
    text = README.read_text(encoding="utf-8")
    section = text[text.index("\n## Options\n"):]
    section = section[:section.index("\n## ", 1)]
    rows: Dict[str, List[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        found = re.match(r"`(--cachecheck-[a-z0-9-]+)", cells[0]) if cells else None
        if found:
            rows[found.group(1)] = cells
    assert set(rows) == {spec.flag for spec in PUBLIC}, "README options table and settings.OPTIONS differ"
    for spec in PUBLIC:
        assert f"`{spec.ini}`" in rows[spec.flag][1], spec.flag
        assert spec.env is None or f"`{spec.env}`" in rows[spec.flag][0], spec.flag


def test_options_markdown_is_the_public_table(monkeypatch):
    lines = options_markdown().splitlines()
    assert lines[0] == "| Option | ini key | env | default | what it does |"
    rows = [[c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]] for line in lines[2:]]
    assert all(len(row) == 5 for row in rows)
    assert [re.match(r"`([^` ]+)", row[0]).group(1) for row in rows] == [spec.flag for spec in PUBLIC]
    by_flag = {re.match(r"`([^` ]+)", row[0]).group(1): row for row in rows}
    assert by_flag["--cachecheck-mode"][1:4] == ["`cachecheck_mode`", "", "`auto`"]
    assert by_flag["--cachecheck-timeout"][3] == "`300`" and by_flag["--cachecheck-min-valid"][3] == "`0.8`"
    assert by_flag["--cachecheck-url"][2] == "`CACHECHECK_URL`" and "(repeatable)" in by_flag["--cachecheck-url"][0]
    for flag in ("--cachecheck-n", "--cachecheck-skip-hit-check", "--cachecheck-record", "--cachecheck-probes"):
        assert by_flag[flag][3] == "", flag  # no default worth a cell (a flag, a path, all probes)
    assert by_flag["--cachecheck-model"][4] == SPECS["model"].help
    hidden = tuple(dataclasses.replace(s, public=False) if s.name == "model" else s for s in OPTIONS)
    monkeypatch.setattr(settings, "OPTIONS", hidden)
    assert "--cachecheck-model" not in options_markdown() and "--cachecheck-mode " in options_markdown()


URL = "http://127.0.0.1:8080"
# one input per rule, in RULES' order, that breaks that rule and no other
RULE_CASES: List[Dict[str, Any]] = [
    {"url": [URL], "target": ["a=http://h1:1"]},
    {"target": ["a=http://h1:1"], "mode": "two-servers"},
    {"url": [URL], "nocache_url": "http://nc:9000", "mode": "one-server"},
    {"url": [URL, "http://10.0.0.2:8080"], "nocache_url": "http://nc:9000"},
    {"url": [URL], "mode": "two-servers"},
    {"url": [URL], "nocache_url": URL + "/"},
    {"url": [URL], "skip_hit_check": True, "mode": "llama.cpp"},
    {"url": [URL], "server_args": "-c 8192"},
    {"url": [URL], "fail_on": "never"},
    {"url": [URL], "record": "rec.json", "report": "out.json"},
    {"url": [URL], "record": "rec.json", "baseline": "base.json"},
    {"url": [URL], "record": "rec.json", "max_rate": "0.1"},
]


@pytest.mark.parametrize("index", range(len(RULES)))
def test_every_rule_fires_on_its_own(index, tmp_path):
    assert len(RULE_CASES) == len(RULES), "give each rule of settings.RULES its case here"
    with pytest.raises(ConfigError) as info:
        resolve(RULE_CASES[index], base_dir=tmp_path)
    template = RULES[index][1]
    assert str(info.value).startswith(template.split("{")[0]), str(info.value)
    if "{s.mode}" in template:
        assert str(info.value).endswith(RULE_CASES[index]["mode"])


def test_without_a_server_only_the_nocache_rule_applies(tmp_path):
    assert resolve({"mode": "bogus", "n": "x", "fail_on": "never"}, base_dir=tmp_path) is None
    with pytest.raises(ConfigError, match=r"^--cachecheck-nocache-url: needs --cachecheck-url"):
        resolve({"nocache_url": "http://nc:9000"}, base_dir=tmp_path)


@pytest.mark.parametrize("raw", [
    {"url": [URL, "http://10.0.0.2:8080"], "model": "m", "probes": ["a.jsonl", "b.jsonl"], "n": "3",
     "max_tokens": "64", "hit_tolerance": "0", "no_logprobs": True, "episodes": ["builtin"]},
    {"url": [URL], "nocache_url": "http://nc:9000", "skip_hit_check": "true", "timeout": "5"},
    {"target": ["a=http://h1:1", "b=http://h2:2/v1"], "mode": "one-server"},
], ids=["replicas", "two-servers", "matrix"])
def test_the_reproduce_line_resolves_to_the_same_settings(raw, tmp_path):
    first = resolve(raw, base_dir=tmp_path)
    assert first is not None
    again: Dict[str, Any] = {}
    for arg in shlex.split(" ".join(reproduce_args(first))):
        flag, _, value = arg.partition("=")
        spec = next(s for s in OPTIONS if s.flag == flag)
        assert spec.reproduced, flag
        if spec.kind == "list":
            again.setdefault(spec.name, []).append(value)
        else:
            again[spec.name] = True if spec.kind == "bool" else value
    second = resolve(again, base_dir=tmp_path)
    assert second is not None
    for spec in OPTIONS:
        if spec.reproduced:
            assert getattr(second, spec.field) == getattr(first, spec.field), spec.name
    assert second.url == first.url
