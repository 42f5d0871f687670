"""A chain's later turns go to the server of its first answer while that one is healthy: each turn then finds the
conversation so far in that server's prefix cache, and one chain is rendered by one server's template (a mixed fleet
split a chain's turns between a vLLM and an SGLang, and each turn after the switch broke the prefix)."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest

from tokview.cli import main
from tokview.sim import SimConfig, start_simulator
from tokview.store import Store


@pytest.fixture(scope="module")
def two_sims() -> Iterator[list[Any]]:
    with ExitStack() as stack:
        yield [stack.enter_context(start_simulator(SimConfig(kind="vllm"))) for _ in range(2)]


def _conversation(k: int) -> dict[str, Any]:
    turns: list[dict[str, str]] = []
    for t in range(3):
        turns.append({"role": "user", "content": f"conversation {k} question {t}"})
        turns.append({"role": "assistant", "content": f"answer {t}"})
    return {"id": f"c{k}", "messages": turns}


def test_every_turn_of_a_chain_is_served_where_its_first_was(two_sims, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(_conversation(k)) + "\n" for k in range(8)))
    db = tmp_path / "s.duckdb"
    servers = [arg for sim in two_sims for arg in ("--server", sim.url)]
    assert main(["batch", str(prompts), *servers, "--db", str(db), "--concurrency", "3", "--mode", "chat"]) == 0
    by_conversation: dict[str, set[str]] = defaultdict(set)
    with Store(db) as store:
        rows = store.query("SELECT prompt_id, server_url FROM samples")
    for prompt_id, server in rows:
        by_conversation[prompt_id.split("#")[0]].add(server)
    assert len(rows) == 8 * 3
    assert all(len(servers) == 1 for servers in by_conversation.values()), dict(by_conversation)
    assert {s for servers in by_conversation.values() for s in servers} == {sim.url for sim in two_sims}  # both used


async def test_a_preferred_server_that_is_down_gives_way_to_a_healthy_one(two_sims):
    from tokview.core.profiles import get_profile
    from tokview.servers import CaptureRequest
    from tokview.servers.pool import ServerPool

    pool = ServerPool([two_sims[0].url, "http://127.0.0.1:9"], profile=get_profile("kimi-k2.5"), concurrency=2)
    try:
        await pool.start()
        request = CaptureRequest(messages=[{"role": "user", "content": "hi"}], settings={"max_new_tokens": 8})
        got = await pool.capture(request, prefer="http://127.0.0.1:9")
        assert got.server_url == two_sims[0].url
    finally:
        await pool.aclose()


async def test_a_retry_leaves_a_preferred_server_that_answers_errors():
    """A preferred server answering 503 is never evicted (only connection errors count): every retry went to it and
    the chain's turn failed where the same request without a preference went to the healthy server."""
    from tokview.core.profiles import get_profile
    from tokview.servers import CaptureRequest
    from tokview.servers.pool import ServerPool

    with start_simulator(SimConfig(kind="vllm", quirks={"http-503": True})) as failing:
        with start_simulator(SimConfig(kind="vllm")) as healthy:
            pool = ServerPool(
                [failing.url, healthy.url],
                profile=get_profile("kimi-k2.5"),
                concurrency=2,
                backoff=0.01,
                max_backoff=0.02,
            )
            try:
                await pool.start()
                request = CaptureRequest(messages=[{"role": "user", "content": "hi"}], settings={"max_new_tokens": 8})
                got = await pool.capture(request, prefer=failing.url)
                assert got.server_url == healthy.url
                assert failing.state.stats.generation >= 1  # it was asked first
            finally:
                await pool.aclose()
