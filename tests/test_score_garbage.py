"""`tokview score` against a server whose logprobs are garbage: each such sample is a failure, never a stored score,
and what was scored is never lost to one bad answer (tests/test_loop_sim.py holds the healthy runs)."""

from __future__ import annotations

from typing import Any

import pytest
from builders import kimi, make_capture, profile

from tokview.batch.scoring import ScoreConfig, run_score
from tokview.core.analysis import analyze
from tokview.store import Store

VLLM_INFO = {"/version": {"version": "0.32.0"}, "/v1/models": {"data": [{"id": "m", "max_model_len": 4096}]}}


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ({"rank": 1}, "gives the token no logprob"),
        ({"logprob": None, "rank": 1}, "gives the token no logprob"),
        ({"logprob": 5.0, "rank": 1}, "above 0"),
    ],
    ids=["no logprob", "null logprob", "positive"],
)
async def test_an_answer_without_usable_logprobs_is_a_failure_never_a_score(tmp_path, json_server, entry, why):
    capture = make_capture()
    ids = [*capture.prompt_ids, *capture.output_ids]

    def completions(path: str, headers: dict[str, str]) -> tuple[int, Any]:
        logprobs = [None] + [{str(i): dict(entry)} for i in ids[1:]]
        return 200, {"choices": [{"text": "", "prompt_logprobs": logprobs, "finish_reason": "length"}]}

    url, _ = json_server({**VLLM_INFO, "/v1/completions": completions})
    with Store(tmp_path / "s.duckdb") as store:
        store.put_sample("a@x_gen0", "a", "imported", capture, analyze(capture, profile(), kimi()))
        summary = await run_score(ScoreConfig(servers=[url], retries=0), store)
        assert (summary.ok, summary.failed) == (0, 1), summary
        assert any(why in reason for reason in summary.failures_by_reason), summary.failures_by_reason
        assert store.load_sample("a@x_gen0").capture.target_score is None


async def test_a_write_that_fails_once_loses_no_score(tmp_path, monkeypatch):
    """The pending scores were cleared before their write: one failed write lost up to 64 of them (and counted them
    as one failed sample). They stay pending now, and the next write stores them."""
    import tokview.batch.scoring as scoring
    from tokview.sim import SimConfig, start_simulator
    from tokview.store import StoreError

    real, calls = scoring.put_target_scores, []

    def failing_once(store: Store, items: list[Any]) -> None:
        calls.append(len(items))
        if len(calls) == 1:
            raise StoreError("cannot write to the store: a held file")
        real(store, items)

    monkeypatch.setattr(scoring, "put_target_scores", failing_once)
    monkeypatch.setattr(scoring, "FLUSH", 2)
    with start_simulator(SimConfig(kind="vllm")) as sim, Store(tmp_path / "s.duckdb") as store:
        for k in range(5):
            capture = make_capture(f"question {k}")
            store.put_sample(f"s{k}@x_gen0", f"s{k}", "imported", capture, analyze(capture, profile(), kimi()))
        summary = await run_score(ScoreConfig(servers=[sim.url], retries=0, concurrency=1), store)
        assert (summary.ok, summary.failed) == (5, 0), summary
        assert store.query("SELECT count(*) FROM samples WHERE target_score IS NOT NULL") == [(5,)]
        assert len(calls) >= 2


async def test_a_sample_without_output_ids_is_said_not_scored(tmp_path):
    """A `max_tokens: 0` generation (the proxy records one) has nothing to score: the summary said "of 2 selected"
    for a store of 3 and named no reason for the third."""
    import dataclasses

    from tokview.sim import SimConfig, start_simulator

    with start_simulator(SimConfig(kind="vllm")) as sim, Store(tmp_path / "s.duckdb") as store:
        for k in range(2):
            capture = make_capture(f"question {k}")
            store.put_sample(f"s{k}@x_gen0", f"s{k}", "imported", capture, analyze(capture, profile(), kimi()))
        empty = dataclasses.replace(make_capture("nothing"), output_ids=[], content="", reasoning=None)
        store.put_sample("e@x_gen0", "e", "imported", empty, analyze(empty, profile(), kimi()))
        summary = await run_score(ScoreConfig(servers=[sim.url], retries=0), store)
    assert (summary.ok, summary.input, summary.without_output) == (2, 2, 1), summary
    assert "not scored: 1 selected sample without output ids" in summary.render()


@pytest.mark.parametrize(
    ("setting", "says"),
    [({"off_policy_nll": float("inf")}, "--off-policy-nll"), ({"timeout": float("inf")}, "--timeout")],
)
def test_infinite_settings_are_refused_as_batch_and_export_refuse_them(setting, says):
    """`score --off-policy-nll inf` ran and stored `"off_policy_nll": Infinity` in every score, which is not JSON."""
    from tokview.batch.inputs import InputError

    with pytest.raises(InputError, match=says):
        ScoreConfig(servers=["http://127.0.0.1:9"], **setting).validate()


async def test_a_replica_answering_garbage_fails_no_sample_a_healthy_one_can_score(tmp_path, json_server):
    """Two servers of one model, one answering every scoring request with a shifted `prompt_logprobs`: its samples
    failed (7 of 24 in a user's run) though the other could score them. A malformed answer is now retried as a
    batch retries one, and the pool's next attempt goes to the next server."""
    from tokview.sim import SimConfig, start_simulator

    def garbage(path: str, headers: dict[str, str]) -> tuple[int, Any]:
        return 200, {"choices": [{"text": "", "prompt_logprobs": [None], "finish_reason": "length"}]}

    info = {"/version": {"version": "0.32.0"}, "/v1/models": {"data": [{"id": "tokview-sim", "max_model_len": 4096}]}}
    bad, _ = json_server({**info, "/v1/completions": garbage})
    with start_simulator(SimConfig(kind="vllm")) as sim, Store(tmp_path / "s.duckdb") as store:
        for k in range(6):
            capture = make_capture(question=f"question {k}")
            store.put_sample(f"q{k}@x_gen0", f"q{k}", "imported", capture, analyze(capture, profile(), kimi()))
        config = ScoreConfig(servers=[bad, sim.url], retries=1, any_vocabulary=True, backend="vllm")
        summary = await run_score(config, store)
        assert (summary.ok, summary.failed) == (6, 0), summary.failures_by_reason


async def test_an_answer_the_only_server_gives_unreadably_fails_at_once(tmp_path, json_server):
    """Retried on the same server, an answer it gives the same every time took four attempts and their backoff for
    each sample (hours for a large run on one such server): with no other server it fails at the first."""
    import time

    calls: list[str] = []

    def garbage(path: str, headers: dict[str, str]) -> tuple[int, Any]:
        calls.append(path)
        return 200, {"choices": [{"text": "", "prompt_logprobs": [None], "finish_reason": "length"}]}

    url, _ = json_server({**VLLM_INFO, "/v1/completions": garbage})
    with Store(tmp_path / "s.duckdb") as store:
        for k in range(3):
            capture = make_capture(question=f"question {k}")
            store.put_sample(f"q{k}@x_gen0", f"q{k}", "imported", capture, analyze(capture, profile(), kimi()))
        started = time.monotonic()
        summary = await run_score(ScoreConfig(servers=[url], retries=3, any_vocabulary=True), store)
        assert (summary.ok, summary.failed) == (0, 3)
        assert len(calls) == 3 and time.monotonic() - started < 5
        assert not any("gave up after" in reason for reason in summary.failures_by_reason)


async def test_score_says_its_retries_while_every_request_waits_on_its_backoff(tmp_path, json_server):
    """Score offered its progress line a snapshot only as a sample finished: while every request waited on its
    backoff nothing was printed, then `1/30 … retried 34` ten seconds later."""
    capture = make_capture()
    ids = [*capture.prompt_ids, *capture.output_ids]
    calls: list[int] = []

    def completions(path: str, headers: dict[str, str]) -> tuple[int, Any]:
        calls.append(1)
        if len(calls) <= 2:
            return 503, {"error": {"message": "[/x] overloaded"}}
        logprobs = [None] + [{str(i): {"logprob": -0.5, "rank": 1}} for i in ids[1:]]
        return 200, {"choices": [{"text": "", "prompt_logprobs": logprobs, "finish_reason": "length"}]}

    url, _ = json_server({**VLLM_INFO, "/v1/completions": completions})
    seen: list[Any] = []
    with Store(tmp_path / "s.duckdb") as store:
        store.put_sample("a@x_gen0", "a", "imported", capture, analyze(capture, profile(), kimi()))
        summary = await run_score(ScoreConfig(servers=[url], retries=3), store, on_progress=seen.append)
    assert (summary.ok, summary.failed) == (1, 0), summary
    waiting = [p for p in seen if p.retried and not p.ok]
    assert waiting, [(p.ok, p.retried) for p in seen]
    assert "overloaded" in (waiting[-1].last_retry or "")
