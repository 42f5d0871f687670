"""`tokview batch` into a new store starts its landing child as the process starts (`batch/early_landing.py`).

What must hold: the child is started only for a command line that plainly names a new store; the run takes the
child started for its store (and every sample lands); a child started for a path the run does not use, or for a
run that never begins (bad input, an unreachable server), ends at exit and leaves no file, spare or parts folder.
Real simulator, real child processes, real DuckDB files.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from prompt_files import prompts_file

from tokview.batch import BatchConfig, run_batch
from tokview.batch import early_landing as early
from tokview.batch.landing_process import LandingChild
from tokview.batch.store_opener import StoreOpener
from tokview.default_store import DEFAULT_DB
from tokview.store import Store


@pytest.fixture(autouse=True)
def _no_leftover_children():
    yield
    early._end_untaken()


@pytest.mark.parametrize(
    ("argv", "store"),
    [
        (["batch", "p.jsonl", "--server", "http://x", "--db", "a.duckdb"], "a.duckdb"),
        (["batch", "p.jsonl", "--db=b.duckdb", "--server", "http://x"], "b.duckdb"),
        (["batch", "p.jsonl", "--server", "http://x"], DEFAULT_DB),
        (["batch", "p.jsonl", "--db", "a.duckdb", "--db", "c.duckdb"], "c.duckdb"),  # argparse keeps the last
        (["batch", "p.jsonl", "--db", "a.duckdb", "--help"], None),
        (["batch", "-h"], None),
        (["batch", "p.jsonl", "--ray", "auto", "--db", "a.duckdb"], None),
        (["batch", "p.jsonl", "--ray=auto"], None),
        (["batch", "p.jsonl", "--db"], None),
        (["batch", "p.jsonl", "--db", "  "], None),
        (["export", "--db", "a.duckdb"], None),
        (["batch", "p.jsonl", "--d", "a.duckdb"], None),  # argparse reads --d as --db: left to the run
        (["batch", "p.jsonl", "--ra", "auto"], None),
        (["batch", "p.jsonl", "--he"], None),
        (["batch", "p.jsonl", "--dry-run", "--db", "a.duckdb"], "a.duckdb"),  # not a prefix of these flags
        ([], None),
    ],
)
def test_the_store_is_read_only_from_a_plain_batch_command_line(argv, store):
    assert early.batch_store(argv) == store


def leftovers(folder: Path) -> list[str]:
    """What is in the folder but the prompts (and a landed run's emptied parts folder, which batches keep)."""
    return sorted(
        p.name
        for p in folder.iterdir()
        if p.name != "p.jsonl" and not (p.name.endswith(".parts") and p.is_dir() and not any(p.iterdir()))
    )


@pytest.mark.parametrize("db", ["a" * 300 + ".duckdb", "~no-such-user-here/x.duckdb"])
def test_a_path_the_file_system_refuses_starts_no_child_and_raises_nothing(db):
    early.start_early(["batch", "p.jsonl", "--db", db])
    assert early.take(db) is None


def test_a_cli_run_with_a_path_too_long_says_so_in_one_line(tmp_path):
    prompts = prompts_file(tmp_path / "p.jsonl", 1)
    argv = ["batch", str(prompts), "--server", "http://127.0.0.1:9", "--db", str(tmp_path / ("a" * 300))]
    done = subprocess.run([sys.executable, "-m", "tokview", *argv], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr


def test_a_child_is_started_only_for_a_store_that_does_not_exist(tmp_path):
    existing = tmp_path / "old.duckdb"
    Store(existing).close()
    early.start_early(["batch", "p.jsonl", "--db", str(existing)])
    assert early.take(str(existing)) is None
    parts_only = tmp_path / "killed.duckdb"
    Path(str(parts_only) + ".parts").mkdir()  # a killed run's parts: the store is opened here to plan
    early.start_early(["batch", "p.jsonl", "--db", str(parts_only)])
    assert early.take(str(parts_only)) is None


def test_the_run_takes_the_child_started_for_its_store(tmp_path):
    db = tmp_path / "new.duckdb"
    prompts = prompts_file(tmp_path / "p.jsonl", 3)
    early.start_early(["batch", str(prompts), "--db", str(db)])
    started = early._started[str(db)]
    opener = StoreOpener(str(db))
    child = LandingChild.for_new_store(opener)
    assert child is not None and child._proc is started  # not a second child
    assert str(db) not in early._started
    child.close()
    assert leftovers(tmp_path) == []  # the run never began: the child made nothing


def test_a_run_into_a_new_store_lands_every_sample_through_the_early_child(tmp_path, vllm_sim):
    db = tmp_path / "new.duckdb"
    prompts = prompts_file(tmp_path / "p.jsonl", 4)
    early.start_early(["batch", str(prompts), "--db", str(db)])
    started = early._started[str(db)]
    config = BatchConfig(servers=[vllm_sim.url], prompts_path=prompts, max_new_tokens=32, run="r1")
    summary = asyncio.run(run_batch(config, StoreOpener(str(db), [vllm_sim.url])))
    assert summary.ok == 4
    assert started.poll() is not None  # the run took it and ended it
    with Store(db) as store:
        assert store.query("SELECT count(*) FROM samples")[0][0] == 4
    assert leftovers(tmp_path) == ["new.duckdb"]


def test_a_child_for_another_path_ends_at_exit_and_leaves_nothing(tmp_path):
    db = tmp_path / "unused.duckdb"
    early.start_early(["batch", "p.jsonl", "--db", str(db)])
    proc = early._started[str(db)]
    early._end_untaken()  # what the exit does
    assert proc.poll() is not None
    assert leftovers(tmp_path) == []


def test_a_second_ctrl_c_while_the_exit_waits_kills_the_child_without_a_traceback(tmp_path, monkeypatch):
    """The first Ctrl-C stopped the run; a second, while the exit waited for the child, left a KeyboardInterrupt
    traceback after the run's one line (and the child running). It is taken as "don't wait"."""
    db = tmp_path / "unused.duckdb"
    early.start_early(["batch", "p.jsonl", "--db", str(db)])
    proc = early._started[str(db)]
    waits = []

    def wait(timeout: float | None = None) -> int:
        waits.append(timeout)
        if len(waits) == 1:
            raise KeyboardInterrupt
        return subprocess.Popen.wait(proc, timeout)

    monkeypatch.setattr(proc, "wait", wait)
    early._end_untaken()  # raises nothing
    assert len(waits) == 2
    assert proc.poll() is not None
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("case", ["missing prompts", "unreachable server", "bad flag value"])
def test_a_cli_run_that_never_begins_leaves_no_file(tmp_path, case):
    prompts = prompts_file(tmp_path / "p.jsonl", 2)
    db = tmp_path / "new.duckdb"
    argv = ["batch", str(prompts), "--server", "http://127.0.0.1:9", "--db", str(db), "--timeout", "2"]
    if case == "missing prompts":
        argv[1] = str(tmp_path / "nope.jsonl")
    elif case == "bad flag value":
        argv += ["--temperature", "-1"]
    done = subprocess.run([sys.executable, "-m", "tokview", *argv], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert leftovers(tmp_path) == []  # no store, no spare, no parts folder, at the moment the command returned


def test_a_cli_run_into_a_new_store_lands_everything(tmp_path, vllm_sim):
    prompts = prompts_file(tmp_path / "p.jsonl", 3)
    db = tmp_path / "new.duckdb"
    argv = ["batch", str(prompts), "--server", vllm_sim.url, "--db", str(db), "--max-new-tokens", "32"]
    done = subprocess.run([sys.executable, "-m", "tokview", *argv], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    with Store(db) as store:
        assert store.query("SELECT count(*) FROM samples")[0][0] == 3
    assert leftovers(tmp_path) == ["new.duckdb"]
