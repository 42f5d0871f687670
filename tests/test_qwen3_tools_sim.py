"""A Qwen3 agent trace with tools regenerated on the simulator over loopback.

The simulated Qwen3 never called a tool (the simulator wrote Kimi's and GLM's calls only), so every Qwen3 agent chain
or proxied harness against it stopped at its first turn. Now it writes hermes calls (`<tool_call>\\n{"name": …,
"arguments": …}\\n</tool_call>`, what Qwen3's template renders for them), the simulated servers return them as their
hermes / qwen25 parsers do, and `tokview batch --history served` runs the loop: stored ids are what the server serves
for the stored request, the served calls are the calls on the ids, the next prompt extends the tool turn id for id,
and a clean run has no warning; an unclosed call, or a call the parser drops, is found."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from test_glm_tools_sim import _run as run_chain

from tokview.core.profiles import BUILTIN_PROFILES
from tokview.core.tool_calls import fold_stream_tool_calls, parse_tool_calls
from tokview.sim import SimConfig, start_simulator

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city", "days"],
            },
        },
    }
    for name in ("get_weather", "get_time")
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
LAYOUT = BUILTIN_PROFILES["qwen3"].tool_calls


def _run(tmp_path: Path, tok_dir: Path, quirks: dict, kind: str = "vllm", trace: dict = TRACE) -> list:
    """GLM's served-chain run (every stored turn asked again gives the stored ids), the Qwen3 tokenizer's own profile."""
    return run_chain(tmp_path, tok_dir, quirks, kind, trace=trace, profile=None)


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_a_qwen3_tool_loop_is_served_token_exact_with_no_warning(tmp_path, qwen_tok_dir, qwen_tok, kind):
    turns = _run(tmp_path, qwen_tok_dir, {}, kind)
    assert len(turns) == 2
    call_turn, answer = turns
    served = call_turn.capture.tool_calls
    on_ids = parse_tool_calls(call_turn.capture.output_ids, LAYOUT, qwen_tok, TOOLS).calls
    assert [(c["name"], c["arguments"]) for c in served] == [(c.name, c.arguments) for c in on_ids]
    assert served[0]["name"] == "get_weather" and isinstance(json.loads(served[0]["arguments"])["days"], int)
    assert call_turn.capture.reasoning and "<think>" not in call_turn.capture.reasoning
    assert answer.capture.content and not answer.capture.tool_calls
    if kind == "sglang":  # its qwen25 detector strips the text before the call: the history renders the output back
        assert call_turn.capture.content in ("", None)
        assert answer.capture.settings["chain"]["extends"] is True
        assert [[f.code for f in s.findings if f.severity != "info"] for s in turns] == [[], []]
        return
    # vLLM's hermes parser returns the "\n\n" after </think> as content; sent back, Qwen3's template writes it, then
    # "\n" before the call because content is not empty: the next prompt has "\n\n\n" where the model wrote "\n\n"
    assert call_turn.capture.content == "\n\n"
    chain = answer.capture.settings["chain"]
    close = call_turn.capture.output_ids.index(151668)
    assert chain["extends"] is False and chain["break_at"] == len(call_turn.capture.prompt_ids) + close + 1
    assert chain["previous_id"] == call_turn.capture.output_ids[close + 1] == 271
    [brk] = [f for f in answer.findings if f.severity != "info"]
    assert brk.code == "session_prefix_break" and "where that turn has id 271 '\\n\\n'" in brk.detail


def test_parallel_qwen3_calls_over_several_rounds_extend_every_turn(tmp_path, qwen_tok_dir, qwen_tok):
    """`tool-calls=each`, `tool-rounds=2`: two calls a turn (separated by a newline, as the template writes them),
    two tool-calling turns before the answer; every later prompt extends the one before it id for id (on SGLang,
    whose parser returns no whitespace content to re-render)."""
    calls = [CALL, {**CALL, "id": "t0", "function": {"name": "get_time", "arguments": '{"city": "Oslo", "days": 1}'}}]
    results = [{"role": "tool", "tool_call_id": c["id"], "content": "ok"} for c in calls]
    turn = {"role": "assistant", "content": "", "tool_calls": calls}
    messages = [TRACE["messages"][0], turn, *results, turn, *results, {"role": "assistant", "content": "Done."}]
    trace = {**TRACE, "messages": messages}
    turns = _run(tmp_path, qwen_tok_dir, {"tool-calls": "each", "tool-rounds": 2}, "sglang", trace)
    assert [len(t.capture.tool_calls or []) for t in turns] == [2, 2, 0]
    assert all(t.capture.settings["chain"]["extends"] is True for t in turns[1:])
    assert [[f.code for f in s.findings if f.severity != "info"] for s in turns] == [[], [], []]
    for t in turns[:2]:  # the second call follows the first after a newline, as the template renders them
        text = qwen_tok.decode(t.capture.output_ids, skip_special_tokens=False)
        assert '}}\n</tool_call>\n<tool_call>\n{"name": "get_time"' in text


@pytest.mark.parametrize(
    ("quirk", "code"),
    [("unclosed-section", "tool_call_unclosed"), ("parser-drops-call", "tool_calls_field_mismatch")],
)
def test_a_qwen3_tool_quirk_fires_its_finding(tmp_path, qwen_tok_dir, quirk, code):
    turns = _run(tmp_path, qwen_tok_dir, {quirk: True})
    assert code in {f.code for f in turns[0].findings}


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_an_unclosed_qwen3_call_is_returned_by_vllm_s_hermes_parser_only(tmp_path, qwen_tok_dir, kind):
    """vLLM's hermes parser reads `<tool_call>(.*)` too: a call whose `</tool_call>` never came is returned once its
    JSON parses (SGLang's qwen25 detector needs the end); either way the finding says the next prompt breaks."""
    turns = _run(tmp_path, qwen_tok_dir, {"unclosed-section": True}, kind)
    calls = turns[0].capture.tool_calls or []
    assert [c["name"] for c in calls] == (["get_weather"] if kind == "vllm" else [])
    [unclosed] = [f for f in turns[0].findings if f.code == "tool_call_unclosed"]
    assert "vLLM's hermes parser returns it" in unclosed.detail


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_a_streamed_qwen3_call_folds_to_the_plain_answers_call(qwen_tok_dir, kind):
    body = {"model": "tokview-sim", "messages": TRACE["messages"][:1], "tools": TOOLS, "temperature": 0, "seed": 1}
    with start_simulator(SimConfig(kind=kind, tokenizer_dir=qwen_tok_dir)) as sim:
        plain = httpx.post(sim.url + "/v1/chat/completions", json=body, timeout=30).json()
        with httpx.stream("POST", sim.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=30) as r:
            lines = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: {")]
    folded = fold_stream_tool_calls([json.loads(line) for line in lines])
    calls = plain["choices"][0]["message"]["tool_calls"]
    assert calls and [(c["name"], c["arguments"]) for c in folded or []] == [
        (c["function"]["name"], c["function"]["arguments"]) for c in calls
    ]
    assert plain["choices"][0]["finish_reason"] == "tool_calls"


def test_a_qwen3_prompt_without_tools_is_answered_in_text(qwen_tok_dir):
    body = {"model": "tokview-sim", "messages": TRACE["messages"][:1], "temperature": 0}
    with start_simulator(SimConfig(kind="vllm", tokenizer_dir=qwen_tok_dir)) as sim:
        plain = httpx.post(sim.url + "/v1/chat/completions", json=body, timeout=30).json()
    message = plain["choices"][0]["message"]
    assert message["content"] and not message.get("tool_calls")


def test_qwen3_without_thinking_breaks_each_chained_turn_in_the_history_and_says_so(tmp_path, qwen_tok_dir):
    """With thinking off Qwen3's prompt ends with an empty think block, which its template drops once the answer is
    history: each chained turn breaks inside the previous turn's prompt. The finding named re-renders of the answer
    (a `</think>` the model never wrote, reasoning dropped)."""
    from tokview.cli import ExitCode, main
    from tokview.store import Store

    conversation = {
        "id": "plain",
        "messages": [
            {"role": "user", "content": "What is 6 times 7?"},
            {"role": "assistant", "content": "42."},
            {"role": "user", "content": "And 18 times 3?"},
            {"role": "assistant", "content": "54."},
        ],
    }
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps(conversation) + "\n")
    db = tmp_path / "q.duckdb"
    args = ["batch", str(prompts), "--db", str(db), "--mode", "chat", "--workers", "1", "--temperature", "0"]
    args += ["--max-new-tokens", "200", "--history", "served", "--tokenizer", str(qwen_tok_dir), "--no-thinking"]
    with start_simulator(SimConfig(kind="vllm", tokenizer_dir=qwen_tok_dir)) as sim:
        assert main([*args, "--server", sim.url]) == ExitCode.OK
    with Store(str(db)) as store:
        [(detail, positions, prompt_len)] = store.query(
            "SELECT f.detail, f.positions, p.prompt_len FROM findings f JOIN samples s USING (sample_id) "
            "JOIN samples p ON p.turn = 0 WHERE f.code = 'session_prefix_break' AND s.turn = 1"
        )
    assert positions[0] < prompt_len
    assert "history before that turn's answer otherwise than in that turn's prompt" in detail
