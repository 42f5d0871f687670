"""The simulator's SGLang `/v1/completions`: ids with `return_token_ids` streamed or not, keys left out without it,
the chat endpoint's sglext flags ignored (its request model has no such fields), `echo` kept with ids (unlike
vLLM), over a real socket."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from facts import KIMI_PROMPT_6X7

from tokview.sim import SimConfig, start_simulator


@pytest.fixture(scope="module")
def sim() -> Iterator[Any]:
    with start_simulator(SimConfig(kind="sglang")) as running:
        yield running


def _post(sim: Any, **body: Any) -> httpx.Response:
    return httpx.post(sim.url + "/v1/completions", json={"model": sim.cfg.model_name, "temperature": 0, **body})


def _chunks(text: str) -> list[Any]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


def test_ids_come_with_the_flag_in_each_choice_output_ids_first(sim: Any) -> None:
    answer = _post(sim, prompt=KIMI_PROMPT_6X7, max_tokens=12, return_token_ids=True).json()
    assert list(answer) == ["id", "object", "created", "model", "choices", "usage", "metadata"]
    [choice] = answer["choices"]
    assert list(choice) == [
        "index",
        "text",
        "logprobs",
        "finish_reason",
        "matched_stop",
        "token_ids",
        "prompt_token_ids",
    ]
    assert choice["prompt_token_ids"] == KIMI_PROMPT_6X7
    assert len(choice["token_ids"]) == answer["usage"]["completion_tokens"] == 12
    plain = _post(sim, prompt=KIMI_PROMPT_6X7, max_tokens=12).json()["choices"][0]
    assert list(plain) == ["index", "text", "logprobs", "finish_reason", "matched_stop"]  # left out, not null
    assert plain["text"] == choice["text"]


def test_a_stream_brings_each_chunks_new_ids_and_the_prompts_in_the_first(sim: Any) -> None:
    whole = _post(sim, prompt=KIMI_PROMPT_6X7, max_tokens=12, return_token_ids=True).json()["choices"][0]
    got = _post(
        sim,
        prompt=KIMI_PROMPT_6X7,
        max_tokens=12,
        stream=True,
        return_token_ids=True,
        stream_options={"include_usage": True},
    )
    assert got.status_code == 200 and got.text.endswith("data: [DONE]\n\n")
    chunks = _chunks(got.text)
    *tokens, usage = chunks
    assert [c["choices"][0]["token_ids"] for c in tokens] == [[i] for i in whole["token_ids"]]
    assert tokens[0]["choices"][0]["prompt_token_ids"] == KIMI_PROMPT_6X7
    assert all("prompt_token_ids" not in c["choices"][0] for c in tokens[1:])
    assert "".join(c["choices"][0]["text"] for c in tokens) == whole["text"]
    assert tokens[-1]["choices"][0]["finish_reason"] == whole["finish_reason"]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 12


def test_the_chat_endpoints_id_flags_are_ignored_here(sim: Any) -> None:
    flags = {"return_input_ids_in_sglext": True, "return_output_ids_in_sglext": True, "return_prompt_token_ids": True}
    streamed = _post(sim, prompt="Hi", max_tokens=4, stream=True, **flags)
    assert streamed.status_code == 200 and "sglext" not in streamed.text and "token_ids" not in streamed.text
    whole = _post(sim, prompt="Hi", max_tokens=4, **flags).json()["choices"][0]
    assert "prompt_token_ids" not in whole and "token_ids" not in whole


def test_echo_puts_the_prompt_text_first_with_ids_or_without(sim: Any) -> None:
    for ids in (False, True):
        text = _post(sim, prompt="Echo me", max_tokens=4, echo=True, return_token_ids=ids).json()["choices"][0]["text"]
        assert text.startswith("Echo me")


@pytest.mark.parametrize(
    "body",
    [{"prompt": []}, {"prompt": "x", "max_tokens": -1}, {"prompt": "x", "stream": "maybe"}, {"prompt": "x", "stop": 3}],
)
def test_a_bad_request_is_a_400_in_sglangs_shape(sim: Any, body: dict[str, Any]) -> None:
    got = _post(sim, **body)
    assert got.status_code == 400
    assert got.json()["object"] == "error" and got.json()["code"] == 400
