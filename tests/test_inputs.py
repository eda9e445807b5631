"""Input that must not break the session (issue 15): output files that clash with each other or with an
input, hostile baselines, huge baselines and servers, many probes, probe files xdist workers cannot
read, a URL ending in /v1, and ini values from pytest 9's native TOML table. Each is a usage error
naming the option (or file and field) before any request, or works.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import textwrap
from pathlib import Path
from typing import Dict, List

import pytest

needs_xdist = pytest.mark.skipif(importlib.util.find_spec("xdist") is None,
                                 reason="pytest-xdist is not installed")
FAST = ["-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-p", "no:benchmark"]
PROBE = '{"id": "own-1", "turn1": "Name a colour.", "turn2": "And another?"}\n'


# -- outputs that clash ----------------------------------------------------------------------------------
def _clash_files(root: Path) -> Dict[str, str]:
    (root / "probes.jsonl").write_text(PROBE)
    (root / "base.json").write_text("{}")
    (root / "sub").mkdir()
    os.symlink(root / "probes.jsonl", root / "link.jsonl")
    return {"probes": str(root / "probes.jsonl"), "baseline": str(root / "base.json")}


# (the options, both option names the error must give)
CLASHES = [
    (["--cachecheck-report=probes.jsonl"], ("--cachecheck-report", "--cachecheck-probes")),
    (["--cachecheck-report=sub/../probes.jsonl"], ("--cachecheck-report", "--cachecheck-probes")),
    (["--cachecheck-report=link.jsonl"], ("--cachecheck-report", "--cachecheck-probes")),  # a symlink to it
    (["--cachecheck-report=base.json", "--cachecheck-baseline=base.json"],
     ("--cachecheck-report", "--cachecheck-baseline")),
    (["--cachecheck-report=out.json", "--cachecheck-html=out.json"],
     ("--cachecheck-report", "--cachecheck-html")),
    (["--cachecheck-report=out.xml", "--junitxml=out.xml"], ("--cachecheck-report", "--junitxml")),
    (["--cachecheck-html=probes.jsonl"], ("--cachecheck-html", "--cachecheck-probes")),
    (["--cachecheck-html=base.json", "--cachecheck-baseline=base.json"],
     ("--cachecheck-html", "--cachecheck-baseline")),
    (["--cachecheck-html=out.xml", "--junitxml=out.xml"], ("--cachecheck-html", "--junitxml")),
]


@pytest.mark.parametrize("args, names", CLASHES, ids=[f"{n[0][13:]}={n[1].lstrip('-')}" + (
    "-symlink" if "link" in a[0] else "-dotdot" if ".." in a[0] else "") for a, n in CLASHES])
def test_clashing_outputs_are_a_usage_error_before_any_request(pytester, emulator, args, names):
    emu = emulator()
    files = _clash_files(pytester.path)
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", f"--cachecheck-probes={files['probes']}",
                                *args, *FAST)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    err = result.stderr.str()
    assert names[0] in err and names[1] in err and "same file" in err, err
    assert emu.requests_log == []
    assert (pytester.path / "probes.jsonl").read_text() == PROBE
    assert (pytester.path / "base.json").read_text() == "{}"
    assert not (pytester.path / "out.json").exists() and not (pytester.path / "out.xml").exists()


def test_distinct_outputs_are_all_written(pytester, emulator):
    emu = emulator()
    _clash_files(pytester.path)
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", "--cachecheck-probes=probes.jsonl",
                                "--cachecheck-report=r.json", "--cachecheck-html=r.html", "--junitxml=j.xml",
                                *FAST)
    result.assert_outcomes(passed=2)  # and cachecheck::gate
    assert json.loads((pytester.path / "r.json").read_text())["probes"][0]["id"] == "own-1"
    assert (pytester.path / "r.html").read_text().startswith("<!DOCTYPE html>")
    assert (pytester.path / "j.xml").read_text().startswith("<?xml")


# -- hostile baselines -------------------------------------------------------------------------------------
def _baseline(matrix: bool = False) -> Dict:
    from tests.support.factories import record, report

    if matrix:
        return report(targets={"a": [record("tea-steeping", "same", target="a")]}).to_json()
    return report([record("tea-steeping", "same"),
                   record("bike-chain", "different", cache="x1", recompute="x2")]).to_json()


def _set(data: Dict, path: str, value: object) -> None:
    keys: List = [int(k) if k.isdigit() else k for k in path.replace("[", ".").replace("]", "").split(".")]
    for k in keys[:-1]:
        data = data[k]
    data[keys[-1]] = value


BIG = "9" * 4300
HOSTILE = [
    ("probes[0].duration_s", BIG, "probes[0].duration_s"),  # INTERNALERROR before (float of a huge int)
    ("probes[0].duration_s", BIG + "9", "probes[0].duration_s"),  # beyond Python's 4300-digit int limit
    ("summary.probes", BIG, "summary.probes"),
    ("probes[1].requests[0].cached_tokens", BIG, "probes[1].requests[0].cached_tokens"),
    ("settings.max_tokens", BIG, "settings.max_tokens"),
    ("schema_version", BIG, "schema_version"),
    ("probes[0].duration_s", "1e999", "probes[0].duration_s"),  # infinite
    ("probes[0].duration_s", "NaN", "probes[0].duration_s"),
    ("settings.model", "[" * 100_000 + "]" * 100_000, "line 1 column"),
    ("settings.model", "[" * 500 + "]" * 500, "field 'settings.model[0][0]"),
    ("probes[0].reason", "{" + '"a":' * 0 + "}", None),  # an object where a string belongs: already named
]


@pytest.mark.parametrize("field, raw, named", HOSTILE, ids=[f"{h[0]}={h[1][:8]}{len(h[1])}" for h in HOSTILE])
def test_hostile_baseline_is_a_usage_error_naming_file_and_field(pytester, emulator, field, raw, named):
    emu = emulator()
    data = _baseline()
    _set(data, field, "@@")
    path = pytester.path / "base.json"
    path.write_text(json.dumps(data).replace('"@@"', raw))
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", f"--cachecheck-baseline={path}",
                                "--cachecheck-n=2", *FAST)
    err = result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, (result.stdout.str()[-3000:], err)
    assert "INTERNALERROR" not in err + result.stdout.str()
    assert f"--cachecheck-baseline: {path}:" in err
    assert (f"field '{named}'" if named else f"field '{field}'") in err or (named and named in err), err
    assert len(err) < 2000  # the 4300 digits are not echoed
    assert emu.requests_log == []


@pytest.mark.parametrize("name", [5, None, True, [1], {"a": 1}])
def test_baseline_target_name_that_is_not_a_string(pytester, emulator, name):
    emu = emulator()
    data = _baseline(matrix=True)
    data["targets"][0]["name"] = name
    path = pytester.path / "base.json"
    path.write_text(json.dumps(data))
    result = pytester.runpytest(f"--cachecheck-target=a={emu.url}", f"--cachecheck-baseline={path}",
                                "--cachecheck-n=2", *FAST)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    # one target named null is a report without a matrix: then its probe's target names no target
    named = ("field 'probes[0].target': 'a' names none of the report's targets" if name is None
             else "field 'targets[0].name': expected a string")
    assert f"{path}: {named}" in result.stderr.str()
    assert emu.requests_log == []


# -- long lists in the terminal ------------------------------------------------------------------------
def test_comparison_table_is_capped():
    from pytest_cachecheck.baseline import compare
    from pytest_cachecheck.model import Outcome, ProbeRecord
    from pytest_cachecheck.terminal import TABLE_ROWS, comparison_lines
    from tests.support.factories import baseline, record

    before = [ProbeRecord(f"p{i}", "test:1", f"sha256:p{i}", Outcome.SAME) for i in range(100_000)]
    now = [record("p0", "different", cache="x1", recompute="x2", fingerprint="sha256:p0")]
    now += [record(f"n{i}", "same") for i in range(3)]
    comparison = compare(baseline(before), now, {})
    for verbose in (False, True):
        lines = comparison_lines(comparison, verbose)
        assert len(lines) < TABLE_ROWS + 20, len(lines)
        assert lines[2].split()[:4] == ["p0", "same", "different", "newly"]  # the most important row first
        assert f"  ... and {100_003 - TABLE_ROWS} more (see the JSON report)" in lines


def test_a_baseline_of_many_probes_prints_a_short_summary(pytester, emulator):
    from tests.support.factories import record, report

    emu = emulator()
    path = pytester.path / "base.json"
    path.write_text(json.dumps(report([record(f"old-{i}", "same") for i in range(2000)]).to_json()))
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", f"--cachecheck-baseline={path}",
                                "--cachecheck-n=2", *FAST)
    result.assert_outcomes(passed=3)
    out = result.stdout.str()
    summary = out[out.index("cachecheck summary"):]
    assert len(summary.splitlines()) < 90, len(summary.splitlines())
    assert "... and 1952 more (see the JSON report)" in summary


def test_a_server_of_many_models_is_named_in_one_short_line(pytester, emulator):
    emu = emulator(flavor="sglang", block_size=1, models=[f"model-{i}" for i in range(20_000)])
    result = pytester.runpytest(f"--cachecheck-url={emu.url}", "--cachecheck-n=1", *FAST)
    assert result.ret == pytest.ExitCode.USAGE_ERROR  # several models and none chosen: before any probe
    out = result.stderr.str()
    assert "choose one with --cachecheck-model" in out and "and 19991 more" in out
    assert max(len(line) for line in out.splitlines()) < 4100
    assert out.count("model-1") < 30


# -- many probes: the session end grows linearly -------------------------------------------------------------
class CountedId(str):
    """A probe id whose comparisons are Python calls, so that a linear scan of a list of ids (``id in ids``)
    shows up in the call count; hashing stays str's, so dict and set lookups cost one call or none."""

    def __eq__(self, other: object) -> bool:
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return str.__ne__(self, other)

    __hash__ = str.__hash__


def _calls(work) -> int:
    """How many function calls (Python and built-in) ``work()`` makes: a count, not a time."""
    import cProfile
    import pstats

    profile = cProfile.Profile()
    profile.enable()
    work()
    profile.disable()
    return sum(stat[1] for stat in pstats.Stats(profile).stats.values())  # type: ignore[attr-defined]


def _grows_linearly(counts: List[int]) -> float:
    """For counts at n, 2n and 4n: the growth from 2n to 4n over the growth from n to 2n (2 when linear,
    4 when quadratic)."""
    c1, c2, c4 = counts
    return (c4 - c2) / (c2 - c1)


def test_run_end_grows_linearly_with_the_probes(tmp_path):
    import copy

    from pytest_cachecheck import terminal
    from pytest_cachecheck.files import write_report
    from pytest_cachecheck.kinds import PROBE
    from pytest_cachecheck.run import KindInput, TargetInput, summarise
    from tests.support.factories import PROBE_SET, baseline, record, settings, setup

    kinds = [record("t", "same"), record("t", "different", cache="x1", recompute="x2"),
             record("t", "inconclusive"), record("t", "error")]

    def records(n: int, prefix: str) -> List:
        out = []
        for i in range(n):
            r = copy.copy(kinds[i % 4])
            r.id = CountedId(f"{prefix}{i}")
            out.append(r)
        return out

    def run_end(n: int) -> None:
        recs = records(n, "p")
        ids = [r.id for r in recs] + [CountedId(f"x{i}") for i in range(n // 4)]  # some not run
        s = settings(baseline="b.json", max_rate=0.5)
        base = baseline(recs[: n // 2] + records(n // 2, "q"))
        result = summarise(s, [KindInput(PROBE, PROBE_SET, ids, {r.key: r for r in recs}, [], ids)],
                           [TargetInput(None, s.url, setup())], {None: base}, "the run was interrupted")
        report = result.report(2)
        write_report(str(tmp_path / "r.json"), report, lambda text: text)
        terminal.summary(report, result.verdict, "b.json", True)

    counts = [_calls(lambda: run_end(n)) for n in (400, 800, 1600)]
    assert _grows_linearly(counts) < 2.1, counts


def test_collect_only_grows_linearly_with_the_probes(pytester, monkeypatch):
    """--collect-only of n, 2n and 4n probes from a file, plugin on: the function calls of the whole run."""
    counts = []
    root = str(Path(__file__).resolve().parent.parent)  # the script imports tests.test_inputs
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    for n in (300, 600, 1200):
        path = pytester.path / f"p{n}.jsonl"
        path.write_text("".join(json.dumps({"id": f"p{i}", "turn1": f"Question {i}?", "turn2": "And?"}) + "\n"
                                for i in range(n)))
        script = textwrap.dedent(f"""
            import cProfile, pstats, sys
            import pytest
            from pytest_cachecheck import probes, session
            from tests.test_inputs import CountedId

            def load(paths):  # ids whose comparisons count, as in the run-end test
                loaded = probes.load_probes(paths)
                for p in loaded:
                    object.__setattr__(p, "id", CountedId(p.id))
                return loaded

            session.load_probes = load
            profile = cProfile.Profile()
            profile.enable()
            code = pytest.main(["--collect-only", "-q", "--cachecheck-url=http://127.0.0.1:9",
                                "--cachecheck-probes={path}", "-p", "no:cacheprovider",
                                "-p", "no:hypothesispytest", "-p", "no:benchmark"])
            profile.disable()
            print("CALLS", int(code), sum(s[1] for s in pstats.Stats(profile).stats.values()))
        """)
        result = pytester.run(sys.executable, "-c", script)
        line = [x for x in result.stdout.lines if x.startswith("CALLS")][0]
        assert line.split()[1] == "0", result.stdout.str()[-2000:]
        counts.append(int(line.split()[2]))
    assert _grows_linearly(counts) < 2.1, counts


# -- a probe file xdist workers cannot read ---------------------------------------------------------------
PIPED = "".join(json.dumps({"id": f"piped-{i}", "turn1": f"Name thing {i}.", "turn2": "And another?"}) + "\n"
                for i in range(3))


def _run_piped(folder: Path, url: str, how: str, *args: str) -> "subprocess.CompletedProcess[str]":
    """pytest with --cachecheck-probes given as a pipe: '/dev/fd/N' as `<(cat f)` gives it, or a FIFO."""
    import subprocess
    import threading

    if how == "fd":
        read, write = os.pipe()
        path, keep = f"/dev/fd/{read}", (read,)
    else:
        path, keep = str(folder / "probes.fifo"), ()
        os.mkfifo(path)

    def feed() -> None:
        with (os.fdopen(write, "w") if how == "fd" else open(path, "w")) as f:
            f.write(PIPED)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        return subprocess.run([sys.executable, "-m", "pytest", f"--cachecheck-url={url}",
                               f"--cachecheck-probes={path}", "--cachecheck-report=r.json", *args, *FAST],
                              cwd=str(folder), pass_fds=keep, capture_output=True, text=True, timeout=120)
    finally:
        if how == "fd":
            os.close(read)


@needs_xdist
@pytest.mark.skipif(not os.path.isdir("/dev/fd"), reason="no /dev/fd")
@pytest.mark.parametrize("how", ["fd", "fifo"])
def test_probes_from_a_pipe_under_xdist_are_read_once_by_the_controller(pytester, emulator, how):
    """The workers cannot read the controller's pipe (it is drained, or not theirs, or a FIFO without a
    writer blocks them): the controller reads it once and hands the probes to its workers."""
    emu = emulator()
    result = _run_piped(pytester.path, emu.url, how, "-n", "2")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    data = json.loads((pytester.path / "r.json").read_text())
    assert [p["id"] for p in data["probes"]] == ["piped-0", "piped-1", "piped-2"]
    assert data["summary"]["status"] == "passed"
    assert "4 passed" in result.stdout


@pytest.mark.skipif(not os.path.isdir("/dev/fd"), reason="no /dev/fd")
def test_probes_from_a_pipe_without_xdist(pytester, emulator):
    emu = emulator()
    result = _run_piped(pytester.path, emu.url, "fd")
    assert result.returncode == 0, result.stdout[-3000:]
    assert [p["id"] for p in json.loads((pytester.path / "r.json").read_text())["probes"]] == [
        "piped-0", "piped-1", "piped-2"]


@needs_xdist
@pytest.mark.skipif(not os.path.isdir("/dev/fd"), reason="no /dev/fd")
def test_baseline_from_a_pipe_under_xdist(pytester, emulator):
    """The baseline too is read once, by the controller: a probe that also differed in it is expected."""
    import subprocess
    import threading

    emu = emulator(diverge_on_hit={"bicycle"})  # bike-chain diverges
    first = pytester.runpytest(f"--cachecheck-url={emu.url}", "--cachecheck-n=2",
                               "--cachecheck-report=b.json", *FAST)
    first.assert_outcomes(passed=1, failed=2)  # bike-chain, and the gate
    text = (pytester.path / "b.json").read_text()
    read, write = os.pipe()
    threading.Thread(target=lambda: os.fdopen(write, "w").write(text), daemon=True).start()
    try:
        result = subprocess.run([sys.executable, "-m", "pytest", f"--cachecheck-url={emu.url}",
                                 "--cachecheck-n=2", f"--cachecheck-baseline=/dev/fd/{read}", "-n", "2",
                                 "-rx", *FAST], cwd=str(pytester.path), pass_fds=(read,),
                                capture_output=True, text=True, timeout=120)
    finally:
        os.close(read)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "2 passed, 1 xfailed" in result.stdout and "also differed in the baseline" in result.stdout


# -- a URL ending in /v1 ------------------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", ["/v1", "/v1/"])
def test_an_openai_base_url_is_taken_as_the_servers_root(pytester, emulator, suffix):
    """OpenAI clients take http://host:8000/v1; the plugin asks for /v1/... itself, so the /v1 goes, and the
    header says so."""
    emu = emulator()
    result = pytester.runpytest(f"--cachecheck-url={emu.url}{suffix}", "--cachecheck-n=2",
                                "--cachecheck-report=r.json", *FAST)
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines([f"cachecheck: note: --cachecheck-url {emu.url}{suffix} ends in /v1 (an "
                                 f"OpenAI client's base URL); the plugin uses the server's root {emu.url}*"])
    result.stdout.fnmatch_lines([f"*reproduce with: pytest --cachecheck-url={emu.url} *"])
    assert json.loads((pytester.path / "r.json").read_text())["settings"]["url"] == emu.url


def test_v1_is_stripped_from_targets_and_the_nocache_url(pytester, emulator):
    a, b = emulator(), emulator()
    result = pytester.runpytest(f"--cachecheck-target=a={a.url}/v1", f"--cachecheck-target=b={b.url}/v1",
                                "--cachecheck-n=1", *FAST)
    result.assert_outcomes(passed=3)
    assert result.stdout.str().count("ends in /v1") == 2
    cache, nocache = emulator(), emulator(prefix_caching=False)
    result = pytester.runpytest(f"--cachecheck-url={cache.url}", f"--cachecheck-nocache-url={nocache.url}/v1",
                                "--cachecheck-n=1", *FAST)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["cachecheck: note: --cachecheck-nocache-url * ends in /v1*"])


def test_v1_stripped_keeps_the_query_and_a_path_prefix():
    from pytest_cachecheck.settings import resolve

    s = resolve({"url": ["http://gw.example:80/llm/v1?tenant=abcdefgh"]}, base_dir=Path("."))
    assert s is not None and s.url == "http://gw.example:80/llm?tenant=abcdefgh"
    s = resolve({"url": ["http://host:8000/v1x"]}, base_dir=Path("."))
    assert s is not None and s.url == "http://host:8000/v1x" and s.notes == ()


# -- ini values in pytest 9's native TOML table ---------------------------------------------------------
NATIVE = """
[tool.pytest]
cachecheck_url = ["{url}"]
cachecheck_n = 2
cachecheck_max_tokens = 64
cachecheck_hit_tolerance = 16
cachecheck_timeout = 30.5
cachecheck_min_valid = 0.5
cachecheck_max_rate = 1
cachecheck_no_logprobs = true
cachecheck_probes = ["probes.jsonl"]
cachecheck_report = "r.json"
"""
INI_OPTIONS = re.sub(r"= ([0-9.]+|true)\n", r'= "\1"\n', NATIVE).replace(
    "[tool.pytest]", "[tool.pytest.ini_options]").replace('["{url}"]', '"{url}"').replace(
    '["probes.jsonl"]', '"probes.jsonl"')


def _native_table_supported() -> bool:
    return int(pytest.__version__.split(".")[0]) >= 9


@pytest.mark.compat
@pytest.mark.parametrize("table", ["native", "pytest.toml", "ini_options"])
def test_ini_values_from_toml(pytester, emulator, table):
    if table != "ini_options" and not _native_table_supported():
        pytest.skip("pytest < 9 has no native TOML table")
    emu = emulator()
    pytester.path.joinpath("probes.jsonl").write_text(PROBE + PROBE.replace("own-1", "own-2")
                                                      + PROBE.replace("own-1", "own-3"))
    text = (INI_OPTIONS if table == "ini_options" else NATIVE).format(url=emu.url)
    if table == "pytest.toml":
        pytester.path.joinpath("pytest.toml").write_text(text.replace("[tool.pytest]", "[pytest]"))
    else:
        pytester.path.joinpath("pyproject.toml").write_text(text)
    result = pytester.runpytest(*FAST)
    result.assert_outcomes(passed=3)
    settings = json.loads((pytester.path / "r.json").read_text())["settings"]
    assert (settings["n"], settings["max_tokens"], settings["hit_tolerance"], settings["timeout"],
            settings["min_valid"], settings["max_rate"], settings["logprobs"]) == (
        2, 64, 16, 30.5, 0.5, 1.0, False)
    assert [p["model"] for p in emu.requests_log[-1:]] and all("logprobs" not in r for r in emu.requests_log)


@pytest.mark.compat
@pytest.mark.parametrize("value, ok", [("true", True), ("false", True), ('"yes"', True), ("3", False)])
def test_native_bool_ini(pytester, emulator, value, ok):
    if not _native_table_supported():
        pytest.skip("pytest < 9 has no [tool.pytest] table")
    cache, nocache = emulator(), emulator(prefix_caching=False)
    pytester.path.joinpath("pyproject.toml").write_text(
        f'[tool.pytest]\ncachecheck_nocache_url = "{nocache.url}"\ncachecheck_skip_hit_check = {value}\n')
    result = pytester.runpytest(f"--cachecheck-url={cache.url}", "--cachecheck-n=1",
                                "--cachecheck-report=r.json", *FAST)
    if ok:
        assert result.ret in (0, 1), result.stdout.str()[-2000:] + result.stderr.str()
        skip = json.loads((pytester.path / "r.json").read_text())["settings"]["skip_hit_check"]
        assert skip == (value in ("true", '"yes"'))
    else:
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        err = result.stderr.str()
        assert "--cachecheck-skip-hit-check (ini cachecheck_skip_hit_check): 3 is not allowed" in err


def test_a_toml_zero_is_a_value_not_an_absence():
    from pytest_cachecheck.settings import lookup

    ini = {"min_valid": 0, "hit_tolerance": 0, "skip_hit_check": False}
    raw = lookup(lambda n: None, ini.get, {})
    assert (raw["min_valid"], raw["hit_tolerance"], raw["skip_hit_check"]) == (0, 0, None)
