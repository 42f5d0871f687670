"""A batch's summary names the error findings that flagged its samples (and `--summary-json` counts them by code), as
`stats` does from the store: a batch whose `--tokenizer` was not the server's model's flagged every sample and said
only "flagged (error findings) 2", exit 0, leaving the user to find out why."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tokview.batch import BatchSummary
from tokview.cli import main
from tokview.sim import SimConfig, start_simulator
from tokview.store import Store


@pytest.fixture(scope="module")
def sim() -> Iterator[Any]:
    with start_simulator(SimConfig(kind="vllm")) as running:  # the Kimi layout: ids past Qwen3's vocabulary
        yield running


@pytest.mark.parametrize("workers", ["1", "2"])
def test_the_summary_names_the_codes_that_flagged_samples(sim, qwen_tok_dir, tmp_path, capsys, workers):
    prompts = tmp_path / "p.jsonl"
    rows = [{"id": f"p{k}", "messages": [{"role": "user", "content": f"question {k}"}]} for k in range(4)]
    prompts.write_text("".join(json.dumps(row) + "\n" for row in rows))
    db = tmp_path / "s.duckdb"
    argv = ["batch", str(prompts), "--server", sim.url, "--db", str(db), "--tokenizer", str(qwen_tok_dir)]
    # --any-vocabulary: the run would stop at its first answers otherwise (test_batch_vocabulary_guard.py)
    assert main([*argv, "--workers", workers, "--summary-json", "--any-vocabulary"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    with Store(db) as store:
        stored = store.query(
            "SELECT code, count(DISTINCT sample_id) FROM findings WHERE severity = 'error' GROUP BY code"
        )
    assert summary["flagged"] == 4
    assert summary["flagged_by_code"] == dict(stored)
    assert summary["flagged_by_code"]["unknown_token_id"] == 4
    assert summary["failures_by_reason"] == {}  # the codes are not failures
    assert "flagged (error findings) 4 (" in captured.err and "unknown_token_id 4" in captured.err
    assert "is --tokenizer the served model's?" in captured.err


def test_a_clean_run_names_no_codes_and_many_codes_are_cut_short():
    clean = BatchSummary(run_id="r", input=1, ok=1)
    assert "flagged (error findings) 0, truncated 0" in clean.render()
    codes = {f"code_{k}": k + 1 for k in range(6)}
    many = BatchSummary(run_id="r", input=6, ok=6, flagged=6, flagged_by_code=codes).render()
    assert "(code_5 6, code_4 5, code_3 4, code_2 3, 2 more codes)" in many
    assert "is --tokenizer" not in many
    # every sample invalid: exit 0, and each export after it said "no samples match" with nothing before to say why
    assert "note: all 6 sample(s) stored have an error finding: an export's default selection" in many
    some = BatchSummary(run_id="r", input=6, ok=6, flagged=5, flagged_by_code=codes).render()
    assert "note: all" not in some and "note: all" not in clean.render()
