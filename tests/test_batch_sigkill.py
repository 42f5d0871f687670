"""SIGKILL a `tokview batch` process at several points, resume, and check nothing is lost or doubled."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from builders import kimi, profile

from tokview.batch import BatchConfig, plan, read_prompts
from tokview.export import export
from tokview.sim import SimConfig, start_simulator
from tokview.store import Store

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ROOT / "sample_data" / "multiturn.jsonl"
EXTRA = ROOT / "sample_data" / "openai_messages.jsonl"
TOKVIEW = [sys.executable, "-c", "import sys; from tokview.cli import main; sys.exit(main())"]


def _batch(url: str, prompts: Path, db: Path, *extra: str) -> list[str]:
    return [
        *TOKVIEW,
        "batch",
        str(prompts),
        "--server",
        url,
        "--db",
        str(db),
        "--concurrency",
        "3",
        "--max-new-tokens",
        "120",
        "--history",  # each turn its own slot (chains are killed and resumed in test_chain_sigkill.py)
        "file",
        *extra,
    ]


def test_sigkill_at_several_points_then_resume(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(PROMPTS.read_text() + EXTRA.read_text())
    rows, _ = read_prompts(prompts)
    config = BatchConfig(servers=[], max_new_tokens=120, history="file")
    identity = {"model": "tokview-sim", "tokenizer": kimi().vocab_fingerprint(), "profile": profile().name}
    items, _ = plan(rows, config, config.sample_settings(identity))
    expected = {i.sample_id for i in items}
    db = tmp_path / "kill.duckdb"
    with start_simulator(SimConfig(kind="vllm", quirks={"latency": 0.1})) as sim:
        kills = 0
        for served in (0, 4, 9, 15):  # generation requests answered before the kill
            start = sim.stats.generation
            proc = subprocess.Popen(
                _batch(sim.url, prompts, db), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
            deadline = time.monotonic() + 60
            if served == 0:
                time.sleep(0.3)  # mid start-up: the tokenizer is loading, the store may be opening
            while sim.stats.generation < start + served and time.monotonic() < deadline:
                assert proc.poll() is None, proc.stderr.read().decode()
                time.sleep(0.01)
            if proc.poll() is None:
                proc.kill()
                kills += 1
            proc.wait(timeout=30)
        assert kills == 4
        with Store(db) as store:
            partial = store.count_samples()
        assert 0 < partial < len(expected)
        done = subprocess.run(
            _batch(sim.url, prompts, db, "--summary-json"), cwd=ROOT, capture_output=True, text=True, timeout=120
        )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["balanced"]
    assert summary["input"] == len(expected)
    assert summary["resumed"] == partial
    assert summary["ok"] == len(expected) - partial
    with Store(db) as store:
        ids = [r[0] for r in store.query("SELECT sample_id FROM samples")]
        assert len(ids) == len(set(ids)) == len(expected)
        assert set(ids) == expected
        assert store.query("SELECT count(*) FROM findings f ANTI JOIN samples s USING (sample_id)")[0][0] == 0
        out = tmp_path / "out.jsonl"
        result = export(store, "speculators", out, select="all", tokenizer=kimi(), profile=profile())
        assert result.exported == len(expected)
        rows_out = [json.loads(line) for line in out.read_text().splitlines()]
        assert len({r["id"] for r in rows_out}) == len(expected)
        for row in rows_out:
            cap = store.load_sample(row["metadata"]["tokview_sample_id"]).capture
            assert (
                row["input_ids"]
                == cap.raw_response["choices"][0]["prompt_token_ids"] + cap.raw_response["choices"][0]["token_ids"]
            )
