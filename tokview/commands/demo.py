"""`tokview demo`: a simulator, a fresh store, a first batch with findings worth looking at, then the app.

Two loopback vLLM simulators with the Kimi-layout tokenizer: a current one, and one that behaves like
vLLM before 0.16 (reasoning in `reasoning_content`) with a parser that puts the whole output in the
reasoning field. Three small runs over the sample prompts go into
the store through `run_batch`, the same call `tokview batch` makes: parsed chat on the current server,
parsed chat on the old one, and raw ids with a small max-tokens budget (truncations). `--no-ui` prints a
summary and the `tokview ui --db …` line that opens the store, instead of opening the app (for CI
and the README).
"""

from __future__ import annotations

import asyncio
import shlex
import sys
import tempfile
from pathlib import Path

from tokview.cli import UserError

DEFAULT_PROMPTS = Path(__file__).resolve().parents[2] / "sample_data" / "openai_messages.jsonl"
FALLBACK_PROMPTS = ["What is 6 times 7?", "Is 221 a prime number? Explain.", "Write a haiku about token ids.",
                    "What is the capital of Australia?", "Explain why the sky is blue in two sentences."]


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="start a simulator, fill a demo store with a first batch, open the app")
    p.add_argument("--db", default=None, help="DuckDB file (default: a fresh one in a temporary folder)")
    p.add_argument("--prompts", type=Path, default=None, help="prompts JSONL (default: sample_data/openai_messages.jsonl)")
    p.add_argument("--limit", type=int, default=12, help="prompts per run (default 12)")
    p.add_argument("--no-ui", "--headless", dest="no_ui", action="store_true",
                   help="run the batches and print a summary instead of opening the app")
    p.set_defaults(run=run)


def _prompts(path: Path | None, limit: int):
    from tokview.batch import read_prompts
    from tokview.core.prompts import parse_row

    if path is None and not DEFAULT_PROMPTS.is_file():
        return [parse_row({"messages": [{"role": "user", "content": t}]}, line=i)
                for i, t in enumerate(FALLBACK_PROMPTS, 1)][:limit]
    rows, _bad = read_prompts(path or DEFAULT_PROMPTS, limit=limit)
    if not rows:
        raise UserError(f"no usable prompts in {path or DEFAULT_PROMPTS}")
    return rows


def demo_runs(current_url: str, old_url: str) -> list[tuple[str, dict]]:
    """(description, BatchConfig fields) of the three demo runs.

    Each run has its own temperature: sample ids derive from the settings, so equal settings on the
    second server would count as already captured and be skipped.
    """
    common = {"concurrency": 4, "timeout": 20.0, "retries": 2}
    return [
        ("parsed chat · vLLM 0.32", {"servers": [current_url], "mode": "chat", "max_new_tokens": 256,
                                     "temperature": 0.6, "run": "demo-chat", **common}),
        ("parsed chat · old vLLM, bad parser", {"servers": [old_url], "mode": "chat", "max_new_tokens": 256,
                                            "temperature": 0.7, "run": "demo-old-vllm", **common}),
        ("raw ids · max 24 tokens", {"servers": [current_url], "mode": "raw", "max_new_tokens": 24,
                                     "temperature": 1.0, "run": "demo-truncated", **common}),
    ]


async def fill_store(store, prompts, tokenizer, profile, current_url: str, old_url: str) -> list:
    from tokview.batch import BatchConfig, run_batch

    summaries = []
    for label, fields in demo_runs(current_url, old_url):
        config = BatchConfig(tokenizer=tokenizer, model_profile=profile, **fields)
        summaries.append((label, await run_batch(config, store, prompts)))
    return summaries


def summary_text(store, summaries) -> str:
    stats = store.stats()
    lines = [f"demo store: {store.path}"]
    for label, s in summaries:
        lines.append(f"  run {s.run_id:<16} {label:<34} ok {s.ok:>3}  failed {s.failed}  flagged {s.flagged}  "
                     f"truncated {s.truncated}")
    lines.append(f"  {stats['samples']} samples · valid {stats['valid']} · invalid {stats['invalid']}")
    for code, info in stats["findings"].items():
        lines.append(f"  {info['severity']:<5} {code:<34} {info['samples']:>3} samples")
    return "\n".join(lines)


def open_hint(db: str | None) -> str:
    """How to look at the store afterwards: `tokview ui --db …`, or how to keep one when it was temporary."""
    if db is None:
        return ("  (a temporary store, removed on exit; to keep one: tokview demo --no-ui --db demo.duckdb, "
                "then open it: tokview ui --db demo.duckdb)")
    return f"  open it: tokview ui --db {shlex.quote(db)}"


def run(args) -> int:
    from tokview.core.resolve import resolve_tokenizer_and_profile
    from tokview.sim import SimConfig, start_simulator
    from tokview.store import Store

    if args.limit < 1:
        raise UserError("--limit must be at least 1")
    prompts = _prompts(args.prompts, args.limit)
    tmp = None
    db = args.db
    if db is None:
        tmp = tempfile.TemporaryDirectory(prefix="tokview-demo-")
        db = str(Path(tmp.name) / "demo.duckdb")
    tokenizer, profile = resolve_tokenizer_and_profile(None, "kimi-k2.5")
    try:
        with start_simulator(SimConfig(kind="vllm")) as current, \
                start_simulator(SimConfig(kind="vllm", quirks={"vllm-pre-0.16": True, "parser-all-reasoning": True})) as old:
            with Store(db) as store:
                summaries = asyncio.run(fill_store(store, prompts, tokenizer, profile, current.url, old.url))
                if args.no_ui:
                    print(summary_text(store, summaries))
                    print(open_hint(args.db))
                    return 0
                print(summary_text(store, summaries), file=sys.stderr)
                from tokview.ui.app import TokviewApp
                from tokview.ui.config import ConfigError, load_config
                from tokview.ui.session import Session

                try:
                    config = load_config()
                except ConfigError as exc:
                    raise UserError(str(exc)) from None
                session = Session(store, tokenizer=tokenizer, profile=profile, server_url=current.url)
                TokviewApp(session, config).run()
        return 0
    finally:
        if tmp is not None:
            tmp.cleanup()
