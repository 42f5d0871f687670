"""tokview batch against the peers' regeneration clients, one loopback server, one run.

    pip install -e '.[bench]'      # aiohttp + openai, for the two baselines only
    python benchmarks/bench_peers.py [--prompts 300] [--concurrency 16] [--output-tokens 2000]

One server (`replay_server.py` in front of `tokview sim`: every generation replays one
2,000-token answer, so the server costs little) and three clients, each its own process, run one
after another on the same prompts:
- tokview: `tokview batch` as a user runs it (every finding, every sample committed to DuckDB);
- speculators: `peers/speculators_regen.py` (aiohttp + worker queue + JSONL append);
- SpecForge: `peers/specforge_regen.py` (OpenAI client + ThreadPoolExecutor).
Printed: samples/s and process CPU (user + sys of the client process, from wait4) of each, the
ratios tokview/peer, and each client's start-up to its first request and first generation.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
QUESTIONS = [
    "What is 6 times 7?",
    "Name a prime number.",
    "Why is the sky blue?",
    "What is DuckDB?",
    "How do tokenizers split words?",
    "Explain speculative decoding.",
]


def spawn_until(args: list[str], ready: Path, timeout: float = 60) -> subprocess.Popen:
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready.exists() and ready.read_text().strip():
            return proc
        if proc.poll() is not None:
            raise SystemExit(f"{args[:4]} exited with {proc.returncode}")
        time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"{args[:4]} did not start")


def wait_http(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{url} did not answer")


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def measured(name: str, argv: list[str], replay: str) -> dict:
    get_json(f"{replay}/_bench/first")
    t0_wall = time.time()
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    first = get_json(f"{replay}/_bench/first")
    return {
        "name": name,
        "wall": wall,
        "cpu": usage.ru_utime + usage.ru_stime,
        "code": proc.returncode,
        "stdout": stdout,
        "stderr": stderr,
        "peak_rss_mb": usage.ru_maxrss / 1024,
        "first_any": first.get("any", float("nan")) - t0_wall,
        "first_gen": first.get("generation", float("nan")) - t0_wall,
    }


def count_lines(path: Path) -> int:
    return sum(1 for _ in path.open()) if path.exists() else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--output-tokens", type=int, default=2000)
    parser.add_argument("--only", nargs="*", help="clients to run (tokview speculators specforge)")
    parser.add_argument("--tokview-args", default="", help="extra flags for tokview batch (e.g. '--workers 1')")
    args = parser.parse_args()
    import importlib.util

    missing = [m for m in ("aiohttp", "openai", "datasets") if importlib.util.find_spec(m) is None]
    if missing and set(args.only or ("speculators", "specforge")) & {"speculators", "specforge"}:
        print(f"bench_peers: skipped, the baselines need {', '.join(missing)}: pip install -e '.[bench]'")
        return 0
    py = sys.executable
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # the speculators baseline's loader: local file only
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        _sim_ready, replay_ready = tmp / "sim.port", tmp / "replay.port"
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            sim_port = s.getsockname()[1]
        sim = subprocess.Popen(
            [py, "-m", "tokview", "sim", "--port", str(sim_port), "--output-tokens", str(args.output_tokens)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        procs = [sim]
        try:
            wait_http(f"http://127.0.0.1:{sim_port}/v1/models")
            replay = spawn_until(
                [
                    py,
                    str(HERE / "replay_server.py"),
                    "--upstream",
                    f"http://127.0.0.1:{sim_port}",
                    "--ready-file",
                    str(replay_ready),
                ],
                replay_ready,
            )
            procs.append(replay)
            port = int(replay_ready.read_text())
            url = f"http://127.0.0.1:{port}"
            prompts = tmp / "prompts.jsonl"
            with prompts.open("w") as f:
                for i in range(args.prompts):
                    f.write(
                        json.dumps(
                            {
                                "id": f"bench-{i:05d}",
                                "messages": [{"role": "user", "content": f"{QUESTIONS[i % len(QUESTIONS)]} ({i})"}],
                            }
                        )
                        + "\n"
                    )
            max_tokens = str(args.output_tokens + 48)
            clients = {
                "tokview": [
                    py,
                    "-m",
                    "tokview",
                    "batch",
                    str(prompts),
                    "--server",
                    url,
                    "--db",
                    str(tmp / "tokview.duckdb"),
                    "--concurrency",
                    str(args.concurrency),
                    "--max-new-tokens",
                    max_tokens,
                    "--run",
                    "bench",
                    "--summary-json",
                    *args.tokview_args.split(),
                ],
                "speculators": [
                    py,
                    str(HERE / "peers" / "speculators_regen.py"),
                    "--endpoint",
                    f"{url}/v1/chat/completions",
                    "--input",
                    str(prompts),
                    "--outfile",
                    str(tmp / "speculators.jsonl"),
                    "--concurrency",
                    str(args.concurrency),
                    "--max-tokens",
                    max_tokens,
                ],
                "specforge": [
                    py,
                    str(HERE / "peers" / "specforge_regen.py"),
                    "--model",
                    "tokview-sim",
                    "--server-address",
                    f"127.0.0.1:{port}",
                    "--input-file-path",
                    str(prompts),
                    "--output-file-path",
                    str(tmp / "specforge.jsonl"),
                    "--concurrency",
                    str(args.concurrency),
                    "--max-tokens",
                    max_tokens,
                ],
            }
            # warm the replay cache (one full generation per endpoint) outside the measured runs
            warm = tmp / "warm.jsonl"
            warm.write_text(prompts.read_text().splitlines()[0] + "\n")
            for name, argv in clients.items():
                subprocess.run([a if a != str(prompts) else str(warm) for a in argv], capture_output=True)
            import shutil

            for p in tmp.glob("*.duckdb*"):
                shutil.rmtree(p) if p.is_dir() else p.unlink()
            for p in tmp.glob("*.jsonl*"):
                if p.name not in ("prompts.jsonl",):
                    p.unlink()
            results = {}
            for name, argv in clients.items():
                if args.only and name not in args.only:
                    continue
                r = measured(name, argv, url)
                results[name] = r
                if r["code"] not in (0,):
                    print(f"{name} exited {r['code']}: {r['stderr'][-600:]}", file=sys.stderr)
            done = {
                "tokview": (
                    json.loads(results["tokview"]["stdout"].strip().splitlines()[-1])["ok"]
                    if "tokview" in results and results["tokview"]["stdout"].strip()
                    else 0
                ),
                "speculators": count_lines(tmp / "speculators.jsonl"),
                "specforge": count_lines(tmp / "specforge.jsonl"),
            }
        finally:
            for p in procs:
                p.kill()
                p.wait()
    n = args.prompts
    print(f"peers: {n} prompts x {args.output_tokens} output tokens, concurrency {args.concurrency}, one replay server")
    print(
        f"  {'client':<12}{'done':>6}{'samples/s':>11}{'CPU s':>8}{'CPU ms/sample':>15}{'peak RSS MB':>13}"
        f"{'1st request s':>15}{'1st generation s':>18}"
    )
    for name, r in results.items():
        print(
            f"  {name:<12}{done[name]:>6}{done[name] / r['wall']:>11.1f}{r['cpu']:>8.2f}"
            f"{1000 * r['cpu'] / max(done[name], 1):>15.2f}{r['peak_rss_mb']:>13.0f}{r['first_any']:>15.2f}"
            f"{r['first_gen']:>18.2f}"
        )
    if "tokview" in results:
        t = results["tokview"]
        for peer in ("speculators", "specforge"):
            if peer in results:
                p = results[peer]
                thr = (done["tokview"] / t["wall"]) / max(done[peer] / p["wall"], 1e-9)
                print(f"  tokview vs {peer}: throughput x{thr:.2f}, process CPU x{t['cpu'] / p['cpu']:.2f}")
    return 0 if all(r["code"] == 0 for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
