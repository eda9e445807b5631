"""Obtain and run a real SGLang 0.5.23 server on this CPU machine, for the end-to-end tests.

SGLang's wheel requires CUDA-only packages (``sglang-kernel``, flashinfer, ...). What runs here: SGLang in its
own venv under ``<cache>/sglang-0.5.23``, installed with ``pip install --no-deps`` from the pinned list
``tests/support/sglang-requirements.txt`` (every package the server imports on a CPU: torch 2.14.1 and
torchvision 0.29.1, which this machine kind keeps on disk, transformers, fastapi, ...; none of the CUDA ones),
and a stand-in ``sgl_kernel`` (``tests/support/sgl_kernel_stub``) on the server's ``PYTHONPATH`` whose every
function raises NotImplementedError and is recorded in a file when called. With ``--device cpu
--attention-backend torch_native`` everything the plugin talks to (HTTP server, scheduler, radix cache,
``cache_salt``, usage reporting, ``/server_info``) is SGLang's own code. ``$CACHECHECK_SGLANG_PYTHON`` names a
Python that already has SGLang instead.

Command line (used by ``tests/run.sh``)::

    python3 -m tests.support.sglang_server install   # install if needed, print the Python with SGLang
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from pytest_cachecheck.llama_server import cache_dir
from tests.support.venv_server import (Log, ServerProcess, ServerProcessError, ensure_venv, install_main,
                                       log_stderr)

SGLANG_VERSION = "0.5.23"
ENV_PYTHON = "CACHECHECK_SGLANG_PYTHON"
SUPPORT = Path(__file__).resolve().parent
REQUIREMENTS = SUPPORT / "sglang-requirements.txt"
STUB_DIR = SUPPORT / "sgl_kernel_stub"
STUB_LOG_ENV = "CACHECHECK_SGL_KERNEL_LOG"  # not SGL_*: SGLang warns about those

#: environment of every server: the CPU engine, no hub (there is none here)
SERVER_ENV = {"SGLANG_USE_CPU_ENGINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
              "DO_NOT_TRACK": "1"}


#: every server started in this process, oldest first (the tests read their logs and stand-in records)
STARTED: List["SglangServer"] = []


def venv_dir() -> Path:
    return cache_dir() / f"sglang-{SGLANG_VERSION}"


def requirements() -> Tuple[str, ...]:
    """The pinned packages of :data:`REQUIREMENTS` (comments and blank lines left out)."""
    lines = (line.split("#", 1)[0].strip() for line in REQUIREMENTS.read_text().splitlines())
    return tuple(line for line in lines if line)


def ensure_sglang(log: Log = log_stderr) -> Path:
    """A Python with SGLang: ``$CACHECHECK_SGLANG_PYTHON``, else the cached venv (installed on first use)."""
    explicit = os.environ.get(ENV_PYTHON)
    if explicit:
        path = Path(explicit).expanduser()
        if not (path.is_file() and os.access(str(path), os.X_OK)):
            raise ServerProcessError(f"{ENV_PYTHON}={explicit} is not an executable file; point it at a "
                                     f"Python that has SGLang, or unset it")
        return path
    return ensure_venv(venv_dir(), ("--no-deps", *requirements()), log=log)


class SglangServer(ServerProcess):
    """``python -m sglang.launch_server`` on the CPU, serving ``model`` on a free loopback port.

    Flags: ``--device cpu --attention-backend torch_native --disable-cuda-graph --mem-fraction-static 0.1
    --context-length 2048 --dtype bfloat16 --sampling-defaults openai --served-model-name <name>
    --max-total-tokens 32768 --sleep-on-idle`` (a KV pool of 32768 tokens, 16 MB on the tiny model, instead of
    10% of the RAM: 3.5 GB instead of 4.8 GB for the server's three processes; and an idle scheduler that
    waits instead of polling, which took ~20% of a core), plus ``--enable-cache-report`` unless
    ``cache_report=False``, plus ``extra_args`` (e.g.
    ``--disable-radix-cache``). Ready when ``GET /ready`` answers 200 (SGLang's ``/health`` runs a generation,
    so it is never polled). The stand-in ``sgl_kernel`` records into :attr:`standin_log`.
    """

    name = "sglang"
    ready_path = "/ready"

    def __init__(self, python: "os.PathLike[str] | str", model: "os.PathLike[str] | str",
                 extra_args: Sequence[str] = (), *, cache_report: bool = True,
                 served_model_name: Optional[str] = "tiny-qwen2", context_length: int = 2048,
                 max_total_tokens: Optional[int] = 32768,
                 dtype: str = "bfloat16", host: str = "127.0.0.1", port: Optional[int] = None,
                 log_path: "os.PathLike[str] | str | None" = None,
                 env: Optional[Dict[str, str]] = None) -> None:
        super().__init__(host=host, port=port, log_path=log_path, env={**SERVER_ENV, **(env or {})})
        self.python = Path(python)
        self.model = Path(model)
        self.extra_args = tuple(str(a) for a in extra_args)
        self.cache_report = cache_report
        self.served_model_name = served_model_name
        self.context_length = context_length
        self.max_total_tokens = max_total_tokens
        self.dtype = dtype

    def command(self) -> List[str]:
        cmd = [str(self.python), "-m", "sglang.launch_server", "--model-path", str(self.model),
               "--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph",
               "--mem-fraction-static", "0.1", "--context-length", str(self.context_length),
               "--dtype", self.dtype, "--sampling-defaults", "openai", "--host", self.host,
               "--port", str(self.port), "--sleep-on-idle"]
        if self.served_model_name:
            cmd += ["--served-model-name", self.served_model_name]
        if self.max_total_tokens:
            cmd += ["--max-total-tokens", str(self.max_total_tokens)]
        if self.cache_report:
            cmd.append("--enable-cache-report")
        return cmd + list(self.extra_args)

    def launch(self) -> None:
        STARTED.append(self)
        super().launch()

    @property
    def standin_log(self) -> Optional[Path]:
        return self.log_path.with_name(self.log_path.name + ".sgl_kernel") if self.log_path else None

    def env(self) -> Dict[str, str]:
        out = super().env()
        out["PYTHONPATH"] = str(STUB_DIR)
        if self.standin_log is not None:
            out[STUB_LOG_ENV] = str(self.standin_log)
        return out

    def standin_events(self) -> List[Tuple[str, str]]:
        """What the stand-in ``sgl_kernel`` saw: ``(kind, name)`` with kind ``import``, ``missing`` (a
        submodule), ``attr`` or ``call``."""
        path = self.standin_log
        if path is None or not path.is_file():
            return []
        events = []
        for line in path.read_text(errors="replace").splitlines():
            parts = line.split()
            if len(parts) >= 2:
                events.append((parts[0], parts[1]))
        return events

    def standin_calls(self) -> List[str]:
        """The ``sgl_kernel`` functions SGLang called (each raised NotImplementedError): none, if all is
        well."""
        return [name for kind, name in self.standin_events() if kind == "call"]

    def rss_mb(self) -> float:
        """Resident memory of the server's whole process group, in MiB (0 when it is not running)."""
        if self.pid is None:
            return 0.0
        total = 0
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[2]) == self.pid:  # field 5 of /proc/PID/stat: the process group
                    total += int(fields[21])  # field 24: resident pages
            except (OSError, IndexError, ValueError):
                continue
        return total * os.sysconf("SC_PAGE_SIZE") / 2**20

    def __repr__(self) -> str:
        return (f"SglangServer(model={str(self.model)!r}, args={self.command()[3:]!r}, "
                f"alive={self.is_alive()})")


CONFIGS: Dict[str, Dict[str, Any]] = {
    "default": {},  # radix cache on (page size 1), --enable-cache-report
    "noradix": {"extra_args": ("--disable-radix-cache",)},
    "noreport": {"cache_report": False},
}
"""The few server configurations the tests use, by name (each costs a start-up of 40-140 s and ~3.5 GB)."""


def configured_server(name: str, python: "os.PathLike[str] | str", model: "os.PathLike[str] | str",
                      log_dir: "os.PathLike[str] | str | None" = None) -> SglangServer:
    """An unstarted :class:`SglangServer` of configuration ``name`` (a key of :data:`CONFIGS`)."""
    log_path = Path(log_dir) / f"sglang-{name}.log" if log_dir is not None else None
    return SglangServer(python, model, log_path=log_path, **CONFIGS[name])


def main(argv: Optional[Sequence[str]] = None) -> int:
    return install_main(argv, "sglang_server", "SGLang", ensure_sglang)


if __name__ == "__main__":
    sys.exit(main())
