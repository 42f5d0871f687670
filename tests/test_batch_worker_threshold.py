"""When `--workers N` spawns a child: only once the plan pays for its start-up.

Measured on 2 idle cores (`benchmarks/bench_goals.py`, replay server, 2,000-token answers): a second
process lost at 300 prompts (1.17 s vs 0.94 s with `--workers 1`) and won at 600 (the lines cross near 470). The
threshold is prompts per worker; `TOKVIEW_MIN_PROMPTS_PER_WORKER` overrides it (the tests' conftest
sets it low so their children are spawned on ~100 prompts: these tests remove it to see the default).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from prompt_files import prompts_file

from tokview.batch import BatchConfig, run_batch
from tokview.batch.workers import WorkerGroup, worker_count
from tokview.sim import SimConfig, start_simulator
from tokview.store import Store

MIN_PROMPTS_ENV = "TOKVIEW_MIN_PROMPTS_PER_WORKER"


@pytest.fixture
def default_threshold(monkeypatch):
    monkeypatch.delenv(MIN_PROMPTS_ENV, raising=False)


@pytest.fixture
def spawned(monkeypatch) -> list[int]:
    """How many children each WorkerGroup the run makes was given (the real group is still made)."""
    counts: list[int] = []
    real = WorkerGroup.__init__

    def init(self, config, children):
        counts.append(children)
        real(self, config, children)

    monkeypatch.setattr(WorkerGroup, "__init__", init)
    return counts


def test_a_second_process_is_spawned_from_500_prompts_by_default(default_threshold):
    assert worker_count(2, 300) == 1
    assert worker_count(2, 499) == 1
    assert worker_count(2, 500) == 2
    assert worker_count(4, 760) == 3
    assert worker_count(8, 10_000) == 8


def test_the_environment_variable_lowers_the_threshold(monkeypatch):
    monkeypatch.setenv(MIN_PROMPTS_ENV, "32")
    assert worker_count(2, 64) == 2
    assert worker_count(2, 63) == 1


@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_a_bad_threshold_is_a_one_line_error(tmp_path, value):
    env = {**os.environ, MIN_PROMPTS_ENV: value}
    argv = [sys.executable, "-m", "tokview", "batch", str(prompts_file(tmp_path / "p.jsonl", 2))]
    argv += ["--server", "http://127.0.0.1:9", "--db", str(tmp_path / "x.duckdb"), "--workers", "2"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        f"tokview: error: {MIN_PROMPTS_ENV} must be a whole number of at least 1, not {value!r}"
    ]
    assert not (tmp_path / "x.duckdb").exists()


async def test_300_prompts_with_two_workers_run_in_one_process(tmp_path, default_threshold, spawned):
    prompts = prompts_file(tmp_path / "p.jsonl", 300)
    with start_simulator(SimConfig(kind="vllm")) as sim, Store(tmp_path / "w.duckdb") as store:
        config = BatchConfig(servers=[sim.url], prompts_path=prompts, max_new_tokens=4, concurrency=16, workers=2)
        summary = await run_batch(config, store)
    assert (summary.ok, summary.failed) == (300, 0), summary.render()
    assert spawned == []


async def test_the_override_spawns_a_child_on_a_small_plan(tmp_path, monkeypatch, spawned):
    """The same observation sees a child when the threshold allows one (so the test above can fail)."""
    monkeypatch.setenv(MIN_PROMPTS_ENV, "32")
    prompts = prompts_file(tmp_path / "p.jsonl", 64)
    with start_simulator(SimConfig(kind="vllm")) as sim, Store(tmp_path / "w.duckdb") as store:
        config = BatchConfig(servers=[sim.url], prompts_path=prompts, max_new_tokens=4, concurrency=4, workers=2)
        summary = await run_batch(config, store)
    assert (summary.ok, summary.failed) == (64, 0), summary.render()
    assert spawned == [1]
