"""How a chain ends when a turn cannot be generated: a failed request (after the pool's retries) fails the
whole chain, recorded on its first turn's sample id and retried whole by the next run; a later turn whose
prompt is over the server's context length ends it like a stop, the turns before kept."""

from __future__ import annotations

import asyncio
import json

from tokview.batch.chains import ChainItem, run_chain
from tokview.cli import main
from tokview.core.record import Capture
from tokview.errors import ExitCode
from tokview.sim import SimConfig, start_simulator
from tokview.store import Store

MESSAGES = [
    {"role": "user", "content": "1"},
    {"role": "assistant", "content": "x"},
    {"role": "user", "content": "2"},
    {"role": "assistant", "content": "y"},
]
ITEM = ChainItem("p#turn0@k_gen0", "p", 0, MESSAGES, None, ((0, 1, "p#turn0@k_gen0"), (1, 3, "p#turn1@k_gen0")), todo=2)


def _served(prompt: list[int]) -> Capture:
    return Capture(prompt_ids=prompt, output_ids=[7, 8], finish_reason="stop", content="a", reasoning="r")


def test_a_failed_request_fails_the_whole_chain_naming_its_turn():
    answers = iter([_served([1, 2]), ("HTTP 500 from POST /v1/chat/completions", "http://s", True)])

    async def attempt(messages, kwargs):
        return next(answers)

    result = asyncio.run(run_chain(ITEM, attempt))
    assert result.samples == []
    assert result.left == 1
    assert result.stop is None
    assert result.failure == ("chain turn 1 failed: HTTP 500 from POST /v1/chat/completions", "http://s", True)


def test_a_later_turn_too_long_to_send_ends_the_chain_keeping_the_turns_before():
    answers = iter([_served([1, 2]), ("over_max_length: 90 prompt ids for a context of 64", None, False)])

    async def attempt(messages, kwargs):
        return next(answers)

    result = asyncio.run(run_chain(ITEM, attempt))
    assert [t.turn for t, _ in result.samples] == [0]
    assert result.failure is None
    assert result.left == 1
    assert result.stop == "turn 1 was not sent: over_max_length: 90 prompt ids for a context of 64"
    assert result.samples[0][1].settings["chain"]["stopped"] == result.stop


def test_a_turn_the_server_aborted_ends_the_chain_there():
    """vLLM answers an engine abort with HTTP 200 and finish_reason abort: the turn is incomplete, so the next turn's
    history (its calls, its answer) is not the model's; the chain stops as it does on a cut at the token limit."""
    aborted = Capture(prompt_ids=[1, 2], output_ids=[7], finish_reason="abort", content="a", reasoning="r")
    answers = iter([aborted, _served([1, 2, 7, 3])])

    async def attempt(messages, kwargs):
        return next(answers)

    result = asyncio.run(run_chain(ITEM, attempt))
    assert [t.turn for t, _ in result.samples] == [0]
    assert result.stop == "turn 0 was ended by the server (finish_reason abort): it is incomplete"


def test_over_the_context_length_on_the_simulator_ends_the_chain_counted(tmp_path, capsys):
    row = {"id": "long", "messages": [*MESSAGES[:2], {"role": "user", "content": "word " * 200}]}
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps(row) + "\n")
    db = tmp_path / "s.duckdb"
    with start_simulator(SimConfig(kind="vllm", max_model_len=160, output_tokens=8)) as sim:
        code = main(["batch", str(prompts), "--server", sim.url, "--db", str(db), "--mode", "chat", "--summary-json"])
    summary = json.loads(capsys.readouterr().out)
    assert code == ExitCode.OK
    assert summary["ok"] == 1
    assert summary["chain_stopped"] == 1
    assert summary["failed"] == 0
    (why,) = summary["chain_stops"]
    assert why.startswith("turn 1 was not sent: over_max_length")
    with Store(str(db)) as store:
        (kept,) = [store.load_sample(r[0]) for r in store.query("SELECT sample_id FROM samples")]
    assert kept.turn == 0
    assert "chain_stopped" in [f.code for f in kept.findings]


def test_the_writer_records_a_failed_chain_on_its_first_turn_and_counts_the_rest(tmp_path):
    from builders import kimi, profile

    from tokview.batch.chains import ChainResult, split_chain_stops
    from tokview.batch.writer_thread import GroupWriter

    with Store(str(tmp_path / "s.duckdb")) as store:
        writer = GroupWriter(store, profile=profile(), tokenizer=kimi(), run_id="r", group_s=0.01)
        writer.add_chain(ITEM, ChainResult(failure=("chain turn 1 failed: HTTP 500", "http://s", True), left=1))
        writer.close()
        (failure,) = store.failures()
        assert store.count_samples() == 0
    assert (failure["sample_id"], failure["reason"]) == ("p#turn0@k_gen0", "chain turn 1 failed: HTTP 500")
    failures, stops = split_chain_stops(writer.reasons)
    assert writer.failed == 1
    assert failures == {"chain turn 1 failed: HTTP 500": 1}
    assert stops == {"its chain failed (recorded on its first turn; the next run retries the chain whole)": 1}


def test_history_reasoning_all_asks_for_the_profile_s_keep_all_kwarg():
    import dataclasses

    from builders import profile

    asked = []

    async def attempt(messages, kwargs):
        asked.append(kwargs)
        return _served([1, 2, 3])

    glm_like = dataclasses.replace(profile(), history_kwarg="clear_thinking")
    for prof, want in ((profile(), {"preserve_thinking": True}), (glm_like, {"clear_thinking": False})):
        asked.clear()
        asyncio.run(run_chain(dataclasses.replace(ITEM, history_reasoning="all"), attempt, None, prof))
        assert asked == [want, want]
