"""A SIGKILL of a running `tokview proxy` loses only the requests in flight: every generation that was
answered before it is in the store once any tokview command opens it (the crash-safe parts land)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tokview.sim.config import SimConfig
from tokview.sim.faults import FaultBook
from tokview.sim.server import start_simulator
from tokview.store import Store


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until(check, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_sigkill_mid_run_loses_only_the_request_in_flight(tmp_path):
    db = tmp_path / "p.duckdb"
    with start_simulator(SimConfig(kind="vllm")) as sim:
        port = _free_port()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tokview",
                "proxy",
                "--server",
                sim.url,
                "--listen",
                f"127.0.0.1:{port}",
                "--db",
                str(db),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_until(lambda: _answers(url) or proc.poll() is not None, "the proxy to listen")
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            answered = []
            for n in range(5):
                body = {
                    "model": sim.cfg.model_name,
                    "messages": [{"role": "user", "content": f"question {n}"}],
                    "max_tokens": 40,
                }
                answered.append(httpx.post(url + "/v1/chat/completions", json=body, timeout=30).status_code)
            assert answered == [200] * 5
            parts = tmp_path / "p.duckdb.parts"
            _wait_until(
                lambda: sum(f.read_bytes().count(b"\n") for f in parts.glob("*.samples.jsonl")) + _landed(db) >= 5,
                "the 5 answered generations to be written",
            )
            sim.state.faults = FaultBook({"stall": 1})  # the next generation hangs: it is in flight at the kill
            hung = threading.Thread(target=_ask_and_lose, args=(url, {**body, "stream": True}), daemon=True)
            hung.start()
            _wait_until(lambda: sim.stats.faults["stall"] == 1, "the request to be in flight")
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    with Store(db) as store:  # opening lands what the killed proxy left in parts
        rows = store.query("SELECT prompt_id, messages FROM samples ORDER BY sample_id")
        failures = store.query("SELECT reason FROM failures")
    assert len(rows) == 5
    assert len({r[0] for r in rows}) == 5  # five one-turn conversations
    assert [f"question {n}" in r[1] for n, r in enumerate(rows)] == [True] * 5
    assert failures == []  # the one in flight left nothing, not a half record


def _ask_and_lose(url: str, body: dict) -> None:
    """The request in flight: the proxy dies under it."""
    try:
        httpx.post(url + "/v1/chat/completions", json=body, timeout=30)
    except httpx.HTTPError:
        pass


def _landed(db) -> int:
    if not db.exists():
        return 0
    try:
        import duckdb

        with duckdb.connect(str(db), read_only=True) as conn:
            row = conn.execute("SELECT count(*) FROM samples").fetchone()
            assert row is not None
            return row[0]
    except Exception:  # held by the proxy's landing this instant: the parts count says the rest
        return 0


def _burst(url: str, model: str, n: int) -> list[int]:
    """`n` short chat requests, 10 at a time: their statuses."""
    from concurrent.futures import ThreadPoolExecutor

    def ask(k: int) -> int:
        body = {"model": model, "messages": [{"role": "user", "content": f"q{k}"}], "max_tokens": 8}
        return httpx.post(url + "/v1/chat/completions", json=body, timeout=30).status_code

    with ThreadPoolExecutor(10) as pool:
        return list(pool.map(ask, range(n)))


def _proxy(sim_url: str, db: object, listen: str) -> subprocess.Popen[bytes]:
    """`tokview proxy` in a process group of its own, as a service manager or `timeout` starts it."""
    argv = [sys.executable, "-m", "tokview", "proxy", "--server", sim_url, "--listen", listen, "--db", str(db)]
    return subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=True,
    )


def test_sigterm_to_the_whole_process_group_right_after_a_burst_records_every_answer(tmp_path):
    """`timeout`, `kill -- -PGID` and systemd stop a service by signalling its whole group: the recorder child got
    the SIGTERM too and died, and every answer it had not landed was lost (30 of 30), with exit 3 for a clean stop.
    It ignores the stop as it ignores Ctrl-C: the parent stops serving, the child records and lands it all."""
    db = tmp_path / "g.duckdb"
    with start_simulator(SimConfig(kind="vllm")) as sim:
        port = _free_port()
        proc = _proxy(sim.url, db, f"127.0.0.1:{port}")
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_until(lambda: _answers(url) or proc.poll() is not None, "the proxy to listen")
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""

            assert _burst(url, sim.cfg.model_name, 30) == [200] * 30
            os.killpg(proc.pid, signal.SIGTERM)  # at once: most answers not landed yet
            proc.wait(60)
            said = proc.stderr.read().decode() if proc.stderr else ""
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert proc.returncode == 0, said
    assert "30 generations recorded" in said and "exit code" not in said, said
    assert "the recorder kept up: no backlog" in said or "the recorder's backlog peaked at" in said, said  # said
    with Store(db) as store:
        assert store.query("SELECT count(*) FROM samples") == [(30,)]


def test_a_listen_address_in_use_is_one_line_and_the_proxy_exits(tmp_path):
    """The recorder child started before the socket was bound: a bind that failed left it running, `tokview proxy`
    hung after its one-line error until killed, and the store held an empty run. Bound first, nothing is made."""
    with start_simulator(SimConfig(kind="vllm")) as sim, socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        proc = _proxy(sim.url, tmp_path / "b.duckdb", f"127.0.0.1:{taken.getsockname()[1]}")
        try:
            proc.wait(60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise AssertionError("the proxy did not exit after its bind failed")
        said = proc.stderr.read().decode().strip() if proc.stderr else ""
    assert proc.returncode != 0
    assert said.splitlines()[-1].startswith("tokview: error: cannot listen on 127.0.0.1:"), said
    assert "Traceback" not in said
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no store, no spool folder


@contextmanager
def _proxy_on_a_held_store(sim_url: str, db: Path, said_file: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """`tokview proxy` in a process group of its own recording into `db`, which another program holds for ~8 s from
    the moment the proxy listens: (the proxy, its URL). Both are ended on the way out."""
    with said_file.open("wb") as said_out:
        port = _free_port()
        argv = [sys.executable, "-m", "tokview", "proxy", "--server", sim_url, "--listen", f"127.0.0.1:{port}"]
        proc = subprocess.Popen(
            [*argv, "--db", str(db)],
            stderr=said_out,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
        )
        url = f"http://127.0.0.1:{port}"
        holder = None
        try:
            _wait_until(lambda: _answers(url) or proc.poll() is not None, "the proxy to listen")
            assert proc.poll() is None, said_file.read_text()
            hold = f"import duckdb, time; c = duckdb.connect({str(db)!r}); print('held', flush=True); time.sleep(8)"
            holder = subprocess.Popen([sys.executable, "-c", hold], stdout=subprocess.PIPE, text=True)
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            yield proc, url
        finally:
            try:  # the whole group (the recorder child has a session of its own: it lands what it holds and ends)
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            if holder is not None:
                holder.kill()
                holder.wait()


def _left_at_once(proc: subprocess.Popen[bytes], said_file: Path) -> str:
    """What the proxy said, once it has left within 4 s (the held store keeps its recorder ~7 s more) and its
    recorder, which it no longer waited for, has finished in the background."""
    proc.wait(4)
    said = said_file.read_text()
    child = int(said.split("recorder; it (pid ")[1].split(")")[0])
    _wait_until(lambda: not _alive(child), "the recorder to finish in the background", timeout=60)
    return said


@pytest.mark.parametrize(
    ("stop", "code", "last"), [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")]
)
def test_a_second_ctrl_c_while_the_recorder_waits_for_a_held_store_leaves_at_once_and_loses_nothing(
    tmp_path, stop, code, last
):
    """The first Ctrl-C waits for the recorder to land what it holds; with the store held by another program that
    is up to its lock timeout. A second Ctrl-C ended the wait with a traceback-free exit, but multiprocessing still
    joined the recorder at interpreter exit, so the proxy stayed as long as before. Now it leaves at once, and the
    recorder child, which ignores Ctrl-C, lands everything in the background once the store is free. Two SIGTERMs
    (a service manager's stop, then its second) do the same and exit 143, 128 + SIGTERM (it was 130)."""
    db, said_file = tmp_path / "h.duckdb", tmp_path / "stderr.txt"
    with start_simulator(SimConfig(kind="vllm")) as sim, _proxy_on_a_held_store(sim.url, db, said_file) as (proc, url):
        assert _burst(url, sim.cfg.model_name, 20) == [200] * 20
        os.killpg(proc.pid, stop)  # what a terminal's Ctrl-C sends: the whole group
        time.sleep(0.5)
        os.killpg(proc.pid, stop)
        said = _left_at_once(proc, said_file)
    assert proc.returncode == code and "Traceback" not in said, said
    assert said.strip().splitlines()[-1] == f"tokview: {last}", said
    with Store(db) as store:
        assert store.query("SELECT count(*) FROM samples") == [(20,)]


@pytest.mark.parametrize(("stop", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_second_ctrl_c_during_the_grace_for_answers_in_flight_leaves_at_once(tmp_path, stop, code):
    """The first Ctrl-C gives answers in flight 2 s to finish; a second one in those 2 s set the already-set stop
    event again and was lost, so the proxy went on to wait for its recorder (a held store: the lock timeout) as
    if no second Ctrl-C had come. Now it cuts the grace short and leaves as a second Ctrl-C does after it."""
    db, said_file = tmp_path / "g.duckdb", tmp_path / "stderr.txt"
    with start_simulator(SimConfig(kind="vllm")) as sim, _proxy_on_a_held_store(sim.url, db, said_file) as (proc, url):
        assert _burst(url, sim.cfg.model_name, 3) == [200] * 3
        sim.state.faults = FaultBook({"stall": 1})  # the next generation hangs: in flight through the grace
        threading.Thread(target=_cut_off, args=(url, sim.cfg.model_name), daemon=True).start()
        _wait_until(lambda: sim.stats.faults["stall"] == 1, "the request to be in flight")
        os.killpg(proc.pid, stop)
        time.sleep(0.3)
        os.killpg(proc.pid, stop)
        said = _left_at_once(proc, said_file)  # before: the 2 s grace, then the wait for the held store
    assert proc.returncode == code and "Traceback" not in said, said
    with Store(db) as store:
        samples, failures = store.query("SELECT count(*) FROM samples"), store.failures()
    assert samples == [(3,)]
    assert [f["reason"] for f in failures] == [
        "cut off by the proxy's shutdown after 0 chunks (the upstream request was closed)"
    ]


@pytest.mark.parametrize(
    ("stop", "code", "last"), [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")]
)
def test_a_second_stop_while_the_backlog_is_handed_to_the_recorder_leaves_and_does_not_hang(tmp_path, stop, code, last):
    """The second stop came while the proxy still wrote its backlog to the recorder's pipe: the proxy said it left
    but never exited (the pipe stayed open, the child waited for more, and the exit waited for the child). Now the
    pipe is closed on the way out: the proxy leaves, and the child records and lands what it was handed."""
    db = tmp_path / "d.duckdb"
    wrapper = Path(__file__).parent / "proxy_held_handover.py"
    with start_simulator(SimConfig(kind="vllm")) as sim, (tmp_path / "stderr.txt").open("w+b") as said_out:
        port = _free_port()
        argv = [sys.executable, str(wrapper), "proxy", "--server", sim.url, "--listen", f"127.0.0.1:{port}"]
        proc = subprocess.Popen(
            [*argv, "--db", str(db)],
            stderr=said_out,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(Path(__file__).parent.parent)},
            start_new_session=True,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_until(lambda: _answers(url) or proc.poll() is not None, "the proxy to listen")
            assert _burst(url, sim.cfg.model_name, 3) == [200] * 3
            os.killpg(proc.pid, stop)
            _wait_until(lambda: b"handing over" in (tmp_path / "stderr.txt").read_bytes(), "the hand-over")
            os.killpg(proc.pid, stop)
            proc.wait(10)  # before: still running when the test gave up
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        said = (tmp_path / "stderr.txt").read_text()
    assert proc.returncode == code and "Traceback" not in said, said
    assert said.strip().splitlines()[-1] == f"tokview: {last}", said
    child = int(said.split("recorder; it (pid ")[1].split(")")[0])
    _wait_until(lambda: not _alive(child), "the recorder to finish in the background", timeout=60)
    with Store(db) as store:
        assert store.query("SELECT count(*) FROM samples") == [(3,)]


def test_answers_the_pipe_never_took_are_counted_and_a_spools_notes_are_not() -> None:
    """What a stop during the hand-over loses: the answers still held (a first one the pipe took part of included),
    not the notes of spooled answers, which the child records from the spool file at its end."""
    import pickle
    from collections import deque

    from tokview.proxy.recorder import Failed
    from tokview.proxy.recorder_process import SpoolDone, Spooled, _answers_in, _frame

    def framed(item: object) -> bytes:
        return _frame(pickle.dumps(item))

    answer = framed(Failed("refused by the upstream", "http://u", None, None))
    frames = deque([answer[7:], framed(Spooled("/s/spool-000001", 4, 10)), answer, framed(SpoolDone("/s/spool-1"))])
    assert _answers_in(frames) == 2
    assert _answers_in(deque()) == 0


def _cut_off(url: str, model: str) -> None:
    """A chat request the proxy's shutdown cuts off."""
    body = {"model": model, "messages": [{"role": "user", "content": "slow"}], "max_tokens": 8}
    try:
        httpx.post(url + "/v1/chat/completions", json=body, timeout=60)
    except httpx.HTTPError:
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:  # a zombie (not reaped yet) counts as ended
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize(
    ("stop", "code", "last"), [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")]
)
def test_a_second_stop_to_a_proxy_recording_in_threads_lands_everything_and_exits_as_hurried(
    tmp_path, stop, code, last
):
    """A proxy recording on its own threads cannot leave its recorder behind (the threads die with it), so a second
    stop during the grace waits for the landing as before; it exited 0 as if stopped once. It lands everything and
    exits 128 + the signal, as the recorder process's proxy does."""
    db, said_file = tmp_path / "t.duckdb", tmp_path / "stderr.txt"
    wrapper = Path(__file__).parent / "proxy_thread_recorder.py"
    with start_simulator(SimConfig(kind="vllm")) as sim, said_file.open("wb") as said_out:
        port = _free_port()
        argv = [sys.executable, str(wrapper), "proxy", "--server", sim.url, "--listen", f"127.0.0.1:{port}"]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(Path(__file__).parent.parent)}
        proc = subprocess.Popen([*argv, "--db", str(db)], stderr=said_out, env=env, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_until(lambda: _answers(url) or proc.poll() is not None, "the proxy to listen")
            assert _burst(url, sim.cfg.model_name, 3) == [200] * 3
            sim.state.faults = FaultBook({"stall": 1})  # in flight through the grace
            threading.Thread(target=_cut_off, args=(url, sim.cfg.model_name), daemon=True).start()
            _wait_until(lambda: sim.stats.faults["stall"] == 1, "the request to be in flight")
            os.killpg(proc.pid, stop)
            time.sleep(0.3)
            os.killpg(proc.pid, stop)
            proc.wait(20)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    said = said_file.read_text()
    assert proc.returncode == code and "Traceback" not in said, said
    assert said.strip().splitlines()[-1] == f"tokview: {last}", said
    assert "3 generations recorded" in said, said
    with Store(db) as store:
        assert store.query("SELECT count(*) FROM samples") == [(3,)]
        assert len(store.failures()) == 1


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _ask_three(url: str, model: str, headers: dict[str, str] | None = None) -> None:
    """`question 0`..`question 2` through the proxy, each answered (the client has it) before the next."""
    for n in range(3):
        body = {"model": model, "messages": [{"role": "user", "content": f"question {n}"}], "max_tokens": 8}
        assert httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=30).status_code == 200


def _kill_all(proc: subprocess.Popen, children: list[int]) -> None:
    """The proxy and its recorder gone, whatever a test left running."""
    for pid in [proc.pid, *children]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def test_sigkill_to_the_whole_group_keeps_the_answers_clients_already_have(tmp_path):
    """`kill -9 -PGID` (a container's or a service's hard stop) reached the recorder child too: the answers it had
    gathered (~0.15 s of them) or that were still in the pipe were lost, though their clients had them (the last
    answer before the kill, 4 of 4). The child has a session of its own: the parent's death ends its pipe, it
    records and lands what it was handed."""
    db = tmp_path / "k.duckdb"
    with start_simulator(SimConfig(kind="vllm")) as sim:
        port = _free_port()
        proc = _proxy(sim.url, db, f"127.0.0.1:{port}")
        url = f"http://127.0.0.1:{port}"
        children: list[int] = []
        try:
            _wait_until(lambda: _answers(url) or proc.poll() is not None, "the proxy to listen")
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            children = _children(proc.pid)
            _ask_three(url, sim.cfg.model_name)
            os.killpg(proc.pid, signal.SIGKILL)  # at once: the last answer is still in the pipe or gathered
            proc.wait(10)
            _wait_until(lambda: not any(_alive(c) for c in children), "the recorder to land what it had", 60)
        finally:
            _kill_all(proc, children)
    assert children  # the recorder child was seen
    with Store(db) as store:
        rows = store.query("SELECT messages FROM samples ORDER BY created_at")
    assert [f"question {n}" in r[0] for n, r in enumerate(rows)] == [True] * 3


def test_a_kill_of_the_proxy_and_its_recorder_together_loses_no_answer_a_client_has(tmp_path):
    """`docker kill` or a cgroup's out-of-memory kill ends both processes at once: the answers the recorder had taken
    and not yet written as a part were lost though their clients had them (2-4 a kill). The recorder writes each to
    a journal in the spool folder as it arrives; the next start on the store records what was not stored, each once,
    and a client's credentials are on no disk."""
    db = tmp_path / "j.duckdb"
    secret = "client-key-4f9a2c7e1b"
    with start_simulator(SimConfig(kind="vllm")) as sim:
        for start in range(2):
            port = _free_port()
            proc = _proxy(sim.url, db, f"127.0.0.1:{port}")
            url = f"http://127.0.0.1:{port}"
            children: list[int] = []
            try:
                _wait_until(lambda: _answers(url) or proc.poll() is not None, "the proxy to listen")
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                children = _children(proc.pid)
                if start == 1:  # the second start recorded the first's leftovers before it listened
                    break
                _ask_three(url, sim.cfg.model_name, {"Authorization": f"Bearer {secret}"})
                time.sleep(0.05)  # the recorder took the last answer off its pipe (it writes parts 0.15 s later)
                spool = next(tmp_path.glob(".tokview-proxy-spool-*"))
                journals = list(spool.glob("spool-c*"))
                assert journals and all(secret.encode() not in p.read_bytes() for p in journals)
                for pid in [proc.pid, *children]:
                    os.kill(pid, signal.SIGKILL)
            finally:
                if start == 1:
                    os.killpg(proc.pid, signal.SIGTERM)
                    proc.wait(30)
                _kill_all(proc, children)
    with Store(db) as store:
        rows = store.query("SELECT messages, sample_id FROM samples ORDER BY sample_id")
    assert sorted(n for n in range(3) for r in rows if f"question {n}" in r[0]) == [0, 1, 2], rows
    assert not list(tmp_path.glob(".tokview-proxy-spool-*"))
    assert secret.encode() not in b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())


def test_a_json_answer_is_handed_to_the_recorder_before_the_client_has_it(tmp_path, monkeypatch):
    """The kill test above lost its last answer now and then on a busy box: the proxy sent the answer, was preempted,
    and the client had it (and killed the proxy) before the hand-over that came after the write. It comes first now."""
    from tokview.proxy import wire
    from tokview.proxy.recorder import Recorder
    from tokview.proxy.serve import ProxyConfig, start_proxy

    order: list[str] = []
    take, whole = Recorder.take, wire.Responder.whole

    def taking(self, item, sample_id=None):
        order.append("take")
        return take(self, item, sample_id)

    async def writing(self, *args, **kwargs):
        order.append("whole")
        return await whole(self, *args, **kwargs)

    monkeypatch.setattr(Recorder, "take", taking)
    monkeypatch.setattr(wire.Responder, "whole", writing)
    with start_simulator(SimConfig(kind="vllm")) as sim:
        config = ProxyConfig([sim.url], listen="127.0.0.1:0", db=str(tmp_path / "p.duckdb"), record_in="thread")
        with start_proxy(config) as proxy:
            _ask_three(proxy.url, sim.cfg.model_name)
    assert order[-6:] == ["take", "whole"] * 3, order


def test_a_streamed_answer_is_handed_to_the_recorder_before_the_client_has_its_done(tmp_path, monkeypatch):
    """The same race for a stream: the hand-over came after the client had `[DONE]` (and the end of the body), so a
    harness that killed the proxy the moment its stream ended could lose that answer. It comes before `[DONE]` goes
    out now, once (the end of the body hands nothing over again)."""
    from tokview.proxy import wire
    from tokview.proxy.recorder import Recorder
    from tokview.proxy.serve import ProxyConfig, start_proxy

    order: list[str] = []
    take, send = Recorder.take, wire.Responder.send

    def taking(self, item, sample_id=None):
        order.append("take")
        return take(self, item, sample_id)

    async def sending(self, data):
        if b"[DONE]" in data:
            order.append("done")
        return await send(self, data)

    monkeypatch.setattr(Recorder, "take", taking)
    monkeypatch.setattr(wire.Responder, "send", sending)
    with start_simulator(SimConfig(kind="vllm")) as sim:
        db = tmp_path / "p.duckdb"
        config = ProxyConfig([sim.url], listen="127.0.0.1:0", db=str(db), record_in="thread")
        with start_proxy(config) as proxy:
            for n in range(3):
                body = {
                    "model": sim.cfg.model_name,
                    "messages": [{"role": "user", "content": f"question {n}"}],
                    "max_tokens": 8,
                    "stream": True,
                }
                with httpx.stream("POST", proxy.url + "/v1/chat/completions", json=body, timeout=30) as r:
                    assert r.status_code == 200
                    assert b"data: [DONE]" in b"".join(r.iter_bytes())
    assert order == ["take", "done"] * 3, order
    with Store(db) as store:
        assert store.query("SELECT count(*) FROM samples") == [(3,)]
