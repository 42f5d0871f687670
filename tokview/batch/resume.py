"""A fully stored run is resumed to "nothing to do" without loading the tokenizer.

Resuming 100,000 stored samples took 4.6 s, about half of it loading the tokenizer (transformers'
import alone is ~1.8 s) only to learn its vocabulary fingerprint and profile name, which every
sample id holds. `identity.known_identity` remembers both from the last run with the same tokenizer
files and `--profile`; with them, a resume asks the servers' info endpoints for the model name (no
generation: the ordinary path's probe sends those once, when work is left), plans from the prompts file
and the stored ids (`worklist.plan_work`) and, when every slot is stored, reports exactly what the full
path would (same run id and accounting) and stops.
When something is left to do, or nothing is remembered, the ordinary path runs and reuses the plan.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tokview.batch.chains import EARLIER_STOP
from tokview.batch.config import BatchConfig, BatchProgress, BatchSummary
from tokview.batch.identity import known_identity
from tokview.batch.preload import probe
from tokview.batch.worklist import WorkList, plan_work

if TYPE_CHECKING:  # DuckDB is imported once the first probe request is out
    from tokview.store import Store


async def resume_shortcut(
    config: BatchConfig,
    store: Store | Callable[[], Store],
    on_progress: Callable[[BatchProgress], None] | None = None,
    *,
    new_store: bool = False,
) -> tuple[Store | Callable[[], Store], BatchSummary | None, WorkList | None]:
    """(the store, opened if this had to open it; the summary when nothing is left to do; the plan made).

    `new_store`: the store does not exist yet (`run_batch` decided it once, when it started the store's landing
    child), so nothing is stored and work is left. Only for a prompts file and a tokenizer named by path;
    otherwise nothing is done here. Raises what `run_batch` raises (ServerUnreachable before the store is opened,
    InputError, StoreError)."""
    if config.prompts_path is None or config.ray:
        return store, None, None
    known = known_identity(config)
    if known is None:
        return store, None, None
    started = time.monotonic()
    # The model name is part of the ids: the info endpoints give it, without the 1-token generations the ordinary
    # path's probe sends anyway when work is left. ServerUnreachable propagates (nothing written).
    pool = config.server_pool(names_only=True)
    try:
        await probe(pool, release_loads=new_store)  # a new store has work left: its tokenizer loads now
        models = sorted({str(d["model"]) for d in pool.server_info() if d.get("model")})
    finally:
        await pool.aclose()
    if len(models) > 1:
        return store, None, None  # the ordinary path says so
    identity = {**({"model": models[0]} if models else {}), **known}
    if new_store:
        # No file and no parts: nothing stored. The plan needs no store, and none is made before the ordinary
        # path's probe has seen the servers generate (a stalled server leaves no file).
        work = plan_work(config, config.sample_settings(identity), lambda _suffix: set())
        return store, None, (work if work.todo else None)
    if callable(store):
        store = store()
    store.ingest()  # parts a killed or concurrent batch left count as stored
    work = plan_work(config, config.sample_settings(identity), store.stored_ids_with)
    if work.todo:
        return store, None, work
    servers = await _probed_servers(config)
    summary = BatchSummary(
        run_id=config.run_id(identity),
        input=work.input,
        resumed=work.resumed,
        duplicates=work.duplicates,
        bad_rows=work.bad,
        servers=servers,
        skipped=work.resumed + work.duplicates + len(work.bad),
        elapsed_s=time.monotonic() - started,
    )
    if work.chain_left:  # chains an earlier run stored up to where they stopped
        summary.chain_stopped, summary.chain_stops = work.chain_left, {EARLIER_STOP: work.chain_left}
    if on_progress is not None:
        progress = BatchProgress(total=summary.input, skipped=summary.skipped, elapsed_s=summary.elapsed_s)
        progress.chain_stopped = summary.chain_stopped
        on_progress(progress)
    return store, summary, work


async def _probed_servers(config: BatchConfig) -> list[dict[str, Any]]:
    """What the ordinary path's probe says of the servers (features included), for a summary with nothing to do."""
    from tokview.secrets import scrub

    pool = config.server_pool()
    try:
        await probe(pool, release_loads=False)  # nothing is left to do: no tokenizer is needed
        servers: list[dict[str, Any]] = scrub(pool.server_info())
        return servers
    finally:
        await pool.aclose()
