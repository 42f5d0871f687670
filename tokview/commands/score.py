"""`tokview score`: re-score stored samples against a live target, without generating.

For every selected sample (captured by `tokview batch` or imported with `tokview audit`), the
target's logprob of each output token is stored with the sample, with its mean NLL (nats per
token) and the share of tokens below `--low-prob`. A sample whose mean NLL is above
`--off-policy-nll` (default 2.0: on-policy samples usually score well under 1 nat, text from another
model or pipeline usually above 2; set it per model after looking at the distribution) gets the
`off_policy` finding (warn): a drafter trained on it learns tokens the target would not produce.

SGLang: `/generate` with input_ids = prompt + output, max_new_tokens 0, logprob_start_len 0.
vLLM: `/v1/completions` with the ids as prompt, max_tokens 1, prompt_logprobs K.
Before anything is scored, a few samples' output ids are read back with the target's /detokenize: a target that
reads most of them as other text than their answers (another vocabulary) is refused, exit 1 (`--any-vocabulary`
scores anyway). Resumable: samples already scored by the same served model (with at least this --top-k) are
skipped; `--rescore` scores them again (`--rescore-before TIME` those scored before TIME: how an interrupted
`--rescore` goes on). Exit codes as `tokview batch`: 0, 1 usage or a run stopped after --max-consecutive-failures
failed samples in a row (a target that died), 2 unreachable, 3 some samples failed, 130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import asdict
from typing import TYPE_CHECKING

from tokview.batch.tasks import cancel_on_signals, sigterm_as_ctrl_c_again
from tokview.commands.store_arg import add_db_argument, existing_store, run_name

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from tokview.batch.progress import ProgressPrinter
    from tokview.batch.scoring import ScoreConfig, ScoreSummary
    from tokview.store import Store


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from tokview.core.logprobs import DEFAULT_LOW_PROB, DEFAULT_OFF_POLICY_NLL

    p = sub.add_parser(
        "score",
        help="re-score stored samples against a live target (mean NLL, off_policy)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_db_argument(p)
    p.add_argument("--server", action="append", required=True, metavar="URL", help="target server URL (repeatable)")
    p.add_argument("--backend", default="auto", choices=("auto", "sglang", "vllm"))
    p.add_argument("--run", type=run_name, dest="run_name", help="only samples of this run")
    p.add_argument("--select", default="all", choices=("all", "valid", "approved"), help="which samples (default all)")
    p.add_argument("--top-k", type=int, default=0, metavar="K", help="also store the target's top-K ids (0-20)")
    p.add_argument(
        "--off-policy-nll",
        type=float,
        default=DEFAULT_OFF_POLICY_NLL,
        metavar="X",
        help=f"mean NLL (nats/token) above which a sample is off_policy (default {DEFAULT_OFF_POLICY_NLL})",
    )
    p.add_argument(
        "--low-prob",
        type=float,
        default=DEFAULT_LOW_PROB,
        metavar="P",
        help=f"a token below this target probability counts as unlikely (default {DEFAULT_LOW_PROB})",
    )
    p.add_argument(
        "--limit",
        type=int,
        help="the first N selected samples, oldest first (as batch's --limit: a re-run resumes the same N)",
    )
    p.add_argument("--rescore", action="store_true", help="score samples this target already scored again")
    p.add_argument(
        "--rescore-before",
        metavar="TIME",
        help="score again the samples whose stored score is older than TIME (YYYY-MM-DDTHH:MM:SSZ, UTC): an "
        "interrupted --rescore prints the one that continues it",
    )
    p.add_argument(
        "--any-vocabulary",
        action="store_true",
        help="score even when the target's /detokenize reads the samples' output ids as other text than their answers "
        "(checked on a few samples before scoring: another vocabulary makes every NLL meaningless)",
    )
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight per server (default 8)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per request (default 60)")
    p.add_argument("--retries", type=int, default=3, help="retries per sample on a server error (default 3)")
    p.add_argument(
        "--max-consecutive-failures",
        type=int,
        default=20,
        metavar="N",
        help="stop (with the reason, exit 1) after N samples failed in a row, as batch does; 0 never stops "
        "(default 20)",
    )
    p.add_argument("--summary-json", action="store_true", help="print the final summary as JSON on stdout")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tokview.batch.progress import ProgressPrinter, score_progress_line
    from tokview.batch.scoring import ScoreConfig, run_score
    from tokview.servers.urls import validate_server_url
    from tokview.store import Store
    from tokview.store.errors import StoreError

    existing_store(args.db)
    servers = [validate_server_url(url) for url in args.server]  # BadServerURL: one line, masked
    config = ScoreConfig(
        servers=servers,
        backend=args.backend,
        run=args.run_name,
        select=args.select,
        top_k=args.top_k,
        off_policy_nll=args.off_policy_nll,
        low_prob=args.low_prob,
        concurrency=args.concurrency,
        timeout=args.timeout,
        retries=args.retries,
        limit=args.limit,
        rescore=args.rescore,
        rescore_before=args.rescore_before,
        any_vocabulary=args.any_vocabulary,
        max_consecutive_failures=args.max_consecutive_failures,
    )
    config.validate()  # InputError
    printer = ProgressPrinter(sys.stderr, line=score_progress_line)
    try:  # InputError, StoreError and ServerUnreachable (exit 2) reach the CLI as they are: one line each
        with Store(args.db, server_urls=servers) as store:
            if store.read_only:  # before the target scores anything: every score would be held, then lost
                raise StoreError(f"cannot write to {args.db}: the store is read-only (nothing scored)")
            summary = asyncio.run(_run(config, store, printer, run_score))
            sigterm_as_ctrl_c_again()  # the loop's close put back SIGTERM's default: it died silently
    finally:
        printer.finish()
    print(summary.render(), file=sys.stderr)
    if args.summary_json:
        print(json.dumps({**asdict(summary), "exit_code": summary.exit_code}, default=str))
    return summary.exit_code


async def _run(
    config: ScoreConfig,
    store: Store,
    printer: ProgressPrinter,
    run_score: Callable[..., Awaitable[ScoreSummary]],
) -> ScoreSummary:
    """Ctrl-C sets the cancel event: in-flight requests are abandoned, written scores kept."""
    cancel = asyncio.Event()
    cancel_on_signals(cancel)
    return await run_score(config, store, on_progress=printer, cancel=cancel)
