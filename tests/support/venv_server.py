"""Generic pieces for serving engines that live in their own Python venv (vLLM, SGLang) in the tests.

* :func:`ensure_venv` makes a venv under the cache, installs packages into it and removes some again, once:
  a lock file serialises concurrent installers (xdist workers, parallel CI jobs), and a marker file written
  atomically at the very end says the venv is complete, so a half-made one (an interrupted install) is
  removed and made again;
* :class:`ServerProcess` runs a server command on a free loopback port with its output in a log file, waits
  until an HTTP path answers 200, and stops the whole process group (the engines start helper processes);
* :class:`ServerPool` keeps named server configurations for a test session: each started once, their
  start-ups overlapped, at most a few alive at a time (a vLLM server takes ~3.5 GB);
* :func:`tiny_model_dir` writes the tiny random-weight Qwen2 model (:mod:`tests.support.tiny_hf_model`) once,
  with an engine venv's Python.

Nothing here imports pytest or knows a particular engine.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Callable, Dict, Iterator, List, Mapping, Optional, Sequence

from pytest_cachecheck.llama_server import cache_dir, free_port

Log = Callable[[str], None]
COMPLETE_MARKER = ".cachecheck-complete"


class ServerProcessError(RuntimeError):
    """A venv could not be made, or a server could not be started or reached."""


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (created if missing), held for the ``with`` block."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(str(path), "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _recipe(install: Sequence[str], remove: Sequence[str]) -> Dict[str, List[str]]:
    return {"install": list(install), "remove": list(remove)}


def venv_complete(venv: Path, install: Sequence[str], remove: Sequence[str] = ()) -> bool:
    """Whether ``venv`` holds a finished install of exactly this recipe."""
    marker = venv / COMPLETE_MARKER
    try:
        return json.loads(marker.read_text()) == _recipe(install, remove) and venv_python(venv).is_file()
    except (OSError, ValueError):
        return False


def mark_complete(venv: Path, install: Sequence[str], remove: Sequence[str] = ()) -> None:
    """Write the complete-marker atomically (the last step of an install)."""
    tmp = venv / (COMPLETE_MARKER + ".tmp")
    tmp.write_text(json.dumps(_recipe(install, remove)))
    os.replace(str(tmp), str(venv / COMPLETE_MARKER))


def _run(cmd: Sequence[str], log: Log) -> None:
    log("+ " + " ".join(cmd))
    proc = subprocess.run(list(cmd), stdin=subprocess.DEVNULL, stdout=sys.stderr, stderr=sys.stderr)
    if proc.returncode != 0:
        raise ServerProcessError(f"command failed with exit code {proc.returncode}: {' '.join(cmd)}")


def ensure_venv(venv: Path, install: Sequence[str], remove: Sequence[str] = (), log: Log = print,
                base_python: str = sys.executable) -> Path:
    """The Python of ``venv``, after ``python -m venv``, ``pip install <install>`` and ``pip uninstall -y
    <remove>`` when the venv is not complete yet (a half-made one is deleted first). Returns at once when
    the complete-marker is there."""
    if venv_complete(venv, install, remove):
        return venv_python(venv)
    with file_lock(venv.with_name(venv.name + ".lock")):
        if venv_complete(venv, install, remove):  # another process finished it while we waited
            return venv_python(venv)
        if venv.exists():
            log(f"cachecheck: removing the incomplete venv {venv}")
            shutil.rmtree(str(venv))
        started = time.monotonic()
        log(f"cachecheck: installing {' '.join(install)} into {venv} (a few minutes, once)")
        try:
            _run([base_python, "-m", "venv", str(venv)], log)
            py = str(venv_python(venv))
            _run([py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *install], log)
            if remove:
                _run([py, "-m", "pip", "uninstall", "--quiet", "-y", *remove], log)
        except BaseException:
            shutil.rmtree(str(venv), ignore_errors=True)
            raise
        mark_complete(venv, install, remove)
        log(f"cachecheck: venv ready in {time.monotonic() - started:.0f} s: {venv}")
    return venv_python(venv)


def http_status(url: str, timeout: float = 5.0) -> Optional[int]:
    """The HTTP status of ``GET url``, or None when nothing answers. Never goes through a proxy."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError, ValueError):
        return None


class ServerProcess:
    """A server command on a free loopback port, ready when ``GET <ready_path>`` answers 200.

    Subclasses give :meth:`command` (the port is known when it is called) and may add to :meth:`env`.
    The process runs in its own session, so :meth:`stop` reaches the helper processes it starts.
    """

    name = "server"
    ready_path = "/health"

    def __init__(self, host: str = "127.0.0.1", port: Optional[int] = None,
                 log_path: "os.PathLike[str] | str | None" = None,
                 env: Optional[Mapping[str, str]] = None) -> None:
        self.host = host
        self.port = port
        self.log_path: Optional[Path] = Path(log_path) if log_path is not None else None
        self.extra_env = dict(env or {})
        self.startup_seconds: Optional[float] = None
        self._began = 0.0
        self._proc: Optional[subprocess.Popen[bytes]] = None
        self._log_file: Optional[IO[bytes]] = None

    def command(self) -> List[str]:
        raise NotImplementedError

    def env(self) -> Dict[str, str]:
        out = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the engine needs none of ours
        out.update(self.extra_env)
        return out

    def start(self, timeout: float = 300.0) -> "ServerProcess":
        """Start and wait until ready. Raises :class:`ServerProcessError` with the log's tail when the process
        exits or is not ready within ``timeout`` seconds (the process is then stopped)."""
        self.launch()
        return self.wait_ready(timeout)

    def launch(self) -> None:
        """Start the process without waiting (see :meth:`wait_ready`)."""
        if self._proc is not None:
            raise ServerProcessError(f"{self.name} already started")
        if self.port is None:
            self.port = free_port(self.host)
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix=f"{self.name}-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        cmd = self.command()
        self._log_file = open(str(self.log_path), "wb")
        self._log_file.write(("$ " + " ".join(cmd) + "\n").encode("utf-8"))
        self._log_file.flush()
        self._began = time.monotonic()
        self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log_file,
                                      stderr=subprocess.STDOUT, env=self.env(), start_new_session=True)

    def wait_ready(self, timeout: float = 300.0) -> "ServerProcess":
        """Wait until ``GET <ready_path>`` answers 200 (see :meth:`start`)."""
        if self._proc is None:
            raise ServerProcessError(f"{self.name} was not launched")
        deadline = self._began + timeout
        while True:
            code = self._proc.poll()
            if code is not None:
                self.stop()
                raise ServerProcessError(f"{self.name} exited with code {code} during start-up; log "
                                         f"{self.log_path}:\n{self.log_tail()}")
            if http_status(self.url + self.ready_path) == 200:
                self.startup_seconds = time.monotonic() - self._began
                return self
            if time.monotonic() > deadline:
                self.stop()
                raise ServerProcessError(f"{self.name} not ready after {timeout:.0f} s; log "
                                         f"{self.log_path}:\n{self.log_tail()}")
            time.sleep(0.5)

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM to the process group, SIGKILL after ``grace`` seconds."""
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # helpers that outlived the main process
            proc.wait()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def is_alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> Optional[int]:
        return self._proc.pid if self._proc is not None else None

    @property
    def url(self) -> str:
        if self.port is None:
            raise ServerProcessError(f"{self.name} has no port yet; call start() first")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def log_tail(self, n: int = 60) -> str:
        """The last ``n`` lines of the log ('' when there is none)."""
        if self.log_path is None or not self.log_path.is_file():
            return ""
        with open(str(self.log_path), "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 256 * 1024))
            data = fh.read().decode("utf-8", "replace")
        return "\n".join(data.splitlines()[-n:])

    def __enter__(self) -> "ServerProcess":
        if self._proc is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ServerPool:
    """Named server configurations, each started once and kept for reuse, at most ``max_alive`` at a time.

    ``factory(name)`` makes an unstarted server; :meth:`get` starts the missing ones of the names asked for
    together (their start-ups overlap) after stopping the least recently used others to make room. A
    configuration that failed to start fails again at once, with the same error, instead of starting again.
    """

    def __init__(self, factory: Callable[[str], ServerProcess], max_alive: int = 3, log: Log = print,
                 timeout: float = 600.0) -> None:
        self.factory = factory
        self.max_alive = max_alive
        self.log = log
        self.timeout = timeout
        self.alive: Dict[str, ServerProcess] = {}  # least recently used first
        self.failed: Dict[str, ServerProcessError] = {}
        self.startups: Dict[str, float] = {}  # seconds each start-up took, for the record

    def get(self, *names: str) -> List[ServerProcess]:
        if len(set(names)) > self.max_alive:
            raise ServerProcessError(f"{len(set(names))} servers asked for at once; at most {self.max_alive}")
        for name in names:
            if name in self.failed:
                raise self.failed[name]
        for name in list(self.alive):
            if not self.alive[name].is_alive():
                self.log(f"cachecheck: server {name} died; log tail:\n{self.alive[name].log_tail()}")
                self.alive.pop(name).stop()
        missing = [n for n in dict.fromkeys(names) if n not in self.alive]
        for name in [n for n in list(self.alive) if n not in names]:
            if len(self.alive) + len(missing) <= self.max_alive:
                break
            self.log(f"cachecheck: stopping server {name} to make room")
            self.alive.pop(name).stop()
        started = [(name, self.factory(name)) for name in missing]
        for name, server in started:
            server.launch()
            self.log(f"cachecheck: starting server {name}, log {server.log_path}")
        errors = []
        for name, server in started:
            try:
                server.wait_ready(self.timeout)
            except ServerProcessError as exc:
                self.failed[name] = exc
                errors.append(exc)
                continue
            self.alive[name] = server
            self.startups[name] = server.startup_seconds or 0.0
        if errors:
            raise errors[0]
        for name in names:  # most recently used last
            self.alive[name] = self.alive.pop(name)
        return [self.alive[name] for name in names]

    def stop_all(self) -> None:
        for server in self.alive.values():
            server.stop()
        self.alive.clear()


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def tiny_model_dir(python: "os.PathLike[str] | str", log: Log, version: Optional[int] = None) -> Path:
    """The tiny random-weight Qwen2 model directory (:mod:`tests.support.tiny_hf_model`), written on first use
    by ``python`` (an engine venv's: it needs torch and safetensors) into
    ``<cache>/models/hf-tiny-qwen2-v<N>``."""
    from pytest_cachecheck.serve import ensure_vocab

    if version is None:
        version = _model_version()
    dest = cache_dir() / "models" / f"hf-tiny-qwen2-v{version}"
    if (dest / "model.safetensors").is_file():
        return dest
    vocab = ensure_vocab(log)
    with file_lock(cache_dir() / "hf-tiny-model.lock"):
        if not (dest / "model.safetensors").is_file():
            log(f"cachecheck: writing the tiny Qwen2 model (random weights) to {dest}")
            script = repo_root() / "tests" / "support" / "tiny_hf_model.py"
            proc = subprocess.run([str(python), str(script), str(dest), str(vocab)], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  env={**os.environ, "PYTHONPATH": str(repo_root())})
            if proc.returncode != 0 or not (dest / "model.safetensors").is_file():
                raise ServerProcessError(f"writing the tiny model failed (exit {proc.returncode}):\n"
                                         f"{proc.stdout[-3000:]}")
    return dest


def _model_version() -> int:
    # read MODEL_VERSION without importing the module (it needs numpy, and runs in the engine's venv)
    text = (repo_root() / "tests" / "support" / "tiny_hf_model.py").read_text()
    for line in text.splitlines():
        if line.startswith("MODEL_VERSION ="):
            return int(line.split("=", 1)[1])
    raise ServerProcessError("tests/support/tiny_hf_model.py has no MODEL_VERSION")


def log_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def install_main(argv: Optional[Sequence[str]], module: str, what: str, ensure: Callable[[], Path]) -> int:
    """``python3 -m tests.support.<module> install``: ``ensure()`` and print the server's Python (exit 0),
    or say why it could not be installed (exit 1); any other argument is a usage error (exit 2)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args != ["install"]:
        log_stderr(f"usage: python3 -m tests.support.{module} install")
        return 2
    try:
        print(ensure())
    except (ServerProcessError, OSError) as exc:
        log_stderr(f"cachecheck: {what} could not be installed: {exc}")
        return 1
    return 0
