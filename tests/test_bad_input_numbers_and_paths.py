"""Bad input found by sending it: one line and a non-zero exit, never an internal error, never a success that kept
nothing.

- a whole number of more digits than Python converts (4,300) anywhere in a prompt row was an internal error for
  `batch` and `audit` (exit 70), and lost the good rows before it;
- `tokenize --chat` on JSON nested too deeply was an internal error (RecursionError);
- an empty store path (`--db ""`, `--into ""`) opened DuckDB's throwaway in-memory database: `merge` and `audit`
  reported success and kept nothing;
- a prompts file with bytes that are not UTF-8 past its first block was an internal error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tokview.batch.inputs import InputError, iter_jsonl_fast
from tokview.core.prompts import PromptError, iter_jsonl

TOKVIEW = [sys.executable, "-m", "tokview"]


HUGE = "9" * 5000


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*TOKVIEW, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_a_number_too_long_for_python_is_a_bad_row_for_both_readers(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": "a", "prompt": "hi"}\n{"id": "b", "prompt": "hi", "x": ' + HUGE + "}\n")
    fast = list(iter_jsonl_fast(path))
    assert fast[0][1]["id"] == "a"
    assert isinstance(fast[1][1], PromptError) or fast[1][2] is not None
    plain = list(iter_jsonl(path))
    assert plain[0][1]["id"] == "a" and isinstance(plain[1][1], PromptError)
    assert "more digits than Python reads" in str(plain[1][1])


def test_a_batch_with_a_number_too_long_skips_that_row_and_keeps_the_rest(tmp_path, vllm_sim):
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": "a", "prompt": "hi"}\n{"id": "b", "prompt": "hi", "x": ' + HUGE + "}\n")
    done = _run("batch", str(path), "--server", vllm_sim.url, "--db", str(tmp_path / "b.duckdb"), cwd=tmp_path)
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert "more digits than Python reads" in done.stderr, done.stderr
    assert done.returncode not in (0, 70), done.stderr
    stats = _run("stats", "--db", str(tmp_path / "b.duckdb"), "--json", cwd=tmp_path)
    assert json.loads(stats.stdout)["samples"] == 1, stats.stdout + stats.stderr


def test_an_audit_with_a_number_too_long_says_so(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"conversations": [{"role": "user", "content": "hi"}], "x": ' + HUGE + "}\n")
    done = _run("audit", str(path), "--db", str(tmp_path / "a.duckdb"), cwd=tmp_path)
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert done.returncode != 70


def test_tokenize_chat_on_json_nested_too_deeply_says_so_in_one_line(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    done = _run("tokenize", "--chat", str(path), cwd=tmp_path)
    assert done.returncode == 1 and "nested too deeply" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "args",
    [
        ["stats", "--db", ""],
        ["merge", "x.duckdb", "--into", ""],
        ["audit", "a.jsonl", "--db", ""],
        ["proxy", "--db", ""],
    ],
    ids=["stats", "merge", "audit", "proxy"],
)
def test_an_empty_store_path_is_refused_in_one_line(tmp_path, args):
    (tmp_path / "a.jsonl").write_text('{"conversations": [{"role": "user", "content": "hi"}]}\n')
    done = _run(*args, cwd=tmp_path)
    assert done.returncode == 1 and "empty path" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not any(p.suffix == ".duckdb" for p in tmp_path.iterdir())


def test_a_prompts_file_not_utf8_past_its_first_block_names_the_line(tmp_path):
    """A line that is not UTF-8 is that line's bad row, named with its byte (it stopped the whole file, named as
    line 1 when the file's first block held it); one on line 1 refuses the file (a binary file, most likely)."""
    path = tmp_path / "p.jsonl"
    good = "".join(json.dumps({"id": f"q{i}", "prompt": "x" * 50}) + "\n" for i in range(2000))
    path.write_bytes(good.encode() + b'{"id": "bad", "prompt": "\xff"}\n' + good.encode()[:40] + b"\n")
    rows = list(iter_jsonl_fast(path))
    bad = [(n, row) for n, row, _ in rows if isinstance(row, PromptError)]
    assert (bad[0][0], str(bad[0][1])) == (2001, "line 2001: not UTF-8 text (byte 0xff at column 26)")
    assert len(rows) == 2002 and [n for n, _ in bad] == [2001, 2002]  # 2002: cut short, not JSON
    path.write_bytes(b"\xff\xfe binary\n" + good.encode())
    with pytest.raises(InputError, match=r"p.jsonl:1: not UTF-8"):
        list(iter_jsonl_fast(path))


def test_a_batch_skips_a_line_that_is_not_utf8_and_captures_the_rest(tmp_path, vllm_sim):
    path = tmp_path / "p.jsonl"
    lines = [json.dumps({"id": f"q{i}", "prompt": f"question {i}"}).encode() for i in range(4)]
    path.write_bytes(b"\n".join([*lines, b'{"id": "q4", "prompt": "caf\xe9"}']) + b"\n")
    db = str(tmp_path / "b.duckdb")
    done = _run("batch", str(path), "--server", vllm_sim.url, "--db", db, cwd=tmp_path)
    assert done.returncode == 4, done.stderr
    assert "p.jsonl:5: not UTF-8 text (byte 0xe9 at column 28)" in done.stderr, done.stderr
    stats = _run("stats", "--db", db, "--json", cwd=tmp_path)
    assert json.loads(stats.stdout)["samples"] == 4, stats.stdout + stats.stderr


def _deep(levels: int) -> object:
    value: object = {}
    for _ in range(levels):
        value = {"a": value}
    return value


def test_agent_traces_nested_too_deeply_are_bad_rows_not_internal_errors(tmp_path, vllm_sim):
    """A call's arguments string nested 1,000 levels (Python's json gives up), a tool schema nested 300 levels
    (orjson, which the run's digests and stores use, writes 255) and `tools` given as such a string were exit 70
    for `batch`, `audit` and `tokenize --chat`. Each is now its row's bad-row reason; the good row is captured."""
    base = json.loads((Path(__file__).parent.parent / "sample_data/agent_traces.jsonl").read_text().splitlines()[0])
    rows = [dict(base, id="good")]
    deep_args = json.loads(json.dumps(base))
    deep_args["id"] = "deep-arguments"
    deep_args["messages"][1]["tool_calls"][0]["function"]["arguments"] = '{"a":' + "[" * 1000 + "]" * 1000 + "}"
    deep_tools = json.loads(json.dumps(base))
    deep_tools["id"] = "deep-tools"
    deep_tools["tools"][0]["function"]["parameters"] = _deep(300)
    string_tools = json.loads(json.dumps(base))
    string_tools["id"] = "deep-tools-string"
    string_tools["tools"] = "[" * 1000 + "]" * 1000
    rows += [deep_args, deep_tools, string_tools]
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    db = str(tmp_path / "b.duckdb")
    done = _run("batch", str(path), "--server", vllm_sim.url, "--db", db, "--mode", "chat", cwd=tmp_path)
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 4, done.stderr
    for line in (2, 3, 4):
        assert f"p.jsonl:{line}:" in done.stderr, done.stderr
    assert "nested too deeply" in done.stderr
    stats = _run("stats", "--db", db, "--json", cwd=tmp_path)
    assert json.loads(stats.stdout)["samples"] == 2, stats.stdout + stats.stderr  # the good row's two turns
    audit = _run("audit", str(path), "--db", str(tmp_path / "a.duckdb"), cwd=tmp_path)
    assert "internal error" not in audit.stderr and audit.returncode != 70, audit.stderr
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps(deep_args) + "\n")
    tokenized = _run("tokenize", "--chat", str(one), cwd=tmp_path)
    assert tokenized.returncode == 1 and "nested too deeply" in tokenized.stderr, tokenized.stderr


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize(
    "command", [["tokenize", "hello"], ["stats", "--db", "{db}", "--json"], ["stats", "--db", "{db}"]]
)
def test_output_to_a_full_device_is_one_line_and_exit_1(tmp_path, command):
    """`tokview stats > /dev/full` (a full disk under the output) was an internal error (exit 70)."""
    from tokview.store import Store

    db = tmp_path / "s.duckdb"
    with Store(db):
        pass
    argv = [part.format(db=db) for part in command]
    with open("/dev/full", "w") as full:
        done = subprocess.run([*TOKVIEW, *argv], stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == ["tokview: error: No space left on device"], done.stderr


@pytest.mark.parametrize(("command", "said"), [(["tokenize", "--chat"], "chat file"), (["audit"], "dataset")])
def test_a_directory_given_as_a_file_is_named_a_directory_not_missing(tmp_path, command, said):
    (tmp_path / "adir").mkdir()
    done = _run(*command, str(tmp_path / "adir"), cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip() == f"tokview: error: {said} is a directory: {tmp_path / 'adir'}", done.stderr


@pytest.mark.parametrize("calls", [{"name": "f", "arguments": "{}"}, "f()"])
def test_tool_calls_that_are_not_a_list_are_named_so(calls):
    from tokview.core.prompts import parse_row

    row = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": calls}]}
    with pytest.raises(PromptError, match=r"message 2's `tool_calls` must be a list of calls, not (dict|str)"):
        parse_row(row, line=1)


def test_lines_are_split_as_the_audit_splits_them_old_mac_endings_included(tmp_path):
    """Reading lines as bytes (to refuse a bad byte alone) split only on \\n: a file with \\r endings became one
    bad row, and a line starting with \\r was numbered otherwise than by the audit."""
    from tokview.batch.inputs import iter_rows, read_prompts

    cr_only = tmp_path / "cr.jsonl"
    cr_only.write_bytes(b'{"id":"a","prompt":"x"}\r{"id":"b","prompt":"y"}\r{"id":"c","prompt":"z"}\r')
    rows, bad = read_prompts(cr_only)
    assert [r.prompt_id for r in rows] == ["a", "b", "c"] and bad == []
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_bytes(b'{"id":"a","prompt":"x"}\n\r{"id":"b","prompt":"y"}\n\n{"id":"c",\n')
    _, bad = read_prompts(mixed)
    audit_bad = [n for n, row in iter_rows(mixed) if not isinstance(row, dict)]
    assert [message.split(":")[0] for message in bad] == [f"line {n}" for n in audit_bad] == ["line 5"], bad
    mixed.write_bytes(mixed.read_bytes() + b'{"id":"d","prompt":"\xff"}\r\n')
    _, bad = read_prompts(mixed)
    assert bad[1] == "line 6: not UTF-8 text (byte 0xff at column 21)", bad


def test_a_line_longer_than_memory_is_a_one_line_error_naming_it(monkeypatch, tmp_path):
    """`tokview audit /dev/zero` (no line ends) ended in `internal error: MemoryError`."""
    from tokview.core import prompts
    from tokview.errors import UserError

    class _Lines:
        def __init__(self) -> None:
            self.read = 0

        def __enter__(self) -> _Lines:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def __iter__(self) -> _Lines:
            return self

        def __next__(self) -> str:
            self.read += 1
            if self.read == 3:
                raise MemoryError
            return '{"prompt": "x"}\n'

    path = tmp_path / "rows.jsonl"
    monkeypatch.setattr(type(path), "open", lambda self, *a, **k: _Lines())
    rows = prompts.iter_jsonl(path)
    assert [n for n, _ in (next(rows), next(rows))] == [1, 2]
    with pytest.raises(UserError, match=r"rows.jsonl: line 3 does not fit in memory"):
        next(rows)


def test_an_empty_ray_address_is_refused_before_the_store_exists(tmp_path):
    """`--ray "$RAY_ADDRESS"` with the variable unset ran a local run, exit 0, as if Ray had been asked for nothing."""
    (tmp_path / "p.jsonl").write_text('{"id": "q", "prompt": "hi"}\n')
    done = _run("batch", "p.jsonl", "--server", "http://127.0.0.1:9", "--db", "b.duckdb", "--ray", " ", cwd=tmp_path)
    assert done.returncode == 1 and "--ray needs a Ray address or auto" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "b.duckdb").exists()
