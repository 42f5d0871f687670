"""Agent traces as prompt rows: OpenAI `tools`/`tool_calls`/tool results with reasoning,
ShareGPT `function_call` and Hermes `<tool_call>` turns, and the malformed traces refused as bad rows with
their line numbers, on the slow parse and on the planner's fast path alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokview.batch import read_prompts
from tokview.batch.inputs import iter_checked
from tokview.core.prompts import generation_points

WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}
TIME = {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}
USER = {"role": "user", "content": "Weather and time in Paris?"}


def _call(cid: str | None, name: str, args: object) -> dict:
    call: dict = {"type": "function", "function": {"name": name, "arguments": args}}
    if cid is not None:
        call["id"] = cid
    return call


PARALLEL = {
    "id": "par",
    "tools": [WEATHER, TIME],
    "messages": [
        USER,
        {
            "role": "assistant",
            "content": None,
            "reasoning": "Two tools at once.",
            "tool_calls": [_call("c1", "get_weather", {"city": "Paris"}), _call("c2", "get_time", '{"zone":"CET"}')],
        },
        {"role": "tool", "tool_call_id": "c2", "name": "get_time", "content": "14:00"},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "assistant", "content": "Sunny, 14:00.", "reasoning_content": "Both answered."},
    ],
}


def _file(tmp_path: Path, *rows: object) -> Path:
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_an_openai_trace_with_parallel_calls_is_read_as_sent(tmp_path):
    rows, bad = read_prompts(_file(tmp_path, PARALLEL))
    assert bad == []
    row = rows[0]
    assert row.tools == [WEATHER, {"type": "function", "function": TIME}], "a bare function is wrapped"
    calls = row.messages[1]["tool_calls"]
    assert [c["id"] for c in calls] == ["c1", "c2"]
    assert calls[0]["function"]["arguments"] == '{"city": "Paris"}', "an object is serialised as the servers do"
    assert calls[1]["function"]["arguments"] == '{"zone":"CET"}', "a string is kept verbatim"
    assert row.messages[1]["reasoning_content"] == "Two tools at once."
    assert row.messages[1]["content"] == ""
    assert [(m["tool_call_id"], m.get("name")) for m in row.messages[2:4]] == [("c2", "get_time"), ("c1", None)]
    points = generation_points(row)
    assert [(p.turn, p.at) for p in points] == [(0, 1), (1, 4)]
    assert "reasoning_content" not in points[1].history[1], "file history drops reasoning, as before"


def test_sharegpt_function_call_and_hermes_turns_become_calls_with_kimi_ids(tmp_path):
    llama_factory = {
        "tools": json.dumps([TIME]),
        "conversations": [
            {"from": "human", "value": "Time?"},
            {"from": "function_call", "value": json.dumps({"name": "get_time", "arguments": {"zone": "UTC"}})},
            {"from": "observation", "value": "12:00"},
            {"from": "gpt", "value": "Noon."},
        ],
    }
    hermes = {
        "tools": [WEATHER],
        "conversations": [
            {"from": "human", "value": "Weather?"},
            {
                "from": "gpt",
                "value": 'Checking.<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>',
            },
            {"from": "tool", "value": "rain"},
            {"from": "gpt", "value": "Rain."},
        ],
    }
    rows, bad = read_prompts(_file(tmp_path, llama_factory, hermes))
    assert bad == []
    first, second = rows
    assert first.messages[1]["tool_calls"][0]["id"] == "functions.get_time:0"
    assert first.messages[2] == {"role": "tool", "content": "12:00", "tool_call_id": "functions.get_time:0"}
    assert second.messages[1]["content"] == "Checking."
    assert second.messages[1]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    assert second.messages[2]["tool_call_id"] == "functions.get_weather:0"


def test_a_sharegpt_turn_with_qwen3_coder_xml_calls_becomes_calls_with_the_values_as_written(tmp_path):
    """Qwen3-Coder's SFT rows write their calls as `<function=NAME>` XML inside `<tool_call>`: they were refused as
    "not JSON". Each value stays the text it is (the template writes text back as it is)."""
    xml = "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>"
    row = {
        "tools": [WEATHER],
        "conversations": [
            {"from": "human", "value": "Weather?"},
            {"from": "gpt", "value": "Checking.\n" + xml},
            {"from": "tool", "value": "rain"},
            {"from": "gpt", "value": "Rain."},
        ],
    }
    broken = {
        **row,
        "conversations": [row["conversations"][0], {"from": "gpt", "value": "<tool_call><function=x</tool_call>"}],
    }
    rows, bad = read_prompts(_file(tmp_path, row, broken))
    [only] = rows
    assert only.messages[1]["content"] == "Checking."
    assert only.messages[1]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    assert len(bad) == 1 and "<function=NAME> has no closing '>'" in str(bad[0])


def _with(messages: list, tools: list | None = None) -> dict:
    return {"id": "bad", "tools": [WEATHER] if tools is None else tools, "messages": messages}


CALL = {"role": "assistant", "content": "", "tool_calls": [_call("c1", "get_weather", {"city": "Paris"})]}


@pytest.mark.parametrize(
    ("row", "says"),
    [
        (_with([USER, {"role": "tool", "tool_call_id": "c9", "content": "x"}]), "answers no call"),
        (_with([USER, {"role": "tool", "content": "x"}]), "answers no call"),
        (_with([USER, CALL, {"role": "user", "content": "go on"}]), "has no result"),
        (
            _with(
                [
                    USER,
                    {
                        **CALL,
                        "tool_calls": [_call("c1", "get_weather", {"city": "Paris"}), _call("c2", "get_time", {})],
                    },
                    {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
                ],
                tools=[WEATHER, TIME],
            ),
            "call c2 has none",  # the generation would follow a call nobody answered
        ),
        (_with([USER, CALL, {"role": "tool", "tool_call_id": "c1", "content": "x"}], tools=[TIME]), "does not"),
        (_with([USER, CALL, {"role": "tool", "content": "x"}], tools=[]), "has no `tools`"),
        (
            _with([USER, {**CALL, "tool_calls": [_call("c1", "get_weather", '{"city": "Par')]}]),
            "not a JSON object",
        ),
        (
            _with([USER, CALL, {"role": "tool", "tool_call_id": "c1", "name": "get_time", "content": "x"}]),
            "answers call c1",
        ),
    ],
)
def test_a_malformed_trace_is_a_bad_row_with_its_line(tmp_path, row, says):
    good = {"id": "good", "prompt": "fine"}
    rows, bad = read_prompts(_file(tmp_path, good, row))
    assert [r.prompt_id for r in rows] == ["good"]
    assert len(bad) == 1, bad
    assert bad[0].startswith("line 2: "), bad
    assert says in bad[0], bad


def test_a_trace_ending_on_its_calls_is_fine_and_a_plain_tool_turn_takes_the_checked_path(tmp_path):
    ends_on_calls = _with([USER, CALL])
    lone_tool = {"id": "lone", "messages": [USER, {"role": "tool", "content": "x"}]}  # two keys: fast-path shaped
    checked = list(iter_checked(_file(tmp_path, ends_on_calls, lone_tool), rows=False))
    assert checked[0].bad is None
    assert checked[0].agent
    assert checked[1].bad is not None
    assert "answers no call" in checked[1].bad


def test_a_lone_surrogate_in_the_tools_is_a_bad_row_not_a_template_error(tmp_path):
    path = tmp_path / "p.jsonl"
    tools = '[{"type": "function", "function": {"name": "f", "description": "bad \\ud800"}}]'
    path.write_text('{"id": "s", "tools": ' + tools + ', "messages": [{"role": "user", "content": "hi"}]}\n')
    rows, bad = read_prompts(path)
    assert rows == []
    assert len(bad) == 1
    assert "lone UTF-16 surrogate U+D800" in bad[0]
    assert bad[0].startswith("line 1")


@pytest.mark.parametrize("arguments", ['"{\\"x\\": \\"\\\\ud800\\"}"', '{"x": "\\ud800"}'])
def test_a_lone_surrogate_in_a_calls_arguments_is_a_bad_row(tmp_path, arguments):
    """Escaped inside the arguments string it passed the row's checks; `--history file` sent it, and the server's
    tokenizer refused it (HTTP 500, retried, a failure, exit 3) where it is a bad row (exit 4)."""
    path = tmp_path / "p.jsonl"
    tools = '[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]'
    call = '{"id": "a", "type": "function", "function": {"name": "f", "arguments": ' + arguments + "}}"
    messages = (
        '[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [' + call + "]}, "
        '{"role": "tool", "tool_call_id": "a", "content": "r"}, {"role": "assistant", "content": "ok"}]'
    )
    path.write_text('{"id": "s", "tools": ' + tools + ', "messages": ' + messages + "}\n")
    rows, bad = read_prompts(path)
    assert rows == [] and len(bad) == 1, (rows, bad)
    assert bad[0].startswith("line 1") and "lone UTF-16 surrogate U+D800" in bad[0], bad


@pytest.mark.parametrize("tools", [{}, 0, False])
def test_tools_that_are_no_list_are_refused_whatever_else_the_row_holds(tmp_path, tools):
    """`"tools": {}` was refused on a row the checked path read (a `name` on a turn) and sent as a row without tools
    on the fast path's plain row: the same mistake, two outcomes."""
    plain = {"id": "plain", "tools": tools, "messages": [{"role": "user", "content": "hi"}]}
    named = {"id": "named", "tools": tools, "messages": [{"role": "user", "content": "hi", "name": "u"}]}
    checked = list(iter_checked(_file(tmp_path, plain, named), rows=False))
    assert [c.bad is not None and "`tools` must be a list of tools" in c.bad for c in checked] == [True, True]


def test_an_assistant_turn_before_the_first_user_turn_is_history_not_a_turn_to_generate(tmp_path):
    """A conversation that opens with the assistant's greeting planned that turn with no message before it: the
    request could not be made and the batch stopped with an internal error, nothing stored."""
    greeting = {"role": "assistant", "content": "Hello, how can I help?"}
    rows = [
        {"id": "g1", "messages": [greeting, {"role": "user", "content": "2+2?"}]},
        {
            "id": "g2",
            "messages": [greeting, {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}],
        },
        {
            "id": "g3",
            "messages": [greeting, {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
            + [{"role": "user", "content": "c"}],
        },
    ]
    for checked, row in zip(iter_checked(_file(tmp_path, *rows), rows=True), rows, strict=True):
        points = generation_points(checked.row)
        assert [p.turn for p in points] == checked.turns, row["id"]
        assert all(any(m["role"] == "user" for m in p.history) for p in points)
    assert [len(generation_points(c.row)) for c in iter_checked(_file(tmp_path, *rows), rows=True)] == [1, 1, 2]
