"""`tokview score` stops after `--max-consecutive-failures` failed samples in a row, as batch does.

A user pass killed the target 2 s into a score: every sample left failed one by one after its retries (about two a
second: hours on a big store), exit 3. Now the run stops with the reason, exit 1, and what was scored is kept."""

from __future__ import annotations

import threading

from prompt_files import prompts_file

from tokview.batch import BatchConfig, run_batch
from tokview.batch.scoring import ScoreConfig, ScoreSummary, run_score
from tokview.sim import SimConfig, start_simulator
from tokview.sim.server import launch
from tokview.store import Store


async def test_a_target_that_dies_mid_score_stops_the_run_and_keeps_its_scores(tmp_path):
    with Store(tmp_path / "s.duckdb") as store:
        with start_simulator(SimConfig(kind="vllm")) as sim:
            made = BatchConfig(
                servers=[sim.url], prompts_path=prompts_file(tmp_path / "p.jsonl", 60), max_new_tokens=20
            )
            assert (await run_batch(made, store)).ok == 60
        target = launch(SimConfig(kind="vllm", latency_s=0.02))
        killed = threading.Event()

        def on_progress(progress) -> None:
            if progress.ok >= 8 and not killed.is_set():
                killed.set()
                threading.Thread(target=target.stop).start()  # the target dies (stop joins its thread: not here)

        config = ScoreConfig(servers=[target.url], concurrency=2, retries=0, max_consecutive_failures=5)
        try:
            summary = await run_score(config, store, on_progress=on_progress)
        finally:
            target.stop()
        scored = store.query("SELECT count(*) FROM samples WHERE target_score IS NOT NULL")[0][0]
    assert killed.is_set()
    assert summary.stopped is not None and summary.stopped.startswith("stopped after 5 consecutive failures"), summary
    assert summary.failed < 20 and summary.ok + summary.failed < 60  # the rest was never asked for
    assert scored == summary.ok and summary.exit_code == 1 and not summary.interrupted
    assert "stopped: stopped after 5 consecutive failures" in summary.render()
    assert "re-run the same command to continue" in summary.render()


def test_a_stop_is_told_from_an_interrupt_and_zero_never_stops():
    assert ScoreSummary(input=3, ok=1, failed=2, stopped="stopped after 2 …").exit_code == 1
    assert ScoreSummary(input=3, ok=1, failed=2).exit_code == 3
    ScoreConfig(servers=["http://127.0.0.1:1"], max_consecutive_failures=0).validate()
