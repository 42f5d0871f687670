"""How a `--workers` child ends when the run is interrupted or its parent is gone.
Real children, a real simulator; the parent's side is driven through `WorkerGroup` and `run_batch`."""

from __future__ import annotations

import asyncio
import threading
from collections import deque

from prompt_files import prompts_file

from tokview.batch import BatchConfig, plan, read_prompts, run_batch
from tokview.batch.workers import WorkerGroup, WorkFeed
from tokview.sim import SimConfig, start_simulator
from tokview.store import Store
from tokview.store.parts import parts_dir


async def test_an_interrupted_run_does_not_report_its_workers_as_lost(tmp_path, monkeypatch):
    """Cancelled once the run is generating, its child still starting: the child is stopped with the run, which says
    'interrupted', not 'worker 1 exited with 0' (or -15) as if it had been lost. The cancel comes the moment the
    child is spawned (its first requests out, the parent spawns it): no polling for a child or a request."""
    prompts = prompts_file(tmp_path / "p.jsonl", 200)
    cancel = asyncio.Event()
    loop = asyncio.get_running_loop()
    spawned: list[WorkerGroup] = []
    real_init = WorkerGroup.__init__

    def init(self, config, children):
        real_init(self, config, children)
        spawned.append(self)
        loop.call_soon_threadsafe(cancel.set)

    monkeypatch.setattr(WorkerGroup, "__init__", init)
    with start_simulator(SimConfig(kind="vllm", quirks={"latency": 0.05})) as sim:
        with Store(tmp_path / "s.duckdb") as store:
            config = BatchConfig(servers=[sim.url], prompts_path=prompts, max_new_tokens=20, concurrency=2, workers=2)
            summary = await run_batch(config, store, cancel=cancel)
    assert len(spawned) == 1
    assert summary.interrupted, summary.render()
    assert summary.balanced, summary.render()
    assert not any("exited with" in note or "stopped on its own" in note for note in summary.notes), summary.notes
    assert summary.stopped is None


def test_a_child_whose_parent_is_gone_ends_quietly_and_keeps_what_it_wrote(tmp_path, capfd, monkeypatch):
    """The parent's end of the pipe closes mid-run (what a dead parent looks like to the child): the child
    writes what it holds, ends with exit code 0 and no BrokenPipeError traceback from its writer thread.
    The parent's feed thread, which had that end in its wait, ends cleanly too (it used to die on the closed
    handle, and its check of the child's liveness reaped the child under this test's join, which then saw
    no exit code)."""
    thread_errors: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda hook_args: thread_errors.append(hook_args.exc_value))
    prompts = prompts_file(tmp_path / "p.jsonl", 64)
    rows, _ = read_prompts(prompts)
    db = tmp_path / "s.duckdb"
    with start_simulator(SimConfig(kind="vllm", quirks={"latency": 0.05})) as sim:
        config = BatchConfig(servers=[sim.url], max_new_tokens=20, concurrency=2)
        identity = {"model": "tokview-sim", "tokenizer": "x", "profile": "y"}
        items, _ = plan(rows, config, config.sample_settings(identity))
        group = WorkerGroup(config, 1)
        feed = WorkFeed(deque(items))
        wrote = threading.Event()
        group.on_counts = wrote.set  # called by the feed thread once a part of the child's is on disk
        group.start(str(db), "run-x", feed, 1)
        assert wrote.wait(120), "the child never wrote"  # the wait is only so that a regression fails
        group.conns[0].close()  # the parent is gone, as far as the child can tell
        feed_thread = group._thread
        assert feed_thread is not None
        feed_thread.join(timeout=30)  # first: a join here and one in the feed thread would race on waitpid
        group.procs[0].join(timeout=60)
        code = group.procs[0].exitcode
    assert not feed_thread.is_alive()
    assert thread_errors == []
    err = capfd.readouterr().err
    assert code == 0, err[-1500:]
    assert "Traceback" not in err, err[-1500:]
    assert "BrokenPipeError" not in err, err[-1500:]
    written = [p for p in parts_dir(db).iterdir() if p.name.endswith(".jsonl")] if parts_dir(db).exists() else []
    assert written  # what it captured is on disk for the parent's next run to land


async def test_a_child_the_group_signal_ended_first_is_stopped_with_the_run(tmp_path, monkeypatch):
    """Ctrl-C to the process group reaches a child as soon as the parent: the child's INTERRUPTED end often came in
    before the parent's loop cancelled the group, and the summary said 'worker 1 was stopped on its own'. Here the
    child is signalled first, and the run cancelled once its end is in."""
    import os
    import signal

    prompts = prompts_file(tmp_path / "p.jsonl", 200)
    cancel = asyncio.Event()
    spawned: list[WorkerGroup] = []
    real_init = WorkerGroup.__init__

    def init(self, config, children):
        real_init(self, config, children)
        spawned.append(self)

    monkeypatch.setattr(WorkerGroup, "__init__", init)

    async def signal_the_child_then_the_run() -> None:
        while not spawned or not spawned[0].tallies[0].taken:  # the child is serving: its handlers are set
            await asyncio.sleep(0.01)
        pid = spawned[0].procs[0].pid
        assert pid is not None
        os.kill(pid, signal.SIGTERM)
        while not spawned[0].tallies[0].done.is_set():
            await asyncio.sleep(0.01)
        cancel.set()

    with start_simulator(SimConfig(kind="vllm", quirks={"latency": 0.05})) as sim:
        with Store(tmp_path / "s.duckdb") as store:
            config = BatchConfig(servers=[sim.url], prompts_path=prompts, max_new_tokens=20, concurrency=2, workers=2)
            signaller = asyncio.create_task(signal_the_child_then_the_run())
            summary = await run_batch(config, store, cancel=cancel)
            await signaller
    assert summary.interrupted, summary.render()
    assert summary.balanced, summary.render()
    assert not any("stopped on its own" in note or "exited with" in note for note in summary.notes), summary.notes


def test_a_child_stopped_alone_well_before_the_cancel_keeps_its_note():
    """Only a stop that came with the run's own (within SAME_STOP_S before the parent saw it) is the run's: a child
    someone stopped a minute before a later Ctrl-C was stopped on its own, and its note (and what it left) stays."""
    from tokview.batch.tasks import INTERRUPTED
    from tokview.batch.workers import SAME_STOP_S, RemoteTally

    group = WorkerGroup.__new__(WorkerGroup)  # no children: only the tallies are read
    early, late = RemoteTally(), RemoteTally()
    for tally, ended in ((early, 100.0), (late, 159.9)):
        tally.died, tally.by_a_stop_signal, tally.ended_at = "worker stopped on its own", True, ended
    group.tallies = [early, late]
    group.stopped_with_the_run(cancelled_at=160.0)
    assert SAME_STOP_S < 60
    assert (early.died, early.outcome) == ("worker stopped on its own", None)
    assert (late.died, late.outcome) == (None, INTERRUPTED)
