"""tokview batch against the peers' regeneration clients, one loopback server, one run.

    pip install -e '.[bench]'      # aiohttp + openai, for the two baselines only
    python benchmarks/bench_peers.py [--prompts 300] [--concurrency 16] [--output-tokens 2000] [--repeat 3]

One server (`replay_server.py` in front of `tokview sim`: every generation replays one
2,000-token answer from a pre-encoded body, so the server costs little) and three clients, each its
own process, run one after another on the same prompts, `--repeat` times (the order rotates each
round, so no client always runs on a warmer or quieter box):
- tokview: `tokview batch` as a user runs it (every finding, every sample committed to DuckDB), on
  one process (`--workers 1`: the peers are one process each; this is the per-core comparison);
- speculators: `peers/speculators_regen.py` (aiohttp + worker queue + JSONL append);
- SpecForge: `peers/specforge_regen.py` (OpenAI client + ThreadPoolExecutor).
Printed per round: samples/s and process CPU (user + sys of the client process and its children,
from wait4) of each, the replay server's CPU during that client's run, each client's start-up to
its first request and first generation, and the ratios tokview/peer; then the range of each ratio
over the rounds, and the machine's load average (the box is shared: read ratios, not absolutes).

tokview's own modules are byte-compiled once before the rounds, as `pip install` does for every
package the peers import: with an editable install and PYTHONDONTWRITEBYTECODE set (as on this
machine), Python would otherwise compile tokview's ~60 modules from source on every run (~0.15 s).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from replay_server import replay_servers, server_cpu_s

HERE = Path(__file__).resolve().parent
QUESTIONS = [
    "What is 6 times 7?",
    "Name a prime number.",
    "Why is the sky blue?",
    "What is DuckDB?",
    "How do tokenizers split words?",
    "Explain speculative decoding.",
]


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def measured(
    name: str,
    argv: list[str],
    replay: str,
    server_pid: int,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> dict:
    get_json(f"{replay}/_bench/first")
    server0 = server_cpu_s(server_pid)
    t0_wall = time.time()
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env, cwd=cwd)
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
        "server_cpu": server_cpu_s(server_pid) - server0,
        "cpu": usage.ru_utime + usage.ru_stime,
        "code": proc.returncode,
        "stdout": stdout,
        "stderr": stderr,
        "peak_rss_mb": usage.ru_maxrss / 1024,
        "first_any": first.get("any", float("nan")) - t0_wall,
        "first_gen": first.get("generation", float("nan")) - t0_wall,
        "tail": t0_wall + wall - first.get("last", float("nan")),
    }


def count_lines(path: Path) -> int:
    return sum(1 for _ in path.open()) if path.exists() else 0


def write_prompts(path: Path, n: int) -> None:
    with path.open("w") as f:
        for i in range(n):
            row = {"id": f"bench-{i:05d}", "messages": [{"role": "user", "content": f"{QUESTIONS[i % 6]} ({i})"}]}
            f.write(json.dumps(row) + "\n")


GOALS = {"speculators": (1.2, 1.0), "specforge": (3.0, 0.5)}
"""Issue 11's per-core goals: tokview's throughput at least x, at a process CPU at most y, of the peer's."""


def clients(tmp: Path, prompts: Path, url: str, port: int, args: argparse.Namespace) -> dict[str, list[str]]:
    py = sys.executable
    max_tokens = str(args.output_tokens + 48)
    return {
        "tokview": [
            *(py, "-m", "tokview", "batch", str(prompts), "--server", url, "--db", str(tmp / "tokview.duckdb")),
            *("--concurrency", str(args.concurrency), "--max-new-tokens", max_tokens, "--run", "bench"),
            *("--summary-json", *args.tokview_args.split()),
        ],
        "speculators": [
            *(py, str(HERE / "peers" / "speculators_regen.py"), "--endpoint", f"{url}/v1/chat/completions"),
            *("--input", str(prompts), "--outfile", str(tmp / "speculators.jsonl")),
            *("--concurrency", str(args.concurrency), "--max-tokens", max_tokens),
        ],
        "specforge": [
            *(py, str(HERE / "peers" / "specforge_regen.py"), "--model", "tokview-sim"),
            *("--server-address", f"127.0.0.1:{port}", "--input-file-path", str(prompts)),
            *("--output-file-path", str(tmp / "specforge.jsonl")),
            *("--concurrency", str(args.concurrency), "--max-tokens", max_tokens),
        ],
    }


def clean(tmp: Path) -> None:
    for p in [*tmp.glob("*.duckdb*"), *tmp.glob("*.jsonl*")]:
        if p.name.startswith("prompts"):
            continue
        shutil.rmtree(p) if p.is_dir() else p.unlink()


def done_count(name: str, result: dict, tmp: Path) -> int:
    if name == "tokview":
        lines = result["stdout"].strip().splitlines()
        return json.loads(lines[-1])["ok"] if lines else 0
    return count_lines(tmp / f"{name}.jsonl")


def one_round(tmp: Path, argvs: dict[str, list[str]], order: list[str], url: str, pid: int) -> dict[str, dict]:
    results = {}
    for name in order:
        clean(tmp)
        r = measured(name, argvs[name], url, pid)
        r["done"] = done_count(name, r, tmp)
        results[name] = r
        if r["code"] != 0:
            print(f"{name} exited {r['code']}: {r['stderr'][-600:]}", file=sys.stderr)
    return results


def print_round(results: dict[str, dict], n: int) -> dict[str, tuple[float, float]]:
    print(
        f"  {'client':<12}{'done':>6}{'samples/s':>11}{'CPU s':>8}{'CPU ms/sample':>15}{'server CPU s':>14}"
        f"{'peak RSS MB':>13}{'1st request s':>15}{'1st generation s':>18}{'after last s':>14}"
    )
    for name, r in results.items():
        print(
            f"  {name:<12}{r['done']:>6}{r['done'] / r['wall']:>11.1f}{r['cpu']:>8.2f}"
            f"{1000 * r['cpu'] / max(r['done'], 1):>15.2f}{r['server_cpu']:>14.2f}{r['peak_rss_mb']:>13.0f}"
            f"{r['first_any']:>15.2f}{r['first_gen']:>18.2f}{r['tail']:>14.2f}"
        )
    ratios = {}
    t = results.get("tokview")
    for peer in ("speculators", "specforge"):
        if t and peer in results:
            p = results[peer]
            thr = (t["done"] / t["wall"]) / max(p["done"] / p["wall"], 1e-9)
            ratios[peer] = (thr, t["cpu"] / p["cpu"])
            print(f"  tokview vs {peer}: throughput x{thr:.2f}, process CPU x{t['cpu'] / p['cpu']:.2f}")
    return ratios


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--output-tokens", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3, help="rounds of all clients (default 3)")
    parser.add_argument("--only", nargs="*", help="clients to run (tokview speculators specforge)")
    parser.add_argument(
        "--tokview-args", default="--workers 1", help="extra flags for tokview batch (default '--workers 1')"
    )
    args = parser.parse_args()
    import importlib.util

    missing = [m for m in ("aiohttp", "openai", "datasets") if importlib.util.find_spec(m) is None]
    if missing and set(args.only or ("speculators", "specforge")) & {"speculators", "specforge"}:
        print(f"bench_peers: skipped, the baselines need {', '.join(missing)}: pip install -e '.[bench]'")
        return 0
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # the speculators baseline's loader: local file only
    names = [n for n in ("tokview", "speculators", "specforge") if not args.only or n in args.only]
    rounds: list[dict[str, tuple[float, float]]] = []
    codes: list[int] = []
    import compileall

    compileall.compile_dir(str(HERE.parent / "tokview"), quiet=1)  # what `pip install` does (docstring)
    with tempfile.TemporaryDirectory() as tmp_name, replay_servers(args.output_tokens) as (url, pid):
        tmp = Path(tmp_name)
        port = int(url.rsplit(":", 1)[1])
        prompts, warm = tmp / "prompts.jsonl", tmp / "prompts-warm.jsonl"
        write_prompts(prompts, args.prompts)
        write_prompts(warm, 1)
        argvs = clients(tmp, prompts, url, port, args)
        for argv in clients(tmp, warm, url, port, args).values():  # fill the replay cache, outside the runs
            subprocess.run(argv, capture_output=True)
        print(
            f"peers: {args.prompts} prompts x {args.output_tokens} output tokens, concurrency "
            f"{args.concurrency}, one replay server; tokview {args.tokview_args or '(defaults)'}; "
            f"{os.cpu_count()} cores"
        )
        for k in range(args.repeat):
            order = names[k % len(names) :] + names[: k % len(names)]
            load = os.getloadavg()[0]
            print(f"round {k + 1} (order {', '.join(order)}; load average {load:.1f} before)")
            results = one_round(tmp, argvs, order, url, pid)
            codes += [r["code"] for r in results.values()]
            rounds.append(print_round({n: results[n] for n in names}, args.prompts))
    for peer, (goal_thr, goal_cpu) in GOALS.items():
        got = [r[peer] for r in rounds if peer in r]
        if got:
            thr, cpu = [g[0] for g in got], [g[1] for g in got]
            met = sum(t >= goal_thr and c <= goal_cpu for t, c in got)
            print(
                f"tokview vs {peer} over {len(got)} rounds: throughput x{min(thr):.2f}–{max(thr):.2f} "
                f"(median x{statistics.median(thr):.2f}), process CPU x{min(cpu):.2f}–{max(cpu):.2f} "
                f"(median x{statistics.median(cpu):.2f}); goal ≥ x{goal_thr} at ≤ x{goal_cpu}: met in {met} of "
                f"{len(got)} rounds"
            )
    return 0 if all(c == 0 for c in codes) else 1


if __name__ == "__main__":
    sys.exit(main())
