"""`--ray`: prompt shards as Ray tasks on a local Ray the test starts; landed like a local run.

Tier: `.ci/ray.sh` (installs the `ray` extra, then `pytest -m ray`); the fast tier leaves it out."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import pytest
from builders import kimi, profile
from prompt_files import prompts_file

from tokview.batch import BatchConfig, plan, read_prompts, run_batch
from tokview.sim import SimConfig, start_simulator
from tokview.store import Store

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


async def test_ray_shards_land_with_the_same_ids_resume_and_accounting(tmp_path, local_ray):
    prompts = prompts_file(tmp_path / "p.jsonl", 40)
    db = tmp_path / "ray.duckdb"
    with start_simulator(SimConfig(kind="vllm")) as sim, Store(db) as store:
        # 6 of the 40 already stored by a local run: the Ray run resumes them
        local = await run_batch(BatchConfig(servers=[sim.url], prompts_path=prompts, max_new_tokens=40, limit=6), store)
        assert local.ok == 6
        config = BatchConfig(servers=[sim.url], prompts_path=prompts, max_new_tokens=40, concurrency=2, ray="auto")
        summary = await run_batch(config, store)
        assert summary.balanced, summary.render()
        assert (summary.ok, summary.failed, summary.resumed) == (34, 0, 6), summary.render()
        again = await run_batch(config, store)
        assert (again.ok, again.resumed) == (0, 40)
        ids = [r[0] for r in store.query("SELECT sample_id FROM samples")]
        assert store.query("SELECT count(*) FROM findings f ANTI JOIN samples s USING (sample_id)")[0][0] == 0
    rows, _ = read_prompts(prompts)
    identity = {"model": "tokview-sim", "tokenizer": kimi().vocab_fingerprint(), "profile": profile().name}
    expected = {i.sample_id for i in plan(rows, config, config.sample_settings(identity))[0]}
    assert len(ids) == len(set(ids)) == 40
    assert set(ids) == expected


async def test_failed_requests_on_ray_are_recorded_once_per_sample(tmp_path, local_ray):
    prompts = prompts_file(tmp_path / "p.jsonl", 20)
    with (
        start_simulator(SimConfig(kind="vllm", quirks={"http-500": True})) as sim,
        Store(tmp_path / "f.duckdb") as store,
    ):
        config = BatchConfig(
            servers=[sim.url],
            prompts_path=prompts,
            max_new_tokens=40,
            retries=0,
            ray="auto",
            max_consecutive_failures=0,
        )
        summary = await run_batch(config, store)
        assert summary.balanced
        assert (summary.ok, summary.failed) == (0, 20)
        await run_batch(config, store)
        assert store.stats()["failures"]["total"] == 20
        assert store.query("SELECT min(attempts), max(attempts) FROM failure_attempts") == [(2, 2)]


async def test_a_dead_server_stops_a_ray_run_after_the_consecutive_failures(tmp_path, local_ray):
    """Each task counted its own failures (16 a shard never reach 20) and a shard that stopped did not stop the run:
    a server failing every request was sent the whole file."""
    prompts = prompts_file(tmp_path / "p.jsonl", 160)
    with (
        start_simulator(SimConfig(kind="vllm", quirks={"http-500": True})) as sim,
        Store(tmp_path / "dead.duckdb") as store,
    ):
        config = BatchConfig(
            servers=[sim.url], prompts_path=prompts, max_new_tokens=40, retries=0, ray="auto", concurrency=2
        )
        summary = await run_batch(config, store)
    assert summary.stopped is not None and summary.stopped.startswith("stopped after"), summary.render()
    assert summary.balanced, summary.render()
    assert 20 <= summary.failed < 160 and summary.abandoned > 0, summary.render()


def _batch(tmp_path, sim_url: str, *extra: str) -> subprocess.Popen[str]:
    prompts = prompts_file(tmp_path / "p.jsonl", 80)
    argv = [sys.executable, "-m", "tokview", "batch", str(prompts), "--server", sim_url]
    argv += ["--db", str(tmp_path / "b.duckdb"), "--concurrency", "2", *extra]
    return subprocess.Popen(argv, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=tmp_path)


def test_ctrl_c_while_ray_cannot_be_reached_ends_the_run_at_once(tmp_path):
    """`ray.init` at an address nobody answers retries forever; on the event loop it kept Ctrl-C from running."""
    with start_simulator(SimConfig(kind="vllm")) as sim:
        run = _batch(tmp_path, sim.url, "--ray", "127.0.0.1:1")
        time.sleep(4)
        assert run.poll() is None, run.communicate()
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=30)
    assert run.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err, err


def test_sigterm_during_a_ray_run_ends_it_as_interrupted_with_its_summary(tmp_path):
    """`ray.init` on the main thread put Ray's own SIGTERM handler in place of the run's: exit 15, a native stack
    dump and no summary. The landed samples stay; a resume finishes the run."""
    with start_simulator(SimConfig(kind="vllm", latency_s=0.3)) as sim:
        run = _batch(tmp_path, sim.url, "--ray", "auto", "--summary-json")
        seen = ""
        assert run.stderr is not None
        while not re.search(r"ok [1-9]", seen):  # the progress line: Ray is up and samples land
            line = run.stderr.readline()
            assert line, f"the run ended early: {seen[-2000:]}"
            seen += line
        run.send_signal(signal.SIGTERM)
        out, err = run.communicate(timeout=60)
        assert run.returncode == 130, seen + err
        assert "SIGTERM received" not in err and "interrupted" in err, err
        summary = json.loads(out)
        assert summary["interrupted"] and summary["ok"] >= 1
        again = subprocess.run(
            [sys.executable, "-m", "tokview", "batch", "p.jsonl", "--server", sim.url, "--db", "b.duckdb"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=120,
        )
    assert again.returncode == 0, again.stderr
    with Store(tmp_path / "b.duckdb") as store:
        assert store.query("SELECT count(*) FROM samples") == [(80,)]


def test_a_ray_address_that_cannot_be_used_leaves_no_run_behind(tmp_path):
    """Ray connected only after the run row was written: a bad `--ray` left a store holding a run and nothing else."""
    with start_simulator(SimConfig(kind="vllm")) as sim:
        run = _batch(tmp_path, sim.url, "--ray", "foo")
        _, err = run.communicate(timeout=120)
    assert run.returncode == 1, err
    assert err.strip().splitlines()[-1].startswith("tokview: error: cannot reach Ray at foo"), err
    db = tmp_path / "b.duckdb"
    if db.exists():
        with Store(db) as store:
            assert store.query("SELECT count(*) FROM runs") == [(0,)]
