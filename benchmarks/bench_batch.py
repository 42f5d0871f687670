"""Batch throughput: tokview's `run_batch` against a minimal client, both on an instant simulator.

    python benchmarks/bench_batch.py [--samples 200] [--concurrency 8] [--store-rows 100000]

The simulator (`tokview sim --output-tokens 2000`) runs in its own process, so the CPU time measured
here is the client's alone. tokview does everything a real run does (render, capture over HTTP with
retries, all findings, alignment, one DuckDB transaction per sample); the baseline only POSTs the
pre-rendered prompt ids and parses the JSON. Then, separately: `samples_page` / `count_samples` on a
store of `--store-rows` synthetic samples (what the UI's list needs).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_sim(port: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from tokview.cli import main; sys.exit(main())",
            "sim",
            "--port",
            str(port),
            "--output-tokens",
            str(OUTPUT_TOKENS),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("simulator did not start")


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
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    sim = start_sim(port)
    try:
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
    finally:
        sim.kill()
        sim.wait()
    print(
        f"batch: {n} samples x ~{OUTPUT_TOKENS} output tokens, concurrency {concurrency}, simulator in its own process"
    )
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
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--store-rows", type=int, default=100_000)
    args = parser.parse_args()
    bench_batch(args.samples, args.concurrency)
    if args.store_rows:
        bench_store(args.store_rows)


if __name__ == "__main__":
    main()
