"""A real full disk: a 20 MB tmpfs holds the store while a batch fills it (the disk-full matrix).

The batch must stop by itself with the documented exit code (1: "a run that stopped early (disk full …)")
and a one-line reason, keep what it generated, and, once space is freed, a re-run must complete with
nothing lost, duplicated or corrupted compared with a clean run on a roomy disk. Readers (`stats`) work
on the full disk too. Needs `mount -t tmpfs` (root, or a container allowed to mount); skipped otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tokview.sim import SimConfig, start_simulator
from tokview.store import Store

ROOT = Path(__file__).resolve().parents[1]
TOKVIEW = [sys.executable, "-c", "import sys; from tokview.cli import main; sys.exit(main())"]
PROMPTS = 60
FREE_AFTER_BALLAST = 700_000
"""Bytes left free once the store exists: room for some samples, not for all of them."""


def batch(url: str, prompts: Path, db: Path) -> subprocess.CompletedProcess:
    argv = [*TOKVIEW, "batch", str(prompts), "--server", url, "--db", str(db), "--workers", "1"]
    argv += ["--concurrency", "4", "--max-new-tokens", "96", "--summary-json"]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)


def content(db: Path) -> dict[str, tuple[Any, ...]]:
    with Store(db) as store:
        rows = store.query("SELECT sample_id, prompt_id, prompt_ids, output_ids, list_sort(codes) FROM samples")
    assert len({r[1] for r in rows}) == len(rows), "a prompt stored twice"
    return {r[0]: tuple(r[1:]) for r in rows}


def fill(disk: Path, leave: int) -> Path:
    """A ballast file taking all but `leave` bytes of the disk."""
    ballast = disk / "ballast"
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    with open(ballast, "wb") as f:
        f.truncate(0)
        chunk = b"\0" * (1 << 20)
        left = free - leave
        while left > 0:
            left -= f.write(chunk[: min(len(chunk), left)])
    return ballast


def test_a_batch_on_a_full_disk_stops_with_exit_1_and_a_rerun_after_freeing_space_loses_nothing(small_disk, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    rows = [
        {"id": f"d{i:03d}", "messages": [{"role": "user", "content": f"Fill question {i}?"}]} for i in range(PROMPTS)
    ]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    db = small_disk / "full.duckdb"
    # 0.1 s an answer: the run spans several landings (the first a second in), so the disk fills part way
    # through, with samples landed before it; a run that ends in one landing keeps all or nothing
    with start_simulator(SimConfig(kind="vllm", seed=3, latency_s=0.1)) as sim:
        reference = batch(sim.url, prompts, tmp_path / "ref.duckdb")
        assert reference.returncode == 0, reference.stderr
        expected = content(tmp_path / "ref.duckdb")
        Store(db).close()  # the store exists; the samples will not all fit
        ballast = fill(small_disk, FREE_AFTER_BALLAST)

        stopped = batch(sim.url, prompts, db)
        assert stopped.returncode == 1, (stopped.returncode, stopped.stderr)
        assert "Traceback" not in stopped.stderr, stopped.stderr
        assert "internal error" not in stopped.stderr, stopped.stderr
        assert "no space left on device" in stopped.stderr, stopped.stderr
        summary = json.loads(stopped.stdout)
        assert summary["stopped"], summary
        assert summary["exit_code"] == 1, summary
        reading = subprocess.run(
            [*TOKVIEW, "stats", "--db", str(db)], cwd=ROOT, capture_output=True, text=True, timeout=60
        )
        assert reading.returncode == 0, reading.stderr  # the landed samples can still be read on a full disk

        ballast.unlink()
        done = batch(sim.url, prompts, db)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["balanced"], summary
    assert summary["failed"] == 0, summary
    assert 0 < summary["resumed"] < PROMPTS, summary  # the full disk stopped it part way, and kept that part
    got = content(db)
    lost = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    corrupted = sorted(sid for sid in set(got) & set(expected) if got[sid] != expected[sid])
    assert (lost, extra, corrupted) == ([], [], []), f"lost {lost}, not in the reference {extra}, differ {corrupted}"
    parts = Path(f"{db}.parts")
    left = sorted(p.name for p in parts.rglob("*") if p.is_file() and not p.name.endswith(".tmp"))
    assert left == [], f"parts left unlanded or set aside as damaged: {left}"


def start_on_a_full_disk(small_disk: Path, tmp_path: Path, url: str) -> tuple[Path, Path, Path]:
    """A batch whose new store cannot even be created: the disk is full before it starts."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"e{i}", "prompt": f"Empty disk {i}?"}) + "\n" for i in range(4)))
    ballast = fill(small_disk, 0)
    db = small_disk / "new.duckdb"
    stopped = batch(url, prompts, db)
    assert stopped.returncode == 1, (stopped.returncode, stopped.stderr)
    assert "Traceback" not in stopped.stderr, stopped.stderr
    assert "internal error" not in stopped.stderr, stopped.stderr
    assert "no space left on device" in stopped.stderr.lower(), stopped.stderr
    assert stopped.stderr.count("\n") == 1, stopped.stderr
    return prompts, db, ballast


def test_a_batch_whose_store_cannot_be_created_on_a_full_disk_says_so_in_one_line(small_disk, tmp_path):
    with _sim() as sim:
        start_on_a_full_disk(small_disk, tmp_path, sim.url)


def test_after_a_full_disk_kept_the_store_from_being_created_a_rerun_creates_it(small_disk, tmp_path):
    with _sim() as sim:
        prompts, db, ballast = start_on_a_full_disk(small_disk, tmp_path, sim.url)
        ballast.unlink()
        done = batch(sim.url, prompts, db)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ok"] == 4


def _sim():
    return start_simulator(SimConfig(kind="vllm", seed=3))


def test_an_export_onto_a_full_disk_fails_in_one_line_and_leaves_the_old_file_alone(small_disk, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"x{i}", "prompt": f"Export {i}?"}) + "\n" for i in range(8)))
    db = tmp_path / "roomy.duckdb"
    with _sim() as sim:
        assert batch(sim.url, prompts, db).returncode == 0
    out = small_disk / "out.jsonl"
    out.write_text('{"old": true}\n')
    fill(small_disk, 8_000)  # room for the sidecars, not for the data
    argv = [*TOKVIEW, "export", "--db", str(db), "--select", "all", "--out", str(out)]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "internal error" not in done.stderr, done.stderr
    assert "no space left on device" in done.stderr.lower(), done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert out.read_text() == '{"old": true}\n'
    assert sorted(p.name for p in small_disk.iterdir()) == ["ballast", "out.jsonl"]  # no temp file left behind


def test_a_merge_into_a_store_on_a_full_disk_lands_nothing_then_everything_once_after_freeing(small_disk, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"m{i}", "prompt": f"Merge {i}?"}) + "\n" for i in range(12)))
    source = tmp_path / "shard.duckdb"
    with _sim() as sim:
        assert batch(sim.url, prompts, source).returncode == 0
    expected = content(source)
    into = small_disk / "into.duckdb"
    Store(into).close()
    ballast = fill(small_disk, 4_096)
    argv = [*TOKVIEW, "merge", str(source), "--into", str(into)]
    full = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert full.returncode == 1, full.stderr
    assert "Traceback" not in full.stderr, full.stderr
    assert "internal error" not in full.stderr, full.stderr
    assert "no space left on device" in full.stderr.lower(), full.stderr
    assert full.stderr.count("\n") == 1, full.stderr
    assert content(source) == expected
    ballast.unlink()
    assert content(into) == {}  # all or nothing: the merge is one transaction
    for _ in range(2):  # after freeing space it lands everything; again, nothing more
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert content(into) == expected


def test_a_file_size_limit_stops_a_batch_as_a_full_disk_does_and_a_rerun_lands_everything(tmp_path):
    """`ulimit -f` (EFBIG, "File too large") stopped a batch with DuckDB's raw error and no summary. It is a disk
    with no more room for that file: the run stops early (exit 1) with its summary, and the next run completes it.
    Needs no mount: the limit is the child's own."""
    import resource

    prompts = tmp_path / "prompts.jsonl"
    rows = [{"id": f"f{i:03d}", "prompt": f"Limit question {i}?"} for i in range(300)]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    db = tmp_path / "limited.duckdb"

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (1_000_000, 1_000_000))

    argv = [*TOKVIEW, "batch", str(prompts), "--db", str(db), "--max-new-tokens", "2000", "--summary-json"]
    argv += ["--workers", "1"]
    # 1 MB: above the new store's size, below one part of 64 answers (~1.1 MB), so the limit is met during the run
    # whatever the timing. At 4 MB the run sometimes fit whole: how much the WAL and the store file hold when depends
    # on when landings and checkpoints fall.
    with start_simulator(SimConfig(kind="vllm", output_tokens=2000)) as sim:
        argv += ["--server", sim.url]
        stopped = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120, preexec_fn=limited)
        assert stopped.returncode == 1, (stopped.returncode, stopped.stderr)
        assert "Traceback" not in stopped.stderr and "internal error" not in stopped.stderr, stopped.stderr
        assert "file too large (a file size limit, `ulimit -f`)" in stopped.stderr, stopped.stderr
        assert json.loads(stopped.stdout)["stopped"]
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["balanced"] and summary["failed"] == 0, summary
    with Store(db) as store:
        assert store.query("SELECT count(*) FROM samples") == [(300,)]


def test_duckdbs_own_file_too_large_error_counts_as_no_room(tmp_path):
    """The batch above meets the limit in its parts; this one meets it inside DuckDB itself, whose error is text,
    not an OSError, so the store must read it from the message to stop as on a full disk."""
    script = (
        "import resource, sys, duckdb\n"
        "from tokview.store.errors import is_disk_full, no_room_said\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (300_000, 300_000))\n"
        "db = duckdb.connect(sys.argv[1])\n"
        "try:\n"
        "    db.execute('CREATE TABLE t AS SELECT random()::VARCHAR || i AS s FROM range(2000000) r(i)')\n"
        "    db.execute('CHECKPOINT')\n"
        "except Exception as exc:\n"
        "    print(is_disk_full(exc), no_room_said(exc), sep='|')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "t.duckdb")], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "True|file too large (a file size limit, `ulimit -f`)", (done.stdout, done.stderr)
