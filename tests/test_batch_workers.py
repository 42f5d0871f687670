"""`--workers`: work is pulled from one feed as each process gets ready, so a slow or dead child neither
holds the run back nor loses or duplicates anything. Real child processes, a real simulator, a real store;
the children are slowed or killed from the parent's side (SIGSTOP, SIGKILL) at fixed points of the
protocol, never by time."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from collections import deque
from pathlib import Path

import pytest
from builders import kimi, profile

from tokview.batch import BatchConfig, plan, read_prompts, run_batch
from tokview.batch.workers import DRAINED_WAIT, FeedTodo, Lander, WorkerGroup, WorkFeed
from tokview.servers import ServerPool
from tokview.sim import SimConfig, start_simulator
from tokview.store import Store

N = 96


def many_prompts(path: Path, n: int = N) -> Path:
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"w{i:04d}", "messages": [{"role": "user", "content": f"question {i}"}]}) + "\n")
    return path


def expected_ids(prompts: Path, config: BatchConfig) -> set[str]:
    rows, _ = read_prompts(prompts)
    identity = {"model": "tokview-sim", "tokenizer": kimi().vocab_fingerprint(), "profile": profile().name}
    return {i.sample_id for i in plan(rows, config, config.sample_settings(identity))[0]}


def stored_ids(store: Store) -> list[str]:
    return [r[0] for r in store.query("SELECT sample_id FROM samples")]


@pytest.fixture
def groups(monkeypatch):
    """Every WorkerGroup the run makes, and a hook called right after its children are spawned."""
    made: list[WorkerGroup] = []
    real = WorkerGroup.__init__

    def init(self, config, children):
        real(self, config, children)
        made.append(self)
        for hook in made_hooks:
            hook(self)

    made_hooks: list = []
    monkeypatch.setattr(WorkerGroup, "__init__", init)
    return made, made_hooks


def config_for(sim, prompts: Path) -> BatchConfig:
    return BatchConfig(servers=[sim.url], prompts_path=prompts, max_new_tokens=40, concurrency=4, workers=2)


async def test_a_child_that_cannot_start_leaves_all_the_work_to_the_parent(tmp_path, groups):
    """The child is stopped (SIGSTOP) the moment it is spawned and let go only once every sample is
    written: with a split fixed up front the run would wait for the child's share; with the feed the
    parent takes it all."""
    made, hooks = groups
    prompts = many_prompts(tmp_path / "p.jsonl")
    hooks.append(lambda g: [os.kill(p.pid, signal.SIGSTOP) for p in g.procs])
    resumed = threading.Event()

    def resume_children() -> None:
        if not resumed.is_set():
            resumed.set()
            for group in made:
                for proc in group.procs:
                    os.kill(proc.pid, signal.SIGCONT)

    def on_progress(p) -> None:
        if p.ok + p.failed >= p.total:
            resume_children()

    watchdog = threading.Timer(240, resume_children)  # only so that a regression fails instead of hanging
    watchdog.start()
    try:
        with start_simulator(SimConfig(kind="vllm")) as sim, Store(tmp_path / "s.duckdb") as store:
            config = config_for(sim, prompts)
            summary = await run_batch(config, store, on_progress=on_progress)
            ids = stored_ids(store)
    finally:
        watchdog.cancel()
        resume_children()
    assert summary.balanced, summary.render()
    assert (summary.ok, summary.failed, summary.stopped) == (N, 0, None), summary.render()
    assert [t.taken for t in made[0].tallies] == [0]  # the parent did every sample
    assert len(ids) == len(set(ids)) == N
    assert set(ids) == expected_ids(prompts, config)


async def test_both_processes_take_work_and_store_every_sample_once(tmp_path, groups):
    made, _ = groups
    prompts = many_prompts(tmp_path / "p.jsonl", 400)
    with start_simulator(SimConfig(kind="vllm")) as sim, Store(tmp_path / "s.duckdb") as store:
        config = config_for(sim, prompts)
        summary = await run_batch(config, store)
        ids = stored_ids(store)
    assert summary.balanced, summary.render()
    assert (summary.ok, summary.failed) == (400, 0), summary.render()
    child = made[0].tallies[0]
    assert child.taken == child.ok
    assert child.leased == {}  # every item the child took, it wrote
    assert len(ids) == len(set(ids)) == 400
    assert set(ids) == expected_ids(prompts, config)


@pytest.mark.parametrize("at_take", [1, 3])
async def test_a_child_killed_mid_run_loses_and_duplicates_nothing(tmp_path, groups, monkeypatch, at_take):
    """SIGKILL the child right after the feed answered its `at_take`-th request: what it took and never
    named in a part goes back to the feed (the parent does it); a part it was writing is left to the
    resume. The run says the worker died; after a resume every sample is stored exactly once.

    The parent's own captures wait until the child is killed, so the child is killed mid-run, with work
    left in the feed, however slow its start-up: timed by the answers alone, a child that started late on
    a busy box found the parent had done nearly everything, asked twice, and was never killed."""
    made, _ = groups
    prompts = many_prompts(tmp_path / "p.jsonl")
    loop = asyncio.get_running_loop()
    killed = asyncio.Event()
    takes: list[int] = []
    real_handle, real_capture = WorkerGroup._handle, ServerPool.capture

    def handle(self, i, message):
        last = real_handle(self, i, message)
        if message[0] == "take":
            takes.append(i)
            if len(takes) == at_take:
                os.kill(self.procs[i].pid, signal.SIGKILL)
                loop.call_soon_threadsafe(killed.set)
        return last

    held_too_long: list[bool] = []

    async def capture(self, request, **kw):  # patched in this process only: the spawned child captures freely
        # As if its request were out: the children are spawned once one is (`runner._Spawn`). Held before
        # sending, no request went out, so no child was spawned until this wait timed out: the test took 2 minutes.
        self.generation_sent.set()
        try:
            await asyncio.wait_for(killed.wait(), 60)
        except TimeoutError:  # a regression fails instead of hanging
            held_too_long.append(True)
        return await real_capture(self, request, **kw)

    monkeypatch.setattr(WorkerGroup, "_handle", handle)
    monkeypatch.setattr(ServerPool, "capture", capture)
    db = tmp_path / "s.duckdb"
    # Answers take a little while, so by its 3rd request the child may be writing a part (then left for the resume).
    with start_simulator(SimConfig(kind="vllm", quirks={"latency": 0.05})) as sim, Store(db) as store:
        config = config_for(sim, prompts)
        summary = await run_batch(config, store)
        first = stored_ids(store)
        assert not held_too_long, "the child was never killed: the parent's captures waited out their hold"
        assert summary.balanced, summary.render()
        said = summary.stopped if summary.abandoned else " ".join(summary.notes)
        assert said
        assert "worker 1 exited with -9" in said
        if summary.abandoned:  # a part it was writing is left for the resume: the run is not whole
            assert summary.stopped
            assert summary.exit_code != 0
        else:  # the others did all its work: the run is whole, and says what happened
            assert summary.stopped is None
            assert summary.exit_code == 0
            assert "note: worker 1 exited with -9" in summary.render()
        child = made[0].tallies[0]
        assert child.taken == 16 * at_take  # a chunk each time: the parent held 4 items, the feed the rest
        # Only the part it was writing is left for the resume: everything else it took went back and was done.
        assert summary.abandoned == child.unconfirmed
        assert f"{child.unconfirmed} left for a resume" in said
        if at_take == 1:  # it had written nothing: all its items went back and were done by the parent
            assert (summary.ok, summary.abandoned) == (N, 0)
            assert "16 of its samples went back to the others" in said
        assert len(first) == len(set(first)) >= summary.ok
        again = await run_batch(config, store)
        ids = stored_ids(store)
    assert again.balanced
    assert again.ok == N - len(first)
    assert again.resumed == len(first)
    assert len(ids) == len(set(ids)) == N
    assert set(ids) == expected_ids(prompts, config)


async def test_a_cancel_stops_every_process_and_what_they_wrote_is_counted(tmp_path, groups):
    """Ctrl-C (the cancel event): the feed closes, the children stop taking work and write what was
    handed to their writers; what is counted is exactly what is stored, and a resume does the rest."""
    prompts = many_prompts(tmp_path / "p.jsonl", 400)
    cancel = asyncio.Event()

    def on_progress(p) -> None:
        if p.ok >= 40:
            cancel.set()

    with start_simulator(SimConfig(kind="vllm")) as sim, Store(tmp_path / "s.duckdb") as store:
        config = config_for(sim, prompts)
        summary = await run_batch(config, store, on_progress=on_progress, cancel=cancel)
        first = stored_ids(store)
        assert summary.interrupted, summary.render()
        assert summary.balanced, summary.render()
        assert summary.abandoned > 0, summary.render()
        assert len(first) == len(set(first)) == summary.ok
        again = await run_batch(config, store)
        ids = stored_ids(store)
    assert again.balanced
    assert again.ok == 400 - len(first)
    assert len(ids) == len(set(ids)) == 400
    assert set(ids) == expected_ids(prompts, config)


def test_the_feed_hands_out_given_back_items_first_and_nothing_once_closed():
    feed = WorkFeed(deque(range(10)))
    assert feed.take(3) == [0, 1, 2]
    feed.give_back([1, 2])
    assert len(feed) == 9
    assert feed.take(4) == [1, 2, 3, 4]
    local = FeedTodo(feed)
    assert local
    assert local.popleft() == 5
    assert len(local) == 4
    assert feed.take(4) == [6, 7, 8, 9]
    feed.give_back([9])
    assert feed.take(2) == [9]
    feed.close()
    assert not local
    assert feed.take(5) == []
    assert len(feed) == 0


def test_an_edited_prompts_file_closes_the_feed_with_the_error():
    class Broken:
        def __len__(self):
            return 5

        def popleft(self):
            raise ValueError("the prompts file changed")

    feed = WorkFeed(Broken())
    assert feed.take(2) == []
    assert feed.closed
    assert isinstance(feed.error, ValueError)


async def test_a_server_that_fails_everything_stops_every_process(tmp_path):
    prompts = many_prompts(tmp_path / "p.jsonl", 400)
    with (
        start_simulator(SimConfig(kind="vllm", quirks={"http-500": True})) as sim,
        Store(tmp_path / "f.duckdb") as store,
    ):
        config = BatchConfig(
            servers=[sim.url],
            prompts_path=prompts,
            max_new_tokens=30,
            concurrency=2,
            retries=0,
            max_consecutive_failures=5,
            workers=2,
        )
        summary = await run_batch(config, store)
    assert summary.stopped
    assert "stopped after 5 consecutive failures" in summary.stopped
    assert summary.failed < 100, summary.render()
    assert summary.abandoned > 300, summary.render()
    assert summary.balanced, summary.render()


def test_the_lander_lands_what_is_left_when_closed_and_a_full_disk_closes_the_feed():
    from tokview.store import StoreError
    from tokview.store.store import StoreFull

    class Parts:
        def __init__(self, fail: StoreError | None = None):
            self.landed, self.fail = 0, fail

        def ingest(self):
            if self.fail is not None:
                raise self.fail
            self.landed += 1
            return 0, 0

    store = Parts()
    lander = Lander(store, every_s=3600)  # no beat within the test: only the landing on close
    lander.close()
    assert store.landed == 1
    assert lander.error is None
    # When a landing is due, read off the rule rather than waited for: with work left at the next gap;
    # once the feed is drained, DRAINED_WAIT gaps after the part (the run's end usually lands it first)
    # unless live. Never poked, it lands only on close.
    left = [1]
    drained = Parts()
    lander = Lander(drained, every_s=600, drained=lambda: not left)
    now = time.monotonic()
    assert lander._due(now) == lander._next
    left.clear()
    assert lander._due(now) == now + DRAINED_WAIT * 600
    lander.live = True
    assert lander._due(now) == lander._next
    lander.close()
    assert drained.landed == 1
    feed = WorkFeed(deque(range(3)))
    full = Parts(StoreFull("the disk is full"))
    lander = Lander(full, every_s=3600, on_error=feed.close)
    lander.close()
    assert isinstance(lander.error, StoreFull)
    assert feed.closed
    assert feed.take(1) == []


def test_a_landing_that_fails_with_an_error_no_store_layer_named_stops_the_run_said_not_a_dead_thread():
    """An OS error the store did not turn into its own (a folder the parts cannot be listed in) or a bug: the Lander
    stops the run as for a full disk, with the error named, instead of dying on its thread with a traceback while
    the run goes on landing nothing."""
    from tokview.store import StoreError

    class Broken:
        def ingest(self):
            raise PermissionError(13, "Permission denied", "/store.parts")

    feed = WorkFeed(deque(range(3)))
    lander = Lander(Broken(), every_s=0.0, on_error=feed.close)
    lander.poke()
    deadline = time.monotonic() + 10
    while lander.error is None:
        assert time.monotonic() < deadline, "the landing's error was never said"
        time.sleep(0.01)
    assert isinstance(lander.error, StoreError)
    assert "Permission denied" in str(lander.error)
    assert feed.closed
    lander.close()  # the run's end: no traceback out of it


async def test_rows_given_in_memory_start_the_children_once_planned(tmp_path, groups):
    """The app's path (rows, no prompts file): no plan before the tokenizer, so the children are spawned
    after planning; the run is the same."""
    made, _ = groups
    prompts = many_prompts(tmp_path / "p.jsonl", 200)
    rows, _ = read_prompts(prompts)
    with start_simulator(SimConfig(kind="vllm")) as sim, Store(tmp_path / "s.duckdb") as store:
        config = BatchConfig(servers=[sim.url], max_new_tokens=40, concurrency=4, workers=2)
        summary = await run_batch(config, store, prompts=rows)
        ids = stored_ids(store)
    assert summary.balanced, summary.render()
    assert (summary.ok, summary.failed) == (200, 0), summary.render()
    assert len(made) == 1
    assert made[0].tallies[0].done.is_set()
    assert made[0].tallies[0].leased == {}
    assert len(ids) == len(set(ids)) == 200
    assert set(ids) == expected_ids(prompts, config)


def test_ctrl_c_on_the_process_group_stops_every_worker_and_a_resume_finishes(tmp_path):
    """A terminal's Ctrl-C reaches the whole process group: `tokview batch --workers 2` exits 130 with
    what was in flight written, every child gone, and a resume stores each sample once."""
    import subprocess
    import sys

    prompts = many_prompts(tmp_path / "p.jsonl", 400)
    db = tmp_path / "c.duckdb"
    cli = [sys.executable, "-c", "import sys; from tokview.cli import main; sys.exit(main())"]
    argv = [*cli, "batch", str(prompts), "--db", str(db), "--max-new-tokens", "40", "--concurrency", "2"]
    with start_simulator(SimConfig(kind="vllm", quirks={"latency": 0.05})) as sim:
        argv += ["--server", sim.url, "--workers", "2", "--summary-json"]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        deadline = time.monotonic() + 120
        while sim.stats.generation < 60 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        summary = json.loads(out.decode().strip().splitlines()[-1])
        assert proc.returncode == 130, err.decode()[-800:]
        assert summary["interrupted"], err.decode()[-800:]
        assert summary["balanced"], err.decode()[-800:]
        with Store(db) as store:
            first = stored_ids(store)
        assert len(first) == len(set(first)) == summary["ok"] < 400
        config = BatchConfig(servers=[sim.url], prompts_path=prompts, max_new_tokens=40, concurrency=4, workers=2)
        with Store(db) as store:
            again = asyncio.run(run_batch(config, store))
            ids = stored_ids(store)
    assert again.ok == 400 - len(first)
    assert again.resumed == len(first)
    assert len(ids) == len(set(ids)) == 400
    assert set(ids) == expected_ids(prompts, config)


def test_a_landing_that_meets_a_held_store_tries_again_and_only_the_last_one_is_an_error():
    """A notebook or the duckdb CLI holding the store past the wait: the parts are safe, so a landing during the run
    is tried again at the next gap (it stopped all landing for good: a proxy then dropped every later answer), said
    once held and once free; the final landing, with nothing after it, reports it."""
    from tokview.store.errors import StoreHeld

    class Held:
        def __init__(self, times: int):
            self.times, self.landed = times, 0

        def ingest(self):
            if self.times:
                self.times -= 1
                raise StoreHeld("the store s.duckdb is in use by another program: gave up after 0s")
            self.landed += 1
            return 1, 0

    said: list[BaseException | None] = []
    store = Held(2)
    lander = Lander(store, every_s=0.01, on_held=said.append)
    lander.poke()
    deadline = time.monotonic() + 10
    while not store.landed:
        assert time.monotonic() < deadline, "the held landing was never tried again"
        time.sleep(0.01)
    assert lander.error is None and lander.held is None
    assert [type(s) for s in said] == [StoreHeld, StoreHeld, type(None)]
    lander.close()
    assert lander.error is None

    lander = Lander(Held(10**6), every_s=3600)
    lander.close()
    assert isinstance(lander.error, StoreHeld)


async def test_a_batch_whose_last_landing_meets_a_held_store_prints_its_summary_and_loses_nothing(tmp_path):
    """The run's answers were all written when another program took the store past the wait: the run ended with one
    error line and no summary (`--summary-json` gave nothing to parse). It ends stopped, its summary saying the
    next command lands them, and the next open of the store does."""
    import subprocess
    import sys

    from prompt_files import prompts_file

    from tokview.batch import BatchConfig, run_batch
    from tokview.sim import SimConfig, start_simulator
    from tokview.store import Store

    db = tmp_path / "held.duckdb"
    prompts = prompts_file(tmp_path / "p.jsonl", 4)
    hold = (
        "import duckdb, sys, time\n"
        "while True:\n"
        "    try:\n"
        f"        c = duckdb.connect({str(db)!r}); break\n"
        "    except duckdb.Error:\n"
        "        time.sleep(0.005)\n"
        "print('held', flush=True); time.sleep(6)\n"
    )
    with start_simulator(SimConfig(kind="vllm", quirks={"latency": 0.4})) as sim:
        store = Store(str(db), lock_timeout=0.5)
        config = BatchConfig(servers=[sim.url], prompts_path=prompts, max_new_tokens=8, concurrency=1, workers=1)
        holder = None

        async def hold_once_started() -> None:
            nonlocal holder
            parts = tmp_path / "held.duckdb.parts"
            while not any(parts.glob("*.samples.jsonl")):  # the run is under way: hold the store through its end
                await asyncio.sleep(0.01)
            holder = subprocess.Popen([sys.executable, "-c", hold], stdout=subprocess.PIPE, text=True)

        try:
            summary, _ = await asyncio.gather(run_batch(config, store), hold_once_started())
        finally:
            if holder is not None:
                holder.wait(30)
    assert summary.stopped is not None and "in use by" in summary.stopped, summary
    assert "the next tokview command on it lands them" in summary.stopped
    assert summary.ok == 4
    with Store(str(db)) as again:
        assert again.query("SELECT count(*) FROM samples") == [(4,)]


def test_a_batch_into_a_new_store_goes_on_through_a_held_store_and_says_so(tmp_path):
    """The same through the landing child a batch into a new store lands with: its held landing came back as a
    plain store error, which stopped the run (no summary) though every answer was safe in parts. The child says
    "held" and goes on; the run prints its summary (stopped: exit 1), and the next open lands every answer.
    TOKVIEW_STORE_WAIT_S shortens the wait."""
    import os
    import subprocess
    import sys

    from prompt_files import prompts_file

    from tokview.sim import SimConfig, start_simulator
    from tokview.store import Store

    db = tmp_path / "new.duckdb"
    prompts = prompts_file(tmp_path / "p.jsonl", 6)
    hold = (
        "import duckdb, pathlib, sys, time\n"
        f"parts = pathlib.Path({str(db)!r} + '.parts')\n"
        "while not any(parts.glob('*.samples.jsonl')):\n"
        "    time.sleep(0.005)\n"
        "while True:\n"
        "    try:\n"
        f"        c = duckdb.connect({str(db)!r}); break\n"
        "    except duckdb.Error:\n"
        "        time.sleep(0.005)\n"
        "time.sleep(5)\n"
    )
    with start_simulator(SimConfig(kind="vllm", quirks={"latency": 0.3})) as sim:
        holder = subprocess.Popen([sys.executable, "-c", hold])
        try:
            run = subprocess.run(
                [sys.executable, "-m", "tokview", "batch", str(prompts), "--server", sim.url, "--db", str(db)]
                + ["--concurrency", "1", "--workers", "1", "--max-new-tokens", "8"],
                capture_output=True,
                text=True,
                timeout=120,
                env={**os.environ, "TOKVIEW_STORE_WAIT_S": "0.5"},
            )
        finally:
            holder.wait(30)
    said = run.stdout + run.stderr
    assert run.returncode == 1, said
    assert "Traceback" not in said
    assert "ok 6" in said and "the next tokview command on it lands them" in said, said
    with Store(str(db)) as again:
        assert again.query("SELECT count(*) FROM samples") == [(6,)]


def test_a_store_wait_that_is_not_seconds_is_one_line(tmp_path, monkeypatch):
    from tokview.store import Store, StoreError

    for bad in ("soon", "-1", "inf", "nan"):
        monkeypatch.setenv("TOKVIEW_STORE_WAIT_S", bad)
        with pytest.raises(StoreError, match="TOKVIEW_STORE_WAIT_S must be a number of seconds"):
            Store(str(tmp_path / "s.duckdb"))
