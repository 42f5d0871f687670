"""A chat stream of plain chunks is merged in one quick pass, with the very result of the chunk-by-chunk walk
(issue 24 item 5: the merge was ~10% of the proxy recorder's CPU per stream)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from tokview.servers.errors import Retryable
from tokview.servers.vllm import merge_chat_stream, merge_chat_stream_walk


def _chunk(i: int, **delta: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "delta": delta or {"content": f"t{i}"},
                "logprobs": None,
                "finish_reason": None,
                "token_ids": [100 + i],
            }
        ],
    }


def _stream(n: int = 6) -> list[dict[str, Any]]:
    first = {**_chunk(0, role="assistant", content=""), "prompt_token_ids": [1, 2, 3], "prompt_text": None}
    first["choices"][0].pop("token_ids")
    body = [_chunk(i, reasoning=f"r{i}") for i in range(1, n // 2)] + [_chunk(i) for i in range(n // 2, n)]
    last = _chunk(n, content="")
    last["choices"][0].update(finish_reason="stop", stop_reason=None)
    return [first, *body, last]


def _with(*changes: Callable[[list[dict[str, Any]]], None]) -> list[dict[str, Any]]:
    chunks = _stream()
    for change in changes:
        change(chunks)
    return chunks


def _set(i: int, path: tuple[Any, ...], value: Any) -> Callable[[list[dict[str, Any]]], None]:
    def change(chunks: list[dict[str, Any]]) -> None:
        target: Any = chunks[i]
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return change


STREAMS: dict[str, list[dict[str, Any]]] = {
    "plain": _stream(),
    "empty": [],
    "usage chunk": [*_stream(), {"id": "x", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 6}}],
    "spec decode metrics": [*_stream(), {"choices": [], "metrics": {"speculative_decoding": {"num_spec_steps": 2}}}],
    "reasoning_content": _with(_set(2, ("choices", 0, "delta"), {"reasoning_content": "old"})),
    "a None text": _with(_set(2, ("choices", 0, "delta"), {"reasoning": None})),
    "no ids anywhere": [{"choices": [{"index": 0, "delta": {"content": "a"}}]}],
    "prompt ids in the choice": _with(_set(0, ("choices", 0, "prompt_token_ids"), [7, 8])),
    "a second choice": _with(_set(3, ("choices",), [_chunk(3)["choices"][0], {**_chunk(9)["choices"][0], "index": 1}])),
    "only index 1": _with(_set(3, ("choices", 0, "index"), 1)),
    "tool calls": _with(
        _set(
            3,
            ("choices", 0, "delta"),
            {"tool_calls": [{"index": 0, "id": "c", "function": {"name": "f", "arguments": "{}"}}]},
        )
    ),
    "logprobs": _with(_set(3, ("choices", 0, "logprobs"), {"content": [{"token": "t", "logprob": -0.1}]})),
    "matched_stop": _with(_set(-1, ("choices", 0, "matched_stop"), "</s>")),
    "finish as an object": _with(_set(-1, ("choices", 0, "finish_reason"), {"type": "stop", "matched": 5})),
    "a choice that is a string": _with(_set(2, ("choices",), ["x"])),
    "choices an object": _with(_set(2, ("choices",), {"index": 0})),
    "ids not a list": _with(_set(2, ("choices", 0, "token_ids"), "12")),
    "a float id": _with(_set(2, ("choices", 0, "token_ids"), [1.0])),
    "a bool id": _with(_set(2, ("choices", 0, "token_ids"), [True])),
    "a negative id": _with(_set(2, ("choices", 0, "token_ids"), [-1])),
    "an id beyond any vocabulary": _with(_set(2, ("choices", 0, "token_ids"), [2**40])),
    "prompt ids with a string": _with(_set(0, ("prompt_token_ids",), [1, "2"])),
    "a text that is a number": _with(_set(2, ("choices", 0, "delta", "content"), 5)),
    "a lone surrogate": _with(_set(2, ("choices", 0, "delta", "content"), "a\ud800")),
    "a lone surrogate split over two chunks": _with(
        _set(2, ("choices", 0, "delta", "content"), "\ud83d"), _set(3, ("choices", 0, "delta", "content"), "\ude00")
    ),
    "a delta that is a list": _with(_set(2, ("choices", 0, "delta"), ["a"])),
    "a finish that is a number": _with(_set(-1, ("choices", 0, "finish_reason"), 3)),
    "an unknown delta key": _with(_set(2, ("choices", 0, "delta"), {"content": "a", "refusal": None})),
    "an error then a bad finish": _with(
        _set(1, ("choices", 0, "token_ids"), "x"), _set(-1, ("choices", 0, "finish_reason"), 3)
    ),
}


def _outcome(merge: Callable[..., dict[str, Any]], chunks: list[dict[str, Any]], asked: bool) -> Any:
    try:
        return merge(copy.deepcopy(chunks), "POST /v1/chat/completions (stream)", asked)
    except Retryable as exc:
        return ("raised", str(exc))


@pytest.mark.parametrize("asked", [False, True])
@pytest.mark.parametrize("name", list(STREAMS))
def test_the_quick_merge_gives_what_the_chunk_by_chunk_walk_gives(name: str, asked: bool) -> None:
    chunks = STREAMS[name]
    assert _outcome(merge_chat_stream, chunks, asked) == _outcome(merge_chat_stream_walk, chunks, asked)


def test_a_256_chunk_stream_merges_as_the_chunk_by_chunk_walk_does() -> None:
    """What the merge costs against one `orjson.loads` of its chunks is measured in `benchmarks/bench_recorder.py`
    (x1.0 there; chunk by chunk it was ~2.7x): as a timed assertion here it could fail on a loaded CI machine."""
    chunks = _stream(256)
    assert merge_chat_stream(chunks) == merge_chat_stream_walk(chunks)
