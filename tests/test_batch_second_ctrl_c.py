"""A second Ctrl-C while a batch ends leaves at once. The run's last landing waits for a store another program holds
(a notebook with the file open) up to TOKVIEW_STORE_WAIT_S; a second Ctrl-C was taken as the first again, and the
batch sat there silent. What was written is in parts on disk: the next command on the store lands it, and a resume
generates the rest, exact."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
from test_batch_integration import _wait_for_samples

from tokview.sim import SimConfig, start_simulator
from tokview.store import Store

ROOT = Path(__file__).resolve().parents[1]
ROWS = [{"id": f"p{k}", "messages": [{"role": "user", "content": f"Count to {k}."}]} for k in range(40)]


def _batch(prompts: Path, url: str, db: Path, **popen: object) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "tokview", "batch", str(prompts), "--server", url, "--db", str(db)]
    argv += ["--workers", "1", "--concurrency", "2", "--max-new-tokens", "60", "--run", "r"]
    env = {**os.environ, "TOKVIEW_STORE_WAIT_S": "60"}
    return subprocess.Popen(argv, cwd=ROOT, text=True, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _hold(db: Path, deadline: float) -> duckdb.DuckDBPyConnection:
    """The store's write lock, taken between the batch's landings (it holds the file only while it lands)."""
    while True:
        try:
            return duckdb.connect(str(db))
        except duckdb.Error:
            assert time.monotonic() < deadline, "the batch never let the store go"
            time.sleep(0.05)


def test_a_second_ctrl_c_leaves_at_once_and_a_resume_is_whole(tmp_path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps(ROWS[0]) + "\n")
    db = tmp_path / "s.duckdb"
    with start_simulator(SimConfig(kind="vllm", quirks={"latency": 0.3})) as sim:
        first = _batch(prompts, sim.url, db)  # the store exists: the batch lands in its own process
        assert first.wait(timeout=60) == 0, first.communicate()
        prompts.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
        proc = _batch(prompts, sim.url, db)
        try:
            _wait_for_samples(db, 3, proc)  # generating: the store is held only while parts land
            holder = _hold(db, time.monotonic() + 30)
            try:
                proc.send_signal(signal.SIGINT)
                time.sleep(1.0)  # the first is taken: the run stops and waits to land
                assert proc.poll() is None, proc.communicate()
                proc.send_signal(signal.SIGINT)
                _, err = proc.communicate(timeout=10)
            finally:
                holder.close()
            assert proc.returncode == 130, err
            assert "leaving now" in err and "Traceback" not in err
        finally:
            if proc.poll() is None:
                proc.kill()
        again = _batch(prompts, sim.url, db)
        _, err = again.communicate(timeout=120)
        assert again.returncode == 0, err
    with Store(db) as store:
        rows = store.query("SELECT prompt_id FROM samples WHERE run_id = 'r'")
    assert sorted(str(r[0]) for r in rows) == sorted(str(r["id"]) for r in ROWS)
