"""How a request the upstream broke off is said: it was reachable (the request went), so not "unreachable"; and a
JSON answer cut short is not "after 0 chunks"."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tokview.proxy.serve import ProxyConfig, start_proxy
from tokview.sim.config import SimConfig
from tokview.sim.server import start_simulator
from tokview.store import Store


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _front(target: tuple[str, int], cut: str) -> tuple[str, socket.socket]:
    """A TCP front to the simulator that passes every request through, except a chat completion: `close` shuts the
    connection once the request is in (nothing answered); `half` sends the answer's head and half its body, then
    shuts it."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)

    def serve_one(conn: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            data = conn.recv(65536)
            if not data:
                return
            head += data
        if not head.startswith(b"POST /v1/chat/completions"):
            upstream = socket.create_connection(target)
            upstream.sendall(head)
            threading.Thread(target=_pipe, args=(upstream, conn), daemon=True).start()
            _pipe(conn, upstream)
            return
        if cut == "half":
            body = b'{"id": "x", "choices": [{"message": {"content": "never who'
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 400\r\n\r\n" + body)
        conn.shutdown(socket.SHUT_RDWR)
        conn.close()

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve_one, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}", listener


@pytest.fixture(scope="module")
def sim() -> Iterator[Any]:
    with start_simulator(SimConfig(kind="vllm")) as running:
        yield running


@pytest.mark.parametrize(
    ("cut", "said"),
    [("close", "broke off before answering"), ("half", "the upstream's answer broke off before it was whole")],
)
def test_a_request_the_upstream_broke_off_is_said_as_such(sim, tmp_path, kimi_tok, kimi_profile, cut, said) -> None:
    url, listener = _front(("127.0.0.1", sim.port), cut)
    db = tmp_path / "cut.duckdb"
    config = ProxyConfig([url], listen="127.0.0.1:0", db=str(db), tokenizer=kimi_tok, profile=kimi_profile)
    try:
        with start_proxy(config) as proxy, httpx.Client(timeout=30) as client:
            body = {"model": sim.cfg.model_name, "messages": [{"role": "user", "content": "Hi?"}], "max_tokens": 8}
            answered = client.post(proxy.url + "/v1/chat/completions", json=body)
            assert answered.status_code == 502
            assert "unreachable" not in answered.text and "after 0 chunks" not in answered.text
    finally:
        listener.close()
    with Store(db) as store:
        reasons = [r[0] for r in store.query("SELECT reason FROM failures")]
    assert len(reasons) == 1 and said in reasons[0], reasons
