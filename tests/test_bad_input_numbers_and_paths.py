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
    path = tmp_path / "p.jsonl"
    good = "".join(json.dumps({"id": f"q{i}", "prompt": "x" * 50}) + "\n" for i in range(2000))
    path.write_bytes(good.encode() + b'{"id": "bad", "prompt": "\xff"}\n')
    with pytest.raises(InputError, match="not UTF-8"):
        list(iter_jsonl_fast(path))
