"""A request for `n` > 1 generations: every choice is a sample of its own (issue 24: each generation is a sample), at
the same session and turn as the first, generation index k, and the harness may go on from any of them. Before, only
choice 0 was stored, and flagged `completion_count_mismatch` by a usage that counts every choice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from tokview.core.profiles import ModelProfile
from tokview.core.tokenizer import TokenizerAdapter
from tokview.proxy.app import Upstream
from tokview.proxy.capture import choice_indexes, choice_view
from tokview.proxy.recorder import Finished, Recorder
from tokview.proxy.serve import ProxyConfig, open_recorder
from tokview.store import Store

UP = "http://127.0.0.1:9"


def _choices(tok: TokenizerAdapter, profile: ModelProfile) -> tuple[list[int], list[list[int]], list[str]]:
    prompt = tok.render([{"role": "user", "content": "pick a number"}], template_kwargs={"thinking": True})
    texts = ["Seven.", "Forty-two, clearly.", "Three."]
    assert profile.think_close_id is not None
    outputs = [[profile.think_close_id, *tok.encode(t), profile.stop_ids[0]] for t in texts]
    return prompt, outputs, texts


def _answer(prompt: list[int], outputs: list[list[int]], texts: list[str], stream: bool) -> bytes:
    usage = {"prompt_tokens": len(prompt), "completion_tokens": sum(map(len, outputs)), "total_tokens": 0}
    if not stream:
        body = {
            "id": "c",
            "object": "chat.completion",
            "prompt_token_ids": prompt,
            "choices": [
                {"index": i, "message": {"role": "assistant", "content": t}, "finish_reason": "stop", "token_ids": o}
                for i, (o, t) in enumerate(zip(outputs, texts, strict=True))
            ],
            "usage": usage,
        }
        return orjson.dumps(body)
    chunks: list[dict[str, Any]] = []
    for i in range(len(outputs)):  # every choice opens first, then their text: interleaved as vLLM sends them
        first = {"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None, "token_ids": []}
        chunks.append({"id": "c", "choices": [first], **({"prompt_token_ids": prompt} if i == 0 else {})})
    for i, (ids, text) in enumerate(zip(outputs, texts, strict=True)):
        delta = {"index": i, "delta": {"content": text}, "finish_reason": None, "token_ids": ids[:-1]}
        last = {"index": i, "delta": {}, "finish_reason": "stop", "token_ids": ids[-1:]}
        chunks += [{"id": "c", "choices": [delta]}, {"id": "c", "choices": [last]}]
    chunks.append({"id": "c", "choices": [], "usage": usage})
    return b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_every_choice_of_an_n_request_is_a_sample(tmp_path: Path, kimi_tok, kimi_profile, stream: bool) -> None:
    prompt, outputs, texts = _choices(kimi_tok, kimi_profile)
    request = {"model": "m", "messages": [{"role": "user", "content": "pick a number"}], "n": 3, "stream": stream}
    raw = _answer(prompt, outputs, texts, stream)
    db = tmp_path / "n.duckdb"
    config = ProxyConfig([UP], db=str(db), tokenizer=kimi_tok, profile=kimi_profile, record_in="thread")
    recorder = open_recorder(config, [Upstream(UP, "vllm", None, {}, None)])
    assert isinstance(recorder, Recorder)
    recorder.record(Finished("chat", "vllm", UP, {}, None, request, {"body": request}, raw, stream, 0.01, None, None))
    recorder.close()
    with Store(db) as store:
        rows = store.query(
            "SELECT prompt_id, turn, gen_index, prompt_ids, output_ids, content, valid FROM samples ORDER BY gen_index"
        )
        codes = {c for (c,) in store.query("SELECT DISTINCT code FROM findings")}
    assert [r[2] for r in rows] == [0, 1, 2]
    assert len({(r[0], r[1]) for r in rows}) == 1  # one session, one turn
    assert [list(r[3]) for r in rows] == [prompt] * 3
    assert [list(r[4]) for r in rows] == outputs
    assert [r[5] for r in rows] == texts
    assert all(r[6] for r in rows), codes
    assert "completion_count_mismatch" not in codes


def test_a_single_choice_answer_is_read_as_it_is() -> None:
    body = {"choices": [{"index": 0, "message": {"content": "x"}}], "usage": {"completion_tokens": 3}}
    assert choice_indexes(body, stream=False) == [0]
    assert choice_indexes([{"choices": []}], stream=True) == [0]
    assert choice_indexes({"choices": [{"index": 10**9}]}, stream=False) == [10**9]  # one choice, not a count
    view = choice_view({**body, "choices": [{"index": 1, "message": {"content": "y"}}]}, 1, stream=False)
    assert view == {"choices": [{"index": 0, "message": {"content": "y"}}]}


def test_a_harness_that_goes_on_from_another_choice_stays_in_the_session(
    tmp_path: Path, kimi_tok, kimi_profile
) -> None:
    """Best-of-n: the harness keeps choice 1 and sends its next turn. Only the first choice was kept as the session's
    turn, so the next turn started a session of its own."""
    prompt, outputs, texts = _choices(kimi_tok, kimi_profile)
    asked = [{"role": "user", "content": "pick a number"}]
    request = {"model": "m", "messages": asked, "n": 3}
    db = tmp_path / "n.duckdb"
    config = ProxyConfig([UP], db=str(db), tokenizer=kimi_tok, profile=kimi_profile, record_in="thread")
    recorder = open_recorder(config, [Upstream(UP, "vllm", None, {}, None)])
    assert isinstance(recorder, Recorder)
    raw = _answer(prompt, outputs, texts, stream=False)
    recorder.record(Finished("chat", "vllm", UP, {}, None, request, {"body": request}, raw, False, 0.01, None, None))
    messages = [*asked, {"role": "assistant", "content": texts[1]}, {"role": "user", "content": "why?"}]
    nxt = kimi_tok.render(messages, template_kwargs={"thinking": True})
    assert nxt[: len(prompt) + len(outputs[1])] == prompt + outputs[1]  # it extends choice 1's ids, not choice 0's
    more = _answer(nxt, [outputs[0]], [texts[0]], stream=False)
    request2 = {"model": "m", "messages": messages}
    recorder.record(Finished("chat", "vllm", UP, {}, None, request2, {"body": request2}, more, False, 0.01, None, None))
    recorder.close()
    with Store(db) as store:
        rows = store.query("SELECT prompt_id, turn, gen_index FROM samples ORDER BY turn, gen_index")
    assert len({r[0] for r in rows}) == 1, rows
    assert [(r[1], r[2]) for r in rows] == [(0, 0), (0, 1), (0, 2), (1, 0)]


def test_every_choice_of_a_turn_that_breaks_the_prefix_has_the_finding(tmp_path: Path, kimi_tok, kimi_profile) -> None:
    """An `n` > 1 turn joined by its messages, its ids re-rendered otherwise: only its first choice was flagged
    `session_prefix_break`, its siblings (the same prompt) were stored as if their prompt extended the session."""
    prompt, outputs, texts = _choices(kimi_tok, kimi_profile)
    asked = [{"role": "user", "content": "pick a number"}]
    db = tmp_path / "n.duckdb"
    config = ProxyConfig([UP], db=str(db), tokenizer=kimi_tok, profile=kimi_profile, record_in="thread")
    recorder = open_recorder(config, [Upstream(UP, "vllm", None, {}, None)])
    assert isinstance(recorder, Recorder)
    first = {"model": "m", "messages": asked}
    raw = _answer(prompt, outputs[:1], texts[:1], stream=False)
    recorder.record(Finished("chat", "vllm", UP, {}, None, first, {"body": first}, raw, False, 0.01, None, None))
    messages = [*asked, {"role": "assistant", "content": texts[0]}, {"role": "user", "content": "why?"}]
    rerendered = [*asked, {"role": "assistant", "content": texts[0] + " "}, {"role": "user", "content": "why?"}]
    nxt = kimi_tok.render(rerendered, template_kwargs={"thinking": True})  # the harness changed the history's text
    assert nxt[: len(prompt) + len(outputs[0])] != prompt + outputs[0]
    request = {"model": "m", "messages": messages, "n": 3}
    more = _answer(nxt, outputs, texts, stream=False)
    recorder.record(Finished("chat", "vllm", UP, {}, None, request, {"body": request}, more, False, 0.01, None, None))
    recorder.close()
    with Store(db) as store:
        rows = store.query(
            "SELECT s.turn, s.gen_index, count(f.code) FROM samples s LEFT JOIN findings f "
            "ON f.sample_id = s.sample_id AND f.code = 'session_prefix_break' GROUP BY ALL ORDER BY 1, 2"
        )
    assert rows == [(0, 0, 0), (1, 0, 1), (1, 1, 1), (1, 2, 1)]


def _completions(prompts: list[list[int]], outputs: list[list[int]], n: int) -> bytes:
    """vLLM's `/v1/completions` answer to a list of prompts: choice index = prompt × n + k, each with its prompt's ids."""
    choices = [
        {"index": i, "text": "x", "finish_reason": "stop", "token_ids": o, "prompt_token_ids": prompts[i // n]}
        for i, o in enumerate(outputs)
    ]
    usage = {"prompt_tokens": sum(map(len, prompts)), "completion_tokens": sum(map(len, outputs)), "total_tokens": 0}
    return orjson.dumps({"id": "c", "object": "text_completion", "choices": choices, "usage": usage})


def test_a_list_of_prompts_is_placed_prompt_by_prompt(tmp_path: Path, kimi_tok, kimi_profile) -> None:
    """Each prompt of a `/v1/completions` list is a generation of its own prompt: its own session (unnamed) or its own
    place in the named one, its choices generations 0… of it. They were taken for `n` choices of the first prompt:
    one session and turn, and a false `session_prefix_break` on a prompt that did extend the session."""
    stop = kimi_profile.stop_ids[0]
    first = kimi_tok.render([{"role": "user", "content": "pick a number"}], template_kwargs={"thinking": True})
    other = kimi_tok.render([{"role": "user", "content": "name a colour"}], template_kwargs={"thinking": True})
    out = [kimi_profile.think_close_id, *kimi_tok.encode("Seven."), stop]
    db = tmp_path / "list.duckdb"
    config = ProxyConfig([UP], db=str(db), tokenizer=kimi_tok, profile=kimi_profile, record_in="thread")
    recorder = open_recorder(config, [Upstream(UP, "vllm", None, {}, None)])
    assert isinstance(recorder, Recorder)

    def send(prompts: list[list[int]], outputs: list[list[int]], n: int, named: str | None) -> None:
        request = {"model": "m", "prompt": prompts, "n": n}
        raw = _completions(prompts, outputs, n)
        item = Finished("completions", "vllm", UP, {}, None, request, {"body": request}, raw, False, 0.01, named, None)
        recorder.record(item)

    send([first, other], [out, out[:-1] + [stop], out, out], 2, None)  # unnamed: two conversations
    send([first], [out], 1, "s")  # named: turn 0, then a list holding an unrelated prompt and turn 1
    send([other, [*first, *out, 400, 163601]], [out, out], 1, "s")
    send([first, other], [out, out], 1, "t")  # a new named session's list: parallel prompts, not a history
    recorder.close()
    with Store(db) as store:
        rows = store.query("SELECT prompt_id, turn, gen_index, prompt_ids, sample_id FROM samples ORDER BY sample_id")
        broke = {s for (s,) in store.query("SELECT sample_id FROM findings WHERE code = 'session_prefix_break'")}
    unnamed, named, parallel = rows[:4], rows[4:7], rows[7:]
    assert [r[2] for r in unnamed] == [0, 1, 0, 1]
    assert unnamed[0][:2] == unnamed[1][:2] and unnamed[2][:2] == unnamed[3][:2]
    assert unnamed[0][0] != unnamed[2][0], "another prompt is another conversation"
    assert [list(r[3]) for r in unnamed] == [first, first, other, other]
    assert [(r[0], r[1]) for r in named] == [("session:s", 0), ("session:s", 1), ("session:s", 1)]
    assert named[0][4] not in broke and named[2][4] not in broke, "the turn that extends turn 0 does not break"
    assert named[1][4] in broke, "the unrelated prompt does"
    # a list's second prompt that extends no kept turn sits beside the first (it was turn 1, flagged as a rewritten
    # history: "the harness rewrote its history (a compaction, a summary)")
    assert [(r[0], r[1], list(r[3])) for r in parallel] == [("session:t", 0, first), ("session:t", 0, other)]
    assert not {r[4] for r in parallel} & broke


def test_choices_past_the_most_recorded_are_failures_each_with_its_index(
    tmp_path: Path, kimi_tok, kimi_profile
) -> None:
    """`n` = 130: 128 were stored and the proxy's summary said nothing of the other two."""
    from tokview.proxy.capture import MAX_CHOICES

    prompt, outputs, texts = _choices(kimi_tok, kimi_profile)
    n = MAX_CHOICES + 2
    request = {"model": "m", "messages": [{"role": "user", "content": "pick a number"}], "n": n}
    raw = _answer(prompt, (outputs * n)[:n], (texts * n)[:n], False)
    db = tmp_path / "n.duckdb"
    config = ProxyConfig([UP], db=str(db), tokenizer=kimi_tok, profile=kimi_profile, record_in="thread")
    recorder = open_recorder(config, [Upstream(UP, "vllm", None, {}, None)])
    assert isinstance(recorder, Recorder)
    recorder.record(Finished("chat", "vllm", UP, {}, None, request, {"body": request}, raw, False, 0.01, None, None))
    recorder.close()
    assert (recorder.recorded, recorder.failed) == (MAX_CHOICES, 2)
    with Store(db) as store:
        [(samples,)] = store.query("SELECT count(*) FROM samples")
        reasons = [r for (r,) in store.query("SELECT reason FROM failures ORDER BY reason")]
    assert samples == MAX_CHOICES
    assert reasons == [
        f"not recorded: choice {i} of an answer with more than {MAX_CHOICES} choices" for i in (128, 129)
    ]
