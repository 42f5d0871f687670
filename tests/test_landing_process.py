"""A new store is created and landed into by a child process (`batch/landing_process.py`).

What must hold: the batch's own process never imports DuckDB for a new store and every sample still lands by the
time the run returns; a child that dies mid-run is replaced by landing in the batch's process (nothing lost, nothing
doubled); a batch SIGKILLed mid-run leaves a child that lands what was written and ends; a run that never begins
(nothing to do) creates no file; the child's refusal of the run reaches the batch as the one-line error it would
have raised itself. Real simulator, real child processes, real DuckDB files.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gated_sim import gated
from mounts import tmpfs
from prompt_files import prompts_file
from run_records import record

from tokview.batch import BatchConfig, BatchSummary, run_batch
from tokview.batch.early_landing import spare_path
from tokview.batch.inputs import InputError
from tokview.batch.landing_process import (
    LandingChild,
    make_spare,
    remove_unused_store,
    take_spare,
    wait_for_exit,
)
from tokview.batch.run_record import RunRecord
from tokview.batch.store_opener import StoreOpener
from tokview.batch.tasks import StartInterrupted
from tokview.sim import SimConfig, start_simulator
from tokview.store import Store
from tokview.store.parts import complete_parts

CLI = [sys.executable, "-c", "import sys; from tokview.cli import main; sys.exit(main())"]


async def run_into(opener: StoreOpener, prompts: Path) -> BatchSummary:
    """A one-process batch of `prompts` against a fresh simulator into the store `opener` makes; the stores it
    opened here are closed."""
    with start_simulator(SimConfig(kind="vllm")) as sim:
        config = BatchConfig(servers=[sim.url], prompts_path=prompts, max_new_tokens=16, concurrency=4, workers=1)
        try:
            return await run_batch(config, opener)
        finally:
            for store in opener.opened:
                store.close()


def landing_children(parent: int) -> list[int]:
    """Pids of the landing processes whose parent is `parent`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == parent and b"tokview.batch.landing_process" in cmdline:
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


NO_DUCKDB_PROBE = """
import json, sys
from tokview.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "duckdb": "duckdb" in sys.modules}))
"""


def test_a_new_store_is_made_and_filled_without_duckdb_in_the_batch_process(tmp_path):
    prompts = prompts_file(tmp_path / "p.jsonl", 12)
    db = tmp_path / "new" / "store.duckdb"
    with start_simulator(SimConfig(kind="vllm")) as sim:
        argv = ["batch", str(prompts), "--server", sim.url, "--db", str(db), "--max-new-tokens", "16"]
        done = subprocess.run(
            [sys.executable, "-c", NO_DUCKDB_PROBE, *argv, "--workers", "1"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-800:]
        assert json.loads(done.stdout.strip().splitlines()[-1]) == {"code": 0, "duckdb": False}
        assert "Traceback" not in done.stderr
        with Store(db) as store:
            assert store.count_samples() == 12
            assert store.query("SELECT count(*) FROM runs")[0][0] == 1
        # The second run resumes an existing store: opened in the batch's process, nothing generated twice.
        again = subprocess.run([*CLI, *argv, "--summary-json"], capture_output=True, text=True, timeout=120)
        assert again.returncode == 0, again.stderr[-800:]
        summary = json.loads(again.stdout.strip().splitlines()[-1])
        assert summary["resumed"] == 12 and summary["ok"] == 0


async def test_a_landing_child_that_dies_mid_run_is_replaced_by_landing_here(tmp_path, monkeypatch):
    """The child is SIGKILLed as soon as the run begins: the batch lands in its own process instead, every
    sample once, and the run reports no error."""
    killed: list[int] = []
    begin = LandingChild.begin_run

    def begin_then_die(self: LandingChild, run: RunRecord) -> None:
        begin(self, run)
        assert self._proc is not None
        killed.append(self._proc.pid)
        os.kill(self._proc.pid, signal.SIGKILL)

    monkeypatch.setattr(LandingChild, "begin_run", begin_then_die)
    db = tmp_path / "s.duckdb"
    opener = StoreOpener(db)
    summary = await run_into(opener, prompts_file(tmp_path / "p.jsonl", 9))
    assert killed and not alive(killed[0])
    assert len(opener.opened) == 1  # the store was opened here once the child was gone
    assert summary.ok == 9 and summary.balanced and summary.stopped is None
    with Store(db) as store:
        ids = [r[0] for r in store.query("SELECT sample_id FROM samples")]
        assert store.query("SELECT count(*) FROM runs")[0][0] == 1  # the run is recorded here too
    assert len(ids) == len(set(ids)) == 9


def test_a_batch_killed_mid_run_leaves_a_child_that_lands_what_was_written_and_ends(tmp_path):
    """SIGKILL the batch while answers are held at the server: its landing child lands every part already
    written, closes the store and exits; a resume then generates only the rest."""
    n = 8
    prompts = prompts_file(tmp_path / "p.jsonl", n)
    db = tmp_path / "k.duckdb"
    with start_simulator(SimConfig(kind="vllm")) as sim, gated(sim.url, free=3) as (url, gate):
        argv = [*CLI, "batch", str(prompts), "--server", url, "--db", str(db), "--max-new-tokens", "40"]
        argv += ["--workers", "1", "--concurrency", "4", "--summary-json"]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        parts = Path(str(db) + ".parts")
        while gate.answered < 3:  # three answers are let through, the others held
            assert proc.poll() is None and time.monotonic() < deadline, "the run never got its first answers"
            time.sleep(0.01)
        children = landing_children(proc.pid)
        assert len(children) == 1
        while not (parts.is_dir() and complete_parts(parts)[0]):  # the answers are written as a part
            assert proc.poll() is None and time.monotonic() < deadline, "the run never wrote a part"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
        while alive(children[0]):  # it lands what was written, closes the store, and ends by itself
            assert time.monotonic() < deadline, "the landing child outlived its batch"
            time.sleep(0.01)
        assert complete_parts(parts) == ([], [])  # the child landed every part written
        with Store(db) as store:
            landed = store.count_samples()
        assert 1 <= landed <= 3  # the three answers let through, as far as they were written when it was killed
        gate.open()
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-800:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["resumed"] == landed and summary["ok"] == n - landed and summary["balanced"]


async def test_a_run_with_nothing_to_do_creates_no_store(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("not json\n")
    db = tmp_path / "none.duckdb"
    opener = StoreOpener(db)
    with start_simulator(SimConfig(kind="vllm")) as sim:
        config = BatchConfig(servers=[sim.url], prompts_path=prompts, max_new_tokens=8, workers=1)
        summary = await run_batch(config, opener)
    assert summary.ok == 0 and len(summary.bad_rows) == 1
    assert not db.exists() and not Path(str(db) + ".parts").exists()
    assert opener.opened == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.jsonl"]  # nor the spare the child had made


def test_the_childs_refusal_reaches_the_batch_as_its_one_line_error(tmp_path):
    """A store made meanwhile by another run of the same name with other settings: the child refuses to record
    this run, and `ingest` raises the InputError the batch would have raised opening the store itself."""
    db = tmp_path / "race.duckdb"
    opener = StoreOpener(db)
    child = LandingChild.for_new_store(opener)
    assert child is not None
    with Store(db) as other:  # another batch created it in the meantime
        other.put_run("r1", settings={"temperature": 0.0})
    child.begin_run(record("r1", {"temperature": 1.0}))
    with pytest.raises(InputError, match="run r1 was made with other temperature"):
        child.ingest()
    child.close()
    assert child._proc is None


def test_an_opener_for_an_existing_store_or_ray_gets_no_child(tmp_path):
    db = tmp_path / "old.duckdb"
    Store(db).close()
    assert LandingChild.for_new_store(StoreOpener(db)) is None
    assert LandingChild.for_new_store(StoreOpener(tmp_path / "new.duckdb"), ray=True) is None
    assert LandingChild.for_new_store(StoreOpener(":memory:")) is None


async def test_a_cancel_before_the_run_begins_ends_the_child_having_created_nothing(tmp_path, monkeypatch):
    """Ctrl-C while the servers are probed (they never answer): the child, started early, ends with nothing made."""
    prompts = prompts_file(tmp_path / "p.jsonl", 2)
    db = tmp_path / "c.duckdb"
    opener = StoreOpener(db)
    spawned: list[LandingChild] = []
    start = LandingChild.start

    def remembered(self: LandingChild) -> None:
        start(self)
        spawned.append(self)

    monkeypatch.setattr(LandingChild, "start", remembered)
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        config = BatchConfig(servers=[url], prompts_path=prompts, max_new_tokens=8, workers=1)
        cancel = asyncio.Event()
        run = asyncio.create_task(run_batch(config, opener, cancel=cancel))
        deadline = time.monotonic() + 30
        while not spawned:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # the probe is waiting on the silent server
        cancel.set()
        with pytest.raises(StartInterrupted, match="nothing was written"):
            await run
    assert spawned[0]._proc is None
    assert not db.exists() and not Path(str(db) + ".parts").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.jsonl"]  # nor the spare the child had made


async def test_a_landing_child_killed_in_the_middle_of_a_landing_loses_and_doubles_nothing(tmp_path, monkeypatch):
    """SIGKILL the child the moment it was asked to land (it is opening the file, inside the transaction, or
    committing): the batch lands here from then on; every sample is stored exactly once."""
    killed: list[int] = []
    reply = LandingChild._reply

    def killing_reply(self: LandingChild, stdout):
        if self._ready and not killed and self._proc is not None:  # the request to land is written
            killed.append(self._proc.pid)
            os.kill(self._proc.pid, signal.SIGKILL)
        return reply(self, stdout)

    monkeypatch.setattr(LandingChild, "_reply", killing_reply)
    db = tmp_path / "s.duckdb"
    summary = await run_into(StoreOpener(db), prompts_file(tmp_path / "p.jsonl", 30))
    assert killed and not alive(killed[0])
    assert summary.ok == 30 and summary.balanced and summary.stopped is None
    with Store(db) as store:
        ids = [r[0] for r in store.query("SELECT sample_id FROM samples")]
        findings = store.query("SELECT count(*), count(DISTINCT (sample_id, code, detail)) FROM findings")[0]
    assert len(ids) == len(set(ids)) == 30
    assert findings[0] == findings[1]  # no finding landed twice either


GARBLED_CHILD = """
import sys
sys.stdin.readline()  # the spec
print('{"ready": true}', flush=True)
sys.stdin.readline()  # "land"
print('{"landed": "many"}', flush=True)
sys.stdin.read()
"""


def test_a_child_that_answers_garbage_is_dropped_and_the_batch_lands_here(tmp_path, monkeypatch):
    """A reply that is not the one asked for: the child is killed, the store opened here, the run recorded and
    the parts landed in this process (no error: nothing was lost)."""

    def start_garbled(self: LandingChild) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", GARBLED_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )

    monkeypatch.setattr(LandingChild, "start", start_garbled)
    db = tmp_path / "g.duckdb"
    opener = StoreOpener(db)
    child = LandingChild.for_new_store(opener)
    assert child is not None and child._proc is not None
    garbled = child._proc
    child.begin_run(record("r1", {"temperature": 0.0}))
    child.write_part([], [{"prompt_id": "p", "sample_id": "p@x", "run_id": "r1", "reason": "boom", "server": None}])
    try:
        child.ingest()  # (opening the store here lands the parts left beside it)
        assert garbled.poll() is not None  # killed and reaped
        assert child.landed_here is not None and opener.opened == [child.landed_here]
        assert child.landed_here.query("SELECT run_id FROM runs") == [("r1",)]
        assert child.landed_here.query("SELECT sample_id FROM failures") == [("p@x",)]
    finally:
        child.close()
        for store in opener.opened:
            store.close()


def _wait_for(check, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_the_store_is_made_as_a_spare_before_the_run_begins_and_linked_into_place(tmp_path):
    """Creating the file and its schema (~0.1 s on 2 busy cores) was the tail of a one-prompt run: the child now
    makes it as a hidden spare while the batch loads its tokenizer, and the run only links it into place."""
    db = tmp_path / "s.duckdb"
    child = LandingChild.for_new_store(StoreOpener(db))
    assert child is not None and child._proc is not None
    spare = spare_path(str(db), child._proc.pid)
    _wait_for(spare.exists, "the child made no spare")
    assert not db.exists()
    child.begin_run(record("r1", {"temperature": 0.0}))
    assert child.ingest() == (0, 0)
    child.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.duckdb"]
    with Store(db) as store:
        assert store.query("SELECT run_id FROM runs") == [("r1",)]


def test_a_spare_never_replaces_a_store_made_meanwhile(tmp_path):
    db = tmp_path / "race.duckdb"
    spare = make_spare(str(db))
    assert spare is not None and spare.exists()
    with Store(db) as other:
        other.put_run("theirs", settings={})
    take_spare(spare, str(db))
    assert not spare.exists()
    with Store(db) as store:
        assert store.query("SELECT run_id FROM runs") == [("theirs",)]
    assert make_spare(str(db)) is None  # the store is there: nothing to prepare
    assert make_spare(str(tmp_path / "no" / "such.duckdb")) is None  # no folder is made before the run begins
    assert sorted(p.name for p in tmp_path.iterdir()) == ["race.duckdb"]


def test_a_killed_childs_spare_is_removed_by_its_batch_or_the_next_child(tmp_path):
    db = tmp_path / "k.duckdb"
    child = LandingChild.for_new_store(StoreOpener(db))
    assert child is not None and child._proc is not None
    pid = child._proc.pid
    _wait_for(spare_path(str(db), pid).exists, "the child made no spare")
    os.kill(pid, signal.SIGKILL)
    child.close()
    assert list(tmp_path.iterdir()) == []
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = spare_path(str(db), int(dead.stdout))  # a child killed with its batch: nobody removed its spare
    left.write_bytes(b"x")
    left.with_name(left.name + ".wal").write_bytes(b"x")
    spare = make_spare(str(db))
    assert spare is not None
    assert sorted(p.name for p in tmp_path.iterdir()) == [spare.name]
    take_spare(spare, str(db))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.duckdb"]


def test_names_that_only_look_like_spares_are_left_and_never_fail_the_run(tmp_path):
    """A name whose "pid" `isdigit` accepts but `int` refuses, or one past any pid: the sweep raised, and the child
    answered the run with that error."""
    odd = [".s.duckdb.tokview-new-\u00b2", ".s.duckdb.tokview-new-99999999999999999999", ".s.duckdbX.tokview-new-1"]
    for name in odd:
        (tmp_path / name).write_bytes(b"x")
    spare = make_spare(str(tmp_path / "s.duckdb"))
    assert spare is not None
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*odd, spare.name])
    take_spare(spare, str(tmp_path / "s.duckdb"))
    summary = asyncio.run(run_into(StoreOpener(tmp_path / "t.duckdb"), prompts_file(tmp_path / "p.jsonl", 2)))
    assert summary.ok == 2 and summary.stopped is None
    left = sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".parts"))
    assert left == sorted([*odd, "p.jsonl", "s.duckdb", "t.duckdb"])


def test_a_spare_is_made_afresh_and_never_for_a_tilde_path(tmp_path, monkeypatch):
    db = tmp_path / "s.duckdb"
    own = spare_path(str(db), os.getpid())
    own.write_bytes(b"an earlier process of this pid left this")  # a container's pids repeat
    spare = make_spare(str(db))
    assert spare == own
    take_spare(spare, str(db))
    with Store(db) as store:
        assert store.query("SELECT count(*) FROM runs") == [(0,)]
    monkeypatch.setenv("HOME", str(tmp_path))
    assert make_spare("~/other.duckdb") is None  # DuckDB reads `~` its own way: the run creates it itself


def test_a_spare_that_cannot_be_written_whole_is_not_used(tmp_path):
    """On a nearly full disk the schema stayed in the spare's write-ahead log, which is not linked: the store put in
    place was an empty DuckDB file, and the run then failed for the room the spare had taken."""
    with tmpfs(tmp_path / "disk", "3m") as disk:
        ballast = disk / "ballast"
        free = os.statvfs(disk)
        ballast.write_bytes(b"\0" * (free.f_bavail * free.f_frsize - 300 * 1024))
        assert make_spare(str(disk / "s.duckdb")) is None
        assert sorted(p.name for p in disk.iterdir()) == ["ballast"]


def _held_elsewhere(db: Path) -> subprocess.Popen[str]:
    """Another process with `db` open in DuckDB (and so locked), until its stdin closes."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import duckdb, sys; c = duckdb.connect(sys.argv[1]); print('open', flush=True); sys.stdin.read()",
            str(db),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline() == "open\n"
    return holder


def test_a_store_opened_ahead_takes_the_run_once_it_begins(tmp_path):
    """`open_ahead` (the servers have generated, work is left): the spare goes into place and the child holds the
    store open while the tokenizer loads; the run then records into it and lands as ever."""
    db = tmp_path / "a.duckdb"
    child = LandingChild.for_new_store(StoreOpener(db))
    assert child is not None
    child.open_ahead()
    child.open_ahead()  # once is enough: a second call sends nothing
    _wait_for(db.exists, "the store was not opened ahead")
    probe = subprocess.run(  # held open by the child: another process waits for it
        [sys.executable, "-c", "import duckdb, sys; duckdb.connect(sys.argv[1])", str(db)], capture_output=True
    )
    assert probe.returncode != 0 and "lock" in probe.stderr.decode().lower()
    child.begin_run(record("r1", {"temperature": 0.0}))
    assert child.ingest() == (0, 0)
    child.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.duckdb"]
    with Store(db) as store:
        assert store.query("SELECT run_id FROM runs") == [("r1",)]


def test_a_store_opened_ahead_for_a_run_that_never_begins_is_removed(tmp_path):
    """The tokenizer fails to load, a Ctrl-C, a batch killed: the child's input ends before the run does, and the
    file it put in place goes, as if it had never been opened."""
    db = tmp_path / "gone.duckdb"
    child = LandingChild.for_new_store(StoreOpener(db))
    assert child is not None and child._proc is not None
    child.open_ahead()
    _wait_for(db.exists, "the store was not opened ahead")
    proc = child._proc
    child.close()
    assert proc.returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_store_opened_ahead_is_not_made_where_no_spare_could_be(tmp_path):
    """No spare (the store's folder does not exist yet): the early open makes nothing, the run's line makes the
    store as before, and a run that never begins leaves no folder."""
    never = tmp_path / "no" / "such.duckdb"
    child = LandingChild.for_new_store(StoreOpener(never))
    assert child is not None and child._proc is not None
    child.open_ahead()
    proc = child._proc
    child.close()
    assert proc.returncode == 0 and not never.parent.exists()
    db = tmp_path / "later" / "made.duckdb"
    child = LandingChild.for_new_store(StoreOpener(db))
    assert child is not None
    child.open_ahead()
    child.begin_run(record("r1", {}))
    assert child.ingest() == (0, 0)
    child.close()
    with Store(db) as store:
        assert store.query("SELECT run_id FROM runs") == [("r1",)]


def test_an_unused_store_another_process_opened_is_left_to_it(tmp_path):
    """The removal of a never-used store takes DuckDB's own lock first: a process that opened the file meanwhile
    keeps it (here one holding it open); once nobody has it, it goes with its write-ahead log."""
    db = tmp_path / "u.duckdb"
    Store(db).close()
    holder = _held_elsewhere(db)
    try:
        remove_unused_store(str(db))
        assert db.exists()
    finally:
        holder.communicate("")
    (tmp_path / "u.duckdb.wal").write_bytes(b"")
    remove_unused_store(str(db))
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    remove_unused_store(str(db))  # nothing there: nothing to do


def test_waiting_for_a_childs_exit_returns_its_code_or_times_out(monkeypatch):
    quick = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    assert wait_for_exit(quick, 60) == 3 and quick.returncode == 3
    slow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            wait_for_exit(slow, 0.05)
        assert slow.returncode is None
    finally:
        slow.kill()
        assert wait_for_exit(slow, 60) == -signal.SIGKILL

    def no_pidfd(pid: int) -> int:
        raise OSError("no pidfd here")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    fallback = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(4)"])
    assert wait_for_exit(fallback, 60) == 4


def test_a_store_opened_ahead_keeps_what_it_landed_on_opening_when_the_run_never_begins(tmp_path):
    """Opening a store lands the parts beside it: a concurrent batch's, written after this batch began. A run that
    then never begins must not remove the file that now holds them."""
    from tokview.store.part_sink import PartSink

    db = tmp_path / "kept.duckdb"
    child = LandingChild.for_new_store(StoreOpener(db))
    assert child is not None
    failure = {"prompt_id": "p", "sample_id": "p@x", "run_id": "theirs", "reason": "boom", "server": None}
    PartSink(str(db), []).write_part([], [failure])  # the other batch's part
    child.open_ahead()
    _wait_for(db.exists, "the store was not opened ahead")
    child.close()
    with Store(db) as store:
        assert store.query("SELECT sample_id FROM failures") == [("p@x",)]


OPENS_WHEN_FREE = """
import sys, time, duckdb
deadline = time.monotonic() + 30
while True:
    try:
        duckdb.connect(sys.argv[1]).close()
        print("opened", flush=True)
        break
    except duckdb.Error:
        assert time.monotonic() < deadline, "never free"
        time.sleep(0.05)
"""


def test_a_store_opened_ahead_is_not_held_past_the_stores_longest_hold(tmp_path):
    """The tokenizer loads for long (or a server is probed again): the store opened ahead is let go after
    MAX_HOLD_S, so another process gets its turn before the run begins; the run is then recorded as ever."""
    db = tmp_path / "free.duckdb"
    child = LandingChild.for_new_store(StoreOpener(db))
    assert child is not None and child._proc is not None
    child.open_ahead()
    _wait_for(db.exists, "the store was not opened ahead")
    other = subprocess.run([sys.executable, "-c", OPENS_WHEN_FREE, str(db)], capture_output=True, text=True)
    assert other.stdout == "opened\n", other.stderr
    assert child._proc.poll() is None  # still waiting for the run
    child.begin_run(record("r1", {}))
    assert child.ingest() == (0, 0)
    child.close()
    with Store(db) as store:
        assert store.query("SELECT run_id FROM runs") == [("r1",)]


def test_waiting_for_a_child_reaped_already_never_watches_the_process_its_pid_names_now():
    """`kill` polls first, so a child that had died is reaped before the wait: its pid may be reused."""
    gone = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(5)"])
    gone.wait()
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        gone.pid = stranger.pid  # the pid reused by another process
        assert wait_for_exit(gone, 0.05) == 5
    finally:
        stranger.kill()
        stranger.wait()


def test_two_batches_starting_at_once_into_a_new_store_under_one_run_never_mix_their_settings(tmp_path):
    """Both start before the store exists; the one whose settings differ from the run the other recorded first is
    refused, and it used to have written parts by then, which the other's landing put into that run: 113 of 300
    answers at the refused temperature, exported as the run's."""
    prompts = prompts_file(tmp_path / "p.jsonl", 300)
    db = tmp_path / "race.duckdb"
    with start_simulator(SimConfig(kind="vllm")) as sim:
        runs = [
            subprocess.Popen(
                [*CLI, "batch", str(prompts), "--server", sim.url, "--db", str(db), "--run", "X"]
                + ["--temperature", temperature, "--max-new-tokens", "64"],
                cwd=tmp_path,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for temperature in ("0.5", "0.9")
        ]
        done = [(p.wait(timeout=120), p.stderr.read() if p.stderr else "") for p in runs]
    assert sorted(code for code, _ in done) == [0, 1], done  # one run X, at one temperature: the other is refused
    [refused] = [err for code, err in done if code == 1]
    assert "choose another --run name" in refused and "Traceback" not in refused, refused
    with Store(db) as store:
        [(recorded,)] = store.query("SELECT json_extract_string(settings, '$.temperature') FROM runs WHERE run_id='X'")
        stored = store.query(
            "SELECT DISTINCT json_extract_string(settings, '$.temperature') FROM samples WHERE run_id = 'X'"
        )
    assert stored == [(recorded,)], (stored, recorded, done)


def test_a_store_held_as_the_run_begins_still_keeps_every_answer_and_records_the_run_at_the_next_landing(tmp_path):
    """The child says "held" (another program held the new store past the wait) and ends: that is no refusal. Parts
    are still written, and the first landing that gets the store records the run; `wait_until_recorded` raised
    StoreHeld, the writer dropped its group and the summary said the answers were kept."""
    db = tmp_path / "held.duckdb"
    child = LandingChild(StoreOpener(db))
    held = json.dumps({"error": "held", "message": f"the store {db} is in use by python (pid 1): gave up after 1s"})
    child._proc = subprocess.Popen(
        [sys.executable, "-c", f"import sys; sys.stdin.readline(); print({held!r}, flush=True)"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    child.begin_run(record("r1", {"temperature": 0.0}))
    child.wait_until_recorded()  # returns: the answers may be written
    assert child._proc is None
    assert child.ingest() == (0, 0)  # lands here, recording the run first
    child.close()
    with Store(db) as store:
        assert store.query("SELECT run_id FROM runs") == [("r1",)]
