"""A store another program holds as the proxy starts: the proxy starts anyway, forwards, keeps the answers in parts,
says NOT LANDING, and lands them (its run recorded first) once the store is free. It waited 10 s, then refused to
start, and a harness pointed at it could not connect at all."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tokview.proxy.serve import ProxyConfig, start_proxy
from tokview.sim.config import SimConfig
from tokview.sim.server import start_simulator
from tokview.store import Store

HOLDER = "import duckdb, sys\nc = duckdb.connect(sys.argv[1])\nprint('held', flush=True)\nsys.stdin.readline()\n"


@contextmanager
def _held(db: Path) -> Iterator[subprocess.Popen[str]]:
    """Another program holding a new store at `db` (a line on its stdin lets go), killed at the end whatever happens."""
    Store(db).close()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield holder
    finally:
        holder.kill()
        holder.wait()


def _ask(client: httpx.Client, proxy: Any, sim: Any) -> httpx.Response:
    body = {"model": sim.cfg.model_name, "messages": [{"role": "user", "content": "Hi?"}], "max_tokens": 8}
    return client.post(proxy.url + "/v1/chat/completions", json=body)


@pytest.mark.parametrize("record_in", ["process", "thread"])
def test_a_proxy_started_on_a_held_store_forwards_and_lands_once_it_is_free(
    tmp_path, kimi_tok, kimi_profile, record_in
):
    db = tmp_path / "held.duckdb"
    said: list[str] = []
    with _held(db) as holder, start_simulator(SimConfig(kind="vllm")) as sim:
        config = ProxyConfig([sim.url], listen="127.0.0.1:0", db=str(db), tokenizer=kimi_tok, profile=kimi_profile)
        config.say, config.lock_timeout, config.record_in = said.append, 0.3, record_in
        with start_proxy(config) as proxy, httpx.Client(timeout=30) as client:
            answered = _ask(client, proxy, sim)
            assert answered.status_code == 200, answered.text
            assert any("NOT LANDING" in line for line in said), said
            assert holder.stdin is not None
            holder.stdin.write("\n")
            holder.stdin.flush()
            holder.wait(timeout=10)
            deadline = time.monotonic() + 20
            while not any("landing again" in line for line in said):
                assert time.monotonic() < deadline, said
                time.sleep(0.05)
    with Store(db) as store:
        assert store.count_samples() == 1
        assert store.query("SELECT count(*) FROM runs WHERE run_id LIKE 'proxy-%'") == [(1,)]


def test_a_proxy_that_stops_while_its_store_is_still_held_leaves_its_run_for_the_next_command(
    tmp_path, kimi_tok, kimi_profile
):
    """Its answers stayed in parts and the next command landed them with no runs row: the run's settings, profile,
    tokenizer and servers were gone."""
    db = tmp_path / "still.duckdb"
    with _held(db), start_simulator(SimConfig(kind="vllm")) as sim:
        config = ProxyConfig([sim.url], listen="127.0.0.1:0", db=str(db), tokenizer=kimi_tok, profile=kimi_profile)
        config.say, config.lock_timeout, config.record_in = (lambda line: None), 0.3, "thread"
        with start_proxy(config) as proxy, httpx.Client(timeout=30) as client:
            assert _ask(client, proxy, sim).status_code == 200
    with Store(db) as store:  # the next command: lands the parts, the run first
        assert store.count_samples() == 1
        runs = store.query("SELECT run_id, profile, source FROM runs")
        (run_id,) = {r[0] for r in store.query("SELECT run_id FROM samples")}
    assert runs == [(run_id, kimi_profile.name, "tokview proxy")]
    assert not list((tmp_path / "still.duckdb.parts").glob("run-*"))
