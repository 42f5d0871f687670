"""Spec-decode metrics and logprobs through the capture clients, from the real recordings over a socket."""

from __future__ import annotations

import copy
import json

import pytest
from facts import KIMI_CHAIN_OUTPUT
from replay import (
    OUTPUT,
    PROMPT,
    Replay,
    fast_pool,
    rec,
    request,
    serve,
    sglang_routes,
    stream_lines,
    vllm_routes,
)

from tokview.servers import CaptureFailed


def _as_token_ids(body):
    """The recording as vLLM answers with return_tokens_as_token_ids (strings → `token_id:N`)."""
    body = copy.deepcopy(body)
    choice = body["choices"][0]
    for tid, entry in zip(choice["token_ids"], choice["logprobs"]["content"]):
        entry["token"] = f"token_id:{tid}"
        for k, alt in enumerate(entry["top_logprobs"]):
            alt["token"] = f"token_id:{tid if k == 0 else 279}"
    return body


async def test_vllm_chat_spec_metrics_and_logprobs_recorded():
    routes = vllm_routes()
    routes["/v1/chat/completions"] = [{"json": _as_token_ids(rec("vllm_chat_specdec_logprobs.json"))}]
    replay = Replay(routes)
    with serve(replay) as url:
        async with fast_pool(url) as pool:
            cap = await pool.capture(request("chat", logprobs=2))
    sent = [b for p, b, _ in replay.seen if p == "/v1/chat/completions"][-1]
    assert sent["logprobs"] is True
    assert sent["top_logprobs"] == 2
    assert sent["return_tokens_as_token_ids"] is True
    assert cap.spec_decode["schema"] == "vllm"
    assert cap.spec_decode["per_step_accepted"] == [0, 0, 3]
    assert cap.spec_decode["mean_acceptance_length"] == 2.0
    assert len(cap.output_logprobs) == len(cap.output_ids) == 18
    assert cap.output_top_ids[0] == [cap.output_ids[0], 279]
    assert cap.output_top_logprobs[0][1] < -30


async def test_vllm_chat_logprobs_as_strings_are_refused_when_asked_and_ignored_otherwise():
    routes = vllm_routes()
    routes["/v1/chat/completions"] = [{"json": rec("vllm_chat_specdec_logprobs.json")}]
    with serve(Replay(routes)) as url:
        async with fast_pool(url, retries=0) as pool:
            cap = await pool.capture(request("chat"))
            assert cap.output_logprobs is None
            assert cap.spec_decode["steps"] == 3
            with pytest.raises(CaptureFailed, match="return_tokens_as_token_ids"):
                await pool.capture(request("chat", logprobs=2))


async def test_vllm_chat_stream_metrics_ride_the_usage_chunk():
    routes = vllm_routes()
    routes["/v1/chat/completions"] = [{"sse": stream_lines("vllm_chat_specdec_stream.txt")}]
    with serve(Replay(routes)) as url:
        async with fast_pool(url) as pool:
            cap = await pool.capture(request("chat", stream=True))
    assert len(cap.output_ids) == 18
    assert cap.spec_decode["steps"] == 3
    assert cap.spec_decode["histogram"] == [2, 0, 0, 1]


async def test_vllm_completions_summary_metrics_and_logprobs():
    body = rec("vllm_completions_specdec_prompt_logprobs.json")
    choice = body["choices"][0]
    choice.pop("prompt_token_ids", None)  # the recording's prompt, not this request's (an echo that differs fails)
    ids = choice["token_ids"]
    lps = choice["logprobs"]
    lps["tokens"] = [f"token_id:{t}" for t in ids]
    lps["top_logprobs"] = [{f"token_id:{t}": v for v in top.values()} for t, top in zip(ids, lps["top_logprobs"])]
    routes = vllm_routes()
    routes["/v1/completions"] = [{"json": body}]
    replay = Replay(routes)
    with serve(replay) as url:
        async with fast_pool(url) as pool:
            cap = await pool.capture(request("raw", logprobs=1))
    sent = [b for p, b, _ in replay.seen if p == "/v1/completions"][-1]
    assert sent["logprobs"] == 1
    assert sent["return_tokens_as_token_ids"] is True
    assert cap.spec_decode["steps"] == 0
    assert cap.spec_decode["per_step_accepted"] is None
    assert cap.output_logprobs == [0.0] * 18
    assert cap.output_top_ids[0] == [ids[0]]


async def test_sglang_generate_logprobs_recorded():
    answer = rec("sgl_generate_logprobs.json")
    answer["meta_info"].pop("prompt_tokens")  # the recording's prompt's count, not this request's
    routes = sglang_routes(**{"/generate": [{"json": answer}]})
    replay = Replay(routes)
    with serve(replay) as url:
        async with fast_pool(url) as pool:
            cap = await pool.capture(request("raw", logprobs=2))
    sent = [b for p, b, _ in replay.seen if p == "/generate"][-1]
    assert (sent["return_logprob"], sent["top_logprobs_num"], sent["logprob_start_len"]) == (True, 2, -1)
    assert cap.output_ids == KIMI_CHAIN_OUTPUT
    assert len(cap.output_logprobs) == 18
    assert cap.output_top_ids[0] == [256, 264]
    assert cap.spec_decode is None


SPEC_META = {
    "sglang-0.5.10": {"spec_accept_token_num": 8, "spec_draft_token_num": 24, "spec_accept_histogram": [4, 2, 1, 1]},
    "sglang-0.5.11": {"spec_accepted_drafts": 8, "spec_proposed_drafts": 24, "spec_accept_histogram": [4, 2, 1, 1]},
    "sglang-0.5.12": {
        "spec_num_correct_drafts": 8,
        "spec_num_proposed_drafts": 24,
        "spec_correct_drafts_histogram": [4, 2, 1, 1],
    },
}


@pytest.mark.parametrize("schema", sorted(SPEC_META))
@pytest.mark.parametrize("stream", [False, True])
async def test_sglang_generate_spec_metrics_every_schema(schema, stream):
    meta = {"spec_verify_ct": 8, "spec_accept_rate": 1 / 3, "spec_accept_length": 18 / 8, **SPEC_META[schema]}
    body = rec("sgl_generate.json")
    body["meta_info"].update(meta)
    if stream:
        chunks = []
        for k in range(1, len(OUTPUT) + 1):
            last = k == len(OUTPUT)
            m = dict(body["meta_info"]) if last else {"completion_tokens": k, "finish_reason": None}
            chunks.append("data: " + json.dumps({"text": "", "output_ids": OUTPUT[:k], "meta_info": m}) + "\n\n")
        answer = {"sse": chunks + ["data: [DONE]\n\n"]}
    else:
        answer = {"json": body}
    with serve(Replay(sglang_routes(**{"/generate": [answer]}))) as url:
        async with fast_pool(url) as pool:
            cap = await pool.capture(request("raw", stream=stream))
    spec = cap.spec_decode
    assert spec["schema"] == schema
    assert (spec["steps"], spec["accepted"], spec["drafted"]) == (8, 8, 24)
    assert spec["mean_acceptance_length"] == 2.0
    assert spec["reported"]["spec_accept_length"] == 18 / 8
    assert spec["histogram"] == [4, 2, 1, 1]
    assert cap.prompt_ids == PROMPT


async def test_sglang_cumulative_stream_with_sliced_logprobs_is_joined():
    """Cumulative output_ids but logprob arrays sliced per chunk: the slices are joined, not refused."""
    body = rec("sgl_generate_logprobs.json")
    meta = body["meta_info"]
    chunks = []
    for k in range(1, len(OUTPUT) + 1):
        last = k == len(OUTPUT)
        m = {
            "completion_tokens": k,
            "finish_reason": meta["finish_reason"] if last else None,
            "output_token_logprobs": meta["output_token_logprobs"][k - 1 : k],
            "output_top_logprobs": meta["output_top_logprobs"][k - 1 : k],
        }
        chunks.append("data: " + json.dumps({"text": "", "output_ids": OUTPUT[:k], "meta_info": m}) + "\n\n")
    routes = sglang_routes(**{"/generate": [{"sse": chunks + ["data: [DONE]\n\n"]}]})
    with serve(Replay(routes)) as url:
        async with fast_pool(url) as pool:
            cap = await pool.capture(request("raw", stream=True, logprobs=2))
    assert cap.output_ids == OUTPUT
    assert len(cap.output_logprobs) == 18
    assert cap.output_top_ids[0] == [256, 264]


def test_sglangs_abort_is_said_as_sglang_says_it_not_as_a_changed_prompt() -> None:
    """SGLang answers a prompt past its context with an abort whose `prompt_tokens` is 1 (it keeps [0] as the
    prompt): the prompt-echo check ran first and put it down to something changing the prompt on its way."""
    import pytest

    from tokview.servers.errors import CaptureFailed
    from tokview.servers.sglang import capture_from_generate

    meta = {"finish_reason": {"type": "abort", "message": "too long"}, "prompt_tokens": 1}
    abort = {"text": "", "output_ids": [], "meta_info": meta}
    with pytest.raises(CaptureFailed, match="SGLang aborted the request on POST /generate: too long"):
        capture_from_generate(abort, list(range(40)))
    answer = {"text": "x", "output_ids": [5], "meta_info": {"finish_reason": {"type": "length"}, "prompt_tokens": 39}}
    with pytest.raises(CaptureFailed, match="says it read 39 prompt ids where 40 were sent"):
        capture_from_generate(answer, list(range(40)))
