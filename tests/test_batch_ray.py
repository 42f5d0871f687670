"""`--ray`: prompt shards as Ray tasks on a local Ray the test starts; landed like a local run.

Tier: `.ci/ray.sh` (installs the `ray` extra, then `pytest -m ray`); the fast tier leaves it out."""

from __future__ import annotations

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
