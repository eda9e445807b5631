"""The output files: what a report path may be and how each kind is written (a regular file replaced
atomically, a symlink written through to its target, a character device and a FIFO written through, a
directory and a socket refused), and what the HTML page shows of server text (no raw control or bidi
character) and of a huge comparison (a capped list, whole counts).

Character devices are made here with ``os.mknod`` (the numbers of ``/dev/null`` and ``/dev/full``), never
the machine's own ``/dev`` nodes.
"""

from __future__ import annotations

import errno
import json
import os
import re
import socket
import stat
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, List

import pytest

import pytest_cachecheck.protocol  # noqa: F401 - one copy of requests across in-process runs (test_faults.py)
from pytest_cachecheck.files import write_report, write_text
from pytest_cachecheck.htmlreport import MAX_ROWS, render_html
from pytest_cachecheck.model import NEWLY_DIVERGED, NOT_RUN, STATUSES, STILL_SAME, Comparison, Row
from tests.support import factories as f

FAST = ["-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-p", "no:benchmark"]
NULL, FULL = os.makedev(1, 3), os.makedev(1, 7)


def _device(path: Path, numbers: int) -> Path:
    """A character device node at ``path`` (skips when this process may not make one)."""
    try:
        os.mknod(str(path), stat.S_IFCHR | 0o666, numbers)
    except OSError as exc:  # EPERM without CAP_MKNOD
        pytest.skip(f"cannot make a character device here: {exc}")
    return path


def _is_char_device(path: Path, numbers: int) -> bool:
    st = os.lstat(str(path))
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == numbers


def _within(seconds: float, call: Callable[[], None]) -> BaseException:
    """Run ``call`` in a thread; fail if it is still running after ``seconds``; return what it raised."""
    raised: List[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s"
    assert raised, "it did not raise"
    return raised[0]


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "report.fifo"
    os.mkfifo(str(path))
    yield path
    assert stat.S_ISFIFO(os.lstat(str(path)).st_mode), "the FIFO was replaced"


# -- write_text: each kind of path -------------------------------------------------------------------------
def test_a_new_path_and_a_regular_file_are_replaced_atomically(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    write_text(str(path), "first\n")
    assert path.read_text(encoding="utf-8") == "first\n"
    inode = path.stat().st_ino
    write_text(str(path), "second\n")
    assert path.read_text(encoding="utf-8") == "second\n"
    assert path.stat().st_ino != inode  # a new file renamed into place, not the old one rewritten
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_a_symlink_stays_a_link_and_its_target_gets_the_text(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "links").mkdir()
    target = tmp_path / "real" / "r.json"
    target.write_text("old report\n", encoding="utf-8")
    link = tmp_path / "links" / "r.json"
    os.symlink(os.path.join("..", "real", "r.json"), str(link))
    second = tmp_path / "links" / "again.json"  # a link to a link
    os.symlink(str(link), str(second))
    write_text(str(second), "new report\n")
    assert os.readlink(str(link)) == os.path.join("..", "real", "r.json")
    assert os.readlink(str(second)) == str(link)
    assert target.read_text(encoding="utf-8") == "new report\n"
    assert sorted(p.name for p in (tmp_path / "real").iterdir()) == ["r.json"]  # no temporary file left
    assert sorted(p.name for p in (tmp_path / "links").iterdir()) == ["again.json", "r.json"]


def test_a_dangling_symlink_gets_its_target_made(tmp_path: Path) -> None:
    link = tmp_path / "r.json"
    os.symlink("made.json", str(link))
    write_text(str(link), "text\n")
    assert link.is_symlink() and (tmp_path / "made.json").read_text(encoding="utf-8") == "text\n"


def test_a_character_device_is_written_through(tmp_path: Path) -> None:
    null = _device(tmp_path / "null", NULL)
    write_text(str(null), "the report\n")
    write_report(str(null), f.report([f.record("p", "same")]))
    assert _is_char_device(null, NULL)
    assert [p.name for p in tmp_path.iterdir()] == ["null"]


def test_a_failed_write_to_a_device_is_an_oserror(tmp_path: Path) -> None:
    full = _device(tmp_path / "full", FULL)
    with pytest.raises(OSError) as caught:
        write_text(str(full), "x" * 100_000)
    assert caught.value.errno == errno.ENOSPC
    assert _is_char_device(full, FULL)
    assert [p.name for p in tmp_path.iterdir()] == ["full"]


def test_a_symlink_to_a_character_device_is_written_through(tmp_path: Path) -> None:
    null = _device(tmp_path / "null", NULL)
    os.symlink(str(null), str(tmp_path / "out.json"))
    write_text(str(tmp_path / "out.json"), "the report\n")
    assert _is_char_device(null, NULL) and (tmp_path / "out.json").is_symlink()


def test_a_fifo_with_a_reader_gets_the_text(fifo: Path) -> None:
    got: List[bytes] = []

    def read() -> None:
        with open(str(fifo), "rb") as r:
            got.append(r.read())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    text = "a report of some size\n" * 20_000  # more than a pipe holds: the writer must wait for the reader
    deadline = time.monotonic() + 10
    while True:  # the reader opens the FIFO a moment after it starts
        try:
            write_text(str(fifo), text)
            break
        except OSError as exc:
            assert "no process reads the FIFO" in str(exc) and time.monotonic() < deadline, exc
            time.sleep(0.01)
    reader.join(10)
    assert got == [text.encode("utf-8")]


def test_a_fifo_without_a_reader_is_an_error_at_once(fifo: Path) -> None:
    exc = _within(5, lambda: write_text(str(fifo), "the report\n"))
    assert isinstance(exc, OSError) and exc.errno == errno.ENXIO
    assert str(exc) == f"[Errno {errno.ENXIO}] no process reads the FIFO {os.path.realpath(str(fifo))}"


def test_a_directory_and_a_socket_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "dir").mkdir()
    with pytest.raises(OSError, match="is a directory, not a regular file, a character device or a FIFO"):
        write_text(str(tmp_path / "dir"), "x")
    assert (tmp_path / "dir").is_dir() and not list((tmp_path / "dir").iterdir())
    monkeypatch.chdir(tmp_path)  # a short relative name: a socket path has a length limit
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind("s.sock")
        with pytest.raises(OSError, match="s.sock is a socket, not a regular file"):
            write_text("s.sock", "x")
        assert stat.S_ISSOCK(os.lstat("s.sock").st_mode)
    finally:
        server.close()


# -- through the plugin --------------------------------------------------------------------------------------
def test_plugin_writes_reports_through_symlinks(pytester: pytest.Pytester, emulator: Any) -> None:
    emu = emulator()
    out = pytester.path / "out"
    out.mkdir()
    for name in ("r.json", "r.html"):
        (out / name).write_text("old\n", encoding="utf-8")
        os.symlink(os.path.join("out", name), str(pytester.path / f"link-{name}"))
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", "--cachecheck-n=2",
                                           "--cachecheck-report=link-r.json", "--cachecheck-html=link-r.html",
                                           *FAST)
    result.assert_outcomes(passed=3)
    for name in ("r.json", "r.html"):
        assert os.readlink(str(pytester.path / f"link-{name}")) == os.path.join("out", name)
    report = json.loads((out / "r.json").read_text(encoding="utf-8"))
    assert [p["id"] for p in report["probes"]] == ["tea-steeping", "bike-chain"]
    assert (out / "r.html").read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert sorted(p.name for p in out.iterdir()) == ["r.html", "r.json"]


def test_plugin_with_a_fifo_nobody_reads_says_so_and_does_not_hang(pytester: pytest.Pytester,
                                                                   emulator: Any) -> None:
    emu = emulator()
    os.mkfifo(str(pytester.path / "r.json"))
    result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", "--cachecheck-n=1",
                                           "--cachecheck-report=r.json", *FAST, timeout=120)
    result.stdout.fnmatch_lines(["cachecheck: could not write *r.json: *no process reads the FIFO *r.json"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # a lost report is not a pass
    assert stat.S_ISFIFO(os.lstat(str(pytester.path / "r.json")).st_mode)


def test_plugin_refuses_a_socket_as_report_before_any_request(pytester: pytest.Pytester,
                                                              emulator: Any) -> None:
    emu = emulator()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind("r.sock")  # relative (pytester runs in its folder): a socket path has a length limit
        result = pytester.runpytest_subprocess(f"--cachecheck-url={emu.url}", "--cachecheck-report=r.sock",
                                               *FAST)
    finally:
        server.close()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([("*--cachecheck-report (ini cachecheck_report): 'r.sock' is not allowed; "
                                  "expected a path to write to (*r.sock is a socket, not a regular file, a "
                                  "character device or a FIFO)*")])
    assert emu.requests_log == []


# -- the HTML page: server text -----------------------------------------------------------------------------
#: every character the page must never carry raw: C0 (but newline and tab), DEL, C1, bidi marks, embeddings,
#: overrides and isolates
RAW = ([chr(c) for c in range(0x20) if chr(c) not in "\n\t"] + [chr(c) for c in range(0x7F, 0xA0)]
       + ["\u200e", "\u200f"] + [chr(c) for c in range(0x202A, 0x202F)]
       + [chr(c) for c in range(0x2066, 0x206A)])
HOSTILE = "red \x1b[31m\x00 turned \u202etxt.exe\u2066 \u200f" + "".join(RAW)


def _no_raw(page: str) -> None:
    found = sorted({f"U+{ord(c):04X}" for c in page if c in RAW})
    assert not found, found


def test_page_shows_control_and_bidi_characters_as_escapes() -> None:
    before = f.baseline([f.record(f"gone{HOSTILE}", "same"), f.record(f"p{HOSTILE}", "same")])
    report = f.report([
        f.record(f"p{HOSTILE}", "different", cache=f"same start {HOSTILE} A\nline two\tend",
                 recompute=f"same start {HOSTILE} B", turn1=f"turn one {HOSTILE}"),
        f.record("q", "inconclusive", cache="x", recompute="y", reason=f"inconclusive: {HOSTILE}"),
        f.record("r", "error", cache=None, recompute=None, reason=f"connection refused {HOSTILE}"),
    ], setup_=f.setup(model=f"emu/{HOSTILE}", build=f"0.34{HOSTILE}"), baselines={None: before})
    page = render_html(report)
    _no_raw(page)
    mark = '<span class="control" style="color: var(--severe); font-weight: 600">{}</span>'
    for escape in ("\\x1b", "\\x00", "\\u202e", "\\u2066", "\\u200f", "\\x85", "\\r", "\\x7f"):
        assert mark.format(escape) in page
    assert "<h4>p" + "red " + mark.format("\\x1b") + "[31m" + mark.format("\\x00") in page  # the id
    assert "model emu/red " + mark.format("\\x1b") in page  # the model name
    assert "A\nline two\tend" in page  # newline and tab stay as they are
    assert ">gonered " + mark.format("\\x1b") in page  # a comparison row's id


def test_matrix_page_titles_carry_escapes_without_markup() -> None:
    rec = f"p{HOSTILE}"
    report = f.report(targets={"a": [f.record(rec, "same", target="a")],
                               "b": [f.record(rec, "different", cache="one", recompute="two", target="b")]})
    page = render_html(report)
    _no_raw(page)
    attributes = re.findall(r'title="([^"]*)"', page)
    svg_titles = re.findall(r"<title>([^<]*)</title>", page)[1:]  # the page's own title first
    assert len(attributes) == 2 and len(svg_titles) == 1, (attributes, svg_titles)
    for title in attributes + svg_titles:
        assert title.startswith("pred \\x1b[31m\\x00 turned \\u202etxt.exe\\u2066 \\u200f\\x00\\x01"), title
    assert page.count("<title>") == 2  # no markup inside a title ends it early


# -- the HTML page: a huge comparison -----------------------------------------------------------------------
def test_a_comparison_of_100000_rows_lists_the_first_rows_and_keeps_the_counts() -> None:
    report = f.report([f.record("p", "same")], baselines={None: f.baseline([f.record("p", "same")])})
    rows = ([Row(f"new-{i:06d}", "same", "different", NEWLY_DIVERGED) for i in range(300)]
            + [Row(f"gone-{i:06d}", "same", None, NOT_RUN) for i in range(700)]
            + [Row(f"same-{i:06d}", "same", "same", STILL_SAME) for i in range(99_000)])
    counts = {s: 0 for s in STATUSES}
    counts.update({NEWLY_DIVERGED: 300, NOT_RUN: 700, STILL_SAME: 99_000})
    base = report.targets[0].baseline
    assert base is not None
    report.targets[0].baseline = Comparison(rows=rows, counts=counts, verdict="regressed", why="300 newly diverged",
                                            mcnemar_p=0.0, paired=99_300, valid_in_both=99_300)
    page = render_html(report)
    assert len(page.encode("utf-8")) < 1_000_000, len(page)
    assert "newly diverged <b>300</b> | not run <b>700</b> | still same <b>99000</b>" in page
    assert "99000 probes still same" in page
    shown = page[page.index('id="baseline-rows"'):page.index('id="baseline-rows-more"')]
    assert shown.count("<tr>") == 1 + MAX_ROWS
    assert ">new-000000<" in shown and ">new-000299<" in shown  # the most important rows come first
    assert ">gone-000199<" in shown and ">gone-000200<" not in shown
    assert '<p class="why" id="baseline-rows-more">and 500 more rows: see the JSON report</p>' in page
    assert '<p class="why" id="baseline-same-rows-more">and 98500 more rows: see the JSON report</p>' in page
    same = page[page.index('id="baseline-same-rows"'):page.index('id="baseline-same-rows-more"')]
    assert same.count("<tr>") == 1 + MAX_ROWS


def test_a_comparison_of_exactly_max_rows_says_nothing_more() -> None:
    before = f.baseline([f.record(f"p{i}", "same") for i in range(MAX_ROWS)])
    records = [f.record(f"p{i}", "same") for i in range(MAX_ROWS)]
    page = render_html(f.report(records, baselines={None: before}))
    assert "more rows" not in page
    assert page.count("<td>same</td><td>same</td>") == MAX_ROWS
