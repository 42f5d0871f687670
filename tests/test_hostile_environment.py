"""The environment a user runs tokview in: a narrow locale, a cache folder that cannot be written, a FIFO given as the
store, a read-only store, no terminal. Each was a traceback (exit 70), a hang, or work thrown away; each is now the
command's own work or one line and a non-zero exit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tokview.cli import main
from tokview.core.analysis import analyze
from tokview.core.record import Capture
from tokview.store import Store

ROOT = Path(__file__).resolve().parents[1]
TOKVIEW = [sys.executable, "-m", "tokview"]
NARROW = {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": ""}


def _tokview(*args: str, env: dict[str, str], stdin: bytes = b"", timeout: float = 60) -> subprocess.CompletedProcess:
    merged = {**os.environ, **env}
    merged = {k: v for k, v in merged.items() if v != ""}  # "" unsets (PYTHONIOENCODING)
    return subprocess.run([*TOKVIEW, *args], input=stdin, capture_output=True, timeout=timeout, cwd=ROOT, env=merged)


def _store(path: Path, kimi_tok, kimi_profile) -> Path:
    ids = kimi_tok.encode("答案是 🎉 forty-two") + [kimi_profile.stop_ids[0]]
    cap = Capture(prompt_ids=kimi_tok.encode("hi"), output_ids=ids, finish_reason="stop", endpoint="sglang-generate")
    with Store(path) as store:
        store.put_sample("s1", "p1", "r1", cap, analyze(cap, kimi_profile, kimi_tok), profile="kimi-k2.5")
    return path


def test_a_narrow_locale_prints_what_it_cannot_encode_as_escapes(tmp_path, kimi_tok, kimi_profile):
    """`LC_ALL=C PYTHONUTF8=0`: tokview's own `·` and a sample's CJK text ended show, stats, tokenize as its bug."""
    db = _store(tmp_path / "s.duckdb", kimi_tok, kimi_profile)
    for args in (["stats", "--by", "run", "--db", str(db)], ["show", "s1", "--db", str(db)], ["tokenize", "-"]):
        done = _tokview(*args, env=NARROW, stdin="ünï 答案".encode())
        assert done.returncode == 0, done.stderr
        assert b"internal error" not in done.stderr and b"Traceback" not in done.stderr
    assert b"\\xb7" in _tokview("stats", "--by", "run", "--db", str(db), env=NARROW).stdout


def test_a_utf8_argument_a_narrow_locale_cannot_read_names_the_locale():
    done = _tokview("tokenize", "ünï", env=NARROW)
    assert done.returncode == 1
    assert b"which this locale" in done.stderr and b"LC_ALL=C.UTF-8" in done.stderr
    assert b"not UTF-8 text" not in done.stderr  # it is UTF-8: the locale is what cannot read it


@pytest.mark.parametrize("cache", ["/dev/null", "/proc/version/sub", "~no-such-user-tokview/x"])
def test_a_cache_folder_that_cannot_be_written_is_one_line(tmp_path, cache):
    """The built-in tokenizers are built into the cache on first use: a read-only home or a file named as the cache
    was tokview's bug (exit 70) in every command that needs one."""
    done = _tokview("tokenize", "hi", env={"TOKVIEW_CACHE": cache})
    assert done.returncode == 1, done.stderr
    [line] = done.stderr.decode().splitlines()
    assert "TOKVIEW_CACHE" in line


@pytest.mark.parametrize("command", ["batch", "merge"])
def test_a_fifo_given_as_the_store_is_refused_at_once(tmp_path, command, vllm_sim, kimi_tok, kimi_profile):
    """Its open waited for a writer forever, and Ctrl-C and SIGTERM could not stop a batch (only SIGKILL)."""
    fifo = tmp_path / "f.duckdb"
    os.mkfifo(fifo)
    prompts = ROOT / "sample_data" / "plain_prompts.jsonl"
    argv = {
        "batch": ["batch", str(prompts), "--server", vllm_sim.url, "--db", str(fifo), "--limit", "1"],
        "merge": ["merge", str(_store(tmp_path / "s.duckdb", kimi_tok, kimi_profile)), "--into", str(fifo)],
    }[command]
    done = _tokview(*argv, env={}, timeout=60)
    assert done.returncode != 0, done.stderr
    assert b"Traceback" not in done.stderr
    assert b"is not a regular file" in done.stderr


def test_score_refuses_a_read_only_store_before_scoring_anything(tmp_path, kimi_tok, kimi_profile, monkeypatch, capsys):
    """It scored every sample, held every score in memory, then said it could not write them: all thrown away."""
    db = _store(tmp_path / "s.duckdb", kimi_tok, kimi_profile)
    monkeypatch.setattr(Store, "read_only", property(lambda self: True))
    assert main(["score", "--db", str(db), "--server", "http://127.0.0.1:9"]) == 1
    assert "read-only (nothing scored)" in capsys.readouterr().err


def test_a_dry_run_review_of_a_read_only_store_says_what_it_would_do(tmp_path, kimi_tok, kimi_profile, monkeypatch):
    db = _store(tmp_path / "s.duckdb", kimi_tok, kimi_profile)
    monkeypatch.setattr(Store, "read_only", property(lambda self: True))
    assert main(["review", "--db", str(db), "--run", "r1", "--approve", "--dry-run"]) == 0
    assert main(["review", "--db", str(db), "--run", "r1", "--approve"]) == 1


def test_json_in_a_narrow_locale_is_json_and_a_paths_bytes_print_back_as_they_came(tmp_path):
    """stdout's escapes in a narrow locale made `tokenize --json` write `caf\\xe9`, no JSON; and an argument's bytes
    (Python's surrogateescape) printed as `\\udcc3` where the locale's own handler wrote them back."""
    import json

    chat = tmp_path / "chat.json"
    chat.write_text(json.dumps([{"role": "user", "content": "café 🎉"}]), encoding="utf-8")
    done = _tokview("tokenize", "--json", "--chat", str(chat), env=NARROW)
    assert done.returncode == 0, done.stderr
    assert "café 🎉" in json.loads(done.stdout.splitlines()[0])["text"]
    from tokview.cli import _narrow_escape

    assert _narrow_escape(UnicodeEncodeError("ascii", "a\udcc3\u00b7", 1, 3, "x")) == (b"\xc3", 2)
    assert _narrow_escape(UnicodeEncodeError("ascii", "a\udcc3\u00b7", 2, 3, "x")) == ("\\xb7", 3)


def test_an_unknown_users_home_in_tokview_cache_leaves_the_optional_caches_alone(tmp_path, qwen_tok_dir):
    """Only what must live on disk (the built-in layouts) needs the cache: a tokenizer folder of one's own works."""
    done = _tokview("tokenize", "--tokenizer", str(qwen_tok_dir), "hi", env={"TOKVIEW_CACHE": "~no-such-user-tv/x"})
    assert done.returncode == 0, done.stderr


def test_the_app_with_stdin_closed_and_no_store_is_one_line(tmp_path):
    done = subprocess.run(
        f"{sys.executable} -m tokview ui --db {tmp_path / 'none.duckdb'} <&-",
        shell=True,
        capture_output=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 1, done.stderr
    assert b"database not found" in done.stderr and b"Traceback" not in done.stderr
