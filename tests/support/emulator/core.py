"""The emulated server itself: a stdlib threading HTTP server in a daemon thread, its lifecycle (start,
stop, kill), connection tracking, auth, dispatch to the kind's routes (:mod:`.vllm`, :mod:`.sglang`) or
to the generation endpoints (:mod:`.generation`), and the injected faults and hostile bodies.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import socket
import threading
import time
import uuid
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, List, Optional, Set, Tuple
from urllib.parse import urlsplit

from .config import CONTROL_MESSAGE, OTHER_MODEL, EmulatorConfig, Kind, _parse_fault, _RequestError
from .generation import _Generation
from .sglang import SglangKind
from .text import PrefixCache, render_chat, token_str, tokenize
from .vllm import VllmKind


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as uvicorn serves
    disable_nagle_algorithm = True  # small JSON answers would otherwise wait ~40 ms for delayed ACKs
    server_version = "uvicorn"
    sys_version = ""
    emulator: "Emulator"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def setup(self) -> None:
        super().setup()
        self.emulator._register_conn(self.connection)

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        self.emulator._unregister_conn(self.connection)

    # -- sending ---------------------------------------------------------------------------------------------

    def send_body(
        self,
        status: int,
        body: bytes,
        content_type: str = "application/json",
        headers: Optional[Dict[str, str]] = None,
    ) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)
        self.wfile.flush()

    def send_json(self, status: int, obj: Any, headers: Optional[Dict[str, str]] = None) -> None:
        self.send_body(status, json.dumps(obj).encode("utf-8"), "application/json", headers)

    def abort(self) -> None:
        """Drop the connection without (finishing) a response."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.wfile.flush()
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def read_body(self) -> bytes:
        length = int(self.headers.get("content-length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    # -- verbs -----------------------------------------------------------------------------------------------

    def _dispatch(self) -> None:
        try:
            self.emulator._handle(self)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    do_GET = _dispatch
    do_POST = _dispatch
    do_PUT = _dispatch
    do_DELETE = _dispatch



Routes = Dict[str, Tuple[Tuple[str, ...], Callable[[_Handler], None]]]


class Emulator(_Generation):
    """A vLLM- or SGLang-like server on 127.0.0.1 in a daemon thread. Use as a context manager.

    ``Emulator(EmulatorConfig(flavor="sglang"))`` or ``Emulator(flavor="sglang", block_size=1)``.
    """

    def __init__(
        self,
        config: Optional[EmulatorConfig] = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        **overrides: Any,
    ) -> None:
        if config is None:
            config = EmulatorConfig(**overrides)
        elif overrides:
            raise TypeError("give either a config or keyword overrides, not both")
        self.config = config
        self.host = host
        self.port = port
        self.url = ""
        self.requests_log: List[Dict[str, Any]] = []  # every chat (and completion) request body, in order
        self.every_request: List[Tuple[str, str]] = []  # (method, path) of every request of any kind
        self.health_generations = 0  # SGLang GET /health runs
        self.chat_requests = 0  # chat/completion POSTs received (the numbering `fault` uses)
        self.served_requests = 0  # requests that generated an answer
        self.in_flight = 0  # chat/completion requests received and not yet answered
        self.max_in_flight = 0  # the most that were ever in flight at once (1: no client sent in parallel)
        self._cache = PrefixCache(config.block_size, config.cache_capacity_blocks)
        self._lock = threading.Lock()  # batch size one: one generation at a time
        # the generations computing now (batching: EmulatorConfig.compute_seconds, slots, batch_variant): each
        # a one-entry list, set to True when another generation overlapped it
        self._computing: List[List[bool]] = []
        self._slots = threading.Semaphore(config.slots) if config.slots else None
        self._count_lock = threading.Lock()
        self._conns: Set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        self._server: Optional[_Server] = None
        self._thread: Optional[threading.Thread] = None
        self._stopping = threading.Event()
        self._dead = False
        self._started_at = int(time.time())
        self._fingerprint = hashlib.sha256(repr(config).encode("utf-8")).hexdigest()[:8]
        self._kind: Kind = VllmKind(self) if config.flavor == "vllm" else SglangKind(self)
        self._metrics = {
            "queries": 0,
            "hits": 0,
            "prompt_tokens": 0,
            "generation_tokens": 0,
            "success_stop": 0,
            "success_length": 0,
        }

    # -- lifecycle -------------------------------------------------------------------------------------------

    def start(self) -> "Emulator":
        if self._server is not None:
            raise RuntimeError("emulator already started")
        handler = type("_BoundHandler", (_Handler,), {"emulator": self})
        self._server = _Server((self.host, self.port), handler)
        self.port = self._server.server_address[1]
        self.url = f"http://{self.host}:{self.port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.01},
            name=f"emulator-{self.config.flavor}-{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close every connection. Safe to call twice or after :meth:`kill`."""
        self._stopping.set()
        self._shutdown_listener()
        self._close_conns()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def kill(self) -> None:
        """Simulate the server dying: stop listening (later connects are refused), drop open connections."""
        self._dead = True
        self._stopping.set()
        self._shutdown_listener()
        self._close_conns()

    def reset_cache(self) -> None:
        """Forget every cached block (SGLang ``/flush_cache``, vLLM ``/reset_prefix_cache``)."""
        with self._lock:
            self._cache.clear()

    @property
    def cached_blocks(self) -> int:
        return len(self._cache)

    def __enter__(self) -> "Emulator":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _shutdown_listener(self) -> None:
        server = self._server
        if server is None:
            return
        with self._count_lock:
            if getattr(server, "_emu_closed", False):
                return
            server._emu_closed = True  # type: ignore[attr-defined]
        server.shutdown()
        server.server_close()

    def _register_conn(self, conn: socket.socket) -> None:
        with self._conns_lock:
            self._conns.add(conn)
        if self._dead:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def _unregister_conn(self, conn: socket.socket) -> None:
        with self._conns_lock:
            self._conns.discard(conn)

    def _close_conns(self) -> None:
        with self._conns_lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    # -- routing ---------------------------------------------------------------------------------------------

    def _error_body(
        self, status: int, message: str, err_type: str, param: Optional[str] = None
    ) -> Dict[str, Any]:
        if self._vllm:
            return {"error": {"message": message, "type": err_type, "param": param, "code": status}}
        return {"object": "error", "message": message, "type": err_type, "param": param, "code": status}

    def _send_error(self, h: _Handler, err: _RequestError) -> None:
        h.send_json(err.status, self._error_body(err.status, err.message, err.err_type, err.param))

    def _not_found(self, h: _Handler) -> None:
        # FastAPI's default for an unknown route (real vLLM 0.32.0 too, tests/test_conformance_vllm.py)
        h.send_json(404, {"detail": "Not Found"})

    def _method_not_allowed(self, h: _Handler) -> None:
        h.send_json(405, {"detail": "Method Not Allowed"})

    def _authorized(self, h: _Handler, path: str) -> bool:
        key = self.config.api_key
        if not key:
            return True
        if self._vllm:
            protected = path.startswith("/v1")  # vLLM's AuthenticationMiddleware guards /v1 only
        else:
            protected = not path.startswith(("/health", "/metrics"))
        return not protected or h.headers.get("Authorization") == f"Bearer {key}"

    def _handle(self, h: _Handler) -> None:
        self.every_request.append((h.command, h.path))
        if self._dead:
            h.abort()
            return
        path = urlsplit(h.path).path
        method = h.command
        chat_paths = ("/v1/chat/completions", "/v1/completions")
        if path in chat_paths and method == "POST":
            self._handle_generation(h, path)
            return
        if not self._authorized(h, path):
            h.read_body()
            h.send_json(401, {"error": "Unauthorized"})
            return
        routes = self._kind.routes()
        entry = routes.get(path)
        if entry is None:
            h.read_body()
            if path in chat_paths:
                self._method_not_allowed(h)
            else:
                self._not_found(h)
            return
        methods, fn = entry
        if method not in methods:
            h.read_body()
            self._method_not_allowed(h)
            return
        fn(h)

    # -- informational endpoints -----------------------------------------------------------------------------

    def _models(self, h: _Handler) -> None:
        cfg = self.config
        data = []
        for name in cfg.served_models:
            if self._vllm:
                data.append(
                    {
                        "id": name,
                        "object": "model",
                        "created": self._started_at,
                        "owned_by": "vllm",
                        "root": cfg.model,
                        "parent": None,
                        "max_model_len": cfg.max_model_len,
                        "permission": [
                            {
                                "id": f"modelperm-{uuid.uuid4().hex}",
                                "object": "model_permission",
                                "created": self._started_at,
                                "allow_create_engine": False,
                                "allow_sampling": True,
                                "allow_logprobs": True,
                                "allow_search_indices": False,
                                "allow_view": True,
                                "allow_fine_tuning": False,
                                "organization": "*",
                                "group": None,
                                "is_blocking": False,
                            }
                        ],
                    }
                )
            else:
                data.append(
                    {
                        "id": name,
                        "object": "model",
                        "created": self._started_at,
                        "owned_by": "sglang",
                        "root": cfg.model,
                        "parent": None,
                        "max_model_len": cfg.max_model_len,
                    }
                )
        h.send_json(200, {"object": "list", "data": data})

    def _tokenize(self, h: _Handler) -> None:
        try:
            body = json.loads(h.read_body() or b"{}")
            if not isinstance(body, dict):
                raise ValueError("body must be a JSON object")
            if "messages" in body:
                text = render_chat(
                    body["messages"], bool(body.get("add_generation_prompt", True)), self.config.chat_template
                )
            elif isinstance(body.get("prompt"), str):
                text = body["prompt"]
            else:
                raise ValueError("give 'prompt' or 'messages'")
        except (ValueError, TypeError) as exc:
            self._send_error(h, _RequestError(400, str(exc), "BadRequestError"))
            return
        ids = tokenize(text)
        limit = self.config.max_model_len
        if not self._vllm and self.config.tokenizer_max_length is not None:
            limit = self.config.tokenizer_max_length
        out: Dict[str, Any] = {"count": len(ids), "max_model_len": limit, "tokens": ids}
        if self._vllm:
            out["token_strs"] = [token_str(t) for t in ids] if body.get("return_token_strs") else None
        h.send_json(200, out)


    def _handle_generation(self, h: _Handler, path: str) -> None:
        with self._count_lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            self._handle_generation_counted(h, path)
        finally:
            with self._count_lock:
                self.in_flight -= 1

    def _handle_generation_counted(self, h: _Handler, path: str) -> None:
        raw = h.read_body()
        with self._count_lock:
            self.chat_requests += 1
            number = self.chat_requests
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = None
        self.requests_log.append(
            body if isinstance(body, dict) else {"_invalid_body": raw.decode("utf-8", "replace")}
        )

        cfg = self.config
        if cfg.fail_after_requests is not None and number > cfg.fail_after_requests:
            self._dead = True  # before anything else can be served
            h.abort()
            threading.Thread(target=self.kill, daemon=True).start()
            return
        fault_kind, slow_for = _parse_fault(cfg.fault[number]) if number in cfg.fault else ("", 0.0)
        if fault_kind in ("429", "500", "503"):
            status = int(fault_kind)
            phrase = {429: "Too Many Requests", 500: "Internal Server Error", 503: "Service Unavailable"}[
                status
            ]
            headers = {"retry-after": "1"} if status in (429, 503) else None
            h.send_json(
                status,
                self._error_body(
                    status,
                    f"{phrase} (emulated fault on request {number})",
                    phrase.replace(" ", "") + "Error",
                ),
                headers,
            )
            return
        if fault_kind == "slow" and self._stopping.wait(slow_for):
            h.abort()  # stopped while "slow"
            return
        if self._hostile(h, fault_kind, number):
            return
        if not self._authorized(h, path):
            h.send_json(401, {"error": "Unauthorized"})
            return
        try:
            if raw and body is None:
                raise self._validation_error("JSON decode error", "body", "json_invalid")
            if not isinstance(body, dict):
                raise self._validation_error("Input should be a valid dictionary or object to extract fields "
                                             "from", "body", "model_attributes_type")
            if path == "/v1/chat/completions":
                response, stream_chunks = self._chat(body)
            else:
                response, stream_chunks = self._completion(body)
        except _RequestError as err:
            self._send_error(h, err)
            return

        if stream_chunks is not None:
            payload = "".join(f"data: {json.dumps(c)}\n\n" for c in stream_chunks) + "data: [DONE]\n\n"
            data = payload.encode("utf-8")
            if fault_kind == "truncated":
                self._send_truncated(h, data, "text/event-stream; charset=utf-8")
            else:
                h.send_body(200, data, "text/event-stream; charset=utf-8")
            return
        if fault_kind == "no-choices":
            response["choices"] = []
        elif fault_kind == "no-usage":
            response.pop("usage", None)
        elif fault_kind == "nested-arguments" and path == "/v1/chat/completions":
            tools = body.get("tools") or [{"function": {"name": "f"}}]
            response["choices"][0]["finish_reason"] = "tool_calls"
            response["choices"][0]["message"].update(content=None, tool_calls=[{
                "id": "call_deep", "type": "function", "function": {
                    "name": tools[0]["function"]["name"], "arguments": '{"a": ' * 5000 + "1" + "}" * 5000}}])
        if fault_kind == "not-json":
            h.send_body(
                200, b"<html><body>502 Bad Gateway (emulated: not JSON)</body></html>", "application/json"
            )
            return
        if fault_kind == "other-model":
            response["model"] = OTHER_MODEL
        if fault_kind == "nan":  # json.dumps writes NaN, which is not JSON
            response["usage"]["prompt_tokens_details"] = {"cached_tokens": float("nan")}
        data = json.dumps(response).encode("utf-8")
        if fault_kind == "truncated":
            self._send_truncated(h, data, "application/json")
            return
        if fault_kind == "drip":
            self._drip(h, data, slow_for)
            return
        h.send_body(200, data)

    _bomb: Optional[bytes] = None

    def _hostile(self, h: _Handler, kind: str, number: int) -> bool:
        """Answer as a hostile or broken server would, for faults that need no real reply; True if done."""
        if kind == "huge":
            total = 100 << 20
            h.send_response(200)
            h.send_header("content-type", "application/json")
            h.send_header("content-length", str(total))
            h.end_headers()
            piece = b'{"choices": [' + b" " * ((1 << 20) - 13)
            with contextlib.suppress(OSError):
                for _ in range(total >> 20):
                    h.wfile.write(piece)
            h.close_connection = True
        elif kind == "gzip-bomb":
            if Emulator._bomb is None:  # 64 gzip members of 4 MiB of zeros each: 256 MiB in 260 KB
                comp = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
                Emulator._bomb = (comp.compress(b"\0" * (4 << 20)) + comp.flush()) * 64
            h.send_body(200, Emulator._bomb, headers={"content-encoding": "gzip"})
        elif kind == "redirect":
            h.send_body(307, b"", headers={"location": f"http://evil.invalid:9{h.path}"})
        elif kind == "nested":
            h.send_body(200, b"[" * 100_000 + b"]" * 100_000)
        elif kind == "bigint":
            h.send_body(200, b'{"choices": [], "usage": {"prompt_tokens": 1' + b"0" * 5000 + b"}}")
        elif kind in ("surrogate", "control"):
            message = "bad \ud800 answer" if kind == "surrogate" else CONTROL_MESSAGE
            h.send_json(500, self._error_body(500, f"{message} (emulated fault on request {number})",
                                              "InternalServerError"))
        else:
            return False
        return True

    def _drip(self, h: _Handler, data: bytes, every: float) -> None:
        h.send_response(200)
        h.send_header("content-type", "application/json")
        h.send_header("content-length", str(len(data)))
        h.end_headers()
        with contextlib.suppress(OSError):
            for i in range(len(data)):
                h.wfile.write(data[i:i + 1])
                h.wfile.flush()
                if self._stopping.wait(every):
                    break
        h.close_connection = True

    @staticmethod
    def _send_truncated(h: _Handler, data: bytes, content_type: str) -> None:
        h.send_response(200)
        h.send_header("content-type", content_type)
        h.send_header("content-length", str(len(data)))
        h.end_headers()
        h.wfile.write(data[: max(len(data) // 2, 1)])
        h.abort()
