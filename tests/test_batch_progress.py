"""Progress on stderr: a redrawn line on a terminal, plain periodic lines in logs; the summary's arithmetic."""

from __future__ import annotations

import io

from tokview.batch import BatchProgress, BatchSummary
from tokview.batch.progress import ProgressPrinter, progress_line


def test_plain_lines_are_throttled_and_final_line_printed_once():
    out = io.StringIO()
    printer = ProgressPrinter(out, tty=False, interval=3600)
    printer(BatchProgress(total=4, skipped=1))  # nothing generated yet: silent
    printer(BatchProgress(total=4, ok=1, skipped=1, elapsed_s=1.0))
    printer(BatchProgress(total=4, ok=2, skipped=1, elapsed_s=2.0))  # within the interval: silent
    printer(BatchProgress(total=4, ok=2, failed=1, skipped=1, flagged=1, truncated=1, output_tokens=300, elapsed_s=3.0))
    printer(BatchProgress(total=4, ok=2, failed=1, skipped=1, elapsed_s=3.0))
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert "\r" not in out.getvalue()
    assert lines[1].startswith("4/4 100.0% | ok 2 failed 1 skipped 1 flagged 1 truncated 1 | 1.0 req/s 100 tok/s")


def test_tty_redraws_one_line():
    out = io.StringIO()
    printer = ProgressPrinter(out, tty=True, interval=0)
    printer(BatchProgress(total=10, ok=1, elapsed_s=1.0))
    printer(BatchProgress(total=10, ok=2, elapsed_s=2.0))
    printer.finish()
    text = out.getvalue()
    assert text.count("\r") == 2
    assert text.count("\x1b[K") == 2
    assert text.endswith("\n")
    assert text.count("\n") == 1


def test_eta_and_summary_balance():
    p = BatchProgress(total=100, ok=10, failed=0, skipped=50, elapsed_s=10.0)
    assert p.req_per_s == 1.0
    assert p.eta_s == 40.0
    assert "ETA 00:40" in progress_line(p)
    s = BatchSummary(run_id="r", input=10, ok=6, failed=1, skipped=2, abandoned=1, interrupted=True)
    assert s.balanced
    assert s.exit_code == 130
    assert "(balanced)" in s.render()
    s = BatchSummary(run_id="r", input=10, ok=6, failed=1, skipped=2)
    assert not s.balanced
    assert "DOES NOT BALANCE" in s.render()
    assert s.exit_code == 3
    assert BatchSummary(run_id="r", input=1, ok=1).exit_code == 0


def test_score_says_off_policy_not_the_batchs_flagged_and_truncated():
    """`tokview score` counts the samples it finds off_policy in `flagged` and truncates nothing: the batch's labels
    said "flagged 2 truncated 0" of a store holding truncated samples."""
    import io

    from tokview.batch.config import BatchProgress
    from tokview.batch.progress import ProgressPrinter, score_progress_line

    out = io.StringIO()
    printer = ProgressPrinter(out, tty=False, line=score_progress_line)
    printer(BatchProgress(total=4, ok=4, flagged=2, output_tokens=80, elapsed_s=2.0))
    line = out.getvalue()
    assert line.startswith("4/4 100.0% | ok 4 failed 0 skipped 0 off_policy 2 | 2.0 req/s 40 tok/s"), line
    assert "flagged" not in line and "truncated" not in line


def test_scores_failures_are_grouped_by_class_as_a_batchs_are():
    """One cause whose message carries each sample's length was one line per length: ten lines adding up to a
    fraction of the failures, and no word of the rest."""
    from tokview.batch.scoring import ScoreSummary

    reasons = {
        f"POST /v1/completions (score): prompt + output are {n} ids, over the server's context of 150": 9
        for n in range(151, 176)
    }
    summary = ScoreSummary(input=300, ok=75, failed=225, failures_by_reason=reasons)
    failed = [line for line in summary.render().splitlines() if line.startswith("  failed x")]
    assert len(failed) == 1 and failed[0].startswith("  failed x225: POST /v1/completions (e.g. POST /v1/completions")


async def test_requests_waiting_on_their_retry_are_said_on_the_line_before_anything_lands(tmp_path):
    """Every request answered 503 at first: the line stood at 0/3 (the CLI printed nothing at all) while each waited
    on its backoff. It now says how many were sent again and why, through `tokview batch` and the app's panel alike."""
    import asyncio

    from tokview.batch import BatchConfig, run_batch
    from tokview.sim import SimConfig, start_simulator
    from tokview.store import Store

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(f'{{"id": "p{i}", "prompt": "Say {i}."}}\n' for i in range(3)))
    seen: list[BatchProgress] = []
    out = io.StringIO()
    printer = ProgressPrinter(out, tty=False, interval=0)

    def on_progress(p: BatchProgress) -> None:
        seen.append(p)
        printer(p)

    # The first 9 generation requests answer 503: the probe's 1-token generations take 6 (with their own retries),
    # so each of the run's 3 requests is answered 503 once and sent again.
    with start_simulator(SimConfig(kind="vllm", quirks={"http-503": 9})) as sim, Store(tmp_path / "s.duckdb") as store:
        config = BatchConfig(servers=[sim.url], prompts_path=prompts, max_new_tokens=16, workers=1)
        summary = await asyncio.wait_for(run_batch(config, store, on_progress=on_progress), 60)
    assert summary.ok == 3 and summary.failed == 0, summary.render()
    waiting = [p for p in seen if p.retried and not p.ok]
    assert waiting, "no progress said the retries before the first answer"
    line = progress_line(waiting[-1])
    assert line.startswith("0/3 ") and " | retried " in line and "503" in line, line
    first_printed = out.getvalue().splitlines()[0]
    assert first_printed.startswith("0/3 ") and "retried" in first_printed, out.getvalue()
