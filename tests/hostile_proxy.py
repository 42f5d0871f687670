"""A misbehaving gateway of our own: a real HTTP server on 127.0.0.1 between tokview and the simulator.

Real deployments put nginx, an API gateway or a load balancer in front of SGLang/vLLM, and those fail
in ways the simulator's own faults do not cover: an HTML error page with status 200, a body cut short
under a whole `content-length`, a redirect, a 429 with a real `Retry-After`, a gateway that echoes the
request's headers into its answer, a body whose ids were changed on the way, one byte every half
second. The proxy forwards probes (`/v1/models`, `/health`, `/tokenize`, …) untouched and answers each
generation request with its fault (the one-token start-up probes too when asked), so a batch through it
reaches planning and every prompt meets the fault.

Written on the standard library's threaded HTTP server so every byte on the wire is ours to choose
(uvicorn would refuse to send a body shorter than its `content-length`).
"""

from __future__ import annotations

import gzip
import http.client
import json
import sys
import threading
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions", "/generate"})
"""The requests a fault applies to; everything else (`/v1/models`, `/health`, `/tokenize`) is forwarded."""


def is_probe(body: bytes) -> bool:
    """tokview's start-up probes ask a generation endpoint for one token; a batch asks for more."""
    try:
        data = json.loads(body)
    except ValueError:
        return False
    if not isinstance(data, dict):
        return False
    asked = data.get("max_tokens", (data.get("sampling_params") or {}).get("max_new_tokens"))
    return asked == 1


JSON = "application/json"


@dataclass
class Answer:
    """What the proxy sends back: a status line, headers and a body, plus how the body goes out."""

    status: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = JSON
    send_bytes: int | None = None
    """Send only this many bytes of the body (under the whole body's content-length), then close."""
    drip_s: float = 0.0
    """Send the body one byte at a time, this many seconds apart."""
    raw_head: bytes | None = None
    """Send these bytes instead of a status line and headers, then close (not HTTP at all)."""


Upstream = Callable[[], tuple[int, dict[str, str], bytes]]
"""Forward the current request to the simulator and return (status, headers, body)."""
Fault = Callable[["Handler", Upstream], Answer]


def _json_answer(status: int, payload: Any, **kw: Any) -> Answer:
    return Answer(status, json.dumps(payload).encode(), **kw)


def _forwarded(upstream: Upstream) -> Answer:
    status, headers, body = upstream()
    return Answer(status, body, content_type=headers.get("content-type", JSON))


def _edit_json(upstream: Upstream, edit: Callable[[Any], None]) -> Answer:
    """Forward, then change the JSON answer on the way back (a gateway that rewrites bodies)."""
    status, _, body = upstream()
    data = json.loads(body)
    edit(data)
    return _json_answer(status, data)


def _first_choice(data: Any) -> dict[str, Any]:
    if isinstance(data, dict) and data.get("choices"):
        return data["choices"][0]
    return data  # SGLang /generate: the ids sit in meta_info / output_ids at the top level


def _set_output_id(value: Any) -> Callable[[Any], None]:
    def edit(data: Any) -> None:
        choice = _first_choice(data)
        for key in ("token_ids", "output_ids"):
            if isinstance(choice.get(key), list) and choice[key]:
                choice[key][0] = value
                return
        raise AssertionError(f"no output ids to mutate in {sorted(choice)}")

    return edit


def _surrogate_text(data: Any) -> None:
    """A lone UTF-16 surrogate in the output text, as the JSON escape a server's encoder writes for it."""
    choice = _first_choice(data)
    choice["text"] = "half a pair: \ud800 " + (choice.get("text") or "")


def _drop_prompt_ids(data: Any) -> None:
    choice = _first_choice(data)
    for key in ("prompt_token_ids",):
        if isinstance(choice.get(key), list) and choice[key]:
            choice[key] = choice[key][1:]
            return
    if isinstance(data.get("prompt_token_ids"), list):
        data["prompt_token_ids"] = data["prompt_token_ids"][1:]


def _echo_headers(handler: Handler, upstream: Upstream) -> Answer:
    """A gateway that reflects the request's headers (Authorization included) into a 200 body."""
    status, _, body = upstream()
    data = json.loads(body)
    data["echo"] = {"headers": dict(handler.headers.items())}
    return _json_answer(status, data)


def _redirect(handler: Handler, upstream: Upstream) -> Answer:
    """307 to the simulator's same path: a load balancer moving the client on (the body must be re-sent)."""
    return Answer(307, b"", headers={"location": handler.server.upstream_url + handler.path}, content_type="text/plain")


def _redirect_to_self(handler: Handler, upstream: Upstream) -> Answer:
    host, port = handler.server.server_address[:2]
    host = host.decode() if isinstance(host, bytes) else host
    return Answer(307, b"", headers={"location": f"http://{host}:{port}{handler.path}"}, content_type="text/plain")


def _compressed(coding: str) -> Fault:
    """A gateway set to compress always, whatever the request's accept-encoding says (the body as `coding` names)."""

    def fault(handler: Handler, upstream: Upstream) -> Answer:
        status, headers, body = upstream()
        if coding == "gzip":
            packed = gzip.compress(body)
        elif coding == "deflate":
            packed = zlib.compress(body)
        else:  # a coding tokview does not read: what it holds does not matter
            packed = b"\x1b\x00" + body
        return Answer(
            status, packed, headers={"content-encoding": coding}, content_type=headers.get("content-type", JSON)
        )

    return fault


def _cut(handler: Handler, upstream: Upstream) -> Answer:
    """The whole answer's content-length, half its body, then the connection closes."""
    status, _, body = upstream()
    return Answer(status, body, send_bytes=len(body) // 2)


NGINX_502 = b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1>"
NGINX_502 += b"</center>\r\n<hr><center>nginx/1.25.3</center>\r\n</body>\r\n</html>\r\n"
LOGIN_PAGE = b"<!DOCTYPE html><html><head><title>Sign in</title></head><body><form>SSO</form></body></html>"
TERMINAL_ESCAPES = "\x1b[2J\x1b[H\x1b]0;pwned\x07"
"""Clear the screen, home the cursor, set the window title: what a hostile body would do to a terminal."""

FAULTS: dict[str, Fault] = {
    "pass": lambda h, up: _forwarded(up),
    "malformed-json": lambda h, up: Answer(200, b'{"id": "cmpl-1", "choices": [{"text": "hi", "token_ids": [1, 2'),
    "empty-200": lambda h, up: Answer(200, b""),
    "json-null": lambda h, up: Answer(200, b"null"),
    "json-array": lambda h, up: Answer(200, b"[]"),
    "cut-body": _cut,
    "cut-head": lambda h, up: Answer(200, raw_head=b"HTTP/1.1 200 OK\r\ncontent-type: appl"),
    "not-http": lambda h, up: Answer(200, raw_head=b"SSH-2.0-OpenSSH_9.6\r\n"),
    "html-200": lambda h, up: Answer(200, LOGIN_PAGE, content_type="text/html"),
    "html-502": lambda h, up: Answer(502, NGINX_502, content_type="text/html"),
    "http-400": lambda h, up: _json_answer(400, {"object": "error", "message": "bad request", "code": 400}),
    "http-401": lambda h, up: _json_answer(401, {"error": "Unauthorized"}),
    "http-404": lambda h, up: _json_answer(404, {"detail": "Not Found"}),
    "http-413": lambda h, up: Answer(413, b"Request Entity Too Large", content_type="text/plain"),
    "http-500": lambda h, up: _json_answer(500, {"error": {"message": "internal server error"}}),
    "http-503": lambda h, up: _json_answer(503, {"error": "overloaded"}, headers={"retry-after": "1"}),
    "http-429": lambda h, up: _json_answer(429, {"error": "rate limited"}, headers={"retry-after": "1"}),
    "redirect-307": _redirect,
    "redirect-loop": _redirect_to_self,
    "echo-headers": _echo_headers,
    "output-id-out-of-vocab": lambda h, up: _edit_json(up, _set_output_id(999999)),
    "output-id-negative": lambda h, up: _edit_json(up, _set_output_id(-1)),
    "output-id-string": lambda h, up: _edit_json(up, _set_output_id("12")),
    "output-id-huge": lambda h, up: _edit_json(up, _set_output_id(2**40)),
    "prompt-ids-shifted": lambda h, up: _edit_json(up, _drop_prompt_ids),
    "output-text-surrogate": lambda h, up: _edit_json(up, _surrogate_text),
    "surrogate-error-body": lambda h, up: Answer(500, b'{"error": {"message": "bad byte \\ud800 here"}}'),
    "control-chars-error-body": lambda h, up: _json_answer(
        500, {"error": {"message": f"nul\x00 bell\x07 {TERMINAL_ESCAPES} end"}}
    ),
    "drip": lambda h, up: Answer(200, up()[2], drip_s=0.3),
    "gzip-always": _compressed("gzip"),
    "deflate-always": _compressed("deflate"),
    "br-always": _compressed("br"),
}
"""Fault name → how the proxy answers a generation request."""


class ProxyServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, upstream_url: str, fault: str, times: int | None, probes: bool) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.upstream_url = upstream_url.rstrip("/")
        self.fault, self.times, self.probes = fault, times, probes
        self.lock = threading.Lock()
        self.generation = 0
        self.faulted = 0
        self.closing = threading.Event()
        self.seen_headers: list[dict[str, str]] = []
        """Every request's headers (lower-cased names), in arrival order."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Quiet when the client hung up mid-answer (tokview giving up on a drip, a cut, a timeout)."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)

    def take_fault(self) -> str:
        """The fault for the next generation request: the configured one for the first `times`, then pass."""
        with self.lock:
            self.generation += 1
            if self.times is None or self.faulted < self.times:
                self.faulted += 1
                return self.fault
            return "pass"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ProxyServer

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the test reads tokview's output, not ours
        return

    def do_GET(self) -> None:
        self._handle(b"")

    def do_POST(self) -> None:
        self._handle(self.rfile.read(int(self.headers.get("content-length") or 0)))

    def _handle(self, body: bytes) -> None:
        self.server.seen_headers.append({k.lower(): v for k, v in self.headers.items()})
        path = self.path.split("?", 1)[0]
        faulted = self.command == "POST" and path in GENERATION_PATHS and (self.server.probes or not is_probe(body))
        fault = self.server.take_fault() if faulted else "pass"
        answer = FAULTS[fault](self, lambda: self._upstream(body))
        self._send(answer)

    def _upstream(self, body: bytes) -> tuple[int, dict[str, str], bytes]:
        parts = urlsplit(self.server.upstream_url)
        assert parts.hostname is not None
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        try:
            keep = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection", "content-length")}
            conn.request(self.command, self.path, body=body or None, headers=keep)
            response = conn.getresponse()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        finally:
            conn.close()

    def _send(self, answer: Answer) -> None:
        if answer.raw_head is not None:
            self.wfile.write(answer.raw_head)
            self.close_connection = True
            return
        head = [f"HTTP/1.1 {answer.status} {http.client.responses.get(answer.status, 'Whatever')}"]
        headers = {"content-type": answer.content_type, "content-length": str(len(answer.body)), **answer.headers}
        cut = answer.send_bytes is not None
        if cut:
            headers["connection"] = "close"
        head += [f"{k}: {v}" for k, v in headers.items()]
        self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
        if answer.drip_s:
            self._drip(answer.body, answer.drip_s)
        else:
            self.wfile.write(answer.body[: answer.send_bytes] if cut else answer.body)
        self.wfile.flush()
        if cut:
            self.close_connection = True

    def _drip(self, body: bytes, every_s: float) -> None:
        for i in range(len(body)):
            if self.server.closing.wait(every_s):
                self.close_connection = True
                return
            self.wfile.write(body[i : i + 1])
            self.wfile.flush()


@contextmanager
def hostile_proxy(
    upstream_url: str, fault: str, times: int | None = None, *, probes: bool = False
) -> Iterator[ProxyServer]:
    """Serve `fault` (a key of FAULTS) for the first `times` generation requests (None: every one; with
    `probes`, the one-token start-up probes count too) and forward everything else to `upstream_url`.
    Yields the server; its URL is `proxy_url(server)`."""
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
    server = ProxyServer(upstream_url, fault, times, probes)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.closing.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def proxy_url(server: ProxyServer, userinfo: str = "") -> str:
    host, port = server.server_address[:2]
    host = host.decode() if isinstance(host, bytes) else host
    return f"http://{userinfo + '@' if userinfo else ''}{host}:{port}"
