"""Scores made on a copy come back with `tokview merge`: a team copies its store to the box that serves the target
model, runs `tokview score` there, and merges the copy back. Before, a sample the target already held kept its own
columns, so the merge brought no score (and `export --max-nll` left every sample out as not scored)."""

from __future__ import annotations

import shutil
from pathlib import Path

from test_merge_review import merge

from tokview.batch.scoring import ScoreConfig, run_score
from tokview.sim import SimConfig, start_simulator
from tokview.store import Store
from tokview.store.token_data import TARGET_COLUMNS

SCORED = f"SELECT sample_id, {', '.join(TARGET_COLUMNS)}, codes FROM samples ORDER BY sample_id"
OFF_POLICY = "SELECT sample_id, severity, detail, positions FROM findings WHERE code = 'off_policy' ORDER BY 1"


def score(path, sim_url: str, **settings) -> None:
    import asyncio

    with Store(path) as store:
        summary = asyncio.run(run_score(ScoreConfig(servers=[sim_url], retries=0, **settings), store))
        assert summary.failed == 0, summary


def _store_and_copy(tmp_path, put, make_capture, n: int) -> tuple[Path, Path]:
    """A store of `n` samples and a copy of it (the copy goes to the box that serves the target model)."""
    original, copy = tmp_path / "orig.duckdb", tmp_path / "copy.duckdb"
    with Store(original) as store:
        for i in range(n):
            put(store, f"s{i}", make_capture(question=f"question {i}"))
    shutil.copy(original, copy)
    return original, copy


def test_scores_made_on_a_copy_come_back_with_their_off_policy_findings(tmp_path, put, make_capture, capsys):
    original, copy = _store_and_copy(tmp_path, put, make_capture, 4)
    with start_simulator(SimConfig(kind="vllm")) as sim:
        score(copy, sim.url, off_policy_nll=1e-9)  # every sample off policy: the finding must come across too
    with Store(copy) as store:
        wanted, flagged = store.query(SCORED), store.query(OFF_POLICY)
    assert flagged and all(row[5] is not None for row in wanted)  # the copy holds a score of every sample

    said = merge(copy, original, capsys)
    assert "merged the target scores of 4 samples already in" in said
    with Store(original) as store:
        assert store.query(SCORED) == wanted
        assert store.query(OFF_POLICY) == flagged
        sample = store.load_sample(wanted[0][0])
        assert sample.capture.target_logprobs == list(wanted[0][1])

    assert "target scores" not in merge(copy, original, capsys)  # merged again: nothing more to take
    with Store(original) as store:
        assert store.query(OFF_POLICY) == flagged


def test_a_sample_scored_in_both_keeps_the_targets_score_and_the_merge_says_so(tmp_path, put, make_capture, capsys):
    original, copy = _store_and_copy(tmp_path, put, make_capture, 3)
    with start_simulator(SimConfig(kind="vllm")) as sim:
        score(copy, sim.url, top_k=2)
        score(original, sim.url, limit=1)  # the target scored one sample itself, otherwise (no top-k)
    with Store(original) as store:
        own = store.query(SCORED)
    scored_here = [row for row in own if row[4] is not None]
    assert len(scored_here) == 1

    said = merge(copy, original, capsys)
    assert "merged the target scores of 2 samples already in" in said
    assert "note: 1 samples already in" in said and "the scores here were kept" in said
    with Store(original) as store, Store(copy) as source:
        after = {row[0]: row for row in store.query(SCORED)}
        theirs = {row[0]: row for row in source.query(SCORED)}
    assert after[scored_here[0][0]] == scored_here[0]
    assert {sid: row for sid, row in after.items() if sid != scored_here[0][0]} == {
        sid: row for sid, row in theirs.items() if sid != scored_here[0][0]
    }
