"""A fully stored run is resumed to "nothing to do" without loading the tokenizer.

Resuming 100,000 stored samples took 4.6 s, about half of it loading the tokenizer (transformers'
import alone is ~1.8 s) only to learn its vocabulary fingerprint and profile name, which every
sample id holds. `identity.known_run` remembers both from the last run with the same tokenizer
files and `--profile`, and the template settings that run's probe rendered with; with them, a resume reads
the servers' info endpoints for the model name (part of the ids), plans from the prompts file and the
stored ids (`worklist.plan_work`) and, when every slot is stored, reports exactly what the full path would
(same run id and accounting) and stops.
When something is left to do, the probe's 1-token generations are sent while the tokenizer loads (on a
real server they take real time), and the ordinary path runs on the probed servers and the plan. An older
remembered entry, without the template settings, leaves the probe to the ordinary path, after the load.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from tokview.batch import identity
from tokview.batch.chains import EARLIER_STOP
from tokview.batch.config import BatchConfig, BatchProgress, BatchSummary
from tokview.batch.legacy_runs import run_id_for
from tokview.batch.preload import probe, release
from tokview.batch.run_record import check_run_provenance, stored_elsewhere
from tokview.batch.worklist import WorkList, plan_work

if TYPE_CHECKING:  # DuckDB is imported once the first probe request is out
    from tokview.servers import ServerPool
    from tokview.store import Store


class Shortcut(NamedTuple):
    """What `resume_shortcut` leaves the ordinary path."""

    store: Store | Callable[[], Store]
    """The store, opened if the shortcut had to open it."""
    finished: BatchSummary | None
    """The run's summary when nothing is left to do."""
    planned: WorkList | None
    """The plan made, for the ordinary path to reuse."""
    pool: ServerPool | None
    """The servers the shortcut probed: in full, with the remembered run's template settings, when work is left and
    the settings were remembered. The ordinary path takes them if the probe found what its own would
    (`ServerPool.adopt`), instead of probing again after its tokenizer has loaded. The caller closes them."""


async def resume_shortcut(
    config: BatchConfig,
    store: Store | Callable[[], Store],
    on_progress: Callable[[BatchProgress], None] | None = None,
    *,
    new_store: bool = False,
) -> Shortcut:
    """Plan from the remembered identity, and finish a run with nothing left to do, before the tokenizer is loaded.

    `new_store`: the store does not exist yet (`run_batch` decided it once, when it started the store's landing
    child), so nothing is stored and work is left. Only for a prompts file and a tokenizer named by path;
    otherwise nothing is done here. Raises what `run_batch` raises (ServerUnreachable before the store is opened,
    InputError, StoreError)."""
    if config.prompts_path is None or config.ray:
        return Shortcut(store, None, None, None)
    known_run = identity.known_run(config)
    if known_run is None:
        return Shortcut(store, None, None, None)
    known, probe_kwargs = known_run
    started = time.monotonic()
    # The model name is part of the ids: the info endpoints give it. With the remembered template settings, once
    # the plan shows work left, the probe's 1-token generations follow while the tokenizer loads, and the run takes
    # the probe (`ServerPool.adopt`: no second probe after the load). ServerUnreachable propagates.
    pool = config.server_pool(names_only=True, probe_kwargs=probe_kwargs)
    try:
        await probe(pool, release_loads=new_store)  # a new store has work left: its tokenizer loads now
        models = sorted({str(d["model"]) for d in pool.server_info() if d.get("model")})
        if len(models) > 1:
            await pool.aclose()
            return Shortcut(store, None, None, None)  # the ordinary path says so
        ids = {**({"model": models[0]} if models else {}), **known}
        if new_store:
            # No file and no parts: nothing stored. The plan needs no store, and none is made before the ordinary
            # path's probe has seen the servers generate (a stalled server leaves no file).
            work = plan_work(config, config.sample_settings(ids), lambda _suffix: set())
            if work.todo and probe_kwargs is not None:
                await pool.probe_generations()
            return Shortcut(store, None, work if work.todo else None, pool)
        if callable(store):
            store = store()
        store.ingest()  # parts a killed or concurrent batch left count as stored
        work = plan_work(
            config, config.sample_settings(ids), store.stored_ids_with, stored_prompts=store.stored_prompts_with
        )
        if probe_kwargs is not None:
            if work.todo:
                release()  # work is left: the tokenizer loads while the servers answer the probe's generations
            await pool.probe_generations()  # nothing left: for the summary's server features
        if work.todo:
            return Shortcut(store, None, work, pool)
        servers = await _probed_servers(config, pool if pool.probed_in_full() else None)
    except BaseException:
        await pool.aclose()
        raise
    await pool.aclose()
    run_id = run_id_for(config, ids, work, store.reads)
    if config.run:  # a name of the user's own, with nothing left to do: still refused for other settings, as with work
        check_run_provenance(store, run_id, config.record_settings(ids))
    summary = BatchSummary(
        run_id=run_id,
        input=work.input,
        resumed=work.resumed,
        duplicates=work.duplicates,
        bad_rows=work.bad,
        servers=servers,
        skipped=work.resumed + work.duplicates + len(work.bad),
        elapsed_s=time.monotonic() - started,
        resumed_from=stored_elsewhere(store, run_id, servers) if work.resumed else None,
    )
    if work.chain_left:  # chains an earlier run stored up to where they stopped
        summary.chain_stopped, summary.chain_stops = work.chain_left, {EARLIER_STOP: work.chain_left}
    if on_progress is not None:
        progress = BatchProgress(total=summary.input, skipped=summary.skipped, elapsed_s=summary.elapsed_s)
        progress.chain_stopped = summary.chain_stopped
        on_progress(progress)
    return Shortcut(store, summary, work, None)


async def _probed_servers(config: BatchConfig, probed: ServerPool | None) -> list[dict[str, Any]]:
    """What the ordinary path's probe says of the servers (features included), for a summary with nothing to do:
    `probed`'s, when the shortcut's probe found what it would, else a probe's now."""
    from tokview.secrets import scrub

    if probed is not None:
        servers: list[dict[str, Any]] = scrub(probed.server_info())
        return servers
    pool = config.server_pool()
    try:
        await probe(pool, release_loads=False)  # nothing is left to do: no tokenizer is needed
        servers = scrub(pool.server_info())
        return servers
    finally:
        await pool.aclose()
