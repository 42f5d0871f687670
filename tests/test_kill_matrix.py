"""The kill matrix: real signals at chosen events of `batch`, `export` and `merge`, then the run finished.

test_batch_sigkill.py kills one process with SIGKILL at request counts and checks the ids; this keeps the
rest of the kill matrix: SIGKILL, SIGTERM and SIGINT, to the process, to its process group
and to one `--workers 2` child, at events (the first probe, the first request in flight, a part renamed
into place, the first progress line), then a re-run to completion. The final store is compared id by
id with a clean reference run of the same prompts against the same deterministic simulator: 0 samples
lost, 0 duplicated, 0 corrupted (prompt ids, output ids and findings per sample id). An export killed at
any point leaves its output absent, the old file, or the whole new one; a merge killed at any point
leaves the source as it was and the target with nothing or everything of it, and a re-run lands all of
it once.
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from hostile_events import IN_CLOSE_WRITE, IN_CREATE, IN_MODIFY, IN_MOVED_TO, Proc, Watch, workers

from tokview.sim import SimConfig, start_simulator
from tokview.store import Store

ROOT = Path(__file__).resolve().parents[1]
TOKVIEW = [sys.executable, "-c", "import sys; from tokview.cli import main; sys.exit(main())"]
PROMPTS = 96
"""Enough for `--workers 2` to spawn its child on the first two starts (conftest sets TOKVIEW_MIN_PROMPTS_PER_WORKER
to 32 items a worker; by default one is spawned per 250)."""
ONE_WORKER_LIMIT = 40
SIM: dict[str, Any] = {"kind": "vllm", "seed": 7}


def batch_argv(url: str, prompts: Path, db: Path, *extra: str, concurrency: int = 2) -> list[str]:
    argv = [*TOKVIEW, "batch", str(prompts), "--server", url, "--db", str(db), "--concurrency", str(concurrency)]
    return [*argv, "--max-new-tokens", "16", *extra]


def content(db: Path) -> dict[str, tuple[Any, ...]]:
    """sample_id → what must survive every kill unchanged; asserts no prompt is stored twice."""
    with Store(db) as store:
        rows = store.query(
            "SELECT sample_id, prompt_id, gen_index, prompt_ids, output_ids, list_sort(codes) FROM samples"
        )
    per_prompt = [(r[1], r[2]) for r in rows]
    assert len(per_prompt) == len(set(per_prompt)), "a prompt stored twice under two sample ids"
    return {r[0]: tuple(r[1:]) for r in rows}


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("kill") / "prompts.jsonl"
    rows = [{"id": f"k{i:03d}", "messages": [{"role": "user", "content": f"Kill question {i}?"}]} for i in range(96)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def sim():
    """The simulator the killed runs talk to: 0.08 s an answer, so every kill point has room. At 0.03 s a loaded box
    (the whole suite on 2 cores) once let the third start land all but a few answers before its SIGINT came, and
    the fourth finish the rest before its first progress line: no work was left to resume."""
    with start_simulator(SimConfig(**SIM, quirks={"latency": 0.08})) as running:
        yield running


@pytest.fixture(scope="module")
def reference(prompts, tmp_path_factory) -> tuple[Path, dict[str, tuple[Any, ...]]]:
    """A clean run of every prompt against the same deterministic simulator (no latency: same answers)."""
    db = tmp_path_factory.mktemp("reference") / "ref.duckdb"
    with start_simulator(SimConfig(**SIM)) as clean:
        proc = Proc(batch_argv(clean.url, prompts, db, "--workers", "1", concurrency=8), ROOT)
        assert proc.finish() == 0, proc.stderr
    got = content(db)
    assert len(got) == PROMPTS
    return db, got


def assert_same_as_reference(db: Path, expected: dict[str, tuple[Any, ...]]) -> None:
    got = content(db)
    lost = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    corrupted = sorted(sid for sid in set(got) & set(expected) if got[sid] != expected[sid])
    assert (lost, extra, corrupted) == ([], [], []), f"lost {lost}, not in the reference {extra}, differ {corrupted}"
    with Store(db) as store:
        assert store.query("SELECT count(*) FROM failures")[0][0] == 0
    parts = Path(f"{db}.parts")
    left = sorted(p.name for p in parts.rglob("*") if p.is_file() and not p.name.endswith(".tmp"))
    assert left == [], f"parts left unlanded or set aside as damaged: {left}"


KILLED = {signal.SIGKILL: {-signal.SIGKILL}, signal.SIGTERM: {130}, signal.SIGINT: {130}}
"""Exit codes a batch may end with after each signal (README: 130 interrupted; it finishes what is in flight)."""
KILLED_AT_ONCE = {
    signal.SIGKILL: {-signal.SIGKILL},
    signal.SIGTERM: {-signal.SIGTERM, 130},
    signal.SIGINT: {-signal.SIGINT, 130},
}
"""`export` and `merge` may also just die on SIGTERM: their files are atomic either way. A SIGINT that arrives once
the command has finished, while the interpreter tears down (Python has put back the default action), ends the
process by the signal: 4 of 80 loops of the merge case, its output whole each time (its files are atomic)."""


def kill_at(proc: Proc, sig: int, target: str, what: str, ready) -> bool:
    """Send `sig` to `target` when `ready()`; False if the run ended before the event came."""
    if not proc.wait_for(what, ready):
        return False
    proc.send(sig, target)
    return True


def resume(sim, prompts: Path, db: Path, *extra: str) -> dict:
    """Run to completion (8 requests in flight: the concurrency is not part of a sample's identity)."""
    proc = Proc(batch_argv(sim.url, prompts, db, "--summary-json", *extra, concurrency=8), ROOT)
    code = proc.finish()
    assert code == 0, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["balanced"], summary
    assert summary["failed"] == 0, summary
    return summary


def test_one_process_killed_four_ways_then_resumed_loses_duplicates_and_corrupts_nothing(
    sim, prompts, reference, tmp_path
):
    """`--workers 1` on 40 prompts, four starts each killed at another event by another signal, then a resume."""
    db = tmp_path / "w1.duckdb"
    parts = Path(f"{db}.parts")
    expected = {sid: row for sid, row in reference[1].items() if int(row[0][1:]) < ONE_WORKER_LIMIT}
    requests = lambda: sum(sim.stats.requests.values())  # noqa: E731
    plan = [
        (signal.SIGKILL, "process", "the first probe", lambda s: requests() > s["requests"]),
        (signal.SIGTERM, "group", "the first request in flight", lambda s: sim.stats.generation > s["gen"] + 2),
        (signal.SIGINT, "group", "a part renamed into place", lambda s: part_landed(s["watch"])),
        (signal.SIGKILL, "group", "the first progress line", lambda s: bool(s["proc"].lines)),
    ]
    Store(db).close()  # a kill inside the store's creation is its own case (the expected failure at the end)
    killed = []
    for sig, target, what, ready in plan:
        with Watch(parts, IN_MOVED_TO) as watch:
            proc = Proc(batch_argv(sim.url, prompts, db, "--workers", "1", "--limit", str(ONE_WORKER_LIMIT)), ROOT)
            state = {"requests": requests(), "gen": sim.stats.generation, "watch": watch, "proc": proc}
            hit = kill_at(proc, sig, target, what, lambda: ready(state))
            code = proc.finish()
        assert hit, f"the run ended before {what}: {proc.stderr}"
        assert code in KILLED[sig], (sig, target, what, code, proc.stderr)
        assert "Traceback" not in proc.stderr, (sig, target, what, code, proc.stderr)
        killed.append(len(content(db)))
    assert 0 < killed[-1] < len(expected), killed  # the kills left work for the resume
    summary = resume(sim, prompts, db, "--workers", "1", "--limit", str(ONE_WORKER_LIMIT))
    assert summary["resumed"] == killed[-1], summary
    assert summary["ok"] == len(expected) - killed[-1], summary
    assert_same_as_reference(db, expected)


def part_landed(watch: Watch) -> bool:
    return any(n.endswith(".samples.jsonl") for n in watch.poll())


def test_workers_killed_one_child_then_the_parent_alone_then_resumed(sim, prompts, reference, tmp_path):
    """`--workers 2` on 96 prompts: SIGKILL a worker child, then SIGINT the parent alone (it stops the other
    workers and lands what they wrote); SIGKILL the parent alone (its child must die with it, quietly: PDEATHSIG);
    then a resume."""
    db = tmp_path / "w2.duckdb"
    argv = batch_argv(sim.url, prompts, db, "--workers", "2")

    def child_working(proc: Proc, since: int) -> bool:
        return bool(workers(proc.pid)) and sim.stats.generation > since + 6

    proc = Proc(argv, ROOT)
    since = sim.stats.generation
    assert kill_at(proc, signal.SIGKILL, "worker", "a worker taking work", lambda: child_working(proc, since))
    since = sim.stats.generation
    assert kill_at(proc, signal.SIGINT, "process", "the others working on", lambda: sim.stats.generation > since + 4)
    code = proc.finish()
    assert code == 130, (code, proc.stderr)
    assert "Traceback" not in proc.stderr, (code, proc.stderr)
    first = len(content(db))

    proc = Proc(argv, ROOT)
    since = sim.stats.generation
    assert kill_at(proc, signal.SIGKILL, "process", "a worker taking work", lambda: child_working(proc, since))
    assert proc.finish() == -signal.SIGKILL
    assert len(proc.tree) > 1  # finish() waits for the orphaned child
    assert "Traceback" not in proc.stderr, proc.stderr  # the child died quietly (its stderr is this pipe too)
    second = len(content(db))
    assert 0 < first <= second < PROMPTS, (first, second)
    summary = resume(sim, prompts, db, "--workers", "1")
    assert summary["resumed"] == second, summary
    assert summary["ok"] == PROMPTS - second, summary
    assert_same_as_reference(db, reference[1])


def export_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


EXPORT_KILLS = [
    (signal.SIGKILL, "its temp files made", IN_CREATE, lambda name: name.endswith(".partial")),
    (signal.SIGTERM, "a temp file written and closed", IN_CLOSE_WRITE, lambda name: name.endswith(".partial")),
    (signal.SIGINT, "a sidecar renamed into place", IN_MOVED_TO, lambda name: not name.startswith("out.jsonl")),
]


def test_a_killed_export_leaves_its_output_absent_old_or_whole(reference, tmp_path):
    db = tmp_path / "ref.duckdb"
    shutil.copy(reference[0], db)
    argv = [*TOKVIEW, "export", "--db", str(db), "--select", "all", "--out"]
    whole_dir = tmp_path / "whole"
    whole_dir.mkdir()
    done = Proc([*argv, str(whole_dir / "out.jsonl")], ROOT)
    assert done.finish() == 0, done.stderr
    whole = export_lines(whole_dir / "out.jsonl")
    assert len(whole) == PROMPTS
    for n, (sig, what, mask, matches) in enumerate(EXPORT_KILLS):
        folder = tmp_path / f"kill{n}"
        out = folder / "out.jsonl"
        with Watch(folder, mask) as watch:
            old = n > 0  # the later kills replace an existing file: it must stay whole too
            if old:
                out.write_text('{"old": true}\n')
            proc = Proc([*argv, str(out)], ROOT)
            kill_at(proc, sig, "process", what, lambda: any(matches(name) for name in watch.poll()))
            code = proc.finish()
        assert code in KILLED_AT_ONCE[sig] | {0}, (sig, code, proc.stderr)
        assert "Traceback" not in proc.stderr, (sig, code, proc.stderr)
        if out.exists():
            got = export_lines(out)
            assert got == whole or (old and got == [{"old": True}]), f"{what}: a partial export ({len(got)} rows)"
        else:
            assert not old, f"{what}: the existing output was removed"


def _checkpointing(names: list[str]) -> bool:
    """The store file written after its write-ahead log appeared: the merge's data going into it."""
    return any(n.endswith(".wal") for n in names) and names[-1] == "into.duckdb"


MERGE_KILLS = [
    (
        signal.SIGKILL,
        "the target's write-ahead log created",
        IN_CREATE,
        lambda names: names[-1:] == ["into.duckdb.wal"],
    ),
    (
        signal.SIGTERM,
        "the target's write-ahead log created",
        IN_CREATE,
        lambda names: names[-1:] == ["into.duckdb.wal"],
    ),
    (signal.SIGINT, "the write-ahead log closed", IN_CLOSE_WRITE, lambda names: any(n.endswith(".wal") for n in names)),
    (signal.SIGKILL, "the store file written after the log", IN_CREATE | IN_MODIFY, _checkpointing),
]
"""Into an existing (empty) store: a kill while a new store is being created is its own case below."""


def test_a_killed_merge_leaves_source_and_target_whole_and_a_rerun_lands_everything_once(reference, tmp_path):
    source = tmp_path / "shard" / "a.duckdb"
    source.parent.mkdir()
    shutil.copy(reference[0], source)
    into = tmp_path / "target" / "into.duckdb"
    argv = [*TOKVIEW, "merge", str(source), "--into", str(into)]
    for sig, what, mask, matches in MERGE_KILLS:
        if not into.exists():
            into.parent.mkdir(exist_ok=True)
            Store(into).close()
        with Watch(into.parent, mask) as watch:
            proc = Proc(argv, ROOT)
            kill_at(proc, sig, "process", what, lambda: matches(watch.poll()))
            code = proc.finish()
        assert code in KILLED_AT_ONCE[sig] | {0}, (sig, code, proc.stderr)
        assert "Traceback" not in proc.stderr, (sig, code, proc.stderr)
        assert content(source) == reference[1], f"{what}: the source changed"
        landed = content(into)
        assert len(landed) in (0, PROMPTS), f"{what}: a merge half landed ({len(landed)})"
        assert all(reference[1][sid] == row for sid, row in landed.items())
        if landed:
            shutil.rmtree(into.parent)  # start the next kill from an empty target again
    for _ in range(2):  # the re-run lands everything; a second adds nothing
        done = Proc(argv, ROOT)
        assert done.finish() == 0, done.stderr
        assert_same_as_reference(into, reference[1])
    assert content(source) == reference[1]


def subset_of_reference(db: Path, expected: dict[str, tuple[Any, ...]]) -> int:
    """What a killed run left is all true (nothing corrupt, nothing twice); returns how much."""
    got = content(db) if db.exists() else {}
    assert all(expected.get(sid) == row for sid, row in got.items())
    return len(got)


def test_ctrl_c_while_the_workers_start_ends_the_run_quietly(sim, prompts, reference, tmp_path):
    """Ctrl-C in a terminal reaches the whole group: here while the `--workers 2` child is still starting."""
    db = tmp_path / "start.duckdb"
    proc = Proc(batch_argv(sim.url, prompts, db, "--workers", "2"), ROOT)
    assert kill_at(proc, signal.SIGINT, "group", "a worker spawned", lambda: bool(workers(proc.pid)))
    code = proc.finish()
    assert code == 130, (code, proc.stderr)
    assert "Traceback" not in proc.stderr, (code, proc.stderr)
    subset_of_reference(db, reference[1])


def test_a_merge_killed_while_it_creates_its_target_leaves_a_store_the_rerun_completes(reference, tmp_path):
    """SIGKILL the moment the new target's write-ahead log appears (DuckDB's first write: the schema). A batch
    killed the same way meets the same refusal in some runs (its store is created beside other threads)."""
    into = tmp_path / "new" / "into.duckdb"
    argv = [*TOKVIEW, "merge", str(reference[0]), "--into", str(into)]
    with Watch(into.parent, IN_CREATE) as watch:
        proc = Proc(argv, ROOT)
        ready = lambda: any(n.endswith(".wal") for n in watch.poll())  # noqa: E731
        assert kill_at(proc, signal.SIGKILL, "process", "the new store's write-ahead log", ready)
        assert proc.finish() == -signal.SIGKILL
    rerun = Proc(argv, ROOT)
    assert rerun.finish() == 0, rerun.stderr
    assert_same_as_reference(into, reference[1])
