"""Unit tests for the real-vLLM test support: the venv installer, the server process and pool, the vLLM
command line and the tiny Qwen2 model's weights (no vLLM needed; the end-to-end tests use the real thing)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Sequence

import pytest

from tests.support import venv_server
from tests.support.venv_server import (COMPLETE_MARKER, ServerPool, ServerProcess, ServerProcessError,
                                       ensure_venv, venv_complete)
from tests.support.vllm_server import CONFIGS, ENV_PYTHON, VllmServer, configured_server, ensure_vllm


# -- ensure_venv ---------------------------------------------------------------------------------------------


class FakeInstaller:
    """Stands in for ``python -m venv`` and pip: records the commands, makes bin/python, can fail."""

    def __init__(self, fail_on: str = "", delay: float = 0.0) -> None:
        self.calls: List[List[str]] = []
        self.fail_on = fail_on
        self.delay = delay
        self.lock = threading.Lock()

    def __call__(self, cmd: Sequence[str], log: object) -> None:
        with self.lock:
            self.calls.append(list(cmd))
        time.sleep(self.delay)
        if cmd[1:3] == ["-m", "venv"]:
            python = Path(cmd[3]) / "bin" / "python"
            python.parent.mkdir(parents=True)
            python.write_text("")
        if self.fail_on and self.fail_on in cmd:
            raise ServerProcessError(f"command failed with exit code 1: {' '.join(cmd)}")


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeInstaller:
    installer = FakeInstaller()
    monkeypatch.setattr(venv_server, "_run", installer)
    return installer


def steps(calls: List[List[str]]) -> List[str]:
    return [" ".join(c[1:3]) + (" " + c[-1] if "pip" in c else "") for c in calls]


def test_ensure_venv_installs_once_then_returns_at_once(tmp_path: Path, fake: FakeInstaller) -> None:
    venv = tmp_path / "v"
    python = ensure_venv(venv, ["pkg==1"], ["extra"], log=lambda m: None)
    assert python == venv / "bin" / "python"
    assert steps(fake.calls) == ["-m venv", "-m pip pkg==1", "-m pip extra"]
    assert json.loads((venv / COMPLETE_MARKER).read_text()) == {"install": ["pkg==1"], "remove": ["extra"]}
    ensure_venv(venv, ["pkg==1"], ["extra"], log=lambda m: None)
    assert len(fake.calls) == 3  # complete: nothing ran again


@pytest.mark.parametrize("state", ["half-made", "other recipe"])
def test_ensure_venv_redoes_an_incomplete_or_different_venv(tmp_path: Path, fake: FakeInstaller,
                                                            state: str) -> None:
    venv = tmp_path / "v"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    (venv / "leftover").write_text("from an interrupted install")
    if state == "other recipe":
        (venv / COMPLETE_MARKER).write_text(json.dumps({"install": ["pkg==0"], "remove": []}))
    logged: List[str] = []
    ensure_venv(venv, ["pkg==1"], log=logged.append)
    assert not (venv / "leftover").exists() and venv_complete(venv, ["pkg==1"])
    assert logged[0] == f"cachecheck: removing the incomplete venv {venv}"


def test_failed_install_leaves_no_venv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(venv_server, "_run", FakeInstaller(fail_on="pkg==1"))
    with pytest.raises(ServerProcessError, match="pkg==1"):
        ensure_venv(tmp_path / "v", ["pkg==1"], log=lambda m: None)
    assert not (tmp_path / "v").exists()


def test_concurrent_installers_install_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    installer = FakeInstaller(delay=0.3)
    monkeypatch.setattr(venv_server, "_run", installer)
    results: List[Path] = []
    threads = [threading.Thread(target=lambda: results.append(ensure_venv(tmp_path / "v", ["pkg==1"],
                                                                         log=lambda m: None)))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 3 and len(set(results)) == 1
    assert steps(installer.calls) == ["-m venv", "-m pip pkg==1"]  # the others waited for the lock


def test_ensure_venv_for_real(tmp_path: Path) -> None:
    """A real venv and pip run, offline: installing pip itself is already satisfied."""
    python = ensure_venv(tmp_path / "v", ["--no-index", "pip"], log=lambda m: None)
    assert python.is_file() and venv_complete(tmp_path / "v", ["--no-index", "pip"])


def test_vllm_python_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_PYTHON, sys.executable)
    assert ensure_vllm() == Path(sys.executable)
    monkeypatch.setenv(ENV_PYTHON, str(tmp_path / "nope"))
    with pytest.raises(ServerProcessError, match=f"{ENV_PYTHON}=.*nope is not an executable file"):
        ensure_vllm()


# -- the vLLM command line -----------------------------------------------------------------------------------


def test_vllm_command_lines() -> None:
    server = configured_server("bf16", "/py", "/model")
    server.port = 8123
    assert server.command() == [
        "/py", "-m", "vllm.entrypoints.openai.api_server", "--model", "/model", "--host", "127.0.0.1",
        "--port", "8123", "--enforce-eager", "--max-model-len", "2048", "--dtype", "bfloat16",
        "--served-model-name", "tiny-qwen2", "--enable-prompt-tokens-details"]
    for name, wanted, unwanted in (("f32-b32", ["--dtype", "float32", "--block-size", "32"], []),
                                   ("nocache", ["--no-enable-prefix-caching"], []),
                                   ("no-details", [], ["--enable-prompt-tokens-details"])):
        server = configured_server(name, "/py", "/model")
        server.port = 1
        cmd = " ".join(server.command())
        assert all(w in cmd for w in wanted) and not any(u in cmd for u in unwanted), (name, cmd)
    assert set(CONFIGS) == {"bf16", "f32-b32", "nocache", "no-details"}
    env = VllmServer("/py", "/model", env={"X": "1"}).env()
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["HF_HUB_OFFLINE"] == "1" and env["X"] == "1"
    assert "PYTHONPATH" not in env


# -- ServerProcess and ServerPool with a real (tiny) HTTP server ---------------------------------------------


class HttpServer(ServerProcess):
    """``python -m http.server``, ready when ``GET /`` answers; with ``exit_code`` it exits at once."""

    name = "http"
    ready_path = "/"

    def __init__(self, exit_code: int = -1, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.exit_code = exit_code

    def command(self) -> List[str]:
        if self.exit_code >= 0:
            return [sys.executable, "-c", f"print('boom: no model'); raise SystemExit({self.exit_code})"]
        return [sys.executable, "-m", "http.server", "--bind", self.host, str(self.port)]


def test_server_process_starts_logs_and_stops(tmp_path: Path) -> None:
    server = HttpServer(log_path=tmp_path / "http.log").start(timeout=30)
    try:
        assert server.is_alive() and server.url.startswith("http://127.0.0.1:") and server.startup_seconds
        assert venv_server.http_status(server.url + "/") == 200
        assert server.log_tail().splitlines()[0].startswith("$ ")
    finally:
        pid = server.pid
        server.stop()
    assert not server.is_alive() and pid is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_server_process_that_exits_shows_its_log(tmp_path: Path) -> None:
    with pytest.raises(ServerProcessError, match="(?s)exited with code 3 during start-up.*boom: no model"):
        HttpServer(exit_code=3, log_path=tmp_path / "x.log").start(timeout=30)


def test_server_process_not_ready_in_time(tmp_path: Path) -> None:
    server = HttpServer(log_path=tmp_path / "x.log")
    server.ready_path = "/missing"  # http.server answers 404 there
    with pytest.raises(ServerProcessError, match="not ready after 2 s"):
        server.start(timeout=2)
    assert not server.is_alive()


def test_pool_keeps_at_most_max_alive_and_remembers_failures(tmp_path: Path) -> None:
    made: Dict[str, int] = {}

    def factory(name: str) -> ServerProcess:
        made[name] = made.get(name, 0) + 1
        return HttpServer(exit_code=5 if name == "bad" else -1, log_path=tmp_path / f"{name}.log")

    pool = ServerPool(factory, max_alive=2, log=lambda m: None, timeout=30)
    try:
        a, b = pool.get("a", "b")
        assert pool.get("a")[0] is a  # reused, and now the most recently used
        (c,) = pool.get("c")  # makes room by stopping b, the least recently used
        assert not b.is_alive() and a.is_alive() and c.is_alive() and list(pool.alive) == ["a", "c"]
        for _ in range(2):
            with pytest.raises(ServerProcessError, match="exited with code 5"):
                pool.get("bad")
        assert made == {"a": 1, "b": 1, "c": 1, "bad": 1}  # a failed start-up is not tried again
        with pytest.raises(ServerProcessError, match="3 servers asked for at once; at most 2"):
            pool.get("a", "b", "c")
    finally:
        pool.stop_all()
    assert not a.is_alive() and not c.is_alive()


# -- the tiny model's weights --------------------------------------------------------------------------------


def test_tiny_model_weights_keep_the_reserved_dimensions() -> None:
    np = pytest.importorskip("numpy")
    from tests.support import tiny_hf_model as T

    cfg = T.TinyHFConfig()
    words, end, marks = [5, 7, 9], 11, {3: 0.325, 4: 0.225}
    t = T.build_weights(12, words, end, marks, seed=1, cfg=cfg)
    embd, head = t["model.embed_tokens.weight"], t["lm_head.weight"]
    assert embd.shape == (12, cfg.hidden) and np.all(embd[:, T.BIAS_DIM] == cfg.bias_value)
    assert embd[3, T.MARK_DIM] == np.float32(0.325) and np.count_nonzero(embd[:, T.MARK_DIM]) == 2
    assert np.all(embd[:, T.LEN_DIM] == 0)
    for name, w in t.items():
        if name.endswith(("q_proj.weight", "k_proj.weight", "gate_proj.weight", "up_proj.weight")):
            assert not w[:, list(T.RESERVED)].any(), name  # random weights never read them ...
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            rows = w[list(T.RESERVED)]
            if name == "model.layers.0.self_attn.o_proj.weight":  # ... but the length head writes LEN_DIM
                assert np.count_nonzero(rows) == 1 and rows[T.LEN_DIM - T.BIAS_DIM].any()
            else:
                assert not rows.any(), name
    hd = cfg.hidden // cfg.heads
    assert not t["model.layers.0.self_attn.q_proj.weight"][2 * hd:].any()  # zero queries: even attention
    v = t["model.layers.0.self_attn.v_proj.weight"]
    assert v[hd, T.MARK_DIM] == 1 and np.count_nonzero(v[hd:]) == 1
    others = [i for i in range(12) if i not in words + [end]]
    assert np.all(head[others, T.BIAS_DIM] == cfg.disallowed_weight) and not head[others, 1:].any()
    assert head[end, T.BIAS_DIM] == cfg.end_weight and head[end, T.LEN_DIM] == cfg.len_weight
    assert np.all(head[words, T.BIAS_DIM] == 0) and head[words].any()
    again = T.build_weights(12, words, end, marks, seed=1, cfg=cfg)
    assert all(np.array_equal(t[k], again[k]) for k in t)  # the seed decides everything


def test_tokenizer_json_is_byte_level_bpe_with_special_tokens() -> None:
    from tests.support.tiny_hf_model import QWEN2_SPLIT, tokenizer_json

    tokens = ["a", "b", "\u0120", "\u0120a", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "[PAD7]"]
    tok = tokenizer_json(tokens, [1, 1, 1, 1, 3, 3, 3, 4], ["\u0120 a"])
    assert tok["model"]["vocab"] == {"a": 0, "b": 1, "\u0120": 2, "\u0120a": 3}  # type: ignore[index]
    assert [a["content"] for a in tok["added_tokens"]] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # type: ignore
    assert tok["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] == QWEN2_SPLIT  # type: ignore[index]
