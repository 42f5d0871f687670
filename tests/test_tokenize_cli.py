"""`tokview tokenize`: ids and pieces of texts or a chat prompt, special ids marked, one line per error."""

from __future__ import annotations

import io
import json
import sys

import pytest

from tokview.cli import main
from tokview.core.kimi_layout import build_kimi_tiktoken_dir
from tokview.core.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def tiktoken_dir(tmp_path_factory):
    return build_kimi_tiktoken_dir(tmp_path_factory.mktemp("kimi-tiktoken"))


def _run(capsys, *argv):
    code = main(["tokenize", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_texts_with_special_ids_marked(capsys, tiktoken_dir):
    code, out, err = _run(capsys, "--tokenizer", tiktoken_dir, "Hello <think>世界", "x")
    assert code == 0
    assert err == ""
    lines = out.splitlines()
    assert lines[0] == (f"tokenizer {tiktoken_dir} (loaded from native tiktoken), 163842 ids; * marks special ids")
    assert "text 'Hello <think>世界': 9 ids" in lines
    assert "  288 32 163606* 228 184 150 231 149 140" in lines
    assert "      2   163606* '<think>'" in lines
    assert "      5      150  '世'" in lines
    assert "      3      228  '‹e4›'" in lines  # a byte that completes no character


def test_json_one_object_per_line_from_stdin(capsys, monkeypatch, kimi_tok_dir, kimi_tok):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"a b\n<|im_end|>\n\n")))
    code, out, _ = _run(capsys, "--tokenizer", kimi_tok_dir, "--json", "first", "-")
    rows = [json.loads(line) for line in out.splitlines()]
    assert code == 0
    assert [r["text"] for r in rows] == ["first", "a b", "<|im_end|>", ""]
    for row in rows:
        assert set(row) == {"text", "ids", "pieces"}
        assert row["ids"] == kimi_tok.encode(row["text"])
        assert row["pieces"] == kimi_tok.pieces(row["ids"])
    assert rows[2]["ids"] == [163586]


@pytest.mark.parametrize("thinking", [True, False])
def test_chat_prints_the_prompt_ids_tokview_sends(capsys, tmp_path, tiktoken_dir, thinking):
    chat = tmp_path / "chat.json"
    messages = [{"role": "user", "content": "What is 6 times 7?"}]
    chat.write_text(json.dumps(messages))
    code, out, _ = _run(
        capsys, "--tokenizer", tiktoken_dir, "--chat", chat, "--json", "--thinking" if thinking else "--no-thinking"
    )
    (row,) = [json.loads(line) for line in out.splitlines()]
    expected = load_tokenizer(tiktoken_dir).render(messages, template_kwargs={"thinking": thinking})
    assert code == 0
    assert row["ids"] == expected
    assert row["ids"][-1] == (163606 if thinking else 163607)
    assert row["text"].startswith("<|im_user|>user")


def test_chat_with_several_assistant_turns(capsys, tmp_path, kimi_tok_dir):
    chat = tmp_path / "chat.json"
    chat.write_text(
        json.dumps(
            {
                "messages": [
                    {"role": "user", "content": "a"},
                    {"role": "assistant", "content": "b"},
                    {"role": "user", "content": "c"},
                ]
            }
        )
    )
    code, out, _ = _run(capsys, "--tokenizer", kimi_tok_dir, "--chat", chat)
    assert code == 0
    assert [line.split(" '")[0] for line in out.splitlines() if line.startswith("chat prompt")] == [
        'chat prompt (assistant turn 0) {"thinking": true}',
        'chat prompt (assistant turn 1) {"thinking": true}',
    ]


@pytest.mark.parametrize(
    "setup, expected",
    [
        (lambda d: d, "no tokenizer files in {d}"),
        (
            lambda d: (d / "f.json").write_text("{}") and d / "f.json",
            "tokenizer path {d}/f.json is a file, not a folder",
        ),
        (lambda d: d / "missing", "tokenizer directory not found: {d}/missing"),
    ],
)
def test_folders_that_cannot_load_are_one_line(capsys, tmp_path, setup, expected):
    code, out, err = _run(capsys, "--tokenizer", setup(tmp_path), "hi")
    assert code == 1
    assert out == ""
    assert err.startswith("tokview: error: " + expected.format(d=tmp_path))
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    "content, expected",
    [
        ('[{"role": "user", "content": "a\tb"}]', "is not valid JSON: Invalid control character"),
        ('[{"role": "wizard", "content": "a"}]', "unknown role 'wizard'"),
        ('{"nothing": 1}', "no `messages`"),
    ],
)
def test_bad_chat_files_are_one_line(capsys, tmp_path, kimi_tok_dir, content, expected):
    chat = tmp_path / "chat.json"
    chat.write_text(content)
    code, _, err = _run(capsys, "--tokenizer", kimi_tok_dir, "--chat", chat)
    assert code == 1
    assert expected in err
    assert err.startswith(f"tokview: error: {chat}")
    assert err.count("\n") == 1


def test_nothing_to_tokenize(capsys):
    code, _, err = _run(capsys)
    assert code == 1
    assert "nothing to tokenize" in err


def test_an_unknown_profile_is_refused_without_chat_too(capsys, kimi_tok_dir):
    """--profile is read only with --chat; a name that is no profile was silently ignored without it."""
    code, out, err = _run(capsys, "--tokenizer", kimi_tok_dir, "--profile", "nosuch", "hi")
    assert code == 1
    assert not out
    assert len(err.strip().splitlines()) == 1
    assert "unknown profile 'nosuch'" in err
    code, out, _ = _run(capsys, "--tokenizer", kimi_tok_dir, "--profile", "qwen3", "hi")
    assert code == 0  # without --chat the profile renders nothing
    assert "ids" in out


def test_a_profile_of_another_tokenizer_is_refused_with_chat_as_every_command_refuses_it(
    capsys, kimi_tok_dir, tmp_path
):
    """`tokenize --profile qwen3 --chat` on the Kimi tokenizer printed a prompt rendered with Qwen3's kwargs (sim,
    audit and doctor refuse the pair)."""
    chat = tmp_path / "c.json"
    chat.write_text('[{"role": "user", "content": "hi"}]')
    code, out, err = _run(capsys, "--tokenizer", kimi_tok_dir, "--profile", "qwen3", "--chat", str(chat))
    assert code == 1 and "151667" not in out
    assert len(err.strip().splitlines()) == 1 and "think_open_id 151667" in err, err
    code, out, _ = _run(capsys, "--tokenizer", kimi_tok_dir, "--profile", "kimi-k2.5", "--chat", str(chat))
    assert code == 0 and "163606" in out


def test_a_chat_turn_of_the_wrong_type_is_named_as_batch_names_it(tmp_path):
    """`tokenize --chat` on a turn whose content is a number said "chat template failed: 'int' object is not
    iterable"; it now says what `tokview batch` says of the same row."""
    import json
    import subprocess
    import sys

    chat = tmp_path / "chat.json"
    chat.write_text(json.dumps([{"role": "user", "content": 5}]))
    argv = [sys.executable, "-m", "tokview", "tokenize", "--chat", str(chat)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"tokview: error: {chat}: message 1 `content` must be a string or a list of text parts, not a number"
    ), done.stderr


def test_stdin_is_one_text_per_newline_and_json_keeps_the_terminal_safe(capsys, monkeypatch, kimi_tok_dir, tmp_path):
    """`splitlines` also cut at a form feed, U+2028 and the other separators: a text holding one printed ids of two
    texts, none of them the text's. `--json` passed C1 controls and bidi overrides raw to the terminal; and
    `--chat /dev/stdin` was "not found" (a pipe is no regular file)."""
    data = "page1\fpage2\r\nA\u2028B\nx\x9b2J\u202ey\n".encode()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    code, out, _ = _run(capsys, "--tokenizer", kimi_tok_dir, "--json", "-")
    assert code == 0
    assert "\x9b" not in out and "\u202e" not in out and "\u2028" not in out  # U+2028 broke splitlines readers
    texts = [json.loads(line)["text"] for line in out.splitlines()]
    assert texts == ["page1\fpage2", "A\u2028B", "x\x9b2J\u202ey"]
    import os
    import threading

    fifo = tmp_path / "chat.json"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text('{"messages": [{"role": "user", "content": "hi"}]}'))
    writer.start()
    code, out, err = _run(capsys, "--tokenizer", kimi_tok_dir, "--chat", str(fifo))
    writer.join(timeout=10)
    assert code == 0, err
    assert "chat prompt" in out


def test_chat_of_a_row_with_tools_prints_the_prompt_batch_sends(capsys, tmp_path, kimi_tok_dir, vllm_sim):
    """The row's `tools` were dropped: turn 0 printed 32 ids where batch sends ~230 (Kimi's tool_declare turn first)."""
    from pathlib import Path

    from tokview.store import Store

    row = json.loads((Path(__file__).parent.parent / "sample_data/agent_traces.jsonl").read_text().splitlines()[0])
    assert row["tools"]
    chat, prompts = tmp_path / "row.json", tmp_path / "p.jsonl"
    chat.write_text(json.dumps(row))
    prompts.write_text(json.dumps(row) + "\n")
    code, out, _ = _run(capsys, "--tokenizer", kimi_tok_dir, "--chat", chat, "--json")
    assert code == 0
    printed = [json.loads(line)["ids"] for line in out.splitlines()]
    db = tmp_path / "b.duckdb"
    args = ["batch", str(prompts), "--server", vllm_sim.url, "--db", str(db), "--mode", "chat", "--workers", "1"]
    assert main([*args, "--tokenizer", str(kimi_tok_dir)]) == 0
    with Store(db) as store:
        sent = [list(ids) for (ids,) in store.query("SELECT prompt_ids FROM samples WHERE turn = 0")]
    assert sent and printed[0] == sent[0]


@pytest.mark.parametrize("source", ["chat", "stdin"])
def test_an_endless_input_is_refused_past_the_read_limit_not_read_until_memory_runs_out(
    source, tmp_path, capsys, monkeypatch
):
    """`tokenize --chat /dev/zero` and `tokenize - < /dev/zero` read until the process ran out of memory (exit 70)."""
    from tokview.commands import tokenize as tokenize_command

    monkeypatch.setattr(tokenize_command, "READ_LIMIT", 1 << 10)
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (1 << 11))
    if source == "chat":
        argv = ["tokenize", "--chat", str(big)]
    else:
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(big.read_bytes())))
        argv = ["tokenize", "-"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("tokview: error: ") and "holds more than 0 MiB" not in err and err.count("\n") == 1, err
    assert "tokenize reads one conversation" in err


def test_no_thinking_without_a_chat_is_refused(capsys, tiktoken_dir):
    """`tokenize --no-thinking hello` was taken and did nothing: the help says it goes with --chat."""
    assert main(["tokenize", "--tokenizer", str(tiktoken_dir), "--no-thinking", "hello"]) == 1
    assert "--thinking and --no-thinking go with --chat only" in capsys.readouterr().err
