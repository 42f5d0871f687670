"""An interrupted `tokview score --rescore` goes on where it stopped: re-run as it was, it started over (every sample
again), and without `--rescore` it did nothing (the old scores count as this target's). Its summary names
`--rescore-before TIME` (its start), which scores again only the samples scored before it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from builders import kimi, profile

from tokview.batch import BatchConfig, run_batch
from tokview.batch.inputs import InputError
from tokview.batch.scoring import ScoreConfig, run_score
from tokview.sim import SimConfig, start_simulator
from tokview.store import Store

PROMPTS = Path(__file__).resolve().parents[1] / "sample_data" / "plain_prompts.jsonl"


def _scored_at(store: Store) -> dict[str, str]:
    scores = {r.sample_id: store.load_sample(r.sample_id).capture.target_score for r in store.samples_page()}
    return {sample_id: score["scored_at"] for sample_id, score in scores.items() if score is not None}


async def test_an_interrupted_rescore_goes_on_with_rescore_before_its_start(tmp_path) -> None:
    batch = BatchConfig(
        servers=[], prompts_path=PROMPTS, tokenizer=kimi(), model_profile=profile(), max_new_tokens=40, limit=6
    )
    with start_simulator(SimConfig(kind="vllm")) as sim, Store(tmp_path / "s.duckdb") as store:
        batch.servers = [sim.url]
        await run_batch(batch, store)
        assert (await run_score(ScoreConfig(servers=[sim.url]), store)).ok == 6
        time.sleep(1.1)  # scores are timed to the second
        cancel = asyncio.Event()

        def stop_after_two(progress) -> None:
            if progress.ok >= 2:
                cancel.set()

        config = ScoreConfig(servers=[sim.url], rescore=True, concurrency=1)
        first = await run_score(config, store, on_progress=stop_after_two, cancel=cancel)
        assert first.interrupted and 2 <= first.ok < 6
        since = first.rescoring_since
        assert f"re-run with --rescore-before {since} in place of --rescore" in first.render()
        again = await run_score(ScoreConfig(servers=[sim.url], rescore=True), store)  # what it said before
        assert again.ok == 6  # starts over: why it is not the way to go on
        time.sleep(1.1)
        cancel.clear()
        second = await run_score(
            ScoreConfig(servers=[sim.url], rescore=True, concurrency=1),
            store,
            on_progress=stop_after_two,
            cancel=cancel,
        )
        assert second.rescoring_since is not None
        rest = await run_score(ScoreConfig(servers=[sim.url], rescore_before=second.rescoring_since), store)
        assert (rest.ok, rest.skipped) == (6 - second.ok, second.ok)  # each sample scored again exactly once
        assert all(at >= second.rescoring_since for at in _scored_at(store).values())
        assert not rest.interrupted
        last = await run_score(ScoreConfig(servers=[sim.url], rescore_before=second.rescoring_since), store)
        assert (last.ok, last.skipped) == (0, 6)


@pytest.mark.parametrize(
    ("config", "said"),
    [
        (ScoreConfig(servers=["http://127.0.0.1:1"], rescore=True, rescore_before="2026-01-01T00:00:00Z"), "not both"),
        (ScoreConfig(servers=["http://127.0.0.1:1"], rescore_before="yesterday"), "YYYY-MM-DDTHH:MM:SSZ"),
    ],
)
def test_rescore_before_takes_a_score_time_alone(config, said) -> None:
    with pytest.raises(InputError, match=said):
        config.validate()
