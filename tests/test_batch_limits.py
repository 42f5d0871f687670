"""Prompts longer than the server's max_model_len are failed as `over_max_length` before they are sent,
measured without tokenizing when a bound already decides, over real sockets against the simulator."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from builders import kimi, profile

from tokview.batch import BatchConfig, run_batch
from tokview.batch.limits import prompt_length
from tokview.cli import main
from tokview.servers import CaptureRequest, ServerPool
from tokview.servers.features import context_limit
from tokview.sim import SimConfig, start_simulator
from tokview.store import Store

LIMIT = 600


def _prompts(tmp_path: Path) -> Path:
    path = tmp_path / "p.jsonl"
    rows = [
        {"id": "short", "prompt": "hello"},
        {"id": "fits", "prompt": "the " * 150},  # 683 rendered bytes but 313 tokens: counted exactly, fits
        {"id": "long", "prompt": "the " * 1000},  # 2013 tokens
        {"id": "huge", "prompt": "word " * 600_000},
    ]  # 3 MB: refused by the lower bound, never tokenized
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("kind, generate_path", [("vllm", "/v1/completions"), ("sglang", "/generate")])
async def test_over_max_length_is_recorded_and_never_sent(tmp_path, kind, generate_path):
    with start_simulator(SimConfig(kind=kind, max_model_len=LIMIT)) as sim:
        config = BatchConfig(
            servers=[sim.url],
            prompts_path=_prompts(tmp_path),
            tokenizer=kimi(),
            model_profile=profile(),
            max_new_tokens=20,
            timeout=10.0,
        )
        with Store(tmp_path / "s.duckdb") as store:
            summary = await run_batch(config, store)
            reasons = dict(store.query("SELECT prompt_id, reason FROM failures"))
        sent = sim.stats.requests[generate_path]
    assert (summary.ok, summary.failed) == (2, 2)
    assert summary.balanced
    assert summary.failures_by_class == {"over_max_length": 2}
    assert reasons["long"] == (
        f"over_max_length: the prompt has 2013 tokens; the server's max_model_len is {LIMIT}, "
        f"which leaves no room for output: shorten or drop this prompt"
    )
    assert reasons["huge"].startswith("over_max_length: the prompt has at least ")
    assert "counted without tokenizing it" in reasons["huge"]
    assert sent == 1 + 2  # the probe's 1-token request and the two prompts that fit: nothing else went out


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
async def test_the_probe_learns_max_model_len(kind):
    with start_simulator(SimConfig(kind=kind, max_model_len=1234)) as sim:
        async with ServerPool(sim.url, tokenizer=kimi(), profile=profile(), timeout=5.0) as pool:
            (info,) = pool.server_info()
    assert info["max_model_len"] == 1234


def test_context_limit_reads_every_shape_servers_use():
    assert context_limit({"object": "list", "data": [{"id": "m", "max_model_len": 2048}]}) == 2048  # vLLM 0.32
    assert context_limit(None, {"model_path": "m"}, {"context_length": 4096}) == 4096  # SGLang /get_server_info
    assert context_limit({"tokens": [1], "count": 1, "max_model_len": 512}) == 512  # /tokenize
    assert context_limit({"data": [{"id": "m"}]}, {"context_length": None}, {"max_model_len": 0}) is None


def test_bounds_decide_without_tokenizing_and_agree_with_the_exact_count():
    tok, prof = kimi(), profile()
    huge = CaptureRequest(messages=[{"role": "user", "content": "word " * 600_000}])
    assert prompt_length(huge, tok, prof, LIMIT) == (3_000_000 // 28 + 1, False)
    short = CaptureRequest(messages=[{"role": "user", "content": "hello"}])
    tokens, exact = prompt_length(short, tok, prof, LIMIT)
    real = len(tok.render(short.messages, template_kwargs=prof.template_kwargs(True)))
    assert not exact
    assert real <= tokens < LIMIT  # an upper bound under the limit: no tokenizing needed
    fits = CaptureRequest(messages=[{"role": "user", "content": "the " * 150}])
    assert prompt_length(fits, tok, prof, LIMIT) == (313, True)


def test_sim_cli_takes_max_model_len(capsys):
    assert main(["sim", "--max-model-len", "1", "--port", "0"]) == 1
    assert "--max-model-len must be at least 2" in capsys.readouterr().err


async def test_over_length_prompts_do_not_stop_the_run_as_failures_in_a_row(tmp_path):
    path = tmp_path / "many.jsonl"
    rows = [{"id": f"long{i}", "prompt": "the " * 1000} for i in range(4)] + [{"id": "short", "prompt": "hello"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with start_simulator(SimConfig(kind="vllm", max_model_len=LIMIT)) as sim:
        config = BatchConfig(
            servers=[sim.url],
            prompts_path=path,
            tokenizer=kimi(),
            model_profile=profile(),
            max_new_tokens=20,
            timeout=10.0,
            concurrency=1,
            max_consecutive_failures=2,
        )
        with Store(tmp_path / "s.duckdb") as store:
            summary = await run_batch(config, store)
    assert summary.stopped is None
    assert (summary.ok, summary.failed) == (1, 4)
    assert summary.exit_code == 3


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
async def test_a_prompt_near_the_limit_is_sent_with_the_room_there_is(tmp_path, kind):
    """vLLM refuses prompt + max_tokens over max_model_len with a 400: with --max-new-tokens 1024 and a
    600-token context every prompt that fits failed, and 20 in a row stopped the run. Now the request
    asks for what fits, and an answer cut at the limit is kept, marked truncated. SGLang refuses a prompt +
    max_new_tokens that reaches its limit (`>=`): one id of it is left unused there, else each such prompt was a 400."""
    with start_simulator(SimConfig(kind=kind, max_model_len=LIMIT, output_tokens=2000)) as sim:
        config = BatchConfig(
            servers=[sim.url],
            prompts_path=_prompts(tmp_path),
            tokenizer=kimi(),
            model_profile=profile(),
            max_new_tokens=1024,
            timeout=10.0,
        )
        with Store(tmp_path / "s.duckdb") as store:
            summary = await run_batch(config, store)
            rows = dict(store.query("SELECT prompt_id, len(prompt_ids) + len(output_ids) FROM samples"))
            finish = dict(store.query("SELECT prompt_id, finish_reason FROM samples"))
    assert (summary.ok, summary.failed) == (2, 2)
    assert summary.failures_by_class == {"over_max_length": 2}
    usable = LIMIT - (1 if kind == "sglang" else 0)
    assert rows == {"short": usable, "fits": usable}
    assert set(finish.values()) == {"length"}


def test_a_prompt_with_tools_is_counted_as_its_server_renders_the_tools(kimi_tok):
    """SGLang renders each tool with `"defer_loading": null` (20 more ids a tool here) and no tools for
    tool_choice none; counted with the tools as sent, an SGLang prompt near the limit was under-counted."""
    from tokview.batch.limits import exact_prompt_tokens

    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    messages = [{"role": "user", "content": "hi"}]
    with_tools = CaptureRequest(messages=messages, settings={"tools": tools, "thinking": True})
    vllm = exact_prompt_tokens(with_tools, kimi_tok, profile(), "vllm")
    sglang = exact_prompt_tokens(with_tools, kimi_tok, profile(), "sglang")
    rendered = kimi_tok.render(
        messages, template_kwargs={"thinking": True, "tools": [{**tools[0], "defer_loading": None}]}
    )
    assert sglang == len(rendered) > vllm
    bare = exact_prompt_tokens(CaptureRequest(messages=messages, settings={"thinking": True}), kimi_tok, profile())
    none = CaptureRequest(messages=messages, settings={"tools": tools, "tool_choice": "none", "thinking": True})
    assert exact_prompt_tokens(none, kimi_tok, profile(), "sglang") == bare < vllm


@pytest.mark.parametrize("path", ["/generate", "/v1/chat/completions"])
def test_the_sglang_sim_refuses_a_request_that_reaches_its_limit(path):
    """As SGLang's TokenizerManager does (`max_new_tokens + input >= context_len`); a request without a limit of its
    own gets the room there is."""
    prompt = list(range(1000, 1010))

    def body(max_new: int | None) -> dict:
        if path == "/generate":
            return {"input_ids": prompt, "sampling_params": {} if max_new is None else {"max_new_tokens": max_new}}
        chat: dict = {"messages": [{"role": "user", "content": "hi"}]}
        return chat if max_new is None else {**chat, "max_tokens": max_new}

    with start_simulator(SimConfig(kind="sglang", max_model_len=LIMIT, output_tokens=5000)) as sim:
        with httpx.Client(base_url=sim.url, timeout=10) as client:
            prompt_len = (
                len(prompt) if path == "/generate" else client.post(path, json=body(1)).json()["usage"]["prompt_tokens"]
            )
            refused = client.post(path, json=body(LIMIT - prompt_len))
            fits = client.post(path, json=body(LIMIT - prompt_len - 1))
            unasked = client.post(path, json=body(None))
    assert refused.status_code == 400
    assert "Requested token count exceeds the model's maximum context length of 600 tokens" in refused.text
    assert fits.status_code == 200
    if path != "/generate":  # /generate's own default is 128 new tokens
        assert unasked.json()["usage"]["completion_tokens"] == LIMIT - prompt_len
