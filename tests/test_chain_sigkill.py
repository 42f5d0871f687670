"""SIGKILL a chained `tokview batch` mid-run and resume: chains are written whole, so every stored chain is its
turns 0..k in order, each turn's parent is the stored turn before it, and nothing is stored twice."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from tokview.sim import SimConfig, start_simulator
from tokview.store import Store

ROOT = Path(__file__).resolve().parents[1]
TOKVIEW = [sys.executable, "-c", "import sys; from tokview.cli import main; sys.exit(main())"]


def _rows() -> list[dict]:
    rows = []
    for i in range(12):
        messages = [{"role": "user", "content": f"Question {i}?"}]
        for t in range(2):
            messages += [{"role": "assistant", "content": f"A{t}."}, {"role": "user", "content": f"More {t}?"}]
        rows.append({"id": f"conv{i}", "messages": messages})
    return rows


def test_a_killed_chained_batch_resumes_to_whole_chains(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    db = tmp_path / "kill.duckdb"
    with start_simulator(SimConfig(kind="vllm", quirks={"latency": 0.05})) as sim:
        args = [*TOKVIEW, "batch", str(prompts), "--server", sim.url, "--db", str(db), "--workers", "1"]
        args += ["--concurrency", "3", "--temperature", "0"]
        proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while sim.stats.generation < 14 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.005)
        proc.kill()
        proc.wait(timeout=30)
        done = subprocess.run([*args, "--summary-json"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["balanced"]
    assert summary["input"] == 36
    with Store(db) as store:
        rows = store.query("SELECT sample_id, prompt_id, turn, settings FROM samples ORDER BY prompt_id, turn")
    assert len({r[0] for r in rows}) == len(rows) == summary["ok"] + summary["resumed"]
    by_conversation: dict[str, list] = {}
    for sample_id, prompt_id, turn, settings in rows:
        by_conversation.setdefault(prompt_id, []).append((sample_id, turn, json.loads(settings)["chain"]))
    assert len(by_conversation) == 12
    for turns in by_conversation.values():
        assert [t for _, t, _ in turns] == list(range(len(turns))), "a chain is its first turns, in order"
        parents = [chain["parent"] for _, _, chain in turns]
        assert parents == [None] + [sample_id for sample_id, _, _ in turns[:-1]]
