"""`run_batch` and `tokview batch` over real sockets against the simulator."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest
from builders import kimi, profile

from tokview.batch import BatchConfig, BatchProgress, read_prompts, run_batch
from tokview.export import export
from tokview.sim import SimConfig, start_simulator
from tokview.store import Store

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_data"
TOKVIEW = [sys.executable, "-c", "import sys; from tokview.cli import main; sys.exit(main())"]


def _config(url: str, path: Path, **kw) -> BatchConfig:
    return BatchConfig(
        servers=[url],
        prompts_path=path,
        tokenizer=kimi(),
        model_profile=profile(),
        max_new_tokens=kw.pop("max_new_tokens", 200),
        timeout=kw.pop("timeout", 10.0),
        **kw,
    )


@pytest.mark.parametrize("shape", ["openai_messages", "sharegpt_conversations", "plain_prompts", "multiturn"])
async def test_every_sample_shape_and_exported_ids_equal_served_ids(vllm_sim, tmp_path, shape):
    path = SAMPLES / f"{shape}.jsonl"
    rows, bad = read_prompts(path)
    assert rows
    assert not bad
    with Store(tmp_path / "b.duckdb") as store:
        seen: list[BatchProgress] = []
        summary = await run_batch(_config(vllm_sim.url, path, limit=8), store, on_progress=seen.append)
        assert summary.balanced
        assert summary.failed == 0
        assert summary.ok == summary.input > 0
        assert seen[-1].ok == summary.ok
        assert store.count_samples() == summary.ok
        out = tmp_path / "s.jsonl"
        export(store, "speculators", out, select="all", tokenizer=kimi(), profile=profile())
        for line in out.read_text().splitlines():
            row = json.loads(line)
            raw = store.load_sample(row["metadata"]["tokview_sample_id"]).capture
            # the raw response the server sent: its prompt ids and output ids, concatenated
            assert row["input_ids"] == raw.prompt_ids + raw.output_ids
            assert row["loss_mask"].index(1) == len(raw.prompt_ids)
    if shape == "multiturn":
        assert summary.ok > 6  # one sample per assistant generation


async def test_served_ids_are_what_the_server_returned(vllm_sim, tmp_path):
    with Store(":memory:") as store:
        await run_batch(_config(vllm_sim.url, SAMPLES / "plain_prompts.jsonl", limit=3), store)
        for row in store.samples_page():
            cap = store.load_sample(row.sample_id).capture
            body = cap.raw_response
            assert body["choices"][0]["token_ids"] == cap.output_ids
            assert body["choices"][0]["prompt_token_ids"] == cap.prompt_ids
            assert cap.raw_request["body"]["prompt"] == cap.prompt_ids


async def test_resume_skips_and_other_settings_do_not_collide(vllm_sim, tmp_path):
    path = SAMPLES / "openai_messages.jsonl"
    with Store(tmp_path / "r.duckdb") as store:
        first = await run_batch(_config(vllm_sim.url, path, limit=5), store)
        again = await run_batch(_config(vllm_sim.url, path, limit=7), store)
        assert (first.ok, again.ok, again.resumed) == (5, 2, 5)
        assert again.balanced
        other = await run_batch(_config(vllm_sim.url, path, limit=5, temperature=0.5), store)
        assert other.ok == 5
        assert store.count_samples() == 12
        k = await run_batch(_config(vllm_sim.url, path, limit=2, samples_per_prompt=3), store)
        assert k.ok == 4
        assert k.resumed == 2


async def test_failures_are_recorded_and_retried_on_resume(tmp_path):
    db = tmp_path / "f.duckdb"
    with start_simulator(SimConfig(kind="sglang", quirks={"http-500": True})) as sim, Store(db) as store:
        summary = await run_batch(_config(sim.url, SAMPLES / "plain_prompts.jsonl", limit=3, retries=0), store)
        assert (summary.ok, summary.failed, summary.exit_code) == (0, 3, 3)
        assert summary.balanced
        assert store.stats()["failures"]["total"] == 3
        assert store.count_samples() == 0
        assert summary.failures_by_reason
        assert sum(summary.failures_by_reason.values()) == 3
    with start_simulator(SimConfig(kind="sglang", quirks={"http-503": 1})) as sim, Store(db) as store:
        again = await run_batch(_config(sim.url, SAMPLES / "plain_prompts.jsonl", limit=3, retries=2), store)
        assert (again.ok, again.failed, again.resumed) == (3, 0, 0)
        assert again.exit_code == 0


async def test_cancel_keeps_committed_work(tmp_path):
    with start_simulator(SimConfig(kind="vllm", quirks={"latency": 0.2})) as sim, Store(tmp_path / "c.duckdb") as store:
        cancel = asyncio.Event()

        def on_progress(p: BatchProgress) -> None:
            if p.ok >= 2:
                cancel.set()

        summary = await run_batch(
            _config(sim.url, SAMPLES / "openai_messages.jsonl", concurrency=2),
            store,
            on_progress=on_progress,
            cancel=cancel,
        )
        assert summary.interrupted
        assert summary.exit_code == 130
        assert summary.balanced
        assert 2 <= summary.ok < summary.input
        assert summary.abandoned > 0
        assert store.count_samples() == summary.ok


async def test_parquet_prompts(vllm_sim, tmp_path):
    pq = tmp_path / "p.parquet"
    con = duckdb.connect()
    con.execute(
        f"COPY (SELECT * FROM read_json_auto('{SAMPLES / 'openai_messages.jsonl'}') LIMIT 4) TO '{pq}' (FORMAT parquet)"
    )
    rows, bad = read_prompts(pq)
    jrows, _ = read_prompts(SAMPLES / "openai_messages.jsonl", limit=4)
    assert [r.prompt_id for r in rows] == [r.prompt_id for r in jrows]
    assert not bad
    with Store(":memory:") as store:
        summary = await run_batch(_config(vllm_sim.url, pq), store)
        assert summary.ok == 4


def _cli(*args: str, env=None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*TOKVIEW, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env={**os.environ, **(env or {})}
    )


def test_cli_exit_codes_and_clean_stdout(vllm_sim, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "prompt": "hello"}\nnot json\n{"foo": 1}\n')
    db = str(tmp_path / "cli.duckdb")
    ok = _cli("batch", str(bad), "--server", vllm_sim.url, "--db", db, "--max-new-tokens", "100")
    assert ok.returncode == 4, ok.stderr  # finished, but two rows were skipped: not a clean 0
    assert ok.stdout == ""  # data never goes to stdout unless asked
    assert f"{bad}:2: not valid JSON" in ok.stderr
    assert f"{bad}:3:" in ok.stderr
    assert "(balanced)" in ok.stderr
    stop = _cli("batch", str(bad), "--server", vllm_sim.url, "--db", db, "--on-bad-row", "stop")
    assert stop.returncode == 1
    assert f"{bad}:2: not valid JSON" in stop.stderr
    assert "Traceback" not in stop.stderr
    down = _cli(
        "batch",
        str(SAMPLES / "plain_prompts.jsonl"),
        "--server",
        "http://127.0.0.1:9",
        "--db",
        db,
        "--retries",
        "0",
        "--run",
        "down",
    )
    assert down.returncode == 2
    assert "Traceback" not in down.stderr
    missing = _cli("batch", str(tmp_path / "nope.jsonl"), "--server", vllm_sim.url, "--db", db)
    assert missing.returncode == 1
    assert "not found" in missing.stderr
    js = _cli("batch", str(bad), "--server", vllm_sim.url, "--db", db, "--max-new-tokens", "100", "--summary-json")
    summary = json.loads(js.stdout)
    assert summary["resumed"] == 1
    assert summary["balanced"]
    assert summary["exit_code"] == 4


def test_sigint_exits_130_and_keeps_work(tmp_path):
    with start_simulator(SimConfig(kind="vllm", quirks={"latency": 0.3})) as sim:
        db = tmp_path / "int.duckdb"
        proc = subprocess.Popen(
            [
                *TOKVIEW,
                "batch",
                str(SAMPLES / "openai_messages.jsonl"),
                "--server",
                sim.url,
                "--db",
                str(db),
                "--concurrency",
                "2",
                "--max-new-tokens",
                "100",
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        _wait_for_samples(db, 2, proc)
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err
        assert "interrupted" in err
        assert "(balanced)" in err
        with Store(db) as store:
            n = store.count_samples()
        assert n >= 2


def _count(db: Path) -> int:
    """Samples committed so far, read from a copy (the batch process holds the write lock)."""
    if not db.exists():
        return 0
    copy = db.with_name(db.name + ".peek")
    try:
        copy.write_bytes(db.read_bytes())
        wal = db.with_name(db.name + ".wal")
        wal_copy = copy.with_name(copy.name + ".wal")
        if wal.exists():
            wal_copy.write_bytes(wal.read_bytes())
        elif wal_copy.exists():
            wal_copy.unlink()
        con = duckdb.connect(str(copy), read_only=True)
        try:
            row = con.execute("SELECT count(*) FROM samples").fetchone()
            assert row is not None
            return row[0]
        finally:
            con.close()
    except (duckdb.Error, OSError):
        return 0


def _wait_for_samples(db: Path, n: int, proc: subprocess.Popen, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        got = _count(db)
        if got >= n:
            return got
        time.sleep(0.1)
    raise AssertionError(f"fewer than {n} samples after {timeout}s")


def test_a_server_that_does_not_answer_is_named_at_the_start(vllm_sim, tmp_path):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hello"}\n')
    out = _cli(
        "batch",
        str(prompts),
        "--server",
        vllm_sim.url,
        "--server",
        dead,
        "--db",
        str(tmp_path / "w.duckdb"),
        "--max-new-tokens",
        "50",
    )
    assert out.returncode == 0, out.stderr
    first = out.stderr.strip().splitlines()[0]
    assert first.startswith(f"tokview: warning: --server {dead} does not answer (ConnectError")


async def test_an_error_on_one_sample_is_recorded_and_the_run_goes_on(tmp_path, replay_server):
    """An id no tokenizer (or DuckDB INTEGER) holds is a malformed answer: the batch records why, not crash."""
    import copy

    from replay import OUTPUT, Replay, vllm_routes

    routes = vllm_routes()
    completion = copy.deepcopy(routes["/v1/completions"][0]["json"])
    completion["choices"][0]["token_ids"] = OUTPUT[:3] + [2**40] + OUTPUT[3:]
    routes["/v1/completions"] = [{"json": completion}]
    url = replay_server(Replay(routes))
    with Store(tmp_path / "e.duckdb") as store:
        config = _config(url, SAMPLES / "plain_prompts.jsonl", limit=2, retries=0, max_new_tokens=60)
        summary = await run_batch(config, store)
        assert (summary.ok, summary.failed, summary.exit_code) == (0, 2, 3)
        assert summary.balanced
        reasons = [f["reason"] for f in store.failures()]
        assert len(reasons) == 2
        assert all(r.startswith("malformed response from POST /v1/completions: ") for r in reasons)
        assert all("id 1099511627776, beyond any vocabulary" in r for r in reasons)


def test_an_unreachable_server_exits_2_and_leaves_no_database(tmp_path, capsys):
    from tokview.cli import main

    db = tmp_path / "sub" / "never.duckdb"
    prompts = SAMPLES / "plain_prompts.jsonl"
    code = main(
        ["batch", str(prompts), "--server", "http://127.0.0.1:9", "--db", str(db), "--retries", "0", "--timeout", "2"]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert not db.exists()
    assert not db.parent.exists()
    assert err.startswith("tokview: error: server unreachable: "), err
    assert len(err.splitlines()) == 1, err
