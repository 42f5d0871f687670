"""The simulator cuts a generation at the request's stop strings as vLLM and SGLang do: the ids end with the id that
completed the string, the text ends before it (or after it: vLLM's `include_stop_str_in_output`, SGLang's
`no_stop_trim`), and the string is named (`stop_reason`, `matched_stop`). Streamed text joins to the same text."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tokview.sim import SimConfig, start_simulator

QUESTION = [{"role": "user", "content": "What is 6 times 7?"}]
STOP = ["seven", "let me"]


@pytest.fixture(scope="module", params=["vllm", "sglang"])
def sim(request) -> Any:
    with start_simulator(SimConfig(kind=request.param)) as running:
        yield running


def _streamed_text(response: httpx.Response, field: str) -> str:
    text = ""
    for line in response.text.splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:]).get("choices") or []:
                text += (choice.get("delta") or {}).get(field) or choice.get("text") or ""
    return text


def test_chat_is_cut_at_a_stop_string_streamed_or_not(sim):
    reasoning = "reasoning" if sim.cfg.kind == "vllm" else "reasoning_content"
    body = {"messages": QUESTION, "max_tokens": 300, "return_token_ids": True}
    whole = httpx.post(sim.url + "/v1/chat/completions", json=body).json()["choices"][0]
    cut = httpx.post(sim.url + "/v1/chat/completions", json={**body, "stop": STOP}).json()["choices"][0]
    full_reasoning = whole["message"][reasoning]
    at = min(full_reasoning.find(s) for s in STOP if s in full_reasoning)  # (both end inside one id: the first)
    assert cut["finish_reason"] == "stop"
    first = min((s for s in STOP if s in full_reasoning), key=lambda s: full_reasoning.find(s) + len(s))
    assert (cut.get("stop_reason") or cut.get("matched_stop")) == first
    assert cut["message"][reasoning].strip() == full_reasoning[:at].strip()
    ids_key = "token_ids" if "token_ids" in cut else "response_token_ids"
    whole_ids, cut_ids = whole[ids_key], cut[ids_key]
    assert cut_ids == whole_ids[: len(cut_ids)] and len(cut_ids) < len(whole_ids)
    asked = {"messages": QUESTION, "max_tokens": 300, "stop": STOP, "stream": True}  # (SGLang streams no ids)
    streamed = httpx.post(sim.url + "/v1/chat/completions", json=asked)
    joined = _streamed_text(streamed, reasoning)
    if sim.cfg.kind == "sglang":  # its parser strips the reasoning of a whole answer, never a stream's deltas
        joined = joined.strip()
    assert joined == cut["message"][reasoning]


def test_raw_text_is_cut_and_kept_as_asked(sim):
    if sim.cfg.kind == "vllm":
        path, body = "/v1/completions", {"prompt": "Count: one two three", "max_tokens": 200, "return_token_ids": True}
        keep_flag: dict[str, Any] = {"include_stop_str_in_output": True}

        def text(r: dict[str, Any]) -> str:
            return r["choices"][0]["text"]

        def named(r: dict[str, Any]) -> Any:
            return r["choices"][0]["stop_reason"]
    else:
        path, body = "/generate", {"text": "Count: one two three", "sampling_params": {"max_new_tokens": 200}}
        keep_flag = {"no_stop_trim": True}

        def text(r: dict[str, Any]) -> str:
            return r["text"]

        def named(r: dict[str, Any]) -> Any:
            return r["meta_info"]["finish_reason"]["matched"]

    def ask(**sampling: Any) -> dict[str, Any]:
        if path == "/generate":
            return httpx.post(
                sim.url + path, json={**body, "sampling_params": {**body["sampling_params"], **sampling}}
            ).json()
        return httpx.post(sim.url + path, json={**body, **sampling}).json()

    whole = text(ask())
    stop = next(s for s in ("think", "question", "careful", "answer") if s in whole)
    cut, kept = ask(stop=stop), ask(stop=[stop], **keep_flag)
    assert named(cut) == named(kept) == stop
    assert text(cut) == whole[: whole.find(stop)]
    assert text(kept) == whole[: whole.find(stop) + len(stop)]


def test_a_stop_that_is_no_string_is_refused(sim):
    got = httpx.post(sim.url + "/v1/chat/completions", json={"messages": QUESTION, "stop": [1, 2]})
    assert got.status_code == 400
    assert "stop must be a string or a list of strings" in got.text
