"""Two batches on the same prompts and ten readers on one store at once (the concurrency matrix).

README: "two batches on the same prompts store every sample once" and stats, show and export all work
on a store a batch is filling. Here 10 reader processes (`stats`, `show`, `export` in a loop, see
tests/hostile_readers.py) run for the whole time two batches fill the store: every sample must be
stored exactly once, equal to a clean run of the same prompts, and no reader call may fail.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from flag_defaults import unless_given
from hostile_events import Proc

from tokview.sim import SimConfig, start_simulator
from tokview.store import Store

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
TOKVIEW = [sys.executable, "-c", "import sys; from tokview.cli import main; sys.exit(main())"]
PROMPTS = 32
SEEDED = 6
"""Samples stored before the readers start, so `show` has ids to read from the first call."""
READERS = {"stats": 4, "show": 3, "export": 3}


def batch_argv(url: str, prompts: Path, db: Path, *extra: str) -> list[str]:
    argv = [*TOKVIEW, "batch", str(prompts), "--server", url, "--db", str(db), "--workers", "1"]
    return [*argv, *unless_given(["--concurrency", "2", "--max-new-tokens", "16"], extra), "--summary-json", *extra]


def content(db: Path) -> dict[str, tuple[Any, ...]]:
    with Store(db) as store:
        rows = store.query("SELECT sample_id, prompt_id, prompt_ids, output_ids, list_sort(codes) FROM samples")
    assert len({r[1] for r in rows}) == len(rows), "a prompt stored twice"
    return {r[0]: tuple(r[1:]) for r in rows}


def test_two_batches_and_ten_readers_store_every_sample_once_and_no_reader_fails(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    rows = [
        {"id": f"c{i:03d}", "messages": [{"role": "user", "content": f"Shared question {i}?"}]} for i in range(PROMPTS)
    ]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    db, stop = tmp_path / "shared.duckdb", tmp_path / "stop"
    with start_simulator(SimConfig(kind="vllm", seed=5, quirks={"latency": 0.03})) as sim:
        seeded = Proc(batch_argv(sim.url, prompts, db, "--limit", str(SEEDED)), ROOT)
        assert seeded.finish() == 0, seeded.stderr
        ids = sorted(content(db))
        readers = []
        for kind, count in READERS.items():
            for n in range(count):
                out = tmp_path / f"{kind}{n}.jsonl"
                argv = [sys.executable, str(TESTS / "hostile_readers.py"), kind, str(db), str(stop), str(out), *ids]
                readers.append(subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        for reader in readers:  # every reader has read once before the batches start
            assert reader.stdout.readline().strip() == b"ready", reader.stderr.read().decode()
        batches = [Proc(batch_argv(sim.url, prompts, db), ROOT) for _ in range(2)]
        codes = [b.finish(timeout=120) for b in batches]
        stop.touch()
        reports = []
        for reader in readers:
            out, err = reader.communicate(timeout=120)
            assert reader.returncode == 0, err.decode()
            reports.append(json.loads(out.decode().splitlines()[-1]))
    for b, code in zip(batches, codes):
        assert code == 0, b.stderr
        assert "Traceback" not in b.stderr, b.stderr
        summary = json.loads(b.stdout)
        assert summary["balanced"], summary
        assert summary["failed"] == 0, summary
        assert summary["ok"] + summary["resumed"] + summary["skipped"] >= PROMPTS - SEEDED, summary
    assert [r for r in reports if r["failures"]] == []
    assert all(r["calls"] >= 2 for r in reports), [(r["kind"], r["calls"]) for r in reports]
    got = content(db)
    assert len(got) == PROMPTS
    with start_simulator(SimConfig(kind="vllm", seed=5)) as clean:
        reference = Proc(batch_argv(clean.url, prompts, tmp_path / "ref.duckdb", "--concurrency", "8"), ROOT)
        assert reference.finish() == 0, reference.stderr
    expected = content(tmp_path / "ref.duckdb")
    corrupted = sorted(sid for sid in expected if got.get(sid) != expected[sid])
    assert sorted(got) == sorted(expected), corrupted
    assert corrupted == [], corrupted
