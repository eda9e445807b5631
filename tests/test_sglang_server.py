"""The parts of tests/support/sglang_server.py that need no SGLang: the pins, the command line and
environment, the stand-in sgl_kernel and what it records."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import sglang_server as sg
from tests.support.venv_server import ServerProcessError


def test_requirements_pin_everything_and_nothing_cuda_only() -> None:
    pins = sg.requirements()
    assert len(pins) > 100 and all("==" in p and " " not in p for p in pins), pins
    names = {p.split("==")[0].lower() for p in pins}
    assert {"sglang", "torch", "torchvision", "triton", "transformers"} <= names
    assert "sglang==0.5.23" in pins and "torch==2.14.1" in pins
    # the CUDA-only requirements of the sglang wheel stay out: the stand-in replaces sgl_kernel
    assert not names & {"sglang-kernel", "sgl-kernel", "flashinfer-python", "flash-attn-4", "torchaudio",
                        "nvidia-cutlass-dsl", "sgl-deep-gemm", "cuda-python"}


def test_command_and_environment(tmp_path: Path) -> None:
    server = sg.SglangServer("/venv/bin/python", "/models/m", extra_args=["--disable-radix-cache"], port=1234,
                             log_path=tmp_path / "s.log")
    cmd = server.command()
    assert cmd[:3] == ["/venv/bin/python", "-m", "sglang.launch_server"]
    for flag in ("--device cpu", "--attention-backend torch_native", "--dtype bfloat16", "--port 1234",
                 "--max-total-tokens 32768", "--served-model-name tiny-qwen2", "--sampling-defaults openai"):
        assert flag in " ".join(cmd), flag
    assert "--enable-cache-report" in cmd and cmd[-1] == "--disable-radix-cache"
    assert "--enable-cache-report" not in sg.SglangServer("p", "m", cache_report=False, port=1).command()
    env = server.env()
    assert env["PYTHONPATH"] == str(sg.STUB_DIR)  # the stand-in and nothing of ours
    assert env["SGLANG_USE_CPU_ENGINE"] == "1" and env["HF_HUB_OFFLINE"] == "1"
    assert env[sg.STUB_LOG_ENV] == str(tmp_path / "s.log.sgl_kernel")
    assert not any(k.startswith("SGL_") for k in env if k not in os.environ)  # SGLang warns about SGL_*
    assert set(sg.CONFIGS) == {"default", "noradix", "noreport"}


def test_explicit_python_must_be_executable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(sg.ENV_PYTHON, str(tmp_path / "missing"))
    with pytest.raises(ServerProcessError, match="CACHECHECK_SGLANG_PYTHON=.* is not an executable file"):
        sg.ensure_sglang()
    monkeypatch.setenv(sg.ENV_PYTHON, sys.executable)
    assert sg.ensure_sglang() == Path(sys.executable)


def test_standin_raises_and_records(tmp_path: Path) -> None:
    record = tmp_path / "record"
    code = (
        "import sgl_kernel\n"
        "assert sgl_kernel.STANDIN\n"
        "try:\n"
        "    from sgl_kernel.scalar_type import scalar_types\n"
        "except ImportError:\n"
        "    print('no submodule')\n"
        "from sgl_kernel import rmsnorm\n"
        "try:\n"
        "    rmsnorm(1)\n"
        "except NotImplementedError as exc:\n"
        "    print('raised', exc)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(sg.STUB_DIR), sg.STUB_LOG_ENV: str(record)}
    out = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=60, check=True).stdout
    assert "no submodule" in out and "raised sgl_kernel.rmsnorm: sgl_kernel is a stand-in" in out
    server = sg.SglangServer("p", "m", log_path=tmp_path / "x.log")
    (tmp_path / "x.log.sgl_kernel").write_text(record.read_text())
    assert server.standin_events() == [("import", "sgl_kernel"), ("missing", "sgl_kernel.scalar_type"),
                                       ("attr", "sgl_kernel.rmsnorm"), ("call", "sgl_kernel.rmsnorm")]
    assert server.standin_calls() == ["sgl_kernel.rmsnorm"]
    assert sg.SglangServer("p", "m").standin_calls() == []  # no log yet
