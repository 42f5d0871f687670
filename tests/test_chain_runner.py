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


def test_a_later_turn_the_server_refuses_ends_the_chain_keeping_the_turns_before():
    """SGLang answers 400 to a history whose call arguments are no JSON (the model's own, sent back as written): failed
    whole, the chain was asked again every run and never stored the turn that shows why. A turn 0 refused stays a
    failure (the prompt file's request itself)."""
    refused = ("HTTP 400 from POST /v1/chat/completions: function.arguments must be valid JSON", "http://s", True, True)
    answers = iter([_served([1, 2]), refused])

    async def attempt(messages, kwargs):
        return next(answers)

    result = asyncio.run(run_chain(ITEM, attempt))
    assert [t.turn for t, _ in result.samples] == [0]
    assert result.failure is None
    assert result.stop == f"turn 1 was refused by the server: {refused[0]}"
    assert result.samples[0][1].settings["chain"]["stopped"] == result.stop

    first = iter([refused])

    async def at_once(messages, kwargs):
        return next(first)

    result = asyncio.run(run_chain(ITEM, at_once))
    assert result.samples == [] and result.failure == (refused[0], "http://s", True)


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


def test_a_turn_whose_end_was_lost_ends_the_chain_there():
    """No finish_reason and no stop id at the end (a stream whose last events were lost): `generation_aborted`, and
    the chain built its next turn on the cut output, stored as valid."""
    from builders import profile

    kimi = profile()
    lost = Capture(prompt_ids=[1, 2], output_ids=[7], finish_reason=None, content="a", reasoning="r")
    whole = Capture(prompt_ids=[1, 2], output_ids=[7, kimi.stop_ids[0]], finish_reason=None, content="a")
    for first, stop in (
        (lost, "turn 0 names no finish_reason and does not end with a stop id: its end was lost"),
        (whole, None),
    ):
        answers = iter([first, _served([1, 2, 7, 3])])

        async def attempt(messages, kwargs, answers=answers):
            return next(answers)

        result = asyncio.run(run_chain(ITEM, attempt, profile=kimi))
        assert result.stop == stop
        assert len(result.samples) == (1 if stop else 2)


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


def test_each_file_result_goes_to_the_served_call_in_the_place_of_the_file_call_it_answers():
    """The file's results were paired with the served calls by the results' order: a harness that listed Oslo's
    result before Paris's gave the served Paris call Oslo's weather, and nothing said so. The results keep the
    file's order; each takes the id of the served call at its file call's place."""
    weather = {"name": "get_weather"}
    calls = [
        {"id": "call_paris", "type": "function", "function": {**weather, "arguments": '{"city": "Paris"}'}},
        {"id": "call_oslo", "type": "function", "function": {**weather, "arguments": '{"city": "Oslo"}'}},
    ]
    messages = [
        {"role": "user", "content": "weather in Paris and Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "call_oslo", "content": "OSLO: rain"},
        {"role": "tool", "tool_call_id": "call_paris", "content": "PARIS: sun"},
        {"role": "assistant", "content": "Sun in Paris, rain in Oslo."},
    ]
    item = ChainItem("w#turn0@k_gen0", "w", 0, messages, None, ((0, 1, "w#turn0@k_gen0"), (1, 4, "w#turn1@k_gen0")))
    first = _served([1, 2])
    first.finish_reason = "tool_calls"
    first.tool_calls = [
        {"id": "s0", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"id": "s1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
    ]
    sent: list[list[dict]] = []

    async def attempt(history, kwargs):
        sent.append(history)
        return first if len(sent) == 1 else _served([1, 2, 7, 8, 9])

    result = asyncio.run(run_chain(item, attempt))
    assert result.stop is None and len(result.samples) == 2
    results = [(m["tool_call_id"], m["content"]) for m in sent[1] if m["role"] == "tool"]
    assert results == [("s1", "OSLO: rain"), ("s0", "PARIS: sun")]


def test_a_gpt_oss_raw_turn_goes_back_as_its_analysis_and_final_channels():
    """On the raw path a Harmony answer was decoded whole, special tokens skipped: the analysis, the channel names
    and `assistantfinal` became the next turn's visible answer, a history the model never wrote."""
    from tokview.batch.chains import split_on_ids
    from tokview.core import harmony as h
    from tokview.core.profiles import get_profile

    class Decoder:
        def decode(self, ids, skip_special_tokens=False):
            return "".join(f"<{i}>" for i in ids)

    analysis, final = [11, 12], [21, 22, 23]
    out = [h.CHANNEL, *h.CHANNEL_IDS["analysis"], h.MESSAGE, *analysis, h.END]
    out += [h.START, 1, h.CHANNEL, *h.CHANNEL_IDS["final"], h.MESSAGE, *final, h.RETURN]
    capture = Capture(prompt_ids=[5], output_ids=out, finish_reason="stop")
    reasoning, content = split_on_ids(capture, Decoder(), get_profile("gpt-oss"))
    assert (reasoning, content) == ("<11><12>", "<21><22><23>")


def test_only_a_request_refused_as_it_is_stops_a_chain_not_the_servers_state():
    """A 401 (a key rotated), 403 or 404 (a model reloading) on a later turn stopped the chain for good, exit 0, and a
    re-run skipped it as stopped: those fail the chain, which the next run asks again whole."""
    from tokview.batch.capture_loop import REFUSED_REQUEST

    assert {400, 413, 422} == REFUSED_REQUEST
