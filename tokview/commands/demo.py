"""`tokview demo`: a simulator, a fresh store, a first batch with findings worth looking at, then the app.

Two loopback vLLM simulators with the Kimi-layout tokenizer: a current one, and one that behaves like
vLLM before 0.16 (reasoning in `reasoning_content`) with a parser that puts the whole output in the
reasoning field. Three small runs over the sample prompts go into
the store through `run_batch`, the same call `tokview batch` makes: parsed chat on the current server,
parsed chat on the old one, and raw ids with a small max-tokens budget (truncations). `--no-ui` prints a
summary and the `tokview ui --db …` line that opens the store, instead of opening the app (for CI
and the README). With the app, each run's progress shows on stderr before it opens, and the summary is
printed after it closes, with the counts as they are then (samples generated in the app included); a
store made without `--db` is temporary, and the last line says so and how to keep one.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, TextIO, TypedDict

from tokview.commands.store_arg import creatable_store
from tokview.errors import ExitCode, UserError
from tokview.untrusted_text import printable_line

if TYPE_CHECKING:
    from tokview.batch.config import BatchSummary
    from tokview.core.profiles import ModelProfile
    from tokview.core.prompts import PromptRow
    from tokview.core.tokenizer import TokenizerAdapter
    from tokview.store import Store

DEFAULT_PROMPTS = Path(__file__).resolve().parents[2] / "sample_data" / "openai_messages.jsonl"
FALLBACK_PROMPTS = [
    "What is 6 times 7?",
    "Is 221 a prime number? Explain.",
    "Write a haiku about token ids.",
    "What is the capital of Australia?",
    "Explain why the sky is blue in two sentences.",
]


class DemoRunFields(TypedDict):
    """The BatchConfig fields a demo run sets (typed, so mypy checks each against BatchConfig)."""

    servers: list[str]
    mode: str
    max_new_tokens: int
    temperature: float
    run: str
    concurrency: int
    timeout: float
    retries: int


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("demo", help="start a simulator, fill a demo store with a first batch, open the app")
    p.add_argument("--db", default=None, help="DuckDB file (default: a fresh one in a temporary folder)")
    p.add_argument(
        "--prompts", type=Path, default=None, help="prompts JSONL (default: sample_data/openai_messages.jsonl)"
    )
    p.add_argument("--limit", type=int, default=12, help="prompts per run (default 12)")
    p.add_argument(
        "--no-ui",
        "--headless",
        dest="no_ui",
        action="store_true",
        help="run the batches and print a summary instead of opening the app",
    )
    p.set_defaults(run=run)


def _prompts(path: Path | None, limit: int) -> tuple[list[PromptRow], list[str]]:
    """The demo's prompts and the rows of `path` skipped as bad (`FILE:LINE: why`, said on stderr as batch says
    them: the demo exited 0 naming none of them)."""
    from tokview.batch import read_prompts
    from tokview.batch.inputs import say_bad_rows
    from tokview.core.prompts import parse_row

    if path is None and not DEFAULT_PROMPTS.is_file():
        rows = [
            parse_row({"messages": [{"role": "user", "content": t}]}, line=i) for i, t in enumerate(FALLBACK_PROMPTS, 1)
        ]
        return rows[:limit], []
    rows, bad = read_prompts(path or DEFAULT_PROMPTS, limit=limit)
    if not rows:
        raise UserError(f"no usable prompts in {path or DEFAULT_PROMPTS}")
    say_bad_rows(path or DEFAULT_PROMPTS, bad)
    return rows, bad


def exit_code(summaries: list[tuple[str, BatchSummary]], bad_rows: list[str]) -> int:
    """As `tokview batch` exits for the same runs: the worst of the demo's runs (interrupted, stopped, failures),
    else 4 when rows of the prompts file were skipped, else 0 (the demo exited 0 whatever its runs met)."""
    codes = {summary.exit_code for _, summary in summaries}
    for code in (ExitCode.INTERRUPTED, ExitCode.USAGE, ExitCode.FAILURES):  # as a batch ranks them
        if code in codes:
            return int(code)
    return ExitCode.BAD_ROWS if bad_rows else ExitCode.OK


def demo_runs(current_url: str, old_url: str) -> list[tuple[str, DemoRunFields]]:
    """(description, BatchConfig fields) of the three demo runs.

    Each run has its own temperature: sample ids derive from the settings, so equal settings on the
    second server would count as already captured and be skipped.
    """

    def fields(server: str, mode: str, max_new_tokens: int, temperature: float, run: str) -> DemoRunFields:
        return DemoRunFields(
            servers=[server],
            mode=mode,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            run=run,
            concurrency=4,
            timeout=20.0,
            retries=2,
        )

    return [
        ("parsed chat · vLLM 0.32", fields(current_url, "chat", 256, 0.6, DEMO_RUN_IDS[0])),
        ("parsed chat · old vLLM, bad parser", fields(old_url, "chat", 256, 0.7, DEMO_RUN_IDS[1])),
        ("raw ids · max 24 tokens", fields(current_url, "raw", 24, 1.0, DEMO_RUN_IDS[2])),
    ]


async def fill_store(
    store: Store,
    prompts: list[PromptRow],
    *,
    tokenizer: TokenizerAdapter,
    profile: ModelProfile,
    current_url: str,
    old_url: str,
    stream: TextIO | None = None,
) -> list[tuple[str, BatchSummary]]:
    """The three demo runs; with a `stream`, a progress line per run on it (the app is not up yet)."""
    from tokview.batch import BatchConfig, run_batch
    from tokview.batch.progress import ProgressPrinter

    summaries = []
    runs = demo_runs(current_url, old_url)
    for n, (label, fields) in enumerate(runs, 1):
        config = BatchConfig(tokenizer=tokenizer, model_profile=profile, **fields)
        printer = None
        if stream is not None:
            stream.write(f"tokview demo: run {n}/{len(runs)} · {label}\n")
            stream.flush()
            printer = ProgressPrinter(stream, interval=0.1)
        summaries.append((label, await run_batch(config, store, prompts, on_progress=printer)))
        if printer is not None:
            printer.finish()
    return summaries


def summary_text(store: Store, summaries: list[tuple[str, BatchSummary]], temporary: bool = False) -> str:
    """The demo runs and the store's counts as they are now (read at the call, so after the app they are current)."""
    stats = store.stats()
    where = "temporary (deleted on exit, so no path to keep)" if temporary else str(store.path)
    lines = [f"demo store: {where}"]
    for label, s in summaries:
        bad = f"  bad rows {len(s.bad_rows)} (first: {printable_line(s.bad_rows[0])})" if s.bad_rows else ""
        lines.append(
            f"  run {s.run_id:<16} {label:<34} ok {s.ok:>3}  failed {s.failed}  flagged {s.flagged}  "
            f"truncated {s.truncated}{bad}"
        )
    lines.append(f"  {stats['samples']} samples · valid {stats['valid']} · invalid {stats['invalid']}")
    for code, info in stats["findings"].items():
        lines.append(f"  {info['severity']:<5} {code:<34} {info['samples']:>3} samples")
    return "\n".join(lines)


def open_hint(db: str | None, removed: bool = False) -> str:
    """How to look at the store afterwards: `tokview ui --db …`, or how to keep one when it was temporary."""
    if db is None:
        said = "the temporary store is removed now" if removed else "a temporary store, removed on exit"
        return (
            f"  ({said}; to keep one: tokview demo --db demo.duckdb, then open it again: tokview ui --db demo.duckdb)"
        )
    return (
        f"  open it again: tokview ui --db {shlex.quote(db)}"
        if removed
        else f"  open it: tokview ui --db {shlex.quote(db)}"
    )


DEMO_RUN_IDS = ("demo-chat", "demo-old-vllm", "demo-truncated")
"""The runs the demo makes (`fill_store`)."""


def _refuse_a_store_of_other_runs(db: str) -> None:
    """The demo writes simulator samples: into a store holding a team's own runs they would be counted, reviewed and
    exported beside them (an `--select valid` export took 24 demo rows). A store of the demo's runs only (a demo
    run again) or a new file is fine."""
    from tokview.store import Store

    if not Path(db).expanduser().is_file():
        return
    with Store(db) as store:  # not a store, a newer schema: its one-line error
        others = [r for r in store.run_ids() if r not in DEMO_RUN_IDS]
    if others:
        raise UserError(
            f"--db {db} holds runs that are not the demo's ({', '.join(others[:3])}{', …' if len(others) > 3 else ''}): "
            "the demo adds simulator samples an export would take as yours; give the demo a new file"
        )


def run(args: argparse.Namespace) -> int:
    from tokview.response_size import max_response_bytes

    max_response_bytes()  # a bad TOKVIEW_MAX_RESPONSE_MB: one line before a store or a simulator is made
    if args.db is not None:  # none: a temporary store
        creatable_store(args.db)
    from tokview.core.resolve import load_tokenizer_and_profile
    from tokview.sim import SimConfig, start_simulator
    from tokview.store import Store

    if args.limit < 1:
        raise UserError("--limit must be at least 1")
    prompts, bad_rows = _prompts(args.prompts, args.limit)
    tmp = None
    db = args.db
    if db is None:
        try:
            tmp = tempfile.TemporaryDirectory(prefix="tokview-demo-")
        except OSError as exc:  # no usable temporary folder (TMPDIR, /tmp, /var/tmp and here all unwritable)
            raise UserError(
                f"no folder for the demo's temporary store ({exc.strerror or exc}): pass --db PATH"
            ) from None
        db = str(Path(tmp.name) / "demo.duckdb")
    else:
        _refuse_a_store_of_other_runs(db)
    tokenizer, profile = load_tokenizer_and_profile(None, "kimi-k2.5")
    from tokview.commands.ui import has_terminal

    if not args.no_ui and not has_terminal():  # cron, CI, a redirect: the app would wait forever for keys
        print("tokview demo: no terminal for the app: filling the store headless (as --no-ui)", file=sys.stderr)
        args.no_ui = True
    if not args.no_ui:  # the batches take seconds before the app can open: say what is happening
        where = "a temporary store (removed when you quit; --db PATH keeps one)" if tmp else db
        print(f"tokview demo: filling {where}", file=sys.stderr)
    try:
        old_server = SimConfig(kind="vllm", quirks={"vllm-pre-0.16": True, "parser-all-reasoning": True})
        with start_simulator(SimConfig(kind="vllm")) as current, start_simulator(old_server) as old, Store(db) as store:
            if args.no_ui:
                summaries = asyncio.run(
                    fill_store(
                        store, prompts, tokenizer=tokenizer, profile=profile, current_url=current.url, old_url=old.url
                    )
                )
                print(summary_text(store, summaries, temporary=tmp is not None))
                print(open_hint(args.db))
                return exit_code(summaries, bad_rows)
            from tokview.commands.ui import reviewer_name
            from tokview.ui.app import TokviewApp
            from tokview.ui.config import load_config
            from tokview.ui.session import Session

            config = load_config()  # ConfigError: one line
            summaries = asyncio.run(
                fill_store(
                    store,
                    prompts,
                    tokenizer=tokenizer,
                    profile=profile,
                    current_url=current.url,
                    old_url=old.url,
                    stream=sys.stderr,
                )
            )
            session = Session(
                store,
                tokenizer=tokenizer,
                profile=profile,
                server_url=current.url,
                who=reviewer_name(None, config.reviewer),
            )
            TokviewApp(session, config).run()
            summary = summary_text(store, summaries, temporary=tmp is not None)  # counts after the app
    finally:
        if tmp is not None:
            tmp.cleanup()
    print(summary)
    print(open_hint(args.db, removed=True))
    return exit_code(summaries, bad_rows)
