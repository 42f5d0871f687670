"""`tokview batch`: generate token-exact samples for a prompts file, headless and resumable.

Exit codes: 0 done, 1 usage or input error (an empty prompts file too) or a run that stopped early (a full disk,
--max-consecutive-failures, a bad row with --on-bad-row stop, first answers that read as other text with the run's
tokenizer; the summary's `stopped` says which), 2 server
unreachable, 3 finished with failures, 4 finished but bad input rows were skipped, 70 a bug in tokview, 130 interrupted (Ctrl-C;
committed samples are kept and the same command resumes).
Progress and the summary go to stderr; stdout carries data only when asked (`--summary-json`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from tokview.commands.store_arg import add_db_argument, creatable_store, run_name
from tokview.errors import UserError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from tokview.batch.config import BatchConfig, BatchSummary
    from tokview.batch.progress import ProgressPrinter
    from tokview.core.json_value import JsonObject
    from tokview.store import Store


class _ModeGiven(argparse.Action):
    """`--mode` as given, noted on the namespace (`mode_given`): its default is raw, but chat with `--backend
    sglang-chat`, which serves chat alone (and refuses raw and dual given)."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object, option: str | None = None
    ) -> None:
        setattr(namespace, self.dest, values)
        namespace.mode_given = True


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from tokview.batch.config import BATCH_DEFAULTS as D
    from tokview.batch.config import MIN_PROMPTS_ENV, MIN_PROMPTS_PER_WORKER
    from tokview.core.resolve import add_tokenizer_arguments

    p = sub.add_parser(
        "batch",
        help="generate samples for a prompts file (JSONL/Parquet) into the store",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("prompts", type=Path, help="JSONL or Parquet prompts (messages / conversations / prompt rows)")
    p.add_argument("--server", action="append", required=True, metavar="URL", help="server URL (repeatable)")
    add_db_argument(p)
    add_tokenizer_arguments(
        p, tokenizer_default="tokview's Kimi-layout tokenizer", profile_default="detected from the tokenizer"
    )
    p.add_argument(
        "--backend",
        default=D["backend"],
        choices=("auto", "sglang", "sglang-chat", "vllm"),
        help=f"the server's kind (auto: what its info endpoints say), or sglang-chat: SGLang's chat endpoint alone "
        f"(default {D['backend']})",
    )
    p.add_argument(
        "--mode",
        default=D["mode"],
        action=_ModeGiven,
        choices=("raw", "chat", "dual"),
        help="raw: tokview renders the prompt and sends its ids (exact ids, no parsers); chat: the server renders "
        "and parses (/v1/chat/completions: reasoning and tool parsers, agent traces need it); dual: both, compared "
        f"(default {D['mode']}; chat with --backend sglang-chat)",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=D["concurrency"],
        help=f"requests in flight per server (default {D['concurrency']})",
    )
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=D["max_new_tokens"],
        help=f"output tokens per sample at most (default {D['max_new_tokens']})",
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=D["temperature"],
        help=f"sampling temperature (default {D['temperature']:g})",
    )
    p.add_argument(
        "--top-p",
        type=float,
        default=D["top_p"],
        help=f"nucleus sampling mass, above 0 and at most 1 (default {D['top_p']:g})",
    )
    p.add_argument(
        "--thinking",
        action=argparse.BooleanOptionalAction,
        default=D["thinking"],
        help=f"thinking on/off via the template kwarg (default {'on' if D['thinking'] else 'off'})",
    )
    p.add_argument(
        "--samples-per-prompt",
        type=int,
        default=D["samples_per_prompt"],
        metavar="K",
        help=f"answers generated for each prompt, each a sample of its own (default {D['samples_per_prompt']})",
    )
    p.add_argument("--limit", type=int, default=D["limit"], help="read at most N input rows")
    p.add_argument(
        "--run", type=run_name, dest="run_name", help="run name (default: batch-<settings hash>, so re-runs resume)"
    )
    p.add_argument(
        "--on-bad-row",
        default=D["on_bad_row"],
        choices=("skip", "stop"),
        help=f"a row that cannot be sent (named with its line): skip it and exit 4 at the end, or stop the run at "
        f"the first one, exit 1 (default {D['on_bad_row']})",
    )
    p.add_argument(
        "--timeout", type=float, default=D["timeout"], help=f"seconds per request (default {D['timeout']:g})"
    )
    p.add_argument("--retries", type=int, default=D["retries"], help=f"retries per request (default {D['retries']})")
    p.add_argument(
        "--logprobs",
        type=int,
        metavar="K",
        help="also capture each output token's logprob and its top-K alternatives (ids), 0-20",
    )
    p.add_argument(
        "--history",
        default=D["history"],
        choices=("served", "file"),
        help="a multi-turn row's history: served = regenerate its turns as a chain, each served turn (reasoning "
        "and tool calls as generated) the history of the next, the file's tool results spliced in after the "
        "served calls; file = each turn on the file's own history, independently (default served)",
    )
    p.add_argument(
        "--history-reasoning",
        default=D["history_reasoning"],
        choices=("template", "all", "none"),
        help="reasoning a chain's served turns carry back as reasoning_content: template = all of it, the "
        "template keeps what it keeps (Kimi: the tool loop in progress); all = also preserve_thinking for "
        "templates that keep every turn's (K2.6); none = none (default template)",
    )
    p.add_argument(
        "--chat-template-kwargs",
        type=_json_object,
        metavar="JSON",
        help="chat template kwargs sent with every request and used to render prompts locally, over the profile's "
        '(e.g. \'{"current_date": "2025-08-05", "reasoning_effort": "high"}\' to render gpt-oss prompts again)',
    )
    p.add_argument("--summary-json", action="store_true", help="print the final summary as JSON on stdout")
    p.add_argument(
        "--max-consecutive-failures",
        type=int,
        default=D["max_consecutive_failures"],
        metavar="N",
        help=f"stop (with the reason) after N failed requests in a row; 0 never stops "
        f"(default {D['max_consecutive_failures']})",
    )
    p.add_argument(
        "--any-vocabulary",
        action="store_true",
        default=D["any_vocabulary"],
        help="go on when the first answers, decoded by the run's tokenizer, read as other text than the server "
        "said (another model's vocabulary: by default the run stops there, exit 1)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="processes that capture and analyse (default: the machine's cores); a process is added only "
        f"per {MIN_PROMPTS_PER_WORKER} samples still to generate, as a smaller run is faster in one "
        f"(the environment variable {MIN_PROMPTS_ENV} changes that number)",
    )
    p.add_argument("--shard", type=_shard, metavar="K/N", help="generate only the K-th of N shards of the sample ids")
    p.add_argument(
        "--ray", metavar="auto|ADDRESS", help="run prompt shards as Ray tasks (the ray extra: pip install -e '.[ray]')"
    )
    p.set_defaults(run=run, exit_without_teardown=True)


def _json_object(text: str) -> JsonObject:
    """A JSON object as the servers read it: no NaN or Infinity (not JSON; sent on as such), no lone surrogate escape
    (`"\\ud800"`: the run's settings could not be stored, after its samples were)."""

    def not_json(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    def finite(number: str) -> float:
        value = float(number)
        if not math.isfinite(value):  # 1e999: read as inf, then written as null
            raise ValueError(f"{number} is past the largest number JSON carries")
        return value

    try:
        value = json.loads(text, parse_constant=not_json, parse_float=finite)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object of kwargs")
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError(
            "holds a lone surrogate escape (half a UTF-16 pair), which is no text"
        ) from None
    return value


def _shard(text: str) -> tuple[int, int]:
    try:
        k, n = (int(v) for v in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shard takes K/N (e.g. 2/8), not {text!r}") from None
    if not 1 <= k <= n:
        zero = (  # a Slurm array counts its tasks from 0
            f" (shards count from 1: from a task id counted from 0, pass $((ID + 1))/{n})" if k == 0 and n >= 1 else ""
        )
        raise argparse.ArgumentTypeError(f"--shard {text}: K must be between 1 and N{zero}")
    return k, n


def run(args: argparse.Namespace) -> int:
    creatable_store(args.db)
    from tokview.batch import preload
    from tokview.batch.config import BatchConfig
    from tokview.servers.urls import server_url_notes, validate_server_url

    servers = [validate_server_url(url) for url in args.server]  # BadServerURL: one line, masked
    for note in dict.fromkeys(n for url in args.server for n in server_url_notes(url)):
        print(f"tokview: note: {note}", file=sys.stderr)
    if args.backend == "sglang-chat" and not getattr(args, "mode_given", False):  # its endpoint serves chat alone
        args.mode = "chat"
    config = BatchConfig(
        servers=servers,
        prompts_path=args.prompts,
        tokenizer_dir=args.tokenizer,
        trust_remote_code=args.trust_remote_code,
        profile=args.profile,
        backend=args.backend,
        mode=args.mode,
        concurrency=args.concurrency,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        thinking=args.thinking,
        samples_per_prompt=args.samples_per_prompt,
        limit=args.limit,
        run=args.run_name,
        on_bad_row=args.on_bad_row,
        timeout=args.timeout,
        retries=args.retries,
        max_consecutive_failures=args.max_consecutive_failures,
        any_vocabulary=args.any_vocabulary,
        shard=args.shard,
        ray=args.ray,
        workers=args.workers if args.workers is not None else (os.cpu_count() or 1),
        logprobs=args.logprobs,
        history=args.history,
        history_reasoning=args.history_reasoning,
        chat_template_kwargs=args.chat_template_kwargs,
    )
    config.validate()  # before the database file is created (InputError)
    check_chat_template(args.tokenizer, args.mode)
    from tokview.batch.inputs import row_settings_note

    if (settings_note := row_settings_note(args.prompts)) is not None:
        print(settings_note, file=sys.stderr)
    # The tokenizer loads once the first probe request is out, while the servers answer and the store
    # opens (`preload.py`). Its future is kept on `args`, which `cli.main` holds until it ends the process
    # without teardown: the tokenizer is then never freed (~25 ms for a 160k-entry vocabulary, at the end
    # of every run). A local would not do: it dies when this function returns, before the process ends.
    args.keep_alive = preload.start(config)
    from tokview.batch import run_batch
    from tokview.batch.inputs import say_bad_rows
    from tokview.batch.progress import ProgressPrinter
    from tokview.batch.store_opener import StoreOpener

    printer = ProgressPrinter(sys.stderr)
    # Called by run_batch once a server answered: an unreachable one leaves no database file. DuckDB is imported
    # then, after the first probe request went out (it was ~0.05-0.1 s of the start-up).
    open_store = StoreOpener(args.db, servers)

    from tokview.batch.tasks import sigterm_as_ctrl_c_again

    try:  # InputError, StoreError and ServerUnreachable (exit 2) reach the CLI as they are: one line each
        summary = asyncio.run(_run(config, open_store, printer, run_batch))
        sigterm_as_ctrl_c_again()  # the loop's close put back SIGTERM's default: it died silently
    finally:
        preload.discard(config)  # untaken when a fully stored resume needed no tokenizer
        printer.finish()
        for store in open_store.opened:
            store.close()
    say_bad_rows(args.prompts, summary.bad_rows)
    print(summary.render(), file=sys.stderr)
    if args.summary_json:
        print(
            json.dumps(
                {
                    **asdict(summary),
                    "failures_by_reason": summary.failures_by_class,
                    "failure_examples": summary.failure_examples(),
                    "balanced": summary.balanced,
                    "exit_code": summary.exit_code,
                },
                default=str,
            )
        )
    return summary.exit_code


def check_chat_template(tokenizer_dir: str | Path | None, mode: str) -> None:
    """Refuse a tokenizer folder without a chat template before anything starts, when the mode renders
    prompts locally (raw, dual): every row is a conversation (a `prompt` row is one user turn), so each
    would fail alone, after the servers were probed and the store made. The folder's files say it
    without loading the tokenizer; a folder that cannot be read is left to the loader's own words."""
    from tokview.core.tokenizer_folder import FolderError, TokenizerFolder

    if mode == "chat" or tokenizer_dir is None or not Path(tokenizer_dir).is_dir():
        return
    try:
        template = TokenizerFolder.open(tokenizer_dir).chat_template()
    except FolderError:
        return
    if template is None:
        raise UserError(
            f"tokenizer {tokenizer_dir} has no chat template (no chat_template.jinja, none in "
            f"tokenizer_config.json): --mode {mode} renders every prompt with it; add the model's template "
            f"to the folder, or use --mode chat to let the server render"
        )


async def _run(
    config: BatchConfig,
    store: Callable[[], Store],
    printer: ProgressPrinter,
    run_batch: Callable[..., Awaitable[BatchSummary]],
) -> BatchSummary:
    """Ctrl-C sets the cancel event: in-flight requests are abandoned, committed samples kept."""
    from tokview.batch.tasks import cancel_on_signals

    cancel = asyncio.Event()
    cancel_on_signals(cancel)
    if len(config.servers) > 1:  # with one server, run_batch's own probe says it (exit 2)
        for url, why in await silent_servers(config.servers):
            print(
                f"tokview: warning: --server {url} does not answer ({why}); the run goes on with the "
                f"others and retries it now and then",
                file=sys.stderr,
            )
    return await run_batch(config, store, on_progress=printer, cancel=cancel)


async def silent_servers(urls: list[str], timeout: float = 5.0) -> list[tuple[str, str]]:
    """(URL without credentials, why) for each server that does not answer HTTP at all, checked
    together before the run, so a dead box in a fleet is named at the start, not only in the summary."""
    from tokview.servers.features import unanswered

    found = await asyncio.gather(*(unanswered(url, timeout) for url in urls))
    return [pair for pair in found if pair is not None]
