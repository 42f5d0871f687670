"""A server that accepts connections and never answers ends a batch after one probe's attempts, said as a timeout.

The probe asks the four info endpoints at once, so one probe's attempts are each of them asked and retried once
(`_only_the_info_probe`), in the time of one.

Each of the dozen start-up probes waited the whole `--timeout` with every retry: with `--timeout 1` a batch held
~55 s, then said the server "answers HTTP but is neither SGLang nor vLLM", though it had never answered."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def _silent_server() -> Iterator[tuple[str, list[bytes]]]:
    """Accepts, reads, never answers; yields (URL, the request lines it read)."""
    listener = socket.create_server(("127.0.0.1", 0))
    seen: list[bytes] = []
    open_connections: list[socket.socket] = []

    def read(conn: socket.socket) -> None:
        try:
            chunks = iter(lambda: conn.recv(65536), b"")
            for data in chunks:
                seen.extend(line for line in data.split(b"\r\n") if b" HTTP/1." in line)
        except OSError:  # closed when the test ends
            return

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            open_connections.append(conn)
            threading.Thread(target=read, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", seen
    finally:
        listener.close()
        for conn in open_connections:
            conn.close()


def _only_the_info_probe(seen: list[bytes]) -> None:
    """The requests a silent server saw: the four info endpoints' first attempts and their one retry at most."""
    from tokview.servers.features import INFO_PATHS

    asked = [line.split(b" ")[1].decode() for line in seen]
    assert set(asked) <= set(INFO_PATHS), seen
    assert all(asked.count(path) <= 2 for path in INFO_PATHS), seen
    assert len(asked) >= len(INFO_PATHS), seen


def test_a_batch_against_a_server_that_never_answers_stops_after_one_probe_and_says_it_timed_out(tmp_path: Path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hi"}\n')
    with _silent_server() as (url, seen):
        argv = [
            sys.executable,
            "-m",
            "tokview",
            "batch",
            str(prompts),
            "--server",
            url,
            "--db",
            str(tmp_path / "s.duckdb"),
        ]
        done = subprocess.run([*argv, "--timeout", "1", "--retries", "1"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "timed out after 1s" in done.stderr and "neither SGLang nor vLLM" not in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    _only_the_info_probe(seen)  # and none of the dozen probes after it
    assert not (tmp_path / "s.duckdb").exists()


def test_a_proxy_in_front_of_a_server_that_never_answers_stops_within_its_timeout_and_says_so(tmp_path: Path):
    """`tokview proxy` probed a silent upstream for 2 × 30 s before it said anything; `--timeout` sets the probe's."""
    with _silent_server() as (url, seen):
        argv = [sys.executable, "-m", "tokview", "proxy", "--server", url, "--listen", "127.0.0.1:0"]
        done = subprocess.run(
            [*argv, "--db", str(tmp_path / "s.duckdb"), "--timeout", "1"], capture_output=True, text=True, timeout=60
        )
    assert done.returncode == 2, done.stderr
    assert "timed out after 1s" in done.stderr and "Traceback" not in done.stderr, done.stderr
    _only_the_info_probe(seen)
    assert not (tmp_path / "s.duckdb").exists()


def test_a_proxy_refuses_a_timeout_that_is_not_a_positive_number_in_one_line(tmp_path: Path):
    for bad in ("0", "-1", "inf"):
        argv = [sys.executable, "-m", "tokview", "proxy", "--server", "http://127.0.0.1:9", "--timeout", bad]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert done.returncode == 1, (bad, done.stderr)
        assert done.stderr.strip().splitlines() == [
            "tokview: error: --timeout must be a finite number of seconds above 0"
        ]
