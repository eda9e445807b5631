"""The HTTP layer against hostile or broken servers: every one is a RequestError naming the cause.

`responses` mocks cover what needs no socket; small stdlib servers on loopback cover what depends on real
sockets: a body far larger than the reply can need, a gzip bomb, a server that drips bytes, redirects to
another origin. Server strings in error messages are escaped (:func:`printable`), lone surrogates never
leave the layer (:func:`clean_text`).
"""

from __future__ import annotations

import base64
import gzip
import json
import threading
import time
import tracemalloc
import zlib
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Iterator, List

import pytest
import requests
import responses

from pytest_cachecheck.clients.http import GET_MAX_BYTES, Http, chat_max_bytes
from pytest_cachecheck.errors import RequestError
from pytest_cachecheck.text import clean_text, printable

URL = "http://127.0.0.1:8080"
CHAT = URL + "/v1/chat/completions"
MiB = 1 << 20


def chat_body(content: str = "hello", **extra: object) -> dict:
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}
    body.update(extra)
    return body


# -- loopback servers -----------------------------------------------------------------------------------
class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False


@contextmanager
def serve(handle: Callable[[BaseHTTPRequestHandler], None]) -> Iterator[str]:
    """A loopback HTTP/1.1 server whose every GET and POST is answered by ``handle``."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            try:
                handle(self)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        do_POST = do_GET

    server = _Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def head(h: BaseHTTPRequestHandler, status: int = 200, length: int | None = None, **headers: str) -> None:
    h.send_response(status)
    h.send_header("content-type", "application/json")
    if length is not None:
        h.send_header("content-length", str(length))
    for name, value in headers.items():
        h.send_header(name.replace("_", "-"), value)
    h.end_headers()


# -- A1: bodies far larger than a reply can need; gzip bombs ----------------------------------------------
def test_cap_formula():
    assert chat_max_bytes(256) == MiB + 256 * 8 * 1024
    assert chat_max_bytes(1) == MiB + 8 * 1024
    assert 2 * MiB <= GET_MAX_BYTES <= 16 * MiB


@responses.activate
def test_chat_reply_at_the_cap_is_read_and_one_byte_more_is_not():
    cap = chat_max_bytes(16)
    body = json.dumps(chat_body())
    fits = body[:-1] + " " * (cap - len(body)) + "}"
    assert len(fits) == cap
    responses.post(CHAT, body=fits)
    assert Http(URL).post("/v1/chat/completions", {"max_tokens": 16})["choices"]
    responses.replace(responses.POST, CHAT, body=fits[:-1] + " }")
    with pytest.raises(RequestError, match=rf"larger than {cap} bytes.*max_tokens=16"):
        Http(URL).post("/v1/chat/completions", {"max_tokens": 16})


@responses.activate
def test_get_endpoints_have_a_fixed_cap():
    responses.get(URL + "/metrics", body="x" * (GET_MAX_BYTES + 1))
    cause = rf"GET /metrics to {URL}: the body is larger than {GET_MAX_BYTES} bytes once decoded"
    with pytest.raises(RequestError, match=cause):
        Http(URL).request("GET", "/metrics", expect_json=False)
    responses.get(URL + "/props", body="{}" + " " * (GET_MAX_BYTES - 2))
    assert Http(URL).get("/props") == (200, {})


@responses.activate
def test_explicit_max_bytes_wins():
    responses.get(URL + "/props", json={"a": "b" * 100})
    with pytest.raises(RequestError, match="larger than 50 bytes"):
        Http(URL).get("/props", max_bytes=50)


def _peak_mib(fn: Callable[[], object]) -> float:
    tracemalloc.start()
    try:
        fn()
    except RequestError:
        pass
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / MiB


def test_huge_body_is_cut_at_the_cap_in_bounded_memory_and_time():
    total = 100 * MiB  # what the tester's server sent: 4.3 GB of memory and a 1.26 GB report before

    def huge(h: BaseHTTPRequestHandler) -> None:
        head(h, length=total)
        piece = b'{"choices": [' + b" " * (MiB - 13)
        for _ in range(total // MiB):
            h.wfile.write(piece)

    with serve(huge) as url:
        http = Http(url, timeout=30)
        start = time.monotonic()
        with pytest.raises(RequestError) as info:
            http.post("/v1/chat/completions", {"max_tokens": 256})
        elapsed = time.monotonic() - start
        peak = _peak_mib(lambda: http.post("/v1/chat/completions", {"max_tokens": 256}))
    assert f"POST /v1/chat/completions to {url}: the body is larger than {chat_max_bytes(256)} bytes" \
        in str(info.value)
    assert elapsed < 5, elapsed
    assert peak < 4 * chat_max_bytes(256) / MiB, f"{peak:.1f} MiB"


@pytest.fixture(scope="module")
def gzip_bomb() -> bytes:
    """1 GiB of zeros, gzip-compressed to about 1 MiB."""
    comp = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = b"\0" * (4 * MiB)
    return b"".join([comp.compress(zeros) for _ in range(256)] + [comp.flush()])


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/props"])
def test_gzip_bomb_is_stopped_after_the_cap_of_decoded_bytes(gzip_bomb, path):
    def bomb(h: BaseHTTPRequestHandler) -> None:
        head(h, length=len(gzip_bomb), content_encoding="gzip")
        h.wfile.write(gzip_bomb)

    with serve(bomb) as url:
        http = Http(url, timeout=30)
        call = (lambda: http.post(path, {"max_tokens": 64})) if path.startswith("/v1") else \
            (lambda: http.get(path))
        with pytest.raises(RequestError, match="once decoded"):
            call()
        peak = _peak_mib(call)
    assert peak < 48, f"{peak:.1f} MiB for a 1 GiB bomb"


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "deflate-raw"])
def test_compressed_bodies_are_decoded(encoding):
    data = json.dumps(chat_body("ünïcode ✓")).encode()
    if encoding == "gzip":
        packed = gzip.compress(data)
    elif encoding == "deflate":
        packed = zlib.compress(data)
    else:
        comp = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
        packed = comp.compress(data) + comp.flush()

    def answer(h: BaseHTTPRequestHandler) -> None:
        head(h, length=len(packed), content_encoding=encoding.split("-")[0])
        h.wfile.write(packed)

    with serve(answer) as url:
        data_back = Http(url).post("/v1/chat/completions", {"max_tokens": 8})
    assert data_back["choices"][0]["message"]["content"] == "ünïcode ✓"


def test_unknown_content_encoding_is_an_error():
    def answer(h: BaseHTTPRequestHandler) -> None:
        head(h, length=4, content_encoding="br\x1b[2J")
        h.wfile.write(b"abcd")

    with serve(answer) as url:
        with pytest.raises(RequestError, match=r"encoded with 'br\\x1b\[2J'") as info:
            Http(url).get("/props")
    assert "\x1b" not in str(info.value)


# -- A2: the timeout is a deadline for the whole request ------------------------------------------------
def _drip(what: str, every: float) -> Callable[[BaseHTTPRequestHandler], None]:
    def drip(h: BaseHTTPRequestHandler) -> None:
        body = json.dumps(chat_body()).encode()
        if what == "head":
            raw = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                   + str(len(body)).encode() + b"\r\n\r\n")
            rest = body
        else:
            head(h, length=len(body))
            raw, rest = body, b""
        for i in range(len(raw)):
            h.wfile.write(raw[i:i + 1])
            h.wfile.flush()
            time.sleep(every)
        h.wfile.write(rest)

    return drip


@pytest.mark.parametrize("what", ["body", "head"])
@pytest.mark.parametrize("timeout", [1.0, 2.0])
def test_dripping_server_is_stopped_at_the_deadline(what, timeout):
    with serve(_drip(what, 0.1)) as url:
        start = time.monotonic()
        with pytest.raises(RequestError, match=rf"no answer within {timeout:g} s \(--cachecheck-timeout\)"):
            Http(url, timeout=timeout).post("/v1/chat/completions", {"max_tokens": 8})
        elapsed = time.monotonic() - start
    # the unbounded drip takes 8 s or more; a loaded machine may wake the watchdog late
    assert timeout - 0.1 < elapsed < timeout + 3.0, elapsed


def test_deadline_leaves_the_next_request_working():
    calls: List[int] = []

    def slow_then_fast(h: BaseHTTPRequestHandler) -> None:
        calls.append(1)
        if len(calls) == 1:
            _drip("body", 0.1)(h)
            return
        body = json.dumps(chat_body("second")).encode()
        head(h, length=len(body))
        h.wfile.write(body)

    with serve(slow_then_fast) as url:
        http = Http(url, timeout=1)
        with pytest.raises(RequestError, match="no answer within 1 s"):
            http.post("/v1/chat/completions", {"max_tokens": 8})
        time.sleep(1.5)  # a late watchdog must not kill the connection of the next request
        assert http.post("/v1/chat/completions", {"max_tokens": 8})["choices"][0]["message"]["content"] \
            == "second"


# -- A3: redirects are never followed -------------------------------------------------------------------
@responses.activate
@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_redirects_are_errors_naming_status_and_target(status):
    target = "http://bob:Hunter2-Pw9x@evil.example:9/steal?key=tok-Qr8Zx1Lm5Vn&x=1"
    responses.post(CHAT, status=status, headers={"Location": target})
    responses.get(URL + "/props", status=status, headers={"Location": "/other/props?t=1"})
    http = Http(URL, api_key="sk-Kq3Wz8Lp5Xv")
    with pytest.raises(RequestError) as info:
        http.post("/v1/chat/completions", {"max_tokens": 8})
    text = str(info.value)
    assert f"HTTP {status} redirect to http://evil.example:9/steal?key=***&x=*** (another origin)" in text
    for secret in ("bob", "Hunter2-Pw9x", "tok-Qr8Zx1Lm5Vn"):
        assert secret not in text
    with pytest.raises(RequestError, match=rf"HTTP {status} redirect to {URL}/other/props\?t=\*\*\*; "):
        http.get("/props")
    assert len(responses.calls) == 2  # nothing followed


def test_credentials_never_follow_a_redirect_to_another_origin():
    seen: List[str] = []

    def other(h: BaseHTTPRequestHandler) -> None:
        seen.append(f"{h.command} {h.path} {h.headers.get('Authorization')}")
        head(h, length=2)
        h.wfile.write(b"{}")

    with serve(other) as elsewhere:
        def redirect(h: BaseHTTPRequestHandler) -> None:
            head(h, 307, length=0, location=elsewhere + h.path)

        with serve(redirect) as url:
            for api_key, userinfo in (("sk-Kq3Wz8Lp5Xv", ""), (None, "alice:Wonder-Land9@")):
                http = Http(url.replace("http://", "http://" + userinfo) + "?token=tok-Qr8Zx1Lm5Vn",
                            api_key=api_key)
                with pytest.raises(RequestError, match=r"HTTP 307 redirect to http://127\.0\.0\.1:\d+/v1/chat/"
                                                       r"completions\?token=\*\*\* \(another origin\)"):
                    http.post("/v1/chat/completions", {"max_tokens": 8})
    assert seen == []


# -- A4: malformed JSON ---------------------------------------------------------------------------------
MALFORMED = [
    pytest.param("[" * 100_000 + "]" * 100_000, "nested", id="nested-100000"),
    pytest.param('{"a":' * 65 + "1" + "}" * 65, "nested", id="nested-65"),
    pytest.param('{"choices": [], "usage": {"prompt_tokens": 1' + "0" * 5000 + "}}", "digits",
                 id="int-5000-digits"),
    pytest.param('{"usage": {"prompt_tokens": ' + "9" * 400 + "}}", "digits", id="int-400-digits"),
    pytest.param('{"choices": [{"logprobs": NaN}]}', "NaN", id="nan"),
    pytest.param('{"x": Infinity}', "Infinity", id="infinity"),
    pytest.param('{"x": -Infinity}', "-Infinity", id="minus-infinity"),
    pytest.param('{"x": 1e400}', "too large", id="float-overflow"),
]


@responses.activate
@pytest.mark.parametrize("body, cause", MALFORMED)
def test_malformed_json_is_a_request_error(body, cause):
    responses.post(CHAT, body=body)
    responses.get(URL + "/props", body=body)
    with pytest.raises(RequestError, match=f"malformed JSON.*{cause}"):
        Http(URL).post("/v1/chat/completions", {"max_tokens": 8})
    with pytest.raises(RequestError, match=f"GET /props to {URL}: HTTP 200 but the body is malformed JSON"):
        Http(URL).get("/props")


@responses.activate
def test_plain_non_json_stays_tolerated_on_get():
    responses.get(URL + "/version", body="<html>an SPA answers every path</html>")
    status, data = Http(URL).get("/version")
    assert status == 200 and not isinstance(data, dict)


@responses.activate
def test_depth_64_is_fine():
    responses.get(URL + "/props", body='{"a":' * 63 + "1" + "}" * 63)
    assert isinstance(Http(URL).get("/props")[1], dict)


# -- A5: lone surrogates and undecodable bytes ------------------------------------------------------------
@responses.activate
def test_lone_surrogates_and_bad_utf8_become_replacement_characters():
    body = ('{"choices": [{"message": {"content": "a\\ud800b\\udfffc \\ud83d\\ude00"}, '
            '"finish_reason": "st\\udc80op"}], "usage": {"prompt_tokens": 1, "completion_tokens": 1}, '
            '"k\\ud800": ["\\udbff"]}').encode() + b'\n'
    bad = b'{"choices": [{"message": {"content": "x\xff\xfey\xed\xa0\x80z"}}], "usage": {}}'
    responses.post(CHAT, body=body)
    data = Http(URL).post("/v1/chat/completions", {"max_tokens": 8})
    assert data["choices"][0]["message"]["content"] == "a\ufffdb\ufffdc \U0001F600"
    assert data["choices"][0]["finish_reason"] == "st\ufffdop"
    assert data["k\ufffd"] == ["\ufffd"]
    json.dumps(data, ensure_ascii=False).encode("utf-8")  # any writer can encode it
    responses.replace(responses.POST, CHAT, body=bad)
    content = Http(URL).post("/v1/chat/completions", {"max_tokens": 8})["choices"][0]["message"]["content"]
    assert content.startswith("x\ufffd") and content.endswith("z") and content.encode("utf-8")


def test_clean_text():
    assert clean_text("ok ✓ \U0001F600") == "ok ✓ \U0001F600"
    assert clean_text("\ud800\udc00x\udfff") == "\ufffd\ufffdx\ufffd"


# -- A6: server strings are shown escaped and capped ------------------------------------------------------
def test_printable():
    assert printable("plain text, ünïcode ✓") == "plain text, ünïcode ✓"
    assert printable("a\nb\r\tc") == "a\\nb\\r\\tc"
    assert printable("\x1b[2J\x00\x7f\x85\x9b") == "\\x1b[2J\\x00\\x7f\\x85\\x9b"
    assert printable("x\u202eevil\u2066y\u2069\u202a") == "x\\u202eevil\\u2066y\\u2069\\u202a"
    assert printable("\ud800") == "\\ud800"
    assert printable("x" * 300) == "x" * 200 + "..."
    assert printable("ab", limit=1) == "a..."
    assert printable("\n" * 150, limit=200) == "\\n" * 100 + "..."  # never half an escape
    assert len(printable("\x1b" * 1000, limit=50)) <= 53


HOSTILE = "FAKE\x1b[2K\r\x1b[32mPASSED\x1b[0m\nnext line \u202etxt.exe\u2066 \x85\x07"


@responses.activate
@pytest.mark.parametrize("kind", ["json-error", "text-error", "not-json-200", "redirect"])
def test_server_text_in_error_messages_is_escaped(kind):
    if kind == "json-error":
        responses.post(CHAT, status=500, json={"error": {"message": HOSTILE * 20}})
    elif kind == "text-error":
        responses.post(CHAT, status=502, body=HOSTILE, content_type="text/plain")
    elif kind == "not-json-200":
        responses.post(CHAT, status=200, body=HOSTILE, content_type="text/plain")
    else:
        responses.post(CHAT, status=307, headers={"Location": "http://x/\x1b[2J\x85"})
    with pytest.raises(RequestError) as info:
        Http(URL).post("/v1/chat/completions", {"max_tokens": 8})
    text = str(info.value)
    for bad in ("\x1b", "\r", "\n", "\u202e", "\u2066", "\x85", "\x07"):
        assert bad not in text, (bad, text)
    assert len(text) < 500
    assert "\\x1b" in text


def test_protocol_garbage_is_escaped():
    def garbage(h: BaseHTTPRequestHandler) -> None:
        h.wfile.write(b"\x1b[2J\x1b[31mHTTP/9 ALL TESTS PASSED\r\n\r\n")
        h.close_connection = True

    with serve(garbage) as url:
        with pytest.raises(RequestError, match="connection failed") as info:
            Http(url).post("/v1/chat/completions", {"max_tokens": 8})
    assert "\x1b" not in str(info.value)


# -- other transport failures stay request errors --------------------------------------------------------
def test_cut_short_body_is_an_error():
    def cut(h: BaseHTTPRequestHandler) -> None:
        head(h, length=1000)
        h.wfile.write(b'{"choices": [')
        h.close_connection = True

    with serve(cut) as url:
        with pytest.raises(RequestError, match="cut short"):
            Http(url).post("/v1/chat/completions", {"max_tokens": 8})


def test_basic_auth_with_non_latin1_password_is_sent_as_utf8():
    seen: List[str] = []

    def record(h: BaseHTTPRequestHandler) -> None:
        seen.append(h.headers.get("Authorization", ""))
        body = json.dumps(chat_body()).encode()
        head(h, length=len(body))
        h.wfile.write(body)

    with serve(record) as url:
        for password in ("pässwörd-✓-Ω", "p%C3%A4ss-%E2%9C%93-word"):
            Http(url.replace("http://", f"http://zoë:{password}@")).post("/v1/chat/completions", {})
    decoded = [base64.b64decode(a.split(" ", 1)[1]).decode("utf-8") for a in seen]
    assert decoded == ["zoë:pässwörd-✓-Ω", "zoë:päss-✓-word"]


def test_api_key_a_header_cannot_carry_is_refused_without_showing_it():
    for key in ("sk-Kq3Wz8Lp5Xv\r\nX-Injected: 1", "sk-Kq3Wz8Lp5Xv-\u0416"):
        with pytest.raises(ValueError) as info:
            Http(URL, api_key=key)
        assert "Kq3Wz8Lp" not in str(info.value) and "Kq3Wz8Lp" not in repr(info.value)


def test_reprs_hold_no_secret():
    http = Http("http://alice:Wonder-Land9@127.0.0.1:8080/v1?token=tok-Qr8Zx1Lm5Vn&bare-Tk9Lm2Qx",
                api_key="sk-Kq3Wz8Lp5Xv")
    for text in (repr(http), repr(http.redactor), str(http.redactor)):
        for secret in ("Wonder-Land9", "tok-Qr8Zx1Lm5Vn", "bare-Tk9Lm2Qx", "sk-Kq3Wz8Lp5Xv"):
            assert secret not in text, text
    assert "127.0.0.1:8080" in repr(http)


def test_requests_exceptions_other_than_transport_are_request_errors(monkeypatch):
    http = Http(URL + "?token=tok-Qr8Zx1Lm5Vn")

    def boom(*args: object, **kwargs: object) -> None:
        raise requests.exceptions.InvalidURL(f"cannot parse {args[1]}")

    monkeypatch.setattr(http.session, "request", boom)
    with pytest.raises(RequestError) as info:
        http.get("/props")
    assert "tok-Qr8Zx1Lm5Vn" not in str(info.value) and "InvalidURL" in str(info.value)
