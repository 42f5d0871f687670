"""Servers that answer what tokview does not expect, over real sockets (a scripted JSON server on
127.0.0.1 serves the shapes no simulator quirk makes): a server that is neither SGLang nor vLLM, and
malformed response bodies, each a failure with a reason, never a crash."""

from __future__ import annotations

from typing import Any

import pytest

from tokview.core.profiles import get_profile
from tokview.servers import CaptureFailed, CaptureRequest, ServerPool, ServerUnreachable

KIMI = get_profile("kimi-k2.5")
QUESTION = [{"role": "user", "content": "What is 6 times 7?"}]
VLLM_INFO = {"/version": {"version": "0.32.0"}, "/v1/models": {"data": [{"id": "m"}]}}


async def test_unknown_kind_fails_start_clearly_unless_backend_given(json_server: Any) -> None:
    anything = {p: {"ok": True} for p in ("/get_model_info", "/version", "/v1/models", "/health")}
    url, _ = json_server(anything)
    with pytest.raises(ServerUnreachable) as info:
        async with ServerPool(url, profile=KIMI, retries=0, timeout=5.0):
            pass
    async with ServerPool(url, backend="vllm", profile=KIMI, retries=0, timeout=5.0) as pool:
        assert pool.server_info()[0]["healthy"]
    assert "neither SGLang nor vLLM" in info.value.reason
    assert "--backend" in info.value.reason


SGLANG_INFO = {"/get_model_info": {"model_path": "m", "is_generation": True}}
GEN_OK = {"output_ids": [5, 163586], "text": "x", "meta_info": {"finish_reason": {"type": "stop"}}}


@pytest.mark.parametrize(
    "backend, mode, routes, reason",
    [
        (
            "sglang",
            "raw",
            {"/generate": {**GEN_OK, "meta_info": {"finish_reason": "abort"}}},
            "SGLang aborted the request on POST /generate: no message",
        ),
        ("sglang", "raw", {"/generate": {**GEN_OK, "meta_info": "oops"}}, "meta_info is not an object"),
        ("sglang", "raw", {"/generate": {**GEN_OK, "meta_info": {"finish_reason": 7}}}, "finish_reason is a int"),
        ("sglang", "raw", {"/generate": {**GEN_OK, "text": ["x"]}}, "text is not a string"),
        ("vllm", "raw", {"/v1/completions": {"choices": [{"token_ids": ["a", "b"]}]}}, "token_ids are not a list"),
        ("vllm", "raw", {"/v1/completions": {"choices": [{"token_ids": [5, -1]}]}}, "hold a negative id (-1)"),
        ("sglang", "raw", {"/generate": {**GEN_OK, "output_ids": [-3, 5]}}, "hold a negative id (-3)"),
        ("vllm", "raw", {"/v1/completions": {"choices": ["x"]}}, "choices[0] is not an object"),
        ("vllm", "chat", {"/v1/chat/completions": {"choices": ["x"]}}, "choices[0] is not an object"),
        (
            "vllm",
            "chat",
            {"/v1/chat/completions": {"prompt_token_ids": [1], "choices": [{"message": "hi", "token_ids": [5]}]}},
            "choices[0].message is not an object",
        ),
        (
            "vllm",
            "chat",
            {
                "/v1/chat/completions": {
                    "prompt_token_ids": [1],
                    "choices": [{"message": {"content": "a"}, "token_ids": [5, None]}],
                }
            },
            "output token ids are not a list",
        ),
        (
            "vllm",
            "chat",
            {
                "/v1/chat/completions": {
                    "prompt_token_ids": [1],
                    "choices": [{"message": {"content": {"a": 1}}, "token_ids": [5]}],
                }
            },
            "message.content is not a string",
        ),
    ],
)
async def test_malformed_shapes_are_capture_failures(
    kimi_tok: Any, json_server: Any, backend: str, mode: str, routes: dict[str, Any], reason: str
) -> None:
    info = SGLANG_INFO if backend == "sglang" else VLLM_INFO
    url, seen = json_server({**info, **routes})
    async with ServerPool(
        url, backend=backend, tokenizer=kimi_tok, profile=KIMI, retries=1, backoff=0.01, timeout=5.0
    ) as pool:
        with pytest.raises(CaptureFailed) as failed:
            await pool.capture(CaptureRequest(messages=QUESTION, mode=mode, settings={"max_new_tokens": 5}))
    assert reason in failed.value.reason
    assert any(h["path"] in routes for h in seen)  # the malformed body was really fetched over the socket


@pytest.mark.parametrize("data", ["x", {"id": "m"}, 5, None])
async def test_a_model_list_that_is_not_a_list_is_ignored(json_server: Any, data: Any) -> None:
    """`/v1/models` answering `{"data": "x"}` once crashed the probe (batch, doctor and score) with a TypeError."""
    url, _ = json_server({**VLLM_INFO, "/v1/models": {"data": data}})
    async with ServerPool(url, profile=KIMI, retries=0, timeout=5.0) as pool:
        info = pool.server_info()[0]
    assert info["kind"] == "vllm"
    assert info["healthy"]


def _slow_ids_of(value: object) -> list[int] | str:
    """What `ids_of` answered before its fast path: a type pass, then min and max."""
    from tokview.servers.shapes import MAX_ID

    if not (isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value)):
        return "not ints"
    if value and min(value) < 0:
        return "negative"
    if value and max(value) > MAX_ID:
        return "beyond"
    return value


@pytest.mark.parametrize("seed", range(4))
def test_ids_of_accepts_and_refuses_exactly_what_its_type_min_and_max_checks_do(seed):
    """`ids_of` takes a list in two C passes (its JSON's bytes, then a 32-bit packing) before the type, min and max
    passes that name what is wrong; every list either way gets the same answer."""
    import random

    from tokview.servers.errors import Retryable
    from tokview.servers.shapes import MAX_ID, ids_of

    class Id(int):
        pass

    rng = random.Random(seed)
    odd: list[object] = [True, False, 1.0, -1, MAX_ID, MAX_ID + 1, 2**63, 2**64, -(2**63), "7", None, [3], Id(5), 0]
    for _ in range(2_000):
        value = [rng.randrange(200_000) for _ in range(rng.randrange(0, 40))]
        for _ in range(rng.choice((0, 0, 1, 2))):
            value.insert(rng.randrange(len(value) + 1), rng.choice(odd))
        expected = _slow_ids_of(value)
        try:
            got: list[int] | str = ids_of(value, "here")
        except Retryable as exc:
            reason = str(exc)
            got = "negative" if "negative" in reason else "beyond" if "beyond" in reason else "not ints"
        assert got == expected, value
        if isinstance(got, list):
            assert got is value  # the list itself, not a copy
