"""Batch throughput: tokview's `run_batch` against a minimal client, and `--workers 2` against one worker.

    python benchmarks/bench_batch.py [--samples 200] [--concurrency 8] [--store-rows 100000]
                                     [--scaling-prompts 2400] [--repeat 2]

The server is `replay_server.py` in front of `tokview sim --output-tokens 2000`, in their own
processes: every generation replays one 2,000-token answer from a pre-encoded body, so the server
costs little and the CPU measured here is the client's. tokview does everything a real run does
(render, capture over HTTP with retries, all findings, alignment, every sample committed to the
store); the baseline only POSTs the pre-rendered prompt ids and parses the JSON.

Workers: `tokview batch --workers 1` and `--workers 2` (each its own process tree, the same
prompts, `--repeat` times alternating) on `--scaling-prompts` prompts; printed: samples/s as the
run reports it (from its first request to its last sample) and over the whole process, the
replay server's CPU during each run, and the share of the cores that was idle in the second before
it (each run waits up to `--quiet-wait` s for 90% idle) and the cores other users' processes took
during it (all busy CPU minus this run's process tree and the server). On 2 cores a second worker can
only help as much as the other core is free: on a shared machine, read the pairs where others took ~0.
Then, separately: `samples_page` / `count_samples` on a store of `--store-rows` synthetic samples.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from replay_server import replay_servers, server_cpu_s

from tokview.batch import BatchConfig, run_batch
from tokview.core.kimi_layout import kimi_tokenizer_dir
from tokview.core.profiles import get_profile
from tokview.core.prompts import PromptRow
from tokview.core.tokenizer import load_tokenizer
from tokview.store import SampleFilter, Store

OUTPUT_TOKENS = 2000
QUESTIONS = [
    "What is 6 times 7?",
    "Name a prime number.",
    "Why is the sky blue?",
    "What is DuckDB?",
    "How do tokenizers split words?",
    "Explain speculative decoding.",
]


def prompts(n: int) -> list[PromptRow]:
    return [
        PromptRow(f"bench-{i:05d}", [{"role": "user", "content": f"{QUESTIONS[i % len(QUESTIONS)]} ({i})"}])
        for i in range(n)
    ]


async def baseline(url: str, rows: list[PromptRow], tokenizer, concurrency: int) -> int:
    """POST pre-rendered ids, parse JSON, keep nothing: the floor any client pays."""
    ids = [tokenizer.render(r.messages, template_kwargs={"thinking": True}) for r in rows]
    queue = list(ids)
    tokens = 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal tokens
        while queue:
            prompt = queue.pop()
            r = await client.post(
                "/v1/completions",
                json={
                    "model": "tokview-sim",
                    "prompt": prompt,
                    "max_tokens": OUTPUT_TOKENS + 48,
                    "temperature": 1.0,
                    "return_token_ids": True,
                    "skip_special_tokens": False,
                },
            )
            tokens += len(r.json()["choices"][0]["token_ids"])

    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return tokens


def measure(label: str, fn) -> tuple[float, float, object]:
    wall0, cpu0 = time.perf_counter(), time.process_time()
    result = fn()
    return time.perf_counter() - wall0, time.process_time() - cpu0, result


def bench_batch(n: int, concurrency: int) -> None:
    tokenizer = load_tokenizer(kimi_tokenizer_dir())
    profile = get_profile("kimi-k2.5")
    with replay_servers(OUTPUT_TOKENS) as (url, _):
        rows = prompts(n)
        asyncio.run(baseline(url, rows[:concurrency], tokenizer, concurrency))  # warm both sides
        b_wall, b_cpu, b_tokens = measure("baseline", lambda: asyncio.run(baseline(url, rows, tokenizer, concurrency)))
        with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "bench.duckdb") as store:
            config = BatchConfig(
                servers=[url],
                tokenizer=tokenizer,
                model_profile=profile,
                concurrency=concurrency,
                max_new_tokens=OUTPUT_TOKENS + 48,
                run="bench",
            )
            t_wall, t_cpu, summary = measure("tokview", lambda: asyncio.run(run_batch(config, store, prompts=rows)))
            assert summary.ok == n and summary.balanced, summary.render()
            db_mb = os.path.getsize(Path(tmp) / "bench.duckdb") / 1e6
    print(f"batch: {n} samples x ~{OUTPUT_TOKENS} output tokens, concurrency {concurrency}, replay server")
    print(f"  {'client':<10}{'samples/s':>12}{'CPU-ms/sample':>16}{'wall s':>9}{'tok/s':>10}")
    for name, wall, cpu, tokens in (
        ("baseline", b_wall, b_cpu, b_tokens),
        ("tokview", t_wall, t_cpu, summary.output_tokens),
    ):
        print(f"  {name:<10}{n / wall:>12.1f}{1000 * cpu / n:>16.2f}{wall:>9.2f}{tokens / wall:>10.0f}")
    print(
        f"  ratio tokview/baseline: samples/s x{(n / t_wall) / (n / b_wall):.2f}, CPU per sample "
        f"x{t_cpu / b_cpu:.2f}; store {db_mb:.1f} MB"
    )


def cpu_ticks() -> tuple[int, int]:
    """(all, idle) clock ticks of every core so far (/proc/stat)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    return sum(ticks), ticks[3] + ticks[4]


def idle_share(seconds: float = 1.0) -> float:
    """The share of all cores idle over the next `seconds`: what other users leave free now (the load
    average lags by a minute and counts this benchmark's own last run)."""
    total0, idle0 = cpu_ticks()
    time.sleep(seconds)
    total1, idle1 = cpu_ticks()
    return (idle1 - idle0) / max(1, total1 - total0)


def wait_for_quiet(limit_s: float, idle: float = 0.9) -> float:
    """Wait (at most `limit_s`) until at least `idle` of the cores were idle for a second; that share."""
    deadline = time.monotonic() + limit_s
    share = idle_share()
    while share < idle and time.monotonic() < deadline:
        share = idle_share()
    return share


def bench_workers(n: int, concurrency: int, repeat: int, quiet_wait_s: float = 60.0) -> None:
    """`tokview batch --workers 1` against `--workers 2`, as a user runs them (one process tree each)."""
    import resource

    results: dict[int, list[tuple[float, float, float, float, float, float]]] = {1: [], 2: []}
    cores, tick = os.cpu_count() or 1, os.sysconf("SC_CLK_TCK")
    with tempfile.TemporaryDirectory() as tmp_name, replay_servers(OUTPUT_TOKENS) as (url, pid):
        tmp = Path(tmp_name)
        path = tmp / "prompts.jsonl"
        path.write_text("".join(json.dumps({"id": r.prompt_id, "messages": r.messages}) + "\n" for r in prompts(n)))
        for k in range(repeat):
            for workers in (1, 2) if k % 2 == 0 else (2, 1):
                db = tmp / f"w{workers}-{k}.duckdb"
                load = 100 * wait_for_quiet(quiet_wait_s)
                server0, wall0, ticks0 = server_cpu_s(pid), time.perf_counter(), cpu_ticks()
                ours0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                out = subprocess.run(
                    [
                        *(sys.executable, "-m", "tokview", "batch", str(path), "--server", url, "--db", str(db)),
                        *("--concurrency", str(concurrency), "--max-new-tokens", str(OUTPUT_TOKENS + 48)),
                        *("--workers", str(workers), "--run", "bench", "--summary-json"),
                    ],
                    capture_output=True,
                    text=True,
                )
                wall = time.perf_counter() - wall0
                ours1, ticks1 = resource.getrusage(resource.RUSAGE_CHILDREN), cpu_ticks()
                busy_s = ((ticks1[0] - ticks0[0]) - (ticks1[1] - ticks0[1])) / tick
                ours_s = ours1.ru_utime - ours0.ru_utime + ours1.ru_stime - ours0.ru_stime
                others = max(0.0, busy_s - ours_s - (server_cpu_s(pid) - server0)) / wall  # cores others used
                summary = json.loads(out.stdout.strip().splitlines()[-1])
                assert summary["ok"] == n and summary["balanced"], out.stderr[-500:]
                rate = summary["ok"] / summary["elapsed_s"]
                results[workers].append((rate, n / wall, server_cpu_s(pid) - server0, load, others, ours_s / wall))
    print(f"workers: {n} prompts x ~{OUTPUT_TOKENS} output tokens, concurrency {concurrency}, {cores} cores")
    print(
        f"  {'workers':<9}{'samples/s (run)':>17}{'samples/s (process)':>21}{'server CPU s':>14}"
        f"{'idle before':>13}{'others, cores':>15}{'tokview, cores':>16}"
    )
    for workers, rows in results.items():
        for rate, overall, server, load, others, busy in rows:
            print(
                f"  {workers:<9}{rate:>17.1f}{overall:>21.1f}{server:>14.2f}{load:>12.0f}%{others:>15.2f}{busy:>16.2f}"
            )
    one = sorted(r[5] for r in results[1])[len(results[1]) // 2]
    print(
        f"  one worker keeps {one:.2f} cores busy (its process tree's CPU over its wall time), so {cores} cores "
        f"allow at most x{cores / one:.2f} with more workers"
    )
    ratios = [b[0] / a[0] for a, b in zip(results[1], results[2])]
    overall = [b[1] / a[1] for a, b in zip(results[1], results[2])]
    print(
        f"  2 workers / 1 worker, pair by pair: samples/s x{min(ratios):.2f}–{max(ratios):.2f} "
        f"(median x{sorted(ratios)[len(ratios) // 2]:.2f}) over the run, x{min(overall):.2f}–{max(overall):.2f} "
        f"(median x{sorted(overall)[len(overall) // 2]:.2f}) over the whole process; goal ≥ x1.70"
    )


def bench_store(rows: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "list.duckdb") as store:
        t0 = time.perf_counter()
        store.execute(
            "INSERT INTO samples (sample_id, prompt_id, run_id, gen_index, prompt_ids, output_ids, finish_reason, "
            "status, valid, n_errors, codes, prompt_len, output_len, supervised, content, created_at) "
            "SELECT 'p' || i || '@s_gen0', 'p' || i, 'run' || (i % 4), 0, range(0, 40)::INTEGER[], "
            "range(0, 400 + i % 700)::INTEGER[], CASE WHEN i % 20 = 0 THEN 'length' ELSE 'stop' END, "
            "CASE WHEN i % 50 = 0 THEN 'approved' ELSE 'pending' END, i % 20 <> 0, CAST(i % 20 = 0 AS INTEGER), "
            "CASE WHEN i % 20 = 0 THEN ['think_open_in_prompt', 'truncated'] ELSE ['think_open_in_prompt'] END, "
            "40, 400 + i % 700, 400 + i % 700, 'answer number ' || i, now() FROM range(?) t(i)",
            [rows],
        )
        fill = time.perf_counter() - t0
        cases = {
            "first page (created_at)": lambda: store.samples_page(limit=100),
            "deep page (offset 90k, by output_len desc)": lambda: store.samples_page(
                order_by="-output_len", offset=min(90_000, rows - 100), limit=100
            ),
            "code=truncated": lambda: store.samples_page(SampleFilter(code="truncated"), limit=100),
            "status+run filter": lambda: store.samples_page(SampleFilter(status="approved", run_id="run2"), limit=100),
            "text search": lambda: store.samples_page(SampleFilter(text="number 4242"), limit=100),
            "count_samples(valid=False)": lambda: store.count_samples(SampleFilter(valid=False)),
            "load_sample": lambda: store.load_sample("p777@s_gen0"),
        }
        print(f"store: {rows} samples (filled in {fill:.1f}s)")
        for name, fn in cases.items():
            fn()
            times = []
            for _ in range(5):
                t = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t)
            print(f"  {name:<45}{1000 * sorted(times)[2]:>8.1f} ms (median of 5)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200, help="samples of the tokview-vs-baseline run (0: skip)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--store-rows", type=int, default=100_000)
    parser.add_argument("--scaling-prompts", type=int, default=2400, help="prompts per --workers run (0: skip)")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each worker count")
    parser.add_argument(
        "--quiet-wait", type=float, default=60.0, help="seconds to wait for idle cores before each workers run"
    )
    args = parser.parse_args()
    if args.samples:
        bench_batch(args.samples, args.concurrency)
    if args.scaling_prompts:
        bench_workers(args.scaling_prompts, 16, args.repeat, args.quiet_wait)
    if args.store_rows:
        bench_store(args.store_rows)


if __name__ == "__main__":
    main()
