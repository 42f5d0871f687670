"""Prompt rows that are not what they look like are refused with words that say what is wrong: a turn
with no content (it was sent as an empty turn), a `prompt` that is not text (it was "no `messages`,
`conversations` or `prompt` field"), and a prompts path that is not a file (/dev/null was "not found")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokview.batch import read_prompts
from tokview.cli import main
from tokview.errors import ExitCode


def _file(tmp_path: Path, *rows: object) -> Path:
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


GOOD = {"id": "good", "prompt": "fine"}


@pytest.mark.parametrize(
    ("row", "says"),
    [
        ({"id": "a", "messages": [{"role": "user"}]}, "message 1 has no `content`"),
        ({"id": "a", "messages": [{"role": "user", "content": None}]}, "message 1 has no `content`"),
        (
            {"id": "a", "messages": [{"role": "system", "content": "s"}, {"role": "user"}]},
            "message 2 has no `content`",
        ),
        ({"id": "a", "conversations": [{"from": "human"}]}, "message 1 has no `value`"),
        ({"id": "a", "prompt": 5}, "`prompt` must be a string, not a number"),
        ({"id": "a", "prompt": None}, "`prompt` must be a string, not null"),
        ({"id": "a", "messages": "hi"}, "`messages` must be a list of turns, not a string"),
        ({"id": "a", "conversations": {"from": "human"}}, "`conversations` must be a list of turns, not an object"),
    ],
)
def test_a_row_that_is_not_what_it_looks_like_says_what_is_wrong(tmp_path, row, says):
    rows, bad = read_prompts(_file(tmp_path, row, GOOD))
    assert [r.prompt_id for r in rows] == ["good"]
    assert len(bad) == 1, bad
    assert bad[0].startswith("line 1: "), bad
    assert says in bad[0], bad


def test_an_empty_string_is_still_an_explicit_empty_turn(tmp_path):
    turns = [
        {"role": "system", "content": ""},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "again"},
    ]
    rows, bad = read_prompts(_file(tmp_path, {"id": "a", "messages": turns}))
    assert bad == []
    assert rows[0].messages == turns


@pytest.mark.parametrize(
    ("row", "says"),
    [
        ({"id": "a", "prompt": ""}, "line 1: `prompt` (the user turn) has no text"),
        ({"id": "a", "prompt": " \n"}, "line 1: `prompt` (the user turn) has no text"),
        ({"id": "a", "messages": [{"role": "user", "content": "  "}]}, "line 1: message 1 (a user turn) has no text"),
        ({"id": "a", "conversations": [{"from": "human", "value": ""}]}, "line 1: message 1 (a user turn) has no text"),
        (
            {"id": "a", "messages": [{"role": "user", "content": [{"type": "text", "text": " "}]}]},
            "line 1: message 1 (a user turn) has no text",
        ),
        (
            {
                "id": "a",
                "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
                + [{"role": "user", "content": ""}],
            },
            "line 1: message 3 (a user turn) has no text",
        ),
    ],
)
def test_a_user_turn_with_no_text_is_a_bad_row(tmp_path, row, says):
    """The README says content must be text and not empty; a blank user turn (a question lost in extraction) was
    answered and stored as a valid sample, passing every check."""
    rows, bad = read_prompts(_file(tmp_path, row, GOOD))
    assert [r.prompt_id for r in rows] == ["good"]
    assert len(bad) == 1 and bad[0].startswith(says), bad


@pytest.mark.parametrize("path", ["/dev/null", "/dev/zero"])
def test_a_prompts_path_that_is_a_device_is_not_called_missing(path, capsys):
    code = main(["batch", path, "--server", "http://127.0.0.1:9", "--db", "/nonexistent/x.duckdb"])
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE
    assert err.count("\n") == 1
    assert "not found" not in err, err
    assert f"{path} is not a regular file" in err, err


def test_a_prompts_file_given_by_process_substitution_is_a_pipe_not_missing(tmp_path, capsys):
    """`tokview batch <(cat p.jsonl)` is /dev/fd/N, a link to "pipe:[N]": resolved first, it was "not found"."""
    import os

    read_end, write_end = os.pipe()
    try:
        code = main(["batch", f"/dev/fd/{read_end}", "--server", "http://127.0.0.1:9", "--db", str(tmp_path / "x.db")])
    finally:
        os.close(read_end)
        os.close(write_end)
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE
    assert "is not a regular file (a pipe)" in err and "not found" not in err, err
    assert not (tmp_path / "x.db").exists()


def test_ray_asked_for_without_ray_is_refused_before_the_store_exists(tmp_path, capsys, monkeypatch):
    """`--ray auto` with Ray not installed: the store was made, a run recorded and the server probed, then refused."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    prompts = _file(tmp_path, {"id": "a", "messages": [{"role": "user", "content": "hi"}]})
    db = tmp_path / "r.duckdb"
    code = main(["batch", str(prompts), "--server", "http://127.0.0.1:9", "--db", str(db), "--ray", "auto"])
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE
    assert "--ray needs Ray" in err and err.count("\n") == 1
    assert not db.exists()


def test_a_developer_turn_is_read_and_rendered_as_the_template_writes_it(tmp_path, kimi_tok) -> None:
    """OpenAI's `developer` role (what harnesses send for o-series and gpt-oss models) was a bad row ("unknown role
    'developer'"), though both servers and the proxy take it: the template decides how it renders (Kimi's writes a
    system-kind turn named developer)."""
    row = {"id": "d", "messages": [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "hi"}]}
    [prompt], bad = read_prompts(_file(tmp_path, row))
    assert bad == []
    assert [m["role"] for m in prompt.messages] == ["developer", "user"]
    text = kimi_tok.decode(kimi_tok.render(prompt.messages, template_kwargs={"thinking": True}))
    assert text.startswith("<|im_system|>developer<|im_middle|>Be brief.<|im_end|>")


def test_hermes_tool_responses_are_the_results_inside_them_one_per_block() -> None:
    """A ShareGPT `tool` turn of `<tool_response>` blocks went to the template as it was, which wrapped it again (the
    prompt held `<tool_response>\\n<tool_response>…`), and two blocks in one turn (Hermes' parallel results) were
    refused as a call left without its result."""
    from tokview.core.prompts import parse_row

    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "%s"}}\n</tool_call>'
    weather = '{"name": "get_weather", "content": "%s"}'
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    turns: list[dict[str, str]] = [
        {"from": "human", "value": "Dublin and Oslo?"},
        {"from": "gpt", "value": call % "Dublin" + "\n" + call % "Oslo"},
        {
            "from": "tool",
            "value": f"<tool_response>\n{weather % 'rain'}\n</tool_response>\n"
            f"<tool_response>\n{weather % 'snow'}\n</tool_response>",
        },
        {"from": "gpt", "value": "Rain in Dublin, snow in Oslo."},
    ]
    row = {"tools": tools, "conversations": turns}
    messages = parse_row(row).messages
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "assistant"]
    calls = messages[1]["tool_calls"]
    assert [(m["content"], m["name"], m["tool_call_id"]) for m in messages[2:4]] == [
        (weather % "rain", "get_weather", calls[0]["id"]),
        (weather % "snow", "get_weather", calls[1]["id"]),
    ]
    turns[2]["value"] = "see <tool_response>x</tool_response> above"  # not only blocks: as written
    turns[1]["value"] = call % "Dublin"
    (result,) = [m for m in parse_row(row).messages if m["role"] == "tool"]
    assert result["content"] == "see <tool_response>x</tool_response> above"


def test_hermes_results_in_another_order_match_by_name_and_errors_count_the_files_messages() -> None:
    """Blocks naming their function in another order than the calls were refused as answering the wrong call; and
    an error after a split turn counted the split messages (the row's 4th entry said "message 5")."""
    from tokview.core.agent_traces import PromptError
    from tokview.core.prompts import parse_row

    call = '<tool_call>\n{"name": "%s", "arguments": {"city": "x"}}\n</tool_call>'
    answer = '<tool_response>\n{"name": "%s", "content": "ok"}\n</tool_response>'
    names = ("get_weather", "get_time")
    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in names]
    turns = [
        {"from": "human", "value": "q"},
        {"from": "gpt", "value": call % "get_weather" + "\n" + call % "get_time"},
        {"from": "tool", "value": answer % "get_time" + "\n" + answer % "get_weather"},
        {"from": "gpt", "value": "done"},
    ]
    messages = parse_row({"tools": tools, "conversations": turns}).messages
    calls = {c["function"]["name"]: c["id"] for c in messages[1]["tool_calls"]}
    assert [(m["name"], m["tool_call_id"]) for m in messages[2:4]] == [
        ("get_time", calls["get_time"]),
        ("get_weather", calls["get_weather"]),
    ]
    turns[3] = {"from": "gpt", "value": call % "undeclared"}
    turns.append({"from": "tool", "value": answer % "undeclared"})
    with pytest.raises(PromptError, match="message 4 calls 'undeclared'"):
        parse_row({"tools": tools, "conversations": turns})
