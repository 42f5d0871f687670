"""Chained regeneration's client cost: CPU per generated turn of a `--history served` run against single-turn runs.

    python benchmarks/bench_chain.py [--conversations 32] [--repeat 5] [--concurrency 8]

Issue 23's goal: a chained run's per-turn client cost within x1.2 of a single-turn run's. The server is `tokview
sim` in its own process (kimi_k2 tool parser, `--quirk tool-calls=each --quirk tool-rounds=3`), so the CPU
measured here (this process: `run_batch` in it, one worker, every sample analysed and stored) is the client's.

- chained: agent traces of 8 assistant turns each (two user turns, each a 3-round loop of two parallel calls then
  a text answer), regenerated as chains: each served turn, its reasoning and calls, goes back as history, the
  file's results spliced after the calls, each prompt checked against the previous prompt + output ids;
- single-turn, same conversations (like for like): the same traces with `--history file`, each assistant turn an
  independent single-turn request with the file's history (no chain): prompts of similar lengths;
- single-turn, short prompts: one user message and the tools per row. What a turn costs the client grows with its
  prompt (the template rendered for the length check and again for `prompt_render_mismatch`, the prompt ids
  analysed and stored; a profile of the chained run shows nothing else that grows), so this ratio measures prompt
  length as much as chaining: the like-for-like one is the first.

Per-turn CPU is a run's CPU over its turns (start-up, the same for every mode, is a few percent of a run of 32
conversations); each mode `--repeat` times, alternating; the ratio is the median of the repeats' ratios. On a
shared box a run's CPU time moves with the others' load (a slope between two sizes moved more: x0.5–1.7 for the
same pair of modes), so each repeat compares runs seconds apart.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from replay_server import _wait_http

from tokview.batch import BatchConfig, run_batch
from tokview.core.kimi_layout import kimi_tokenizer_dir
from tokview.core.profiles import get_profile
from tokview.core.prompts import PromptRow, parse_row
from tokview.core.tokenizer import load_tokenizer
from tokview.store import Store

GOAL = 1.2
CHAINED, SAME_PROMPTS, SHORT_PROMPTS = (
    "chained (--history served)",
    "single-turn (--history file)",
    "single-turn, short",
)
TURNS_PER_TRACE = 8
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Local time in a time zone",
            "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]},
        },
    },
]


def _round(n: int) -> list[dict]:
    """One round of the file's loop: two parallel calls and their results."""
    calls = [
        {"id": f"w{n}", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
        {"id": f"t{n}", "type": "function", "function": {"name": "get_time", "arguments": '{"zone": "CET"}'}},
    ]
    return [
        {"role": "assistant", "content": None, "reasoning_content": "Two lookups at once.", "tool_calls": calls},
        {"role": "tool", "tool_call_id": f"w{n}", "content": f"rain, {n + 5} degrees"},
        {"role": "tool", "tool_call_id": f"t{n}", "content": f"1{n}:05"},
    ]


def trace(i: int) -> PromptRow:
    messages = [
        {"role": "user", "content": f"Weather and time in Oslo, trip {i}?"},
        *_round(0),
        *_round(1),
        *_round(2),
        {"role": "assistant", "content": "Rainy, and it is 12:05.", "reasoning_content": "All in."},
        {"role": "user", "content": "And an hour later?"},
        *_round(3),
        *_round(4),
        *_round(5),
        {"role": "assistant", "content": "Still rainy."},
    ]
    return parse_row({"id": f"trace-{i:04d}", "tools": TOOLS, "messages": messages})


def single(i: int) -> PromptRow:
    messages = [{"role": "user", "content": f"Weather and time in Oslo, trip {i}?"}]
    return parse_row({"id": f"single-{i:05d}", "tools": TOOLS, "messages": messages})


def simulator() -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    quirks = ["--quirk", "tool-calls=each", "--quirk", "tool-rounds=3"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokview", "sim", "--port", str(port), *quirks],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    _wait_http(url + "/v1/models", proc)
    return proc, url


def run_once(
    url: str, rows: list[PromptRow], history: str, concurrency: int, tokenizer, profile
) -> tuple[float, int, float]:
    """(client CPU seconds, turns generated, their mean prompt length) of one in-process run into a fresh store."""
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "chain.duckdb") as store:
        config = BatchConfig(
            servers=[url],
            tokenizer=tokenizer,
            model_profile=profile,
            mode="chat",
            concurrency=concurrency,
            max_new_tokens=400,
            temperature=0.0,
            history=history,
            run="bench",
        )
        cpu0 = time.process_time()
        summary = asyncio.run(run_batch(config, store, prompts=rows))
        cpu = time.process_time() - cpu0
        [(prompt_len,)] = store.query("SELECT avg(prompt_len) FROM samples")
    assert summary.balanced and summary.failed == 0, summary.render()
    assert history != "served" or summary.chain_stopped == 0, summary.render()
    return cpu, summary.ok, float(prompt_len)


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def bench_chain(conversations: int, repeat: int, concurrency: int) -> bool:
    tokenizer = load_tokenizer(kimi_tokenizer_dir())
    profile = get_profile("kimi-k2.5")
    modes = {
        CHAINED: (lambda n: [trace(i) for i in range(n)], "served"),
        SAME_PROMPTS: (lambda n: [trace(i) for i in range(n)], "file"),
        SHORT_PROMPTS: (lambda n: [single(i) for i in range(n * TURNS_PER_TRACE)], "served"),
    }
    per_turn: dict[str, list[float]] = {m: [] for m in modes}
    turns: dict[str, int] = {}
    prompt_len: dict[str, float] = {}
    proc, url = simulator()
    try:
        for rows_of, history in modes.values():  # warm both sides: imports, templates, the sim's caches
            run_once(url, rows_of(2), history, concurrency, tokenizer, profile)
        for k in range(repeat):
            order = list(modes) if k % 2 == 0 else list(reversed(modes))
            for name in order:
                rows_of, history = modes[name]
                cpu, turns[name], prompt_len[name] = run_once(
                    url, rows_of(conversations), history, concurrency, tokenizer, profile
                )
                per_turn[name].append(cpu / turns[name])
    finally:
        proc.kill()
        proc.wait()
    print(
        f"chain: client CPU per generated turn, tokview sim (tool calls), concurrency {concurrency}, {repeat} repeats"
    )
    print(f"  {'run':<30}{'turns':>7}{'mean prompt':>13}{'CPU-ms/turn':>13}   runs (ms/turn)")
    for name, values in per_turn.items():
        runs = " ".join(f"{1000 * v:.2f}" for v in values)
        print(f"  {name:<30}{turns[name]:>7}{prompt_len[name]:>13.0f}{1000 * median(values):>13.2f}   {runs}")
    met = True
    for baseline in (SAME_PROMPTS, SHORT_PROMPTS):
        pairs = [c / s for c, s in zip(per_turn[CHAINED], per_turn[baseline], strict=True)]
        ratio = median(pairs)
        met = met and ratio <= GOAL
        shorter = prompt_len[CHAINED] / prompt_len[baseline]
        print(
            f"  chained / {baseline}, CPU per turn: x{ratio:.2f} (repeats x{min(pairs):.2f}–{max(pairs):.2f}; "
            f"its prompts x{shorter:.1f} shorter); goal ≤ x{GOAL}: {'met' if ratio <= GOAL else 'missed'}"
        )
    return met


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=32, help="traces per run (8 turns each)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    bench_chain(args.conversations, args.repeat, args.concurrency)
    return 0


if __name__ == "__main__":
    sys.exit(main())
