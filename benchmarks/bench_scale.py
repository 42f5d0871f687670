"""Scale: resume of a 100,000-sample store, `stats` and the first page on 1,000,000 samples, and the
peak memory of a 1,000,000-prompt batch.

    python benchmarks/bench_scale.py [--resume 100000] [--store 1000000] [--prompts 1000000]

Goals (issue 11): resume to "nothing to do" < 2 s; `stats` < 1 s and the app's first page < 100 ms on
1,000,000 samples; a 1,000,000-prompt batch in bounded memory. Stores are filled with SQL (short id
arrays: the list and stats queries never read the id arrays), the batch runs against `tokview sim`.
Each figure is printed beside its goal, and beside `python -c pass` (the interpreter's own start).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tokview.store import Store  # noqa: E402

TOKVIEW = [sys.executable, "-m", "tokview"]
FILL = (
    "INSERT INTO samples (sample_id, prompt_id, run_id, gen_index, prompt_ids, output_ids, finish_reason, status, "
    "valid, n_errors, codes, prompt_len, output_len, supervised, content, created_at) "
    "SELECT {ids}, {prompts}, 'run' || (i % 4), 0, range(0, 40)::INTEGER[], range(0, 100 + i % 50)::INTEGER[], "
    "CASE WHEN i % 20 = 0 THEN 'length' ELSE 'stop' END, CASE WHEN i % 50 = 0 THEN 'approved' ELSE 'pending' END, "
    "i % 20 <> 0, CAST(i % 20 = 0 AS INTEGER), CASE WHEN i % 20 = 0 THEN ['truncated'] ELSE [] END, 40, "
    "100 + i % 50, 100 + i % 50, 'answer number ' || i, now() + to_microseconds(i) FROM {source}"
)


def timed(argv: list[str]) -> tuple[float, float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        done = subprocess.CompletedProcess(
            argv, os.waitstatus_to_exitcode(status), out.read().decode(), err.read().decode()
        )
    return wall, usage.ru_maxrss / 1024, done


def start_sim() -> tuple[subprocess.Popen, str]:
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sim = subprocess.Popen(
        [*TOKVIEW, "sim", "--port", str(port), "--output-tokens", "40"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            urllib.request.urlopen(url + "/v1/models", timeout=1)
            return sim, url
        except OSError:
            time.sleep(0.1)
    sim.kill()
    raise SystemExit("simulator did not start")


def write_prompts(path: Path, n: int) -> None:
    with path.open("w") as f:
        for i in range(n):
            f.write('{"id": "s%07d", "messages": [{"role": "user", "content": "question %d"}]}\n' % (i, i))


def bench_resume(n: int, url: str, tmp: Path) -> None:
    from tokview.batch import BatchConfig, plan, read_prompts
    from tokview.batch.identity import vocab_fingerprint
    from tokview.core.kimi_layout import kimi_tokenizer_dir
    from tokview.core.tokenizer import load_tokenizer

    prompts = tmp / "resume.jsonl"
    write_prompts(prompts, n)
    rows, _ = read_prompts(prompts)
    config = BatchConfig(servers=[url])
    identity = {
        "model": "tokview-sim",
        "tokenizer": vocab_fingerprint(load_tokenizer(kimi_tokenizer_dir())),
        "profile": "kimi-k2.5",
    }
    items, _ = plan(rows, config, config.sample_settings(identity))
    db = tmp / "resume.duckdb"
    with Store(db) as store, store.hold():
        store.execute(
            "CREATE TEMP TABLE ids AS SELECT unnest(?::VARCHAR[]) AS id, unnest(?::VARCHAR[]) AS pid, "
            "generate_subscripts(?::VARCHAR[], 1) AS i",
            [[i.sample_id for i in items], [i.prompt_id for i in items], [i.sample_id for i in items]],
        )
        store.execute(FILL.format(ids="id", prompts="pid", source="ids"))
    wall, rss, done = timed([*TOKVIEW, "batch", str(prompts), "--server", url, "--db", str(db), "--summary-json"])
    summary = json.loads(done.stdout) if done.stdout.strip() else {}
    python_wall, _, _ = timed([sys.executable, "-c", "pass"])
    print(
        f"resume: {n} stored samples, `tokview batch` to 'nothing to do' in {wall:.2f} s (goal < 2 s; "
        f"resumed {summary.get('resumed')}, ok {summary.get('ok')}; peak RSS {rss:.0f} MB; python start "
        f"{python_wall:.2f} s)"
    )


def bench_store(n: int, tmp: Path) -> None:
    db = tmp / "million.duckdb"
    t0 = time.perf_counter()
    with Store(db) as store:
        store.execute(FILL.format(ids="'p' || i || '@s_gen0'", prompts="'p' || i", source=f"range({n}) t(i)"))
    fill = time.perf_counter() - t0
    size = db.stat().st_size / 1e6
    wall, _, done = timed([*TOKVIEW, "stats", "--db", str(db)])
    assert done.returncode == 0, done.stderr
    python_wall, _, _ = timed([sys.executable, "-c", "pass"])
    with Store(db) as store:
        t = time.perf_counter()
        store.stats()
        stats_in = time.perf_counter() - t
    pages = []
    for _ in range(5):
        t = time.perf_counter()
        with Store(db) as store:  # what the app does on start: open the store, count, read the first page
            store.count_samples()
            store.samples_page(limit=100)
        pages.append(time.perf_counter() - t)
    with Store(db) as store:
        t = time.perf_counter()
        store.samples_page(limit=100)
        page_only = time.perf_counter() - t
    print(f"store: {n} samples ({size:.0f} MB, filled in {fill:.0f} s)")
    print(
        f"  `tokview stats` {wall:.2f} s wall (goal < 1 s; python start {python_wall:.2f} s); Store.stats() "
        f"{stats_in * 1000:.0f} ms"
    )
    print(
        f"  first page: open + count + 100 rows {1000 * sorted(pages)[2]:.0f} ms (median of 5; goal < 100 ms); "
        f"the page query alone {page_only * 1000:.0f} ms"
    )


def bench_memory(n: int, url: str, tmp: Path, run_s: float) -> None:
    prompts = tmp / "million.jsonl"
    write_prompts(prompts, n)
    db = tmp / "mem.duckdb"
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [
            *TOKVIEW,
            "batch",
            str(prompts),
            "--server",
            url,
            "--db",
            str(db),
            "--workers",
            "1",
            "--max-new-tokens",
            "40",
            "--concurrency",
            "8",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    parts = Path(str(db) + ".parts")
    started = None
    while proc.poll() is None and time.perf_counter() - t0 < 600:
        if started is None and (parts.exists() or db.exists()):
            started = time.perf_counter() - t0
        if started is not None and time.perf_counter() - t0 > started + run_s:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, _, usage = os.wait4(proc.pid, 0)
    print(
        f"memory: {n}-prompt batch, generating after {started or float('nan'):.1f} s, stopped {run_s:.0f} s later:"
        f" peak RSS {usage.ru_maxrss / 1024:.0f} MB"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resume", type=int, default=100_000)
    parser.add_argument("--store", type=int, default=1_000_000)
    parser.add_argument("--prompts", type=int, default=1_000_000)
    parser.add_argument("--run-s", type=float, default=10.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        sim, url = start_sim()
        try:
            if args.resume:
                bench_resume(args.resume, url, tmp)
            if args.store:
                bench_store(args.store, tmp)
            if args.prompts:
                bench_memory(args.prompts, url, tmp, args.run_s)
        finally:
            sim.kill()
            sim.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
