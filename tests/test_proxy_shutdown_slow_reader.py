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
