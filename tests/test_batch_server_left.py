"""A server that dies in the middle of a batch: the summary says so at the end, not how the servers were at the start.

`--summary-json` listed it `healthy: true, last_error: null` and the text summary said nothing: an operator could not
tell that half the fleet went down. Two simulators on real sockets, one stopped while the run is under way."""

from __future__ import annotations

import threading

from prompt_files import prompts_file

from tokview.batch import BatchConfig, run_batch
from tokview.sim import SimConfig, start_simulator
from tokview.store import Store


async def test_a_server_that_died_mid_run_is_out_of_the_pool_in_the_summary(tmp_path):
    prompts = prompts_file(tmp_path / "p.jsonl", 120)
    with (
        start_simulator(SimConfig(kind="vllm", latency_s=0.05)) as staying,
        start_simulator(SimConfig(kind="vllm", latency_s=0.05)) as leaving,
        Store(tmp_path / "s.duckdb") as store,
    ):
        config = BatchConfig(servers=[staying.url, leaving.url], prompts_path=prompts, max_new_tokens=20, concurrency=2)
        stop = threading.Timer(0.6, leaving.stop)
        stop.start()
        try:
            summary = await run_batch(config, store)
        finally:
            stop.cancel()
    assert summary.ok == 120 and summary.balanced, summary.render()
    health = {d["url"]: d["healthy"] for d in summary.servers}
    assert health == {staying.url: True, leaving.url: False}, summary.servers
    gone = next(d for d in summary.servers if d["url"] == leaving.url)
    assert gone["last_error"] and "cannot connect" in gone["last_error"]
    assert f"note: server {leaving.url} was out of the pool at the end (last error: cannot connect" in summary.render()


async def test_the_only_server_dying_is_noted_without_others_to_take_its_requests(tmp_path):
    prompts = prompts_file(tmp_path / "p.jsonl", 120)
    with start_simulator(SimConfig(kind="vllm", latency_s=0.05)) as only, Store(tmp_path / "s.duckdb") as store:
        config = BatchConfig(
            servers=[only.url],
            prompts_path=prompts,
            max_new_tokens=20,
            concurrency=2,
            retries=0,
            max_consecutive_failures=0,
        )
        stop = threading.Timer(0.6, only.stop)
        stop.start()
        try:
            summary = await run_batch(config, store)
        finally:
            stop.cancel()
    said = summary.render()
    assert summary.balanced and summary.ok < 120, said
    assert f"note: server {only.url} was out of the pool at the end" in said
    assert "went to the others" not in said
