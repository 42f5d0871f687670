"""A Ctrl-C of the proxy while a client that reads slowly (or not at all) is being streamed its answer: that generation
is recorded as cut off by the shutdown. The shutdown closed such a connection with `close()`, which waits for the
send buffer to drain: the handler never learnt the client was gone, the run's end cancelled it, and the generation
was in neither the samples nor the failures (the proxy said 0 recorded, exit 0)."""

from __future__ import annotations

import json
import signal
import socket
import time

from test_proxy_sigkill import _answers, _free_port, _proxy, _wait_until

from tokview.sim.config import SimConfig
from tokview.sim.faults import FaultBook
from tokview.sim.server import start_simulator
from tokview.store import Store


def test_a_stream_to_a_client_that_stopped_reading_is_recorded_as_cut_off_at_shutdown(tmp_path) -> None:
    db = tmp_path / "r.duckdb"
    with start_simulator(SimConfig(kind="vllm", output_tokens=20_000)) as sim:
        port = _free_port()
        proc = _proxy(sim.url, db, f"127.0.0.1:{port}")
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_until(lambda: _answers(url), "the proxy to answer")
            body = json.dumps(
                {"model": sim.cfg.model_name, "messages": [{"role": "user", "content": "cut"}], "stream": True}
            )
            client = socket.socket()
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a reader that never reads fills this
            client.connect(("127.0.0.1", port))
            head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            client.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n{body}".encode())
            time.sleep(2.0)  # the proxy's send buffer to this client is full
            proc.send_signal(signal.SIGINT)
            proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
            client.close()
    with Store(db) as store:
        samples, failures = store.query("SELECT count(*) FROM samples"), store.failures()
    assert samples == [(0,)]
    [failure] = failures
    assert failure["reason"].startswith("cut off by the proxy's shutdown after"), failure


def test_a_request_the_shutdown_cuts_before_any_byte_gets_a_503_and_is_recorded_as_cut_off(tmp_path) -> None:
    """A generation still thinking when the proxy's grace ran out: its client got a dropped connection (an OpenAI
    client's "Connection error", read as a network fault). Now it gets a 503 it can read, the upstream request is
    closed, and the generation is recorded as cut off by the shutdown."""
    db = tmp_path / "u.duckdb"
    with start_simulator(SimConfig(kind="vllm")) as sim:
        port = _free_port()
        proc = _proxy(sim.url, db, f"127.0.0.1:{port}")
        url = f"http://127.0.0.1:{port}"
        client = socket.socket()
        try:
            _wait_until(lambda: _answers(url), "the proxy to answer")
            sim.state.faults = FaultBook({"stall": 1})  # the generation hangs: in flight through the 2 s grace
            body = json.dumps({"model": sim.cfg.model_name, "messages": [{"role": "user", "content": "wait"}]})
            client.connect(("127.0.0.1", port))
            head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            client.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n{body}".encode())
            _wait_until(lambda: sim.stats.faults["stall"] == 1, "the request to be in flight")
            proc.send_signal(signal.SIGINT)
            client.settimeout(30)
            answer = b""
            while chunk := client.recv(65536):
                answer += chunk
            proc.wait(60)  # one Ctrl-C: a clean stop
        finally:
            if proc.poll() is None:
                proc.kill()
            client.close()
    head_bytes, _, payload = answer.partition(b"\r\n\r\n")
    assert head_bytes.startswith(b"HTTP/1.1 503 "), answer
    assert b"connection: close" in head_bytes.lower()
    assert "shutting down" in json.loads(payload)["error"]["message"]
    with Store(db) as store:
        [failure] = store.failures()
    assert failure["reason"] == "cut off by the proxy's shutdown after 0 chunks (the upstream request was closed)"
