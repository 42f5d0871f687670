"""`--timeout` is a deadline for the whole request.

Not a limit on each read: a server that sends one byte every 2 s would keep `batch --timeout 5` and
`score --timeout 3` running forever. Here a real proxy on 127.0.0.1 (tests/drip_server.py) stands between
tokview and the simulator and drips its answers to captures and scoring requests one byte every 0.2 s;
the runs must end within a bound, each with the timed-out failure recorded (and retried, as timeouts are).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from builders import kimi, profile
from drip_server import Served, drip, is_generation, serve_proxy
from loopback import serve_asgi
from starlette.applications import Starlette
from starlette.routing import Route

from tokview.batch import BatchConfig, run_batch
from tokview.servers.errors import Retryable
from tokview.servers.http import ServerClient
from tokview.store import Store

ROOT = Path(__file__).resolve().parents[1]
TOKVIEW = [sys.executable, "-c", "import sys; from tokview.cli import main; sys.exit(main())"]
DRIP_EVERY = 0.2


def _cli(*args: str, timeout: float = 30) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = subprocess.run(
        [*TOKVIEW, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=dict(os.environ)
    )
    return done, time.monotonic() - started


def _dripping(served: Served):
    return lambda path, body: drip(served, DRIP_EVERY) if is_generation(path, body) else None


def test_batch_against_a_dripping_server_ends_at_the_deadline(vllm_sim, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hello"}\n')
    served = Served()
    with serve_proxy(vllm_sim.url, _dripping(served)) as url:
        done, took = _cli(
            "batch", str(prompts), "--server", url, "--db", str(tmp_path / "b.duckdb"), "--timeout", "1",
            "--retries", "1", "--max-new-tokens", "50", "--summary-json",
        )  # fmt: skip
    assert done.returncode == 3, done.stderr
    summary = json.loads(done.stdout)
    assert (summary["ok"], summary["failed"]) == (0, 1)
    assert "timed out after 1s" in done.stderr, done.stderr
    assert "gave up after 2 attempts" in done.stderr, done.stderr
    assert len(served.sent) == 2
    assert all(n >= 2 for n in served.sent)  # retried; each answer had begun to arrive
    assert took < 15, took  # two 1 s attempts, a backoff and start-up; a per-read limit would run forever
    with Store(tmp_path / "b.duckdb") as store:
        reasons = [f["reason"] for f in store.failures()]
    assert len(reasons) == 1, reasons
    assert "timed out after 1s" in reasons[0], reasons


def test_score_against_a_dripping_server_ends_at_the_deadline(vllm_sim, tmp_path):
    db = tmp_path / "s.duckdb"
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hello"}\n')
    config = BatchConfig(
        servers=[vllm_sim.url], prompts_path=prompts, tokenizer=kimi(), model_profile=profile(), max_new_tokens=30
    )
    with Store(db) as store:
        assert asyncio.run(run_batch(config, store)).ok == 1
    served = Served()
    with serve_proxy(vllm_sim.url, _dripping(served)) as url:
        done, took = _cli(
            "score", "--db", str(db), "--server", url, "--timeout", "1", "--retries", "1", "--summary-json"
        )
    assert done.returncode == 3, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert (summary["ok"], summary["failed"]) == (0, 1)
    assert "timed out after 1s" in done.stderr, done.stderr
    assert len(served.sent) == 2
    assert took < 15, took


def _drip_app(served: Served):
    async def endpoint(request):
        await request.body()
        return drip(served, DRIP_EVERY)

    return Starlette(routes=[Route("/{path:path}", endpoint, methods=["GET", "POST"])])


@pytest.mark.parametrize("fast", [True, False], ids=["small transport", "httpx"])
async def test_one_request_to_a_dripping_server_fails_at_the_deadline(fast):
    served = Served()
    with serve_asgi(_drip_app(served)) as url:
        client = ServerClient(url, timeout=0.8, fast=fast)
        assert (client._fast is not None) is fast
        started = time.monotonic()
        async with asyncio.timeout(10):  # a guard: before the deadline existed this never ended
            with pytest.raises(Retryable, match=r"timed out after 0.8s waiting for POST"):
                await client.post_json("/v1/completions", {"prompt": [1]})
        took = time.monotonic() - started
        await client.aclose()
    assert 0.7 < took < 2.5, took
    assert served.sent
    assert served.sent[0] >= 2  # bytes kept arriving: a read timeout alone never fired


async def test_a_dripping_event_stream_fails_at_the_deadline():
    served = Served()
    with serve_asgi(_drip_app(served)) as url:
        client = ServerClient(url, timeout=0.8)
        started = time.monotonic()
        async with asyncio.timeout(10):  # a guard: before the deadline existed this never ended
            with pytest.raises(Retryable, match=r"timed out after 0.8s waiting for POST"):
                async for _ in client.stream_sse("/v1/chat/completions", {"stream": True}):
                    pass
        took = time.monotonic() - started
        await client.aclose()
    assert 0.7 < took < 2.5, took
