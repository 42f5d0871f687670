"""A gpt-oss-layout run of `tokview batch` against the simulated vLLM over real sockets (issue 28 items 3 and 5):
the simulator serves Harmony messages on o200k_harmony ids (chat with `reasoning` and tool calls, streamed or not,
and completions); the stored ids are the served ones; each `harmony-*` quirk is found by its finding and clean
samples have no warning or error; the recorded date renders the same prompt ids again on another day."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tokview.batch import BatchConfig, run_batch
from tokview.cli import main
from tokview.core import gpt_oss_tokenizer as g
from tokview.core.profiles import get_profile
from tokview.errors import ExitCode
from tokview.sim import SimConfig, start_simulator
from tokview.store import Store

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
QUESTION = {"id": "q", "messages": [{"role": "user", "content": "What is 6 times 7?"}]}
AGENT = {"id": "agent", "tools": TOOLS, "messages": [{"role": "user", "content": "Weather in Paris?"}]}
LOOP = {
    "id": "loop",
    "tools": TOOLS,
    "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Need the weather.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "sunny"},
    ],
}
QUIET = {"parser_hidden_ids"}
"""Info only: vLLM's parser gives no text for the headers and end tokens (the ids are kept)."""


@pytest.fixture(scope="module")
def oss_dir() -> Path:
    try:
        return g.gpt_oss_tokenizer_dir()
    except g.GptOssDataError as exc:
        pytest.skip(f"no o200k ranks on this machine (npm pack js-tiktoken into ~/.cache/tokview): {exc}")


@pytest.fixture(scope="module")
def oss_tok(oss_dir):
    from tokview.core.tokenizer import load_tokenizer

    return load_tokenizer(oss_dir)


async def _batch(
    tmp_path: Path, url: str, tok, rows: list[dict], mode: str = "chat", profile=None, db: str = "s.duckdb"
) -> Store:
    """A batch run through `run_batch` with the loaded tokenizer (the CLI's own path: `_cli_batch`)."""
    prompts = tmp_path / f"{db}.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    store = Store(str(tmp_path / db))
    config = BatchConfig(
        servers=[url],
        prompts_path=prompts,
        tokenizer=tok,
        model_profile=profile or get_profile("gpt-oss"),
        mode=mode,
        max_new_tokens=300,
        history="file",
        timeout=30.0,
    )
    summary = await run_batch(config, store)
    assert summary.ok == summary.input, summary
    assert not summary.failed, summary
    return store


def _cli_batch(tmp_path: Path, url: str, oss_dir: Path, rows: list[dict], *extra: str) -> Store:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["batch", str(prompts), "--server", url, "--db", str(tmp_path / "cli.duckdb"), "--tokenizer", str(oss_dir)]
    args += ["--workers", "1", "--max-new-tokens", "300", "--history", "file", *extra]
    assert main(args) == ExitCode.OK
    return Store(str(tmp_path / "cli.duckdb"))


def _samples(store: Store) -> list:
    ids = [r[0] for r in store.query("SELECT sample_id FROM samples ORDER BY prompt_id, turn")]
    return [store.load_sample(i) for i in ids]


def _check_clean(sim, store: Store, mode: str) -> None:
    """Every stored id is the server's, the recorded kwargs render the served prompt, and no sample has a warning
    or an error."""
    samples = _samples(store)
    assert len(samples) == (1 if mode in ("raw", "dual") else 4)  # the loop row: its call turn and its answer
    for s in samples:
        c = s.capture
        choice = c.raw_response["choices"][0]
        assert choice["token_ids"] == c.output_ids
        assert (choice.get("prompt_token_ids") or c.raw_response.get("prompt_token_ids")) == c.prompt_ids
        kwargs = c.settings["chat_template_kwargs"]
        assert kwargs["reasoning_effort"] == "medium"
        assert len(kwargs["current_date"]) == 10
        served = sim.tokenizer.render(c.messages, template_kwargs={**kwargs, "tools": c.settings.get("tools")})
        assert served == c.prompt_ids  # the recorded kwargs render the served prompt
        assert {f.code for f in s.findings} <= QUIET, (s.sample_id, [(f.code, f.detail) for f in s.findings])
    question = next(s for s in samples if s.prompt_id == "q")
    decoded = sim.tokenizer.decode(question.capture.output_ids)
    assert decoded.startswith("<|channel|>analysis<|message|>")
    assert decoded.endswith("<|return|>")
    if mode != "chat":
        return
    call = next(s for s in samples if s.prompt_id == "agent").capture
    assert call.tool_calls
    assert call.tool_calls[0]["name"] == "get_weather"


@pytest.mark.parametrize("mode", ["raw", "chat", "dual"])
async def test_a_clean_gpt_oss_run_stores_the_served_ids_and_has_no_alarm(tmp_path, oss_dir, oss_tok, mode):
    with start_simulator(SimConfig(kind="vllm", tokenizer_dir=oss_dir)) as sim:
        rows = [QUESTION, AGENT, LOOP] if mode == "chat" else [QUESTION]  # agent traces go by chat only
        with await _batch(tmp_path, sim.url, oss_tok, rows, mode) as store:
            _check_clean(sim, store, mode)


def test_tokview_batch_detects_gpt_oss_from_the_folder_and_runs_clean(tmp_path, oss_dir):
    with start_simulator(SimConfig(kind="vllm", tokenizer_dir=oss_dir)) as sim:
        with _cli_batch(tmp_path, sim.url, oss_dir, [QUESTION, AGENT, LOOP], "--mode", "chat") as store:
            _check_clean(sim, store, "chat")


QUIRK_FINDS = {
    "harmony-no-channel": ("harmony_malformed_header", QUESTION),
    "harmony-constrain-for-start": ("harmony_malformed_header", QUESTION),
    "harmony-no-final": ("harmony_no_final", QUESTION),
    "harmony-analysis-after-final": ("harmony_analysis_after_final", QUESTION),
    "harmony-recipient-on-analysis": ("harmony_recipient_on_analysis", AGENT),
    "harmony-json-garbage": ("harmony_tool_json_invalid", AGENT),
    "harmony-final-ends-call": ("harmony_wrong_end_token", QUESTION),
    "parser-all-reasoning": ("harmony_split_mismatch", QUESTION),
    "server-date": ("prompt_date_mismatch", QUESTION),
}


def test_every_harmony_finding_has_a_quirk():
    from tokview.core.findings import RULES

    harmony_codes = {code for code in RULES if code.startswith("harmony_")} | {"prompt_date_mismatch"}
    assert {code for code, _ in QUIRK_FINDS.values()} == harmony_codes


@pytest.mark.parametrize("quirk", sorted(QUIRK_FINDS))
async def test_each_harmony_quirk_is_found_on_the_served_ids(tmp_path, oss_dir, oss_tok, quirk):
    code, row = QUIRK_FINDS[quirk]
    value = "2025-08-05" if quirk == "server-date" else True
    with start_simulator(SimConfig(kind="vllm", tokenizer_dir=oss_dir, quirks={quirk: value})) as sim:
        with await _batch(tmp_path, sim.url, oss_tok, [row]) as store:
            (s,) = _samples(store)
            assert s.capture.output_ids == s.capture.raw_response["choices"][0]["token_ids"]
            assert code in {f.code for f in s.findings}, [(f.code, f.detail) for f in s.findings]


async def test_the_recorded_date_renders_the_same_prompt_on_another_day(tmp_path, oss_dir, oss_tok):
    """Day 1 records its date; day 2 (another date) renders other ids; day 2 given day 1's date renders day 1's."""
    with start_simulator(SimConfig(kind="vllm", tokenizer_dir=oss_dir)) as sim:
        with await _batch(tmp_path, sim.url, oss_tok, [QUESTION], "raw", db="day1.duckdb") as store:
            (day1,) = _samples(store)
        recorded = day1.capture.settings["chat_template_kwargs"]["current_date"]
        other = tmp_path / "other-day.toml"
        other.write_text('base = "gpt-oss"\n[default_kwargs]\ncurrent_date = "2031-05-06"\n', encoding="utf-8")
        day2_profile = get_profile(str(other))
        with await _batch(tmp_path, sim.url, oss_tok, [QUESTION], "raw", day2_profile, db="day2.duckdb") as store:
            (day2,) = _samples(store)
        pinned = tmp_path / "day1.toml"
        pinned.write_text(f'base = "gpt-oss"\n[default_kwargs]\ncurrent_date = "{recorded}"\n', encoding="utf-8")
        pinned_profile = get_profile(str(pinned))
        with await _batch(tmp_path, sim.url, oss_tok, [QUESTION], "raw", pinned_profile, db="again.duckdb") as store:
            (again,) = _samples(store)
    assert day2.capture.prompt_ids != day1.capture.prompt_ids
    assert "2031-05-06" in sim.tokenizer.decode(day2.capture.prompt_ids)
    assert again.capture.prompt_ids == day1.capture.prompt_ids
    assert again.capture.settings["chat_template_kwargs"]["current_date"] == recorded


def test_harmony_chat_streams_reasoning_content_and_calls_as_the_answer_does(oss_dir):
    with start_simulator(SimConfig(kind="vllm", tokenizer_dir=oss_dir)) as sim:
        for row in (QUESTION, AGENT):
            body = {"messages": row["messages"], "return_token_ids": True, "seed": 3, "tools": row.get("tools")}
            whole = httpx.post(sim.url + "/v1/chat/completions", json=body, timeout=30).json()["choices"][0]
            stream = httpx.post(sim.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=30)
            chunks = [json.loads(line[6:]) for line in stream.text.splitlines() if line.startswith("data: {")]
            deltas = [c["choices"][0] for c in chunks if c["choices"]]
            assert [t for d in deltas for t in d.get("token_ids") or []] == whole["token_ids"]
            reasoning = "".join(d["delta"].get("reasoning") or "" for d in deltas)
            content = "".join(d["delta"].get("content") or "" for d in deltas)
            args = "".join(
                call["function"].get("arguments") or "" for d in deltas for call in d["delta"].get("tool_calls") or []
            )
            message = whole["message"]
            assert reasoning == message["reasoning"]
            assert content == (message["content"] or "")
            assert args == "".join(c["function"]["arguments"] for c in message.get("tool_calls") or [])
            assert deltas[-1]["finish_reason"] == whole["finish_reason"]


def test_chat_template_kwargs_pin_the_date_over_the_profile_defaults(tmp_path, oss_dir, capsys):
    with start_simulator(SimConfig(kind="vllm", tokenizer_dir=oss_dir)) as sim:
        pinned = '{"current_date": "2025-08-05"}'
        with _cli_batch(tmp_path, sim.url, oss_dir, [QUESTION], "--chat-template-kwargs", pinned) as store:
            (s,) = _samples(store)
    assert s.capture.settings["chat_template_kwargs"] == {"reasoning_effort": "medium", "current_date": "2025-08-05"}
    assert "Current date: 2025-08-05" in sim.tokenizer.decode(s.capture.prompt_ids)
    capsys.readouterr()
    args = ["batch", str(tmp_path / "p.jsonl"), "--server", sim.url, "--chat-template-kwargs", "{current_date"]
    assert main(args) == ExitCode.USAGE
    err = capsys.readouterr().err.strip()
    assert err.startswith("tokview: error: batch: argument --chat-template-kwargs: not valid JSON")
    assert "\n" not in err


async def test_a_gpt_oss_run_on_sglang_reads_the_channels_and_the_calls(tmp_path, oss_dir, oss_tok):
    """SGLang's GptOssDetector splits every gpt-oss answer (tools or not): the simulated SGLang ran its think-tag
    split instead, so the reasoning was empty, the Harmony headers ran into `content` and no call came back (every
    chain stopped at turn 0, every sample `harmony_split_mismatch`). It reads the channels as vLLM's sim does."""
    with start_simulator(SimConfig(kind="sglang", tokenizer_dir=oss_dir)) as sim:
        prompts = tmp_path / "p.jsonl"
        prompts.write_text("".join(json.dumps(r) + "\n" for r in [QUESTION, AGENT, LOOP]))
        store = Store(str(tmp_path / "s.duckdb"))
        config = BatchConfig(
            servers=[sim.url],
            prompts_path=prompts,
            tokenizer=oss_tok,
            model_profile=get_profile("gpt-oss"),
            mode="chat",
            max_new_tokens=300,
            history="file",
            timeout=30.0,
        )
        summary = await run_batch(config, store)
        assert summary.ok == summary.input == 4, summary
        with store:
            samples = _samples(store)
        body = {"model": sim.cfg.model_name, "tools": TOOLS, "messages": AGENT["messages"], "max_tokens": 300}
        whole = httpx.post(sim.url + "/v1/chat/completions", json=body, timeout=30).json()["choices"][0]["message"]
        streamed = _streamed_message(sim.url, {**body, "stream": True})
    assert whole["tool_calls"][0]["id"].startswith("call_")  # SGLang's ids for a parser other than kimi_k2
    assert streamed["reasoning_content"] == whole["reasoning_content"]
    assert streamed["names"] == [c["function"]["name"] for c in whole["tool_calls"]]
    assert streamed["arguments"] == [c["function"]["arguments"] for c in whole["tool_calls"]]
    for s in samples:
        assert {f.code for f in s.findings if f.severity != "info"} == set(), (s.sample_id, s.findings)
    question = next(s for s in samples if s.prompt_id == "q").capture
    assert question.reasoning and question.content and question.reasoning_field == "reasoning_content"
    assert "<|" not in question.content and "<|" not in question.reasoning
    call = next(s for s in samples if s.prompt_id == "agent" and s.turn in (None, 0)).capture
    assert [c["name"] for c in call.tool_calls] == ["get_weather"]
    assert call.finish_reason == "tool_calls"


def _streamed_message(url: str, body: dict) -> dict:
    """The reasoning, call names and call arguments a chat stream's deltas add up to."""
    out: dict = {"reasoning_content": "", "names": [], "arguments": []}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=30) as response:
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            for choice in json.loads(line[6:]).get("choices") or []:
                delta = choice.get("delta") or {}
                out["reasoning_content"] += delta.get("reasoning_content") or ""
                for call in delta.get("tool_calls") or []:
                    if call.get("function", {}).get("name"):
                        out["names"].append(call["function"]["name"])
                        out["arguments"].append("")
                    out["arguments"][-1] += call.get("function", {}).get("arguments") or ""
    return out


def test_ignore_eos_writes_on_to_max_tokens_and_says_length(oss_dir):
    """A real server ignoring the stop ids goes on to `max_tokens` and says `length`: the simulated gpt-oss stopped at
    its `<|return|>` and said `stop`, which hid the request's ignore_eos from a proxied harness's sample."""
    with start_simulator(SimConfig(kind="vllm", tokenizer_dir=str(oss_dir))) as sim:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 150, "return_token_ids": True}
        plain = httpx.post(sim.url + "/v1/chat/completions", json=body, timeout=30).json()["choices"][0]
        ignored = httpx.post(sim.url + "/v1/chat/completions", json={**body, "ignore_eos": True}, timeout=30).json()
    assert plain["finish_reason"] == "stop" and len(plain["token_ids"]) < 150
    assert ignored["choices"][0]["finish_reason"] == "length"
    assert len(ignored["choices"][0]["token_ids"]) == 150


async def test_a_conversation_export_of_a_gpt_oss_run_audits_back_to_its_served_ids(tmp_path, oss_dir, oss_tok) -> None:
    """Audit rebuilt a gpt-oss answer as think tags: its analysis and every channel header lost, three false errors on
    most clean rows and no row's ids as served. It now writes the answer's channels as the model does."""
    from tokview.cli import main

    with start_simulator(SimConfig(kind="vllm", tokenizer_dir=oss_dir)) as sim:
        with await _batch(tmp_path, sim.url, oss_tok, [QUESTION, AGENT]) as store:
            served = {tuple(p) + tuple(o) for p, o in store.query("SELECT prompt_ids, output_ids FROM samples")}
    out = tmp_path / "sharegpt.jsonl"  # (SpecForge's template route is refused for Harmony)
    assert main(["export", "--db", str(tmp_path / "s.duckdb"), "--format", "sharegpt", "--out", str(out)]) == 0
    audited = tmp_path / "a.duckdb"
    assert main(["audit", str(out), "--tokenizer", str(oss_dir), "--db", str(audited)]) == 0
    with Store(str(audited)) as store:
        rows = store.query("SELECT prompt_ids, output_ids, codes FROM samples")
    assert len(rows) == len(served) == 2
    for prompt, output, codes in rows:
        assert tuple(prompt) + tuple(output) in served
        assert set(codes) <= QUIET, codes


def test_a_chain_sglang_refuses_to_go_on_keeps_the_turn_that_shows_why(tmp_path, oss_dir):
    """A call whose arguments are no JSON, sent back as the model wrote them: SGLang answers 400. The chain failed
    whole and was asked again every run; its first turn, which holds `harmony_tool_json_invalid`, never landed."""
    quirks = {"harmony-json-garbage": True}
    with start_simulator(SimConfig(kind="sglang", tokenizer_dir=oss_dir, quirks=quirks)) as sim:
        prompts = tmp_path / "p.jsonl"
        prompts.write_text(json.dumps(LOOP) + "\n")
        args = ["batch", str(prompts), "--server", sim.url, "--db", str(tmp_path / "s.duckdb"), "--tokenizer"]
        args += [str(oss_dir), "--workers", "1", "--max-new-tokens", "300", "--mode", "chat", "--history", "served"]
        assert main(args) == ExitCode.OK  # a stop, not a failure
        with Store(str(tmp_path / "s.duckdb")) as store:
            (s,) = _samples(store)
            codes = {f.code for f in s.findings}
            assert {"harmony_tool_json_invalid", "chain_stopped"} <= codes
            assert "was refused by the server: HTTP 400" in s.capture.settings["chain"]["stopped"]
            assert store.query("SELECT count(*) FROM failures") == [(0,)]


def test_an_audited_gpt_oss_answer_cut_in_its_analysis_ends_there(oss_tok) -> None:
    """A truncated row with reasoning and no content was given a final channel header the model never wrote."""
    from tokview.export.audit import _harmony_answer

    out = _harmony_answer(oss_tok, {"role": "assistant"}, "Let me think about", "", True)
    assert oss_tok.decode(out, skip_special_tokens=False) == "<|channel|>analysis<|message|>Let me think about"
    whole = _harmony_answer(oss_tok, {"role": "assistant"}, "Done.", "42.", False)
    assert oss_tok.decode(whole, skip_special_tokens=False) == (
        "<|channel|>analysis<|message|>Done.<|end|><|start|>assistant<|channel|>final<|message|>42.<|return|>"
    )


async def test_doctor_says_a_gpt_oss_output_is_channels_not_an_answer_and_a_stop(oss_dir, oss_tok) -> None:
    """Doctor said of gpt-oss "no think delimiters: the output is the answer, then a stop id"."""
    from tokview.core.profiles import get_profile
    from tokview.servers.doctor import run_doctor

    with start_simulator(SimConfig(kind="vllm", tokenizer_dir=oss_dir)) as sim:
        report = await run_doctor(sim.url, tokenizer=oss_tok, profile=get_profile("gpt-oss"), timeout=10.0)
    checks = {c["title"]: c for c in report.to_dict()["checks"]}
    detail = checks["Think opener in the prompt"]["detail"]
    assert "Harmony channels" in detail and "then a stop id" not in detail
