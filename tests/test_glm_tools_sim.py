"""A GLM-4.7 agent trace with tools regenerated on the simulator over loopback (issue 28 item 5, issue 23 item 4).

`tokview batch --history served` on the GLM-layout tokenizer, the simulator serving it as `glm-4.7`: the model calls
a declared tool in GLM's `<tool_call>NAME<arg_key>…</arg_key><arg_value>…</arg_value></tool_call>` layout, the
simulated vLLM returns `tool_calls` as its glm47 parser would, the file's result goes back and the model answers.
Stored ids are what the server serves for the stored request, the server's calls are the calls on the ids, the next
prompt extends the tool turn id for id, and a clean run has no warning; an unclosed call, or a call the parser drops, is found."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tokview.cli import main
from tokview.core.profiles import BUILTIN_PROFILES
from tokview.core.tool_calls import parse_tool_calls
from tokview.errors import ExitCode
from tokview.sim import SimConfig, start_simulator
from tokview.store import Store

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "zip": {"type": "string", "enum": ["75001"]},  # text that json-decodes: kept a string
                },
                "required": ["city", "days", "zip"],
            },
        },
    }
]
CALL = {
    "id": "w0",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'},
}
TRACE = {
    "id": "agent",
    "tools": TOOLS,
    "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "file reasoning", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "w0", "content": "sunny"},
        {"role": "assistant", "content": "Sunny."},
    ],
}
LAYOUT = BUILTIN_PROFILES["glm-4.7"].tool_calls


def _served_ids(kind: str, answer: dict) -> tuple[list[int], list[int]]:
    """(prompt ids, output ids) of a chat answer, in each server's fields."""
    if kind == "sglang":
        choice = answer["choices"][0]
        return choice["prompt_token_ids"], choice["response_token_ids"]
    return answer["prompt_token_ids"], answer["choices"][0]["token_ids"]


def _run(
    tmp_path: Path,
    tok_dir: Path,
    quirks: dict,
    kind: str = "vllm",
    *,
    trace: dict = TRACE,
    profile: str | None = "glm-4.7",
) -> list:
    """The trace run as a served chain on the simulator (its tokenizer served as `profile`, None: the detected one);
    every stored turn asked again gives the stored ids."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps(trace) + "\n")
    db = tmp_path / "s.duckdb"
    cfg = SimConfig(kind=kind, tokenizer_dir=tok_dir, profile=profile, quirks=quirks)
    args = ["batch", str(prompts), "--db", str(db), "--mode", "chat", "--workers", "1", "--temperature", "0"]
    args += ["--max-new-tokens", "400", "--history", "served", "--tokenizer", str(tok_dir)]
    args += ["--profile", profile] if profile else []
    with start_simulator(cfg) as sim:
        assert main([*args, "--server", sim.url]) == ExitCode.OK
        store = Store(str(db))
        ids = [r[0] for r in store.query("SELECT sample_id FROM samples ORDER BY turn")]
        turns = [store.load_sample(i) for i in ids]
        for s in turns:  # the stored request asked again: the server serves the stored ids
            assert s.capture.raw_request is not None
            again = httpx.post(sim.url + "/v1/chat/completions", json=s.capture.raw_request["body"], timeout=30).json()
            assert (s.capture.prompt_ids, s.capture.output_ids) == _served_ids(kind, again)
    return turns


@pytest.mark.parametrize("kind", ["vllm", "sglang"])  # SGLang's served Kimi's calls: a GLM loop stopped at turn 0
def test_a_glm_tool_loop_is_served_token_exact_with_no_finding(tmp_path, glm_tok_dir, kind):
    from tokview.core.tokenizer import load_tokenizer

    turns = _run(tmp_path, glm_tok_dir, {}, kind)
    assert len(turns) == 2
    call_turn, answer = turns
    served = call_turn.capture.tool_calls
    on_ids = parse_tool_calls(call_turn.capture.output_ids, LAYOUT, load_tokenizer(glm_tok_dir), TOOLS).calls
    assert [(c["name"], c["arguments"]) for c in served] == [(c.name, c.arguments) for c in on_ids]
    assert json.loads(served[0]["arguments"])["zip"] == "75001"
    assert isinstance(json.loads(served[0]["arguments"])["days"], int)
    assert answer.capture.settings["chain"]["extends"] is True
    assert answer.capture.content and not answer.capture.tool_calls
    assert [[f.code for f in s.findings if f.severity != "info"] for s in turns] == [[], []]
    # what every GLM-4.7 chat sample shows: the prefilled <think>, and the ids no text field carries
    assert {f.code for s in turns for f in s.findings} <= {"think_open_in_prompt", "parser_hidden_ids"}


@pytest.mark.parametrize(
    ("quirk", "code"),
    [("unclosed-section", "tool_call_unclosed"), ("parser-drops-call", "tool_calls_field_mismatch")],
)
def test_a_glm_tool_quirk_fires_its_finding(tmp_path, glm_tok_dir, quirk, code):
    turns = _run(tmp_path, glm_tok_dir, {quirk: True})
    assert code in {f.code for f in turns[0].findings}


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_a_streamed_glm_call_folds_to_the_plain_answers_call(glm_tok_dir, kind):
    from tokview.core.tool_calls import fold_stream_tool_calls

    body = {"model": "tokview-sim", "messages": TRACE["messages"][:1], "tools": TOOLS, "temperature": 0, "seed": 1}
    with start_simulator(SimConfig(kind=kind, tokenizer_dir=glm_tok_dir, profile="glm-4.7")) as sim:
        plain = httpx.post(sim.url + "/v1/chat/completions", json=body, timeout=30).json()
        with httpx.stream("POST", sim.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=30) as r:
            lines = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: {")]
    folded = fold_stream_tool_calls([json.loads(line) for line in lines])
    calls = plain["choices"][0]["message"]["tool_calls"]
    assert [(c["name"], c["arguments"]) for c in folded or []] == [
        (c["function"]["name"], c["function"]["arguments"]) for c in calls
    ]
    assert plain["choices"][0]["finish_reason"] == "tool_calls"


def test_sglang_s_stream_misses_ids_quirk_drops_glm_s_markers(glm_tok_dir):
    """The quirk dropped only Kimi's marker ids, so a GLM stream's sglext ids kept every one of its own."""
    body = {"model": "tokview-sim", "messages": TRACE["messages"][:1], "tools": TOOLS, "temperature": 0, "seed": 1}
    body |= {"stream": True, "return_output_ids_in_sglext": True}
    markers = LAYOUT.marker_ids if LAYOUT is not None else frozenset()
    got = []
    for quirks in ({}, {"stream-misses-ids": True}):
        with start_simulator(
            SimConfig(kind="sglang", tokenizer_dir=glm_tok_dir, profile="glm-4.7", quirks=quirks)
        ) as sim:
            with httpx.stream("POST", sim.url + "/v1/chat/completions", json=body, timeout=30) as r:
                chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
        [ext] = [c["sglext"] for c in chunks if c.get("sglext")]
        got.append(ext["output_ids"][0])
    whole, missing = got
    assert markers & set(whole) and not markers & set(missing)
    assert [t for t in whole if t not in markers] == missing


@pytest.mark.parametrize("profile", ["glm-4.7", None])
def test_a_glm_tool_loop_exported_as_conversations_audits_back_to_its_outputs(tmp_path, glm_tok_dir, profile):
    """Audited from ShareGPT rows, a call turn ended at `</tool_call>` (the template writes the `<|observation|>` the
    model stops on before the result), a false `no_stop_token`; with the detected profile a text answer ended in
    `<|endoftext|>` where the model wrote `<|user|>`. Each audited answer is now the served output, id for id."""
    turns = _run(tmp_path, glm_tok_dir, {}, profile=profile)
    out = tmp_path / "g.jsonl"
    assert main(["export", "--db", str(tmp_path / "s.duckdb"), "--format", "sharegpt", "--out", str(out)]) == 0
    audited = tmp_path / "a.duckdb"
    args = ["audit", str(out), "--tokenizer", str(glm_tok_dir), "--db", str(audited)]
    assert main(args + (["--profile", profile] if profile else [])) == 0
    with Store(str(audited)) as store:
        rows = store.query("SELECT output_ids, codes FROM samples")
    assert sorted(list(o) for o, _ in rows) == sorted(t.capture.output_ids for t in turns)
    assert all(set(codes) <= {"think_open_in_prompt", "parser_hidden_ids"} for _, codes in rows), rows
