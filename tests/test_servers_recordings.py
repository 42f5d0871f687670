"""Capture clients against the verbatim real-server recordings, replayed over a real socket
(tests/replay.py: the scripted server and the recorded routes), so the clients parse exactly the bytes
vLLM 0.32 and SGLang 0.5.23 sent."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import pytest
from facts import IM_END
from replay import (
    MESSAGES,
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

from tokview.servers import CaptureFailed, CaptureRequest, ServerUnreachable
from tokview.servers.sglang import stream_mode


async def test_sglang_generate_recorded() -> None:
    replay = Replay(sglang_routes())
    with serve(replay) as url:
        async with fast_pool(url) as pool:
            cap = await pool.capture(request("raw"))
            info = pool.server_info()[0]
    assert (info["kind"], info["version"], info["model"]) == ("sglang", "0.5.23", "tiny-kimi")
    assert info["features"]["generate_ids"] is True
    assert info["features"]["chat_ids_field"] == "response_token_ids"
    assert info["features"]["reasoning_field"] == "reasoning_content"
    assert cap.prompt_ids == PROMPT
    assert cap.output_ids == OUTPUT
    assert (cap.finish_reason, cap.matched_stop, cap.endpoint) == ("stop", IM_END, "sglang-generate")
    assert cap.usage == {"prompt_tokens": 28, "completion_tokens": 18, "reasoning_tokens": 0}
    assert cap.settings["seed"] == 7
    assert cap.settings["chat_template_kwargs"] == {"thinking": True}
    assert cap.settings["backend"] == "sglang"
    assert cap.messages == MESSAGES
    _path, body, headers = [s for s in replay.seen if s[0] == "/generate"][-1]
    assert headers["content-type"] == "application/json"
    assert body["input_ids"] == PROMPT
    assert body["sampling_params"] == {
        "max_new_tokens": 64,
        "temperature": 0.0,
        "top_p": 1.0,
        "skip_special_tokens": False,
        "no_stop_trim": True,
        "sampling_seed": 7,
    }
    assert cap.raw_request is not None
    assert cap.raw_request["body"] == body
    assert cap.raw_response == rec("sgl_generate.json")


def _generate_chunks(ids: list[int], cumulative: bool) -> list[str]:
    lines = []
    for i in range(len(ids)):
        part = ids[: i + 1] if cumulative else ids[i : i + 1]
        done = i == len(ids) - 1
        meta = {
            "finish_reason": {"type": "stop", "matched": IM_END} if done else None,
            "prompt_tokens": 28,
            "completion_tokens": i + 1,
        }
        lines.append("data: " + json.dumps({"text": "x", "output_ids": part, "meta_info": meta}) + "\n\n")
    return lines + ["data: [DONE]\n\n"]


@pytest.mark.parametrize("cumulative", [True, False])
async def test_sglang_generate_stream_modes(cumulative: bool) -> None:
    routes = sglang_routes()
    routes["/generate"] = [{"json": rec("sgl_generate.json")}, {"sse": _generate_chunks(OUTPUT, cumulative)}]
    with serve(Replay(routes)) as url:
        async with fast_pool(url) as pool:
            cap = await pool.capture(request("raw", stream=True))
    assert cap.output_ids == OUTPUT
    assert cap.finish_reason == "stop"
    assert cap.matched_stop == IM_END
    assert cap.raw_response["mode"] == ("cumulative" if cumulative else "incremental")


def test_stream_mode_ambiguous_repeats_settled_by_count() -> None:
    # deltas that also read as a cumulative stream: the final completion_tokens decides
    assert stream_mode([[5], [5]], completion_tokens=2) == "incremental"
    assert stream_mode([[5], [5, 6]], completion_tokens=2) == "cumulative"
    assert stream_mode([[5], [5, 6]], completion_tokens=3) == "incremental"
    assert stream_mode([[1, 2], [3]], completion_tokens=None) == "incremental"


async def test_sglang_stream_error_chunk_is_capture_failed() -> None:
    routes = sglang_routes()
    err = [
        'data: {"text":"Ok","output_ids":[256],"meta_info":{"finish_reason":null}}\n\n',
        'data: {"error": {"message": "out of KV cache"}}\n\n',
        "data: [DONE]\n\n",
    ]
    routes["/generate"] = [{"json": rec("sgl_generate.json")}, {"sse": err}]
    with serve(Replay(routes)) as url:
        async with fast_pool(url) as pool:
            with pytest.raises(CaptureFailed, match="out of KV cache"):
                await pool.capture(request("raw", stream=True))


async def test_sglang_chat_and_dual_recorded() -> None:
    with serve(Replay(sglang_routes())) as url:
        async with fast_pool(url) as pool:
            chat = await pool.capture(request("chat"))
            dual = await pool.capture(request("dual"))
    assert chat.endpoint == "sglang-chat"
    assert chat.prompt_ids == PROMPT
    assert chat.output_ids == OUTPUT
    assert chat.reasoning == "Okay, let me think about this carefully."
    assert chat.reasoning_field == "reasoning_content"
    assert chat.content == "The answer is forty-two!"
    assert chat.matched_stop == IM_END
    assert chat.usage["reasoning_tokens"] == 10
    assert dual.endpoint == "dual"
    assert dual.output_ids == OUTPUT
    assert dual.parsed_output_ids == OUTPUT
    assert dual.reasoning == chat.reasoning
    assert dual.parsed_raw_response == rec("sgl_chat_ns.json")
    assert dual.raw_response == rec("sgl_generate.json")
    assert dual.raw_request is not None
    assert dual.raw_request["parsed"]["body"]["return_token_ids"]


async def test_sglang_chat_stream_refusal_is_clear() -> None:
    routes = sglang_routes()
    routes["/v1/chat/completions"] = [
        {"json": rec("sgl_chat_ns.json")},
        {"status": 400, "text": rec("sgl_chat_stream.txt")},
    ]
    with serve(Replay(routes)) as url:
        async with fast_pool(url, backend="sglang-chat") as pool:
            with pytest.raises(CaptureFailed) as exc:
                await pool.capture(request("chat"))
    assert "HTTP 400" in exc.value.reason
    assert "not supported with streaming" in exc.value.reason


# -- vLLM -------------------------------------------------------------------------------------
async def test_vllm_chat_completions_and_stream_recorded() -> None:
    routes = vllm_routes()
    with serve(Replay(routes)) as url:
        async with fast_pool(url) as pool:
            chat = await pool.capture(request("chat"))
            comp = await pool.capture(request("raw"))
            routes["/v1/chat/completions"] = [{"sse": stream_lines("vllm_chat_stream.txt")}]
            streamed = await pool.capture(request("chat", stream=True))
            info = pool.server_info()[0]
    assert (info["kind"], info["version"]) == ("vllm", "0.32.0")
    assert info["features"]["chat_ids_field"] == "token_ids"
    assert info["features"]["completions_ids"] is True
    assert info["features"]["reasoning_field"] == "reasoning"
    for cap in (chat, streamed):
        assert cap.prompt_ids == PROMPT
        assert cap.output_ids == OUTPUT
        assert cap.endpoint == "vllm-chat"
        assert cap.reasoning == "Okay, let me think about this carefully."
        assert cap.reasoning_field == "reasoning"
        assert cap.content == "The answer is forty-two!"
        assert cap.finish_reason == "stop"
        assert cap.usage == {"prompt_tokens": 28, "completion_tokens": 18, "reasoning_tokens": 9}
    assert comp.endpoint == "vllm-completions"
    assert comp.output_ids == OUTPUT
    assert comp.prompt_ids == PROMPT
    assert comp.raw_request is not None
    assert comp.raw_request["body"]["prompt"] == PROMPT
    assert comp.raw_request["body"]["return_token_ids"] is True


async def test_vllm_reasoning_content_fallback() -> None:
    old = rec("vllm_chat_kimi_k2.json")
    msg = old["choices"][0]["message"]
    msg["reasoning_content"] = msg.pop("reasoning")
    routes = vllm_routes()
    routes["/v1/chat/completions"] = [{"json": old}]
    with serve(Replay(routes)) as url:
        async with fast_pool(url) as pool:
            cap = await pool.capture(request("dual"))
    assert cap.reasoning_field == "reasoning_content"
    assert cap.reasoning is not None
    assert cap.reasoning.startswith("Okay")
    assert cap.endpoint == "dual"
    assert cap.output_ids == OUTPUT
    assert cap.parsed_output_ids == OUTPUT


async def test_vllm_render_via_server_tokenize_without_tokenizer() -> None:
    replay = Replay(vllm_routes())
    with serve(replay) as url:
        async with fast_pool(url) as pool:
            cap = await pool.capture(CaptureRequest(messages=MESSAGES, settings={"thinking": True}))
    assert cap.prompt_ids == PROMPT
    tok_body = [b for p, b, _ in replay.seen if p == "/tokenize"][-1]
    assert tok_body["messages"] == MESSAGES
    assert tok_body["chat_template_kwargs"] == {"thinking": True}


# -- faults -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "fault",
    [
        {"status": 503, "json": {"object": "error", "message": "busy"}},
        {"status": 429, "json": {"message": "slow down"}, "headers": {"Retry-After": "0"}},
        {"status": 200, "text": "{not json"},
        {"stall": 5},
    ],
)
async def test_retryable_faults_then_success(fault: dict[str, Any]) -> None:
    routes = sglang_routes()
    good = {"json": rec("sgl_generate.json")}
    routes["/generate"] = [good, fault, good]  # the probe, one fault, then fine
    with serve(Replay(routes)) as url:
        async with fast_pool(url, timeout=0.5) as pool:
            started = time.monotonic()
            cap = await pool.capture(request("raw"))
            elapsed = time.monotonic() - started
    assert cap.output_ids == OUTPUT
    assert elapsed < 3


async def test_a_retry_after_is_waited_at_most_the_requests_timeout() -> None:
    """A 429 saying `Retry-After: 3600` parked each request for the 120 s cap, with no line said, whatever `--timeout`
    asked: the wait is now bounded by the timeout too."""
    routes = sglang_routes()
    good = {"json": rec("sgl_generate.json")}
    slow = {"status": 429, "json": {"message": "slow down"}, "headers": {"Retry-After": "3600"}}
    routes["/generate"] = [good, slow, good]
    with serve(Replay(routes)) as url:
        async with fast_pool(url, timeout=1.0) as pool:
            assert pool.policy.max_retry_after == 1.0
            started = time.monotonic()
            cap = await pool.capture(request("raw"))
            elapsed = time.monotonic() - started
    assert cap.output_ids == OUTPUT
    assert 0.9 < elapsed < 5


@pytest.mark.parametrize(
    "fault,reason",
    [
        ({"status": 500, "json": {"object": "error", "message": "boom"}}, "HTTP 500 from POST /generate: boom"),
        ({"status": 200, "text": "<html>"}, "malformed response"),
        ({"stall": 5}, "timed out after 0.3s"),
    ],
)
async def test_retryable_faults_forever_fail_clearly(fault: dict[str, Any], reason: str) -> None:
    routes = sglang_routes()
    routes["/generate"] = [{"json": rec("sgl_generate.json")}, fault]
    with serve(Replay(routes)) as url:
        async with fast_pool(url, timeout=0.3, retries=1) as pool:
            with pytest.raises(CaptureFailed) as exc:
                await pool.capture(request("raw"))
    assert reason in exc.value.reason
    assert "gave up after 2 attempts" in exc.value.reason


async def test_client_errors_fail_at_once_with_server_message() -> None:
    routes = sglang_routes()
    routes["/generate"] = [
        {"json": rec("sgl_generate.json")},
        {"status": 400, "json": {"error": {"message": "input_ids too long"}}},
    ]
    replay = Replay(routes)
    with serve(replay) as url:
        async with fast_pool(url) as pool:
            with pytest.raises(CaptureFailed) as exc:
                await pool.capture(request("raw"))
    assert exc.value.reason == "HTTP 400 from POST /generate: input_ids too long"
    assert exc.value.status == 400
    assert replay.counts["/generate"] == 2  # the probe and one attempt: no retry


async def test_api_key_sent_but_never_stored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKVIEW_API_KEY", "sk-secret-123")
    replay = Replay(sglang_routes())
    with serve(replay) as url:
        async with fast_pool(url) as pool:
            cap = await pool.capture(request("dual"))
    assert all(h.get("authorization") == "Bearer sk-secret-123" for _, _, h in replay.seen)
    assert "sk-secret" not in json.dumps(cap.to_dict())


async def test_unreachable_pool_raises() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    pool = fast_pool(f"http://127.0.0.1:{port}")
    with pytest.raises(ServerUnreachable, match="no server answered"):
        await pool.start()
