"""Landing: a run's samples land when their part is written (the lander is woken by the part, not by a
beat), the last landing happens as the last group is written, and `--workers` children are spawned only
for a plan big enough, once the first requests are out. Real simulator behind a gate (`gated_sim.py`)
that holds every answer past the first until the test opens it: no sleeps, no timing bounds."""

from __future__ import annotations

import asyncio
import json
import multiprocessing

from gated_sim import gated
from prompt_files import prompts_file

from tokview.batch import BatchConfig, run_batch
from tokview.sim import SimConfig, start_simulator
from tokview.store import Store


async def until(condition, what: str, limit_s: float = 30.0) -> None:
    """Wait for `condition()` (a state the run reaches by itself); fail with `what` if it never does."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while not condition():
        assert loop.time() < deadline, f"never: {what}"
        await asyncio.sleep(0.01)


async def test_a_written_part_lands_while_the_rest_of_the_run_is_held(tmp_path):
    """The first answer lands while the others are held at the server: with a landing beat that fires
    only after a part is written, the writer waited for the next answer to land the first (forever, here)."""
    prompts = prompts_file(tmp_path / "p.jsonl", 3)
    with start_simulator(SimConfig(kind="vllm")) as sim, gated(sim.url, free=1) as (url, gate):
        with Store(tmp_path / "s.duckdb") as store:
            config = BatchConfig(servers=[url], prompts_path=prompts, max_new_tokens=40, concurrency=2, workers=1)
            run = asyncio.create_task(run_batch(config, store))
            await until(lambda: store.count_samples() == 1 or run.done(), "the first sample landed")
            assert not run.done()
            assert gate.real == 3
            assert gate.answered == 1  # the others are still held
            gate.open()
            summary = await run
            assert store.count_samples() == 3  # landed by the time run_batch returns, not a beat later
    assert summary.ok == 3
    assert summary.balanced


async def test_a_small_plan_spawns_no_worker(tmp_path):
    prompts = prompts_file(tmp_path / "p.jsonl", 10)
    with start_simulator(SimConfig(kind="vllm")) as sim, gated(sim.url, free=1) as (url, gate):
        with Store(tmp_path / "s.duckdb") as store:
            config = BatchConfig(servers=[url], prompts_path=prompts, max_new_tokens=40, concurrency=4, workers=2)
            run = asyncio.create_task(run_batch(config, store))
            await until(lambda: gate.real >= 4 or run.done(), "every slot sent a request")
            children = multiprocessing.active_children()
            gate.open()
            summary = await run
    assert children == []
    assert summary.ok == 10
    assert summary.notes == []


async def test_workers_are_spawned_once_the_first_requests_are_out(tmp_path, monkeypatch):
    """A big plan spawns its child, but only once this process's first generation request is in the
    socket (spawned before, its start-up took the CPU the parent's own start-up needed). Seen from the
    client's side, where the order is certain: the server's side reads the request on another thread,
    which a child spawned just after the send can beat (the old form of this test failed once in CI).
    The gate closes every connection, so the first request must connect before it is sent."""
    from tokview.batch import runner
    from tokview.servers import transport

    written: list[bytes] = []
    seen_at_spawn: list[int] = []
    send, spawn = transport._Connection.send, runner._Spawn.__call__

    def send_and_note(conn, data, head_only):
        written.append(data)
        return send(conn, data, head_only)

    async def spawn_and_note(self, feed):
        seen_at_spawn.append(sum(b"POST /v1/" in data and b'"max_tokens":20' in data for data in written))
        return await spawn(self, feed)

    monkeypatch.setattr(transport._Connection, "send", send_and_note)
    monkeypatch.setattr(runner._Spawn, "__call__", spawn_and_note)
    prompts = prompts_file(tmp_path / "p.jsonl", 70)
    with start_simulator(SimConfig(kind="vllm")) as sim, gated(sim.url, free=1, close=True) as (url, gate):
        with Store(tmp_path / "s.duckdb") as store:
            config = BatchConfig(servers=[url], prompts_path=prompts, max_new_tokens=20, concurrency=4, workers=2)
            run = asyncio.create_task(run_batch(config, store))
            await until(lambda: multiprocessing.active_children() or run.done(), "a child was spawned")
            gate.open()
            summary = await run
            ids = [r[0] for r in store.query("SELECT sample_id FROM samples")]
    assert len(seen_at_spawn) == 1
    assert seen_at_spawn[0] >= 1, "the children were spawned before any generation request was sent"
    assert summary.ok == 70
    assert summary.balanced
    assert len(set(ids)) == len(ids) == 70


def test_a_kill_anywhere_in_the_shutdown_loses_nothing(tmp_path):
    """SIGKILL `tokview batch` once its last answer has left the server, at several points of what
    follows (analysis of the last answers, the last part, the flush, the last landing, the summary);
    a resume then stores every sample exactly once, with balanced accounting."""
    import signal
    import subprocess
    import sys
    import time

    n = 12
    prompts = prompts_file(tmp_path / "p.jsonl", n)
    cli = [sys.executable, "-c", "import sys; from tokview.cli import main; sys.exit(main())"]
    with start_simulator(SimConfig(kind="vllm")) as sim, gated(sim.url, free=10**6) as (url, gate):
        gate.open()
        for k, after_s in enumerate((0.0, 0.02, 0.06, 0.15)):
            db = tmp_path / f"k{k}.duckdb"
            argv = [*cli, "batch", str(prompts), "--server", url, "--db", str(db), "--max-new-tokens", "40"]
            argv += ["--workers", "1", "--concurrency", "4", "--summary-json"]
            start = gate.answered
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            deadline = time.monotonic() + 60
            while gate.answered < start + n and proc.poll() is None:
                assert time.monotonic() < deadline, "the run never got its answers"
                time.sleep(0.002)
            time.sleep(after_s)
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=30)
            done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr[-800:]
            summary = json.loads(done.stdout.strip().splitlines()[-1])
            assert summary["balanced"], summary
            assert summary["resumed"] + summary["ok"] == n, summary
            with Store(db) as store:
                ids = [r[0] for r in store.query("SELECT sample_id FROM samples")]
            assert len(ids) == len(set(ids)) == n, (after_s, len(ids))
