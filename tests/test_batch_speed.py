"""What the batch does for speed must not change what it does: the GIL switch interval is lowered only
while captures run, a run over the small transport stores the same ids a run over httpx stores, and the
batch's tokenizer is read without transformers. (How fast: benchmarks/bench_peers.py, bench_batch.py.)"""

from __future__ import annotations

import sys

import pytest
from prompt_files import prompts_file

import tokview.batch.capture_loop as runner
from tokview.batch import BatchConfig, limits, run_batch
from tokview.servers import http
from tokview.sim import SimConfig, start_simulator
from tokview.store import Store


async def test_switch_interval_is_short_only_while_captures_run(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[float] = []
    original = limits.check_prompt  # what the capture loop calls by the name it imported

    def spy(pool, request):  # called once per sample, inside the capture loop
        seen.append(sys.getswitchinterval())
        return original(pool, request)

    monkeypatch.setattr(runner, "check_prompt", spy)
    before = sys.getswitchinterval()
    with start_simulator(SimConfig(kind="vllm")) as sim, Store(tmp_path / "s.duckdb") as store:
        config = BatchConfig(
            servers=[sim.url], prompts_path=prompts_file(tmp_path / "p.jsonl", 6), max_new_tokens=30, concurrency=2
        )
        summary = await run_batch(config, store)
    assert summary.ok == 6
    assert len(seen) == 6
    assert set(seen) == {min(before, runner.CAPTURE_SWITCH_INTERVAL_S)}
    assert sys.getswitchinterval() == before


async def test_the_small_transport_and_httpx_store_the_same_samples(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    prompts = prompts_file(tmp_path / "p.jsonl", 5)
    stored = []
    with start_simulator(SimConfig(kind="vllm")) as sim:
        for fast in (True, False):
            if not fast:  # a proxy variable makes every client take httpx
                monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
                monkeypatch.setenv("NO_PROXY", "127.0.0.1")
                assert http.plain_http_origin(sim.url) is None
            with Store(tmp_path / f"{fast}.duckdb") as store:
                config = BatchConfig(servers=[sim.url], prompts_path=prompts, max_new_tokens=30, temperature=0.0)
                assert (await run_batch(config, store)).ok == 5
                stored.append(
                    store.query("SELECT sample_id, prompt_ids, output_ids, codes FROM samples ORDER BY sample_id")
                )
    assert stored[0] == stored[1]
    assert len(stored[0]) == 5
