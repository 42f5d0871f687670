"""A proxied answer is a sample with every id the server sent, or a failure that says why: never a sample missing ids.

A lone surrogate escape (`"\\ud800"`) is valid JSON that orjson refuses: a stream event holding one was dropped with
its ids, so the sample lacked an id the server produced. An event holding no JSON object at all was dropped the same
way, silently. Now the first is read (the stdlib's parser) and refused where the servers layer refuses it (a
malformed response), and a stream with the second is recorded as a failure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from tokview.proxy.recorder import Finished, Recorder
from tokview.store import Store

UP = "http://127.0.0.1:9"
PROMPT = [163584, 1000, 1001, 163586]


def _event(i: int, text: str, ids: list[int], finish: str | None = None) -> bytes:
    chunk: dict[str, Any] = {
        "id": "chatcmpl-u",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [
            {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish, "token_ids": ids}
        ],
    }
    if i == 0:
        chunk["prompt_token_ids"] = PROMPT
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def _stream(middle: bytes) -> bytes:
    events = [_event(i, f"w{i} ", [1000 + i]) for i in range(20)]
    events.insert(10, middle)
    return b"".join(events) + _event(20, "", [163586], finish="stop") + b"data: [DONE]\n\n"


def _finished(raw: bytes, stream: bool, user: str) -> Finished:
    request = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream, "user": user}
    return Finished("chat", "vllm", UP, {}, None, request, {"body": request}, raw, stream, 0.01, None, user)


def _record(tmp_path: Path, items: list[Finished], kimi_tok: Any, kimi_profile: Any) -> Store:
    store = Store(tmp_path / "u.duckdb")
    store.put_run("r", settings={"mode": "proxy"})
    recorder = Recorder(store, profile=kimi_profile, tokenizer=kimi_tok, run_id="r", threaded=False)
    for item in items:
        recorder.take(item)
    recorder.close()
    return store


SURROGATE_EVENT = (
    b'data: {"id":"chatcmpl-u","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
    b'"delta":{"content":"bad \\ud800 byte"},"logprobs":null,"finish_reason":null,"token_ids":[1500]}]}\n\n'
)


def test_a_lone_surrogate_is_a_recorded_failure_streamed_or_not_never_a_sample_missing_its_event(
    tmp_path, kimi_tok, kimi_profile
):
    """The servers layer refuses a text holding a lone surrogate as a malformed response (`servers.shapes`): through
    the proxy too, streamed or not. Before, the stream's event was dropped (a sample without the id 1500) and a JSON
    answer was said to be "not JSON"."""
    body = (
        b'{"id":"x","object":"chat.completion","model":"m","prompt_token_ids":[163584,1000,1001,163586],'
        b'"choices":[{"index":0,"message":{"role":"assistant","content":"bad \\ud800 byte"},"finish_reason":"stop",'
        b'"token_ids":[1000,1500,163586]}]}'
    )
    items = [_finished(_stream(SURROGATE_EVENT), True, "streamed"), _finished(body, False, "json")]
    with _record(tmp_path, items, kimi_tok, kimi_profile) as store:
        failures = store.query("SELECT prompt_id, reason FROM failures ORDER BY prompt_id")
        assert store.query("SELECT count(*) FROM samples") == [(0,)]
    assert [p for p, _ in failures] == ["user:json", "user:streamed"]
    for _, reason in failures:
        assert reason.startswith("malformed response from POST /v1/chat/completions") and "lone surrogate" in reason


def test_a_stream_with_an_event_that_is_not_json_is_a_failure_not_a_sample_missing_ids(
    tmp_path, kimi_tok, kimi_profile
):
    items = [
        _finished(_stream(b'data: {"choices":[{"delta":{"content":"x"},"token_ids":[15\n\n'), True, "cut"),
        _finished(_stream(b"data: 5\n\n"), True, "number"),
        _finished(_stream(b": a comment, no data\n\n"), True, "comment"),  # no data: nothing lost, a sample
    ]
    with _record(tmp_path, items, kimi_tok, kimi_profile) as store:
        failures = store.query("SELECT prompt_id, reason FROM failures ORDER BY prompt_id")
        samples = store.query("SELECT prompt_id FROM samples")
    assert samples == [("user:comment",)]
    assert [p for p, _ in failures] == ["user:cut", "user:number"]
    for _, reason in failures:
        assert reason.startswith("malformed response: 1 of the upstream's stream events held no JSON object")


def test_a_stream_abort_is_a_failure_however_its_key_is_spelled(tmp_path, kimi_tok, kimi_profile):
    """The recorder looks for an abort only in a stream whose bytes may spell one: `"error"`, or a \\u escape
    (`"\\u0065rror"` is the same key to a JSON parser). Both spellings are failures; a stream that only says "error"
    in its text is a sample."""
    plain = b'data: {"error":{"message":"engine died","type":"InternalServerError","code":500}}\n\n'
    escaped = b'data: {"\\u0065rror":{"message":"engine died","type":"InternalServerError","code":500}}\n\n'
    items = [
        _finished(_stream(plain), True, "plain"),
        _finished(_stream(escaped), True, "escaped"),
        _finished(_stream(_event(99, 'the "error" was mine', [1099])), True, "text"),
    ]
    with _record(tmp_path, items, kimi_tok, kimi_profile) as store:
        failures = store.query("SELECT prompt_id, reason FROM failures ORDER BY prompt_id")
        samples = store.query("SELECT prompt_id FROM samples")
    assert samples == [("user:text",)]
    assert [p for p, _ in failures] == ["user:escaped", "user:plain"]
    for _, reason in failures:
        assert reason.startswith("the upstream aborted the stream after 10 chunks") and "engine died" in reason
