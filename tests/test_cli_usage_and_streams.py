"""Argument errors are usage errors (exit 1, one line), and a closed stdout or stderr never ends a
command with a traceback: the work is done, the exit code is the command's, and a command whose data
goes to a closed stdout says so in one line.

The closed streams are really closed (the shell's `>&-`), not /dev/null: Python then starts with
`sys.stdout` or `sys.stderr` None, and the next file opened would take fd 1 or 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tokview.cli import main
from tokview.errors import ExitCode
from tokview.sim import SimConfig, start_simulator

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ROOT / "sample_data" / "plain_prompts.jsonl"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["batch", "p.jsonl", "--server", "http://127.0.0.1:9", "--shard", "3/2"], "--shard 3/2"),
        (  # a Slurm array's task ids count from 0
            ["batch", "p.jsonl", "--server", "http://127.0.0.1:9", "--shard", "0/4"],
            "--shard 0/4: K must be between 1 and N (shards count from 1: from a task id counted from 0, pass "
            "$((ID + 1))/4)",
        ),
        (["batch", "p.jsonl", "--server", "http://127.0.0.1:9", "--concurrency", "abc"], "invalid int value: 'abc'"),
        (["stats", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["export", "--db", "x.duckdb"], "the following arguments are required: --out"),
        (["no-such-command"], "invalid choice: 'no-such-command'"),
        (
            ["batch", "p.jsonl", "--server", "http://127.0.0.1:9", "--chat-template-kwargs", '{"a": "\\ud800"}'],
            "holds a lone surrogate escape",
        ),
        (["batch", "p.jsonl", "--server", "http://127.0.0.1:9", "--chat-template-kwargs", '{"a": NaN}'], "NaN is not"),
        (["batch", "p.jsonl", "--server", "http://127.0.0.1:9", "--chat-template-kwargs", '{"a": 1e999}'], "1e999 is"),
    ],
)
def test_an_argument_error_is_a_usage_error_in_one_line(argv, says, capsys):
    """argparse exits 2 (tokview's code for an unreachable server) with a multi-line usage."""
    code = main(argv)
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE
    assert err.count("\n") == 1, err
    assert err.startswith("tokview: error: "), err
    assert says in err, err
    assert "--help" in err  # where the usage is


def test_help_and_version_still_exit_0(capsys):
    for argv in (["--help"], ["batch", "--help"], ["--version"]):
        with pytest.raises(SystemExit) as done:
            main(argv)
        assert done.value.code == 0
    assert "usage: tokview" in capsys.readouterr().out


def _shell(command: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `python -m tokview ARGS` through sh with a redirection such as `>&-` (a closed descriptor)."""
    argv = [sys.executable, "-m", "tokview", *args]
    script = 'exec "$@" ' + command
    return subprocess.run(["sh", "-c", script, "sh", *argv], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


@pytest.fixture(scope="module")
def sim_url():
    with start_simulator(SimConfig(kind="vllm")) as sim:
        yield sim.url


def _batch(sim_url: str, db: Path, *more: str) -> list[str]:
    return ["batch", str(PROMPTS), "--server", sim_url, "--db", str(db), "--limit", "3", "--workers", "1", *more]


def test_batch_with_stdout_closed_finishes_and_exits_0(sim_url, tmp_path):
    db = tmp_path / "a.duckdb"
    done = _shell(">&-", *_batch(sim_url, db))
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "ok 3" in done.stderr


def test_batch_summary_json_to_a_closed_stdout_is_one_line_after_the_work(sim_url, tmp_path):
    db = tmp_path / "a.duckdb"
    done = _shell(">&-", *_batch(sim_url, db, "--summary-json"))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == ExitCode.USAGE, done.stderr
    assert "Traceback" not in done.stderr
    assert lines[-1].startswith("tokview: error: ")
    assert "stdout" in lines[-1]
    again = _shell("", *_batch(sim_url, db, "--summary-json"))  # the work was kept
    assert json.loads(again.stdout)["resumed"] == 3


def test_batch_with_stderr_closed_finishes_and_exits_0(sim_url, tmp_path):
    db = tmp_path / "a.duckdb"
    done = _shell("2>&-", *_batch(sim_url, db, "--summary-json"))
    assert done.returncode == 0
    assert done.stderr == ""
    summary = json.loads(done.stdout)  # stdout holds the data only: no message strayed into it
    assert summary["ok"] == 3
    assert summary["exit_code"] == 0


def test_export_to_a_closed_stdout_is_one_line_not_an_internal_error(sim_url, tmp_path):
    db = tmp_path / "a.duckdb"
    assert _shell("", *_batch(sim_url, db)).returncode == 0
    done = _shell(">&-", "export", "--db", str(db), "--out", "-")
    err = done.stderr.strip().splitlines()
    assert done.returncode == ExitCode.USAGE, done.stderr
    assert len(err) == 1, done.stderr
    assert err[0].startswith("tokview: error: ")
    assert "stdout is closed" in err[0]
    quiet = _shell("2>&-", "export", "--db", str(db), "--out", "-")
    assert quiet.returncode == 0
    assert len(quiet.stdout.splitlines()) == 3


def test_a_closed_stdout_never_lends_its_descriptor_to_a_file(tmp_path):
    """With fd 1 closed, the next file opened would be fd 1, and anything written to stdout (a library's
    print, a child process) would land in it. tokview takes fds 0-2 before it opens anything."""
    code = (
        "import os, sys\n"
        "from tokview.cli import guard_standard_streams\n"
        "guard_standard_streams()\n"
        "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT)\n"
        "os.write(1, b'stray')\n"
        "print(fd, file=sys.stderr)\n"
    )
    target = tmp_path / "f"
    done = subprocess.run(
        ["sh", "-c", 'exec "$@" >&-', "sh", sys.executable, "-c", code, str(target)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stderr) > 2, done.stderr
    assert os.path.getsize(target) == 0


@pytest.mark.parametrize(
    "argv",
    [
        ["export", "--db", "x.duckdb", "--out", "o.jsonl", "--max-nll", "nan"],
        ["score", "--db", "x.duckdb", "--server", "http://127.0.0.1:9", "--off-policy-nll", "NaN"],
        ["batch", "p.jsonl", "--server", "http://127.0.0.1:9", "--temperature", "nan"],
    ],
)
def test_nan_is_refused_by_every_number_option(argv, capsys):
    """`--max-nll nan` was accepted (every comparison with NaN is false: it kept nothing, or everything)."""
    code = main(argv)
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE, err
    assert err.count("\n") == 1, err
    assert "must be a finite number, not nan" in err, err
    assert argv[-2] in err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["batch", "p.jsonl", "--server", "http://127.0.0.1:9", "--run", "\udcff"], "the value of --run ('\\xff')"),
        (["review", "--db", "s.duckdb", "--reviewer", "a\udcffb", "--approve"], "the value of --reviewer ('a\\xffb')"),
        (["show", "id\udcfe"], "argument 2 ('id\\xfe')"),
        (["export", "--db", "s.duckdb", "--out", "o.jsonl", "--tag=\udcff"], "argument 6 ('--tag=\\xff')"),
        # paths a run records: a batch so named stored samples with no run record (prompts, store, tokenizer)
        (["batch", "p\udcff.jsonl", "--server", "http://127.0.0.1:9"], "argument 2 ('p\\xff.jsonl')"),
        (["batch", "p.jsonl", "--server", "http://127.0.0.1:9", "--db", "s\udcff.duckdb"], "the value of --db"),
        (["batch", "p.jsonl", "--server", "http://127.0.0.1:9", "--tokenizer", "t\udcff"], "the value of --tokenizer"),
    ],
)
def test_an_argument_that_is_not_utf8_is_refused_before_anything_is_stored(argv, says, capsys, tmp_path, monkeypatch):
    """Bytes that are not UTF-8 reach Python as lone surrogates, which the store cannot hold: `batch --run $'\\xff'`
    generated and stored samples under a garbled run with no run record, then said it could not write to the store."""
    monkeypatch.chdir(tmp_path)
    if argv[1].startswith("p\udcff"):
        (tmp_path / "p.jsonl").write_text('{"id": "a", "prompt": "hi"}\n')
        os.rename(tmp_path / "p.jsonl", os.fsencode(tmp_path) + b"/p\xff.jsonl")  # an existing file: still refused
    assert main(argv) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert err.startswith("tokview: error: ") and says in err and err.count("\n") == 1, err
    assert [p for p in tmp_path.iterdir() if not p.name.endswith(".jsonl")] == []  # no store, no parts


@pytest.mark.parametrize("looped", ["prompts", "tokenizer"])
def test_a_symlink_loop_given_to_batch_is_one_line_not_an_internal_error(looped, capsys, tmp_path):
    """`Path.resolve()` raises RuntimeError on a loop: `batch LOOP` and `batch --tokenizer LOOP` exited 70."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "q", "messages": [{"role": "user", "content": "hi"}]}\n')
    argv = ["batch", str(tmp_path / "a") if looped == "prompts" else str(prompts), "--server", "http://127.0.0.1:9"]
    argv += ["--db", str(tmp_path / "s.duckdb")] + (
        ["--tokenizer", str(tmp_path / "a")] if looped == "tokenizer" else []
    )
    assert main(argv) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert err.startswith("tokview: error: ") and "not found" in err and err.count("\n") == 1, err
