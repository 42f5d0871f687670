"""Capture clients and the pool against the simulator over real sockets: every endpoint family,
both SGLang stream modes, every fault flag, and a pool with a dead server.

Faults are armed after the pool has probed (`sim.state.faults`), so each one hits a capture, not
the connect-time probe.
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import pytest
from facts import IM_END, THINK_CLOSE, THINK_OPEN

from tokview.core.analysis import analyze
from tokview.core.profiles import get_profile
from tokview.servers import CaptureFailed, CaptureRequest, ServerPool
from tokview.sim import SimConfig, launch, start_simulator
from tokview.sim.faults import FaultBook

QUESTION = [{"role": "user", "content": "What is 6 times 7?"}]
KIMI = get_profile("kimi-k2.5")


def pool_for(urls: Any, tok: Any, **kw: Any) -> ServerPool:
    kw.setdefault("timeout", 2.0)
    kw.setdefault("retries", 3)
    kw.setdefault("backoff", 0.01)
    return ServerPool(urls, tokenizer=tok, profile=KIMI, **kw)


def req(mode: str = "raw", stream: bool = False, **settings: Any) -> CaptureRequest:
    return CaptureRequest(
        messages=QUESTION,
        settings={"temperature": 0.0, "max_new_tokens": 400, "seed": 3, "thinking": True, **settings},
        mode=mode,
        stream=stream,
    )


def assert_kimi_shape(cap: Any) -> None:
    assert cap.prompt_ids[-1] == THINK_OPEN
    assert cap.output_ids[-1] == IM_END
    assert cap.output_ids.count(THINK_CLOSE) == 1
    assert cap.finish_reason == "stop"


@pytest.mark.parametrize("quirks", [{}, {"incremental-streaming": True}])
async def test_sglang_generate_plain_and_both_stream_modes(kimi_tok: Any, quirks: dict[str, Any]) -> None:
    with start_simulator(SimConfig(kind="sglang", quirks=quirks)) as sim:
        async with pool_for(sim.url, kimi_tok) as pool:
            plain = await pool.capture(req("raw"))
            streamed = await pool.capture(req("raw", stream=True))
    assert_kimi_shape(plain)
    assert plain.endpoint == streamed.endpoint == "sglang-generate"
    assert plain.matched_stop == IM_END
    assert streamed.output_ids == plain.output_ids
    assert streamed.text == plain.text
    assert streamed.raw_response["mode"] == ("incremental" if quirks else "cumulative")
    assert plain.usage["completion_tokens"] == len(plain.output_ids)
    assert plain.text is not None
    assert "</think>" in plain.text
    assert plain.text.endswith("<|im_end|>")  # skip_special false, no_stop_trim
    assert analyze(plain, KIMI, kimi_tok).valid


@pytest.mark.parametrize("ids_name", ["response_token_ids", "token_ids"])
async def test_sglang_chat_and_dual(kimi_tok: Any, ids_name: str) -> None:
    cfg = SimConfig(kind="sglang", think_special=False, quirks={"sglang-chat-ids": ids_name})
    with start_simulator(cfg) as sim:
        async with pool_for(sim.url, kimi_tok) as pool:
            chat = await pool.capture(req("chat"))
            dual = await pool.capture(req("dual"))
            features = pool.server_info()[0]["features"]
    assert features["chat_ids_field"] == ids_name
    assert features["reasoning_field"] == "reasoning_content"
    assert chat.endpoint == "sglang-chat"
    assert chat.reasoning_field == "reasoning_content"
    assert chat.reasoning
    assert dual.endpoint == "dual"
    assert dual.parsed_output_ids == dual.output_ids == chat.output_ids
    assert dual.reasoning == chat.reasoning
    assert dual.content == chat.content
    assert dual.text is None


async def test_vllm_all_paths_agree(kimi_tok: Any) -> None:
    with start_simulator(SimConfig(kind="vllm")) as sim:
        async with pool_for(sim.url, kimi_tok) as pool:
            caps = {
                name: await pool.capture(r)
                for name, r in {
                    "raw": req("raw"),
                    "chat": req("chat"),
                    "stream": req("chat", stream=True),
                    "dual": req("dual"),
                    "dual_stream": req("dual", stream=True),
                }.items()
            }
    ids = {name: cap.output_ids for name, cap in caps.items()}
    assert len({tuple(v) for v in ids.values()}) == 1, ids
    assert caps["raw"].endpoint == "vllm-completions"
    assert caps["stream"].endpoint == "vllm-chat"
    assert caps["stream"].reasoning == caps["chat"].reasoning
    assert caps["stream"].reasoning_field == "reasoning"
    assert caps["dual_stream"].parsed_output_ids == caps["raw"].output_ids
    for cap in caps.values():
        assert_kimi_shape(cap)
        assert cap.settings["seed"] == 3
        assert cap.settings["chat_template_kwargs"] == {"thinking": True}


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
async def test_a_pool_probed_before_the_tokenizer_adopts_it(kimi_tok: Any, kind: str) -> None:
    """A pool probed with template settings and no tokenizer (a resume probing while its tokenizer loads) takes
    the tokenizer and profile when the settings match and every raw probe had the server's own prompt ids, and
    captures with them as a pool probed with them does; settings that differ, or a server whose raw probe had no
    prompt ids (it was skipped), are refused and leave the pool as it was."""
    with start_simulator(SimConfig(kind=kind)) as sim:
        async with ServerPool(sim.url, timeout=2.0, probe_kwargs={"thinking": False}) as other:
            assert not other.adopt(kimi_tok, KIMI)
            assert other.tokenizer is None and other.profile is None
        async with ServerPool(sim.url, timeout=2.0, probe_kwargs=KIMI.template_kwargs(True)) as pool:
            async with pool_for(sim.url, kimi_tok) as probed:
                assert pool.server_info()[0]["features"] == probed.server_info()[0]["features"]
                expected = await probed.capture(req("raw"))
            assert pool.adopt(kimi_tok, KIMI)
            assert (pool.tokenizer, pool.profile) == (kimi_tok, KIMI)
            assert (await pool.capture(req("raw"))).output_ids == expected.output_ids
        async with ServerPool(sim.url, timeout=2.0, probe_kwargs=KIMI.template_kwargs(True)) as unready:
            for server in unready._servers:  # what a server without /tokenize nor chat prompt ids leaves
                assert server.info is not None
                server.info.details.pop("probe_prompt_ids", None)
                server.info.details.pop("tokenize_prompt_ids", None)
            assert not unready.adopt(kimi_tok, KIMI)


async def test_vllm_pre_016_reasoning_content(kimi_tok: Any) -> None:
    with start_simulator(SimConfig(kind="vllm", quirks={"vllm-pre-0.16": True})) as sim:
        async with pool_for(sim.url, kimi_tok) as pool:
            plain = await pool.capture(req("chat"))
            streamed = await pool.capture(req("chat", stream=True))
    assert plain.reasoning_field == streamed.reasoning_field == "reasoning_content"
    assert plain.reasoning
    assert plain.reasoning == streamed.reasoning


async def test_no_id_fields_fails_clearly_on_chat(kimi_tok: Any) -> None:
    with start_simulator(SimConfig(kind="vllm", quirks={"no-id-fields": True})) as sim:
        async with pool_for(sim.url, kimi_tok) as pool:
            with pytest.raises(CaptureFailed, match="returned no token ids"):
                await pool.capture(req("chat"))
            with pytest.raises(CaptureFailed, match="no token_ids"):
                await pool.capture(req("raw"))


# -- faults -----------------------------------------------------------------------------------------
RETRIED = ["http-500", "http-503", "http-429", "malformed-json", "drop-connection", "stall"]


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
@pytest.mark.parametrize("fault", RETRIED)
async def test_fault_retried_then_captured(kimi_tok: Any, kind: str, fault: str) -> None:
    with start_simulator(SimConfig(kind=kind)) as sim:
        async with pool_for(sim.url, kimi_tok, timeout=0.5) as pool:
            sim.state.faults = FaultBook({fault: 2})
            started = time.monotonic()
            cap = await pool.capture(req("raw", stream=kind == "sglang"))
            elapsed = time.monotonic() - started
    assert_kimi_shape(cap)
    assert sim.stats.faults[fault] == 2
    assert elapsed < 5


@pytest.mark.parametrize(
    "fault,reason",
    [
        ("http-500", "HTTP 500 from POST"),
        ("http-503", "HTTP 503 from POST"),
        ("http-429", "HTTP 429 from POST"),
        ("malformed-json", "malformed response"),
        ("drop-connection", "connection lost"),
        ("stall", "timed out after 0.3s"),
    ],
)
async def test_fault_forever_is_capture_failed(kimi_tok: Any, fault: str, reason: str) -> None:
    with start_simulator(SimConfig(kind="vllm")) as sim:
        async with pool_for(sim.url, kimi_tok, timeout=0.3, retries=2) as pool:
            sim.state.faults = FaultBook({fault: True})
            started = time.monotonic()
            with pytest.raises(CaptureFailed) as exc:
                await pool.capture(req("raw"))
            elapsed = time.monotonic() - started
    assert reason in exc.value.reason, exc.value.reason
    assert "gave up after 3 attempts" in exc.value.reason, exc.value.reason
    assert elapsed < 5


async def test_stream_error_chunk_is_capture_failed(kimi_tok: Any) -> None:
    with start_simulator(SimConfig(kind="sglang")) as sim:
        async with pool_for(sim.url, kimi_tok) as pool:
            sim.state.faults = FaultBook({"stream-error": 1})
            with pytest.raises(CaptureFailed, match="aborted the stream"):
                await pool.capture(req("raw", stream=True))
            assert_kimi_shape(await pool.capture(req("raw", stream=True)))  # the next one is fine


# -- pool -------------------------------------------------------------------------------------------
def closed_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


async def test_pool_one_of_three_dead(kimi_tok: Any) -> None:
    dead = f"http://127.0.0.1:{closed_port()}"
    with start_simulator(SimConfig(kind="vllm")) as a, start_simulator(SimConfig(kind="vllm")) as b:
        async with pool_for([a.url, dead, b.url], kimi_tok, concurrency=2, connect_timeout=0.5) as pool:
            caps = [await pool.capture(req("raw")) for _ in range(6)]
            info = {s["url"]: s for s in pool.server_info()}
        assert a.stats.generation >= 3
        assert b.stats.generation >= 3  # round-robin over the live two
    assert len({tuple(c.output_ids) for c in caps}) == 1
    assert not info[dead]["healthy"]
    assert "cannot connect" in info[dead]["last_error"]
    assert info[a.url]["healthy"]
    assert info[b.url]["kind"] == "vllm"


async def test_pool_evicts_a_server_that_dies_and_reprobes_it(kimi_tok: Any) -> None:
    with start_simulator(SimConfig(kind="vllm")) as a:
        b = launch(SimConfig(kind="vllm"))  # a bare __enter__() on a temporary would stop it at once
        port = b.port
        async with pool_for([a.url, b.url], kimi_tok, evict_after=1, reprobe_interval=0.0, connect_timeout=0.5) as pool:
            b.stop()
            for _ in range(3):
                assert_kimi_shape(await pool.capture(req("raw")))  # retried onto the live server
            assert not {s["url"]: s for s in pool.server_info()}[b.url]["healthy"]
            with start_simulator(SimConfig(kind="vllm", port=port)) as b2:
                for _ in range(4):
                    await pool.capture(req("raw"))
                    await asyncio.sleep(0.05)
                assert {s["url"]: s for s in pool.server_info()}[b2.url]["healthy"]
                assert b2.stats.generation >= 1


async def test_generation_sent_is_told_by_a_generation_never_by_a_probe_a_capture_started(kimi_tok: Any) -> None:
    """`generation_sent` (a `--workers` batch spawns its children on it) is set once a capture's request is out. A
    capture that re-probes an evicted server it then cannot reach sends nothing: the probe's /health (over httpx,
    whose hook tells before it connects) set it all the same."""
    with start_simulator(SimConfig(kind="vllm")) as sim:
        pool = pool_for(sim.url, kimi_tok, retries=0)
        await pool.start()
    try:
        pool._servers[0].evicted_at = time.monotonic()  # as failed connects in a row leave it; its server is gone
        with pytest.raises(CaptureFailed):
            await pool.capture(req("raw"))
        assert not pool.generation_sent.is_set()
        with start_simulator(SimConfig(kind="vllm", port=int(sim.url.rsplit(":", 1)[1]))):
            assert_kimi_shape(await pool.capture(req("raw")))  # re-probed, then generated
        assert pool.generation_sent.is_set()
    finally:
        await pool.aclose()


async def test_concurrent_captures_over_a_capped_server_all_complete(kimi_tok: Any) -> None:
    with start_simulator(SimConfig(kind="vllm", latency_s=0.05)) as sim:
        async with pool_for(sim.url, kimi_tok, concurrency=3) as pool:
            caps = await asyncio.gather(*(pool.capture(req("raw", seed=i)) for i in range(9)))
    assert len(caps) == 9
    assert all(c.output_ids[-1] == IM_END for c in caps)
