"""run_workers: the one loop batch and score share — a worker's error surfaces at once, a cancel stops
every worker, and no task outlives the call."""

from __future__ import annotations

import asyncio

import pytest

from tokview.batch.tasks import run_workers


async def test_all_workers_finishing_is_not_a_cancel():
    done = []

    async def work(n):
        await asyncio.sleep(0)
        done.append(n)

    workers = [asyncio.create_task(work(n)) for n in range(3)]
    assert await run_workers(workers, asyncio.Event()) is False
    assert sorted(done) == [0, 1, 2]


async def test_a_worker_error_surfaces_at_once_and_the_others_are_cancelled():
    forever = asyncio.Event()

    async def stuck():
        await forever.wait()

    async def broken():
        raise RuntimeError("boom")

    workers = [asyncio.create_task(stuck()), asyncio.create_task(broken())]
    with pytest.raises(RuntimeError, match="boom"):
        await run_workers(workers, None)
    assert workers[0].cancelled()


async def test_a_cancel_returns_true_and_stops_every_worker():
    cancel = asyncio.Event()
    forever = asyncio.Event()

    async def stuck():
        await forever.wait()

    workers = [asyncio.create_task(stuck()) for _ in range(2)]
    asyncio.get_running_loop().call_soon(cancel.set)
    assert await run_workers(workers, cancel) is True
    assert all(w.cancelled() for w in workers)


def test_ctrl_c_while_a_stalled_server_is_probed_ends_the_batch_at_once(tmp_path):
    """A server that accepts connections and never answers kept `tokview batch` probing for minutes, deaf
    to Ctrl-C and SIGTERM (they set an event nobody read until the probe ended)."""
    import signal
    import subprocess
    import sys
    import time

    from tokview.sim import SimConfig, start_simulator

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hi"}\n')
    db = tmp_path / "s.duckdb"
    with start_simulator(SimConfig(kind="vllm", quirks={"stall": True})) as sim:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tokview", "batch", str(prompts), "--server", sim.url, "--db", str(db)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(3)  # well into the probe (the first request stalls)
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        started = time.monotonic()
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - started
    assert proc.returncode == 130, err[-800:]
    assert took < 10
    assert err.strip().splitlines()[-1].startswith("tokview: ")
    assert "interrupted while the servers were probed: nothing was written" in err
    assert not db.exists()


def test_a_sigterm_before_the_run_loop_is_said_as_ctrl_c_is(tmp_path):
    """SIGTERM while `tokview batch` still started (its modules loading, its landing child starting) killed it
    silently (-15); Ctrl-C at that moment said 'tokview: interrupted' (130). The signal is sent from inside that
    moment, so the test needs no timing."""
    import subprocess
    import sys

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hi"}\n')
    script = (
        "import os, signal, sys\n"
        "import tokview.batch.early_landing as early\n"
        "early.start_early = lambda argv: os.kill(os.getpid(), signal.SIGTERM)\n"
        "from tokview.cli import main\n"
        f"sys.argv = ['tokview', 'batch', {str(prompts)!r}, '--server', 'http://127.0.0.1:9', '--db', "
        f"{str(tmp_path / 's.duckdb')!r}]\n"
        "sys.exit(main())\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 130, (done.returncode, done.stderr)
    assert done.stderr.strip() == "tokview: interrupted"
