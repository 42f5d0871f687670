"""`run_batch`: prompts → captures → analysis → store, resumable and interruptible.

Why it is shaped this way:
- Work is planned up front as sample ids (prompt id + settings + served model + tokenizer vocabulary +
  profile + index + turn), and the ids already in the store are skipped (an anti-join), so a re-run
  never re-generates or duplicates anything, and another model's run never "resumes" this one. The
  servers are probed first, since the served model name is part of the id: so even a resume of a
  fully stored run needs a server that answers, and an unreachable one exits 2 before the store is
  opened (the CLI passes a store opener, so no database file is left behind).
- Finished captures go to one writer thread (`writer.py`) that analyses them and writes a group at
  a time as a crash-safe part beside the store; each part wakes the lander (`workers.Lander`), which
  lands it in one short transaction (at most once a second in a batch, at once in the app, and the
  last the moment the last group is written): a kill loses at most the requests in flight plus one
  short group, and the store is never held open, so the app, `stats` and other batches use it while the run goes on.
- A store that does not exist yet is created and landed into by a child process (`landing_process.py`),
  started as the run starts: this process then never imports DuckDB, and its first generation goes out
  ~0.1 s sooner.
- Cancelling (Ctrl-C, or the UI's cancel event) stops taking work and abandons in-flight requests;
  captures already handed to the writer are still written, so nothing half-written is left.
- It stops early, with the reason, on a full disk (what was generated is kept for the resume) and
  after `max_consecutive_failures` failed requests in a row.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tokview.batch import preload
from tokview.batch.chains import EARLIER_STOP, ChainItem, chains_stopped, split_chain_stops
from tokview.batch.config import BatchConfig, BatchProgress, BatchSummary, split_flagged
from tokview.batch.inputs import InputError, check_prompts_path
from tokview.batch.legacy_runs import run_id_for
from tokview.batch.run_record import stored_elsewhere
from tokview.batch.tasks import INTERRUPTED, StartInterrupted, unless_cancelled
from tokview.batch.worklist import TodoQueue, WorkItem, WorkList, chain_settings, plan_work
from tokview.core.profiles import profile_fields
from tokview.core.prompts import PromptRow, generation_points
from tokview.core.record import sample_head, sample_id_for, settings_key
from tokview.core.thinking_switch import thinking_off_refusal

if TYPE_CHECKING:  # imported where they are used, after the first probe request is out (`probe`)
    from tokview.batch.landing_process import LandingChild
    from tokview.batch.resume import Shortcut
    from tokview.batch.workers import Lander, WorkerGroup, WorkFeed
    from tokview.batch.writer_thread import GroupWriter
    from tokview.core.profiles import ModelProfile
    from tokview.core.tokenizer import TokenizerAdapter
    from tokview.servers import ServerPool
    from tokview.store import Store

LANDING_S = 1.0
"""At most one landing a second in a batch (each costs ~50 ms of CPU however small; see workers.Lander). Also when a
landing child lands (`landing_process.py`): at most one every 0.15 s made its 300-prompt runs 0.03 s shorter, and
its 2,400-prompt runs ~10% slower (its landings took the CPU the capture needs)."""
GROUP_S = 0.25
"""How long the writer collects answers into one part in a batch (the writer's own default)."""
SLICED_SAMPLES = 32
"""A run planning more samples loads its whole tokenizer (`BatchConfig` loads it as vocabulary slices, answered
in ~0.07 s instead of a 0.3-0.5 s parse for Qwen3's tokenizer.json, `core.vocab_slices`); a smaller one encodes
its prompts and answers through slices (a 2,000-token answer whose words the slice holds: one encode, as whole;
one of new words: ~20-40 ms, and the slices load the whole one themselves once growing has cost as much)."""
LIVE_LANDING_S = 0.05
LIVE_GROUP_S = 0.05
"""A live run (the app) lands each part as it is written, and writes a part every 50 ms: a sample shows
within ~0.1 s of its answer."""


def plan(
    rows: list[PromptRow], config: BatchConfig, settings: dict[str, Any] | None = None
) -> tuple[list[WorkItem], int]:
    """Every sample slot the prompts ask for, and how many rows repeated an earlier prompt id.

    `settings` is what goes into the sample ids (`config.sample_settings(identity)`). Holds every slot's
    messages: `run_batch` plans with `worklist.plan_work`, which streams the file and gives the same ids
    (this one stays as the reference the tests hold it to)."""
    settings = config.sample_settings() if settings is None else settings
    key = settings_key(settings)  # once, not per sample: hashing the settings 100,000 times took seconds
    served = config.history == "served"
    chain_key = settings_key(chain_settings(settings, config)) if served else key

    def sample_id(prompt_id: str, index: int, turn: int | None) -> str:
        return f"{sample_head(prompt_id, turn)}@{key if turn is None else chain_key}_gen{index}"

    items: list[WorkItem] = []
    seen_prompts: set[str] = set()
    duplicates = 0
    for row in rows:
        points = generation_points(row)
        if row.prompt_id in seen_prompts:
            duplicates += len(points) * config.samples_per_prompt
            continue
        seen_prompts.add(row.prompt_id)
        for point in points:
            for index in range(config.samples_per_prompt):
                items.append(
                    WorkItem(
                        sample_id(row.prompt_id, index, point.turn),
                        row.prompt_id,
                        point.turn,
                        index,
                        point.history,
                        row.tools,
                    )
                )
    if items:  # the one definition of a sample id stays core.record's
        first = items[0]
        hashed = chain_settings(settings, config) if served and first.turn is not None else settings
        if first.sample_id != sample_id_for(first.prompt_id, hashed, first.index, first.turn):
            raise AssertionError("batch sample ids diverge from core.record.sample_id_for")
    return items, duplicates


def select_shard(items: list[WorkItem], shard: tuple[int, int] | None) -> list[WorkItem]:
    """The K-th of N shards (1-based) of the sample ids: a stable hash of the id, so every machine of a
    Slurm array agrees without talking, and shards are disjoint and cover every id."""
    if shard is None:
        return items
    k, n = shard
    return [i for i in items if zlib.crc32(i.sample_id.encode()) % n == k - 1]


def served_identity(pool: ServerPool, tokenizer: TokenizerAdapter, profile: ModelProfile) -> dict[str, Any]:
    """What sample ids must include besides the settings: model name, tokenizer vocabulary, profile.

    The tokenizer enters by its vocabulary (`vocab_fingerprint`: the id → token table), not by its
    files: an edited tokenizer_config.json or a rebuilt cache must not turn a resume into a second
    generation of every prompt. The full file hash stays in the runs table (`tokenizer_hash`). The
    model name enters only when the servers report one; a server that reports none adds no key.
    """
    models = sorted({str(d["model"]) for d in pool.server_info() if d.get("model")})
    if len(models) > 1:
        raise InputError(f"the servers serve different models ({', '.join(models)}): run each model separately")
    from tokview.batch.identity import vocab_fingerprint

    return {
        **({"model": models[0]} if models else {}),
        "tokenizer": vocab_fingerprint(tokenizer),
        "profile": profile.name,
    }


async def run_batch(
    config: BatchConfig,
    store: Store | Callable[[], Store],
    prompts: list[PromptRow] | None = None,
    *,
    on_progress: Callable[[BatchProgress], None] | None = None,
    cancel: asyncio.Event | None = None,
    live: bool = False,
    on_landed: Callable[[int], None] | None = None,
) -> BatchSummary:
    """Generate every planned sample not yet in the store.

    `live` (the app): each sample is landed as soon as it is written, not at most once a second, so
    it shows within a fraction of a second of its answer; `on_landed` is told, from the landing
    thread, how many samples each landing stored.

    `store` is an open Store, or a function that opens one: called only once a server has answered
    the probe, so an unreachable server never creates a database file (the caller closes it). A
    `StoreOpener` whose store does not exist yet is called only if its landing child dies: that child
    creates the store once the servers have answered, and lands into it (`landing_process.py`).
    Raises InputError (bad config or prompts), ServerUnreachable (no server answered the probe) or
    StoreError (the database cannot be written). Any other error on one sample is recorded as that
    sample's failure and the run goes on.
    """

    config.validate()
    if prompts is None:
        if config.prompts_path is None:
            raise InputError("no prompts given")
        check_prompts_path(config.prompts_path)  # the file is read (streamed) once the settings are known
    elif config.limit is not None:
        prompts = prompts[: config.limit]
    from tokview.batch.landing_process import LandingChild

    child = LandingChild.for_new_store(store, ray=bool(config.ray))  # started now: its imports overlap ours
    try:
        planned, pool, remembered_kwargs = None, None, None
        if prompts is None:  # a fully stored run ends here, without loading the tokenizer
            from tokview.batch.resume import resume_shortcut

            shortcut = await unless_cancelled(
                resume_shortcut(config, store, on_progress, new_store=child is not None),
                cancel,
                "the servers were probed",
                discard=_close_probed,
            )
            if shortcut.finished is not None:
                return shortcut.finished
            store, planned, pool = shortcut.store, shortcut.planned, shortcut.pool
            remembered_kwargs = pool.probe_kwargs if pool is not None and not pool.names_only else None
            if child is not None and planned is not None and remembered_kwargs is not None:
                child.open_ahead()  # the servers have generated and work is left: the store opens as the tokenizer loads
        try:
            tokenizer, profile = config.tokenizer_and_profile()
            if pool is None or not pool.adopt(tokenizer, profile):
                if pool is not None:
                    await pool.aclose()
                pool = config.server_pool(tokenizer, profile)
                # ServerUnreachable propagates: exit code 2, nothing written; a cancel meanwhile: exit code 130
                await unless_cancelled(preload.probe(pool), cancel, "the servers were probed")
            elif cancel is not None and cancel.is_set():  # a Ctrl-C while the tokenizer loaded, the servers probed
                raise StartInterrupted("interrupted while the tokenizer loaded: nothing was written")
            if config.ray:  # before the run is recorded: a Ray that cannot be reached leaves no run row behind
                from tokview.batch.ray_shards import RayInterrupted, connect

                try:
                    await connect(config.ray, cancel)
                except RayInterrupted:
                    raise StartInterrupted("interrupted while Ray connected: nothing was written") from None
            return await _run(
                config,
                child or (store() if callable(store) else store),
                pool,
                prompts=prompts,
                planned=planned,
                tokenizer=tokenizer,
                profile=profile,
                on_progress=on_progress,
                cancel=cancel,
                live=live,
                on_landed=on_landed,
                remembered_kwargs=remembered_kwargs,
            )
        finally:
            if pool is not None:
                await pool.aclose()
    finally:
        if child is not None:
            await asyncio.get_running_loop().run_in_executor(None, child.close)


async def _close_probed(shortcut: Shortcut) -> None:
    """The resume shortcut's probed servers, closed when the run is interrupted before it takes them."""
    if shortcut.pool is not None:
        await shortcut.pool.aclose()


def _check_keep_all(config: BatchConfig, tokenizer: TokenizerAdapter, profile: ModelProfile) -> None:
    """`--history-reasoning all` on a template that never reads the key it sends is refused: the run would be one
    of its own, every prompt the same as `template`'s (kimi-k2.5, qwen3: no such kwarg; a GLM-4.5 profile over a
    template that reads `clear_thinking`)."""
    from tokview.batch.chains import keep_all_reasoning

    if config.history != "served" or config.history_reasoning != "all" or not tokenizer.chat_template:
        return
    [key] = keep_all_reasoning(profile)
    if key not in tokenizer.chat_template:
        raise InputError(
            f"--history-reasoning all sends {key}, which this chat template never reads (profile {profile.name}): "
            "every prompt would be the same as with template; give the profile whose template keeps all history "
            "reasoning (kimi-k2.6, glm-4.7) or leave it at template"
        )


async def _run(
    config: BatchConfig,
    store: Store | LandingChild,
    pool: ServerPool,
    *,
    prompts: list[PromptRow] | None,
    planned: WorkList | None,
    tokenizer: TokenizerAdapter,
    profile: ModelProfile,
    on_progress: Callable[[BatchProgress], None] | None,
    cancel: asyncio.Event | None,
    live: bool = False,
    on_landed: Callable[[int], None] | None = None,
    remembered_kwargs: dict[str, Any] | None = None,
) -> BatchSummary:
    """The run proper, on probed servers. `remembered_kwargs`: the template settings the resume shortcut probed
    with (None: it did not), remembered again when this run's probe used others."""
    from tokview.batch.identity import remember_identity
    from tokview.batch.landing_process import LandingChild
    from tokview.secrets import scrub

    _check_keep_all(config, tokenizer, profile)
    sent = {**profile.template_kwargs(False), **(config.chat_template_kwargs or {})}
    refusal = thinking_off_refusal(profile, tokenizer, sent) if config.thinking is False else None
    if refusal is not None:
        raise InputError(f"--no-thinking: {refusal}")
    identity = served_identity(pool, tokenizer, profile)
    sample_settings = config.sample_settings(identity)
    loop = asyncio.get_running_loop()
    if planned is not None and planned.key != settings_key(sample_settings):
        planned = None  # the resume shortcut's remembered identity no longer holds
    if planned is None or remembered_kwargs != pool.probe_kwargs:
        # A plan from the resume shortcut's remembered identity that still holds needs no new entry: the
        # tokenizer files are hashed once per run, not again here.
        remember_identity(config, identity, pool.probe_kwargs)  # lets the next resume skip loading the tokenizer
    if planned is None:
        if not isinstance(store, LandingChild):  # parts a killed or concurrent batch left count as stored
            await loop.run_in_executor(None, store.ingest)
        stored_prompts = None if isinstance(store, LandingChild) else store.stored_prompts_with
        planned = await loop.run_in_executor(
            None, plan_work, config, sample_settings, store.stored_ids_with, prompts, stored_prompts
        )
    work = planned
    queue = work.queue()  # streamed from the prompts file as the workers take it
    todo: Any = queue
    run_id = run_id_for(config, identity, work, None if isinstance(store, LandingChild) else store.reads)
    summary = BatchSummary(
        run_id=run_id,
        input=work.input,
        resumed=work.resumed,
        duplicates=work.duplicates,
        bad_rows=work.bad,
        servers=scrub(pool.server_info()),
    )
    if work.resumed and not isinstance(store, LandingChild):
        summary.resumed_from = stored_elsewhere(store, run_id, summary.servers)  # their kinds, as probed
    started = time.monotonic()
    skipped = work.resumed + work.duplicates + len(work.bad)
    tallies: list[Any] = []  # the writer(s) whose counts make up the progress line

    def snapshot() -> BatchProgress:
        p = BatchProgress(total=summary.input, skipped=skipped, elapsed_s=time.monotonic() - started)
        p.chain_stopped = work.chain_left
        p.retried, p.last_retry = pool.retried, pool.last_retry
        for t in tallies:
            p.retried += getattr(t, "retried", 0)  # a `--workers` child's, as of its last part
            p.last_retry = p.last_retry or getattr(t, "last_retry", None)
            p.ok += t.ok
            p.failed += t.failed
            p.flagged += t.flagged
            p.truncated += t.truncated
            p.output_tokens += t.output_tokens
            reasons = dict.copy(t.reasons)  # in C: a writer thread may be adding a reason meanwhile
            p.chain_stopped += sum(split_chain_stops(reasons)[1].values())
        return p

    def report() -> None:
        if on_progress is not None:
            on_progress(snapshot())

    report()
    if config.run and not todo and not isinstance(store, LandingChild):
        from tokview.batch.run_record import check_run_provenance

        # a name of the user's own with nothing left to do: refused for other settings as with work left (the
        # resume shortcut checks it the same way); said "skipped, already stored", exit 0, for another run's samples
        check_run_provenance(store, run_id, config.record_settings(identity))
    if todo:
        from tokview.batch.capture_loop import capture_all
        from tokview.batch.identity import special_tokens_record
        from tokview.batch.run_record import RunRecord
        from tokview.batch.workers import worker_count
        from tokview.batch.writer_thread import GroupWriter
        from tokview.store.errors import StoreFull, StoreHeld

        store.add_server_urls(config.servers)  # their user/password are masked in the stored bodies
        run = RunRecord(
            run_id=run_id,
            settings=config.record_settings(identity),  # with the history
            special=special_tokens_record(tokenizer),  # another special set stored for these ids: refused
            tokenizer_name=tokenizer.name,
            profile=profile.name,
            tokenizer_dir=str(tokenizer.source) if tokenizer.source else None,
            tokenizer_hash=tokenizer.fingerprint(),
            template_hash=tokenizer.template_hash(),
            server_info=summary.servers,
            source=str(config.prompts_path) if config.prompts_path else None,
            profile_def=profile_fields(profile),
        )
        if isinstance(store, LandingChild):
            store.begin_run(run)  # the child creates the store and records the run while the requests go out
        else:
            run.record(store, tokenizer.piece_text)

        if len(todo) > SLICED_SAMPLES:
            tokenizer.load_whole()  # in the background, as the first requests go out
        n = 1 if store.path == ":memory:" or config.ray else worker_count(config.workers, len(todo))
        # One `Lander` lands every process's parts, woken by each part written (see workers.py)
        from tokview.batch.workers import Lander, WorkFeed

        feed = WorkFeed(queue) if n > 1 else None
        intake = _Intake(queue)
        lander = Lander(
            store,
            every_s=LIVE_LANDING_S if live else LANDING_S,
            on_error=feed.close if feed is not None else intake.close,  # a full disk: nobody takes more work
            drained=(lambda: not feed) if feed is not None else (lambda: intake.drained),
            live=live,
            on_landed=on_landed,
        )
        writer = GroupWriter(
            store,
            profile=profile,
            tokenizer=tokenizer,
            run_id=run_id,
            ingest=False,
            on_commit=lambda _: lander.poke(),
            group_s=LIVE_GROUP_S if live else GROUP_S,
        )
        tallies.append(writer)
        groups: list[Any] = []  # the children, once spawned
        outcomes: list[str | None] = []
        try:
            if config.ray:  # the shards run as Ray tasks; this process lands what they hand back
                from tokview.batch.ray_shards import Tally, run_on_ray

                ray_tally = Tally()
                tallies.append(ray_tally)
                outcomes += await run_on_ray(
                    config, store, run_id=run_id, todo=queue, tally=ray_tally, cancel=cancel, report=report
                )
            elif feed is not None:
                spawn = _Spawn(
                    config,
                    children=n - 1,
                    db_path=store.path,
                    run_id=run_id,
                    lander=lander,
                    tallies=tallies,
                    made=groups,
                    recorded=store.wait_until_recorded if isinstance(store, LandingChild) else None,
                )
                outcomes += await _share_with_children(
                    config, pool, feed, spawn=spawn, writer=writer, cancel=cancel, report=report
                )
            else:
                outcomes.append(await capture_all(config, pool, intake, writer, cancel=cancel, report=report))
        finally:
            await _shut_down(loop, groups[0] if groups else None, writer, lander)
        if feed is not None and feed.error is not None:
            raise feed.error
        summary.interrupted = INTERRUPTED in outcomes
        summary.stopped = next((o for o in outcomes if o not in (None, INTERRUPTED)), None)
        for error in (writer.error, lander.error):
            if error is not None:
                if isinstance(error, StoreHeld):  # the last landing: every answer is written, and safe in parts
                    summary.stopped = f"{error}; every answer is written, and the next tokview command on it lands them"
                elif isinstance(error, StoreFull):
                    summary.stopped = str(error)
                else:
                    raise error
        reasons: Counter[str] = Counter()
        for t in tallies:
            reasons.update(t.reasons)
        others, summary.flagged_by_code = split_flagged(reasons)
        summary.failures_by_reason, summary.chain_stops = split_chain_stops(others)
        summary.chains_stopped = chains_stopped(others)
    p = snapshot()
    summary.ok, summary.failed, summary.skipped = p.ok, p.failed, p.skipped
    summary.flagged, summary.truncated, summary.output_tokens, summary.elapsed_s = (
        p.flagged,
        p.truncated,
        p.output_tokens,
        p.elapsed_s,
    )
    if work.chain_left:
        summary.chain_stops[EARLIER_STOP] = summary.chain_stops.get(EARLIER_STOP, 0) + work.chain_left
    summary.chain_stopped = sum(summary.chain_stops.values())
    summary.abandoned = summary.input - summary.ok - summary.failed - summary.skipped - summary.chain_stopped
    deaths = [t.died for t in tallies if getattr(t, "died", None)]
    if deaths and summary.abandoned and not summary.stopped and not summary.interrupted:
        summary.stopped = deaths.pop(0)  # it left samples for a resume: the run is not whole
    summary.notes += deaths
    summary.servers = scrub(pool.server_info())  # as the run left them: a server that died mid-run said healthy
    any_up = any(d.get("healthy") for d in summary.servers)
    summary.notes += [
        f"server {d.get('url')} was out of the pool at the end (last error: {d.get('last_error') or 'none'})"
        + ("; its requests went to the others" if any_up else "")
        for d in summary.servers
        if d.get("healthy") is False
    ]
    report()
    return summary


class _Intake:
    """A one-process run's work as `capture_all` takes it: the queue, closed at once by a landing error
    (a full disk), and `drained` once it is empty (a flag: the lander reads it from its own thread)."""

    def __init__(self, queue: TodoQueue) -> None:
        self.queue = queue
        self.closed = self.drained = False

    def close(self) -> None:
        self.closed = True

    def __len__(self) -> int:
        return 0 if self.closed else len(self.queue)

    def __bool__(self) -> bool:
        if self.closed or self.drained:
            return False
        self.drained = not self.queue
        return not self.drained

    def popleft(self) -> WorkItem | ChainItem:
        return self.queue.popleft()


class _Spawn:
    """The children of a `--workers` run, spawned once the parent's first requests are in flight.

    Why then and not before: a child's start-up (imports, tokenizer) is ~0.5 s of CPU; on two cores,
    spawned before the parent's own start-up it slowed the parent's first requests by as much, and a
    run's first answers are its critical path. Spawned from a thread, so the parent's event loop keeps
    sending meanwhile; each child's parts wake the lander through its counts."""

    def __init__(
        self,
        config: BatchConfig,
        *,
        children: int,
        db_path: str,
        run_id: str,
        lander: Lander,
        tallies: list[Any],
        made: list[WorkerGroup],
        recorded: Callable[[], None] | None = None,
    ) -> None:
        """`recorded`: blocks until the run is recorded in the store (a new store's landing child records it as
        the first requests go out); children write parts, which must never land for a run the store refused."""
        self.config, self.children, self.db_path, self.run_id = config, children, db_path, run_id
        self.lander, self.tallies, self.made, self.recorded = lander, tallies, made, recorded

    async def __call__(self, feed: WorkFeed) -> WorkerGroup | None:
        from tokview.batch.workers import WorkerGroup

        loop = asyncio.get_running_loop()
        if self.recorded is not None:
            await loop.run_in_executor(None, self.recorded)
        group = await loop.run_in_executor(None, WorkerGroup.spawn, self.config, self.children)
        if group is not None:
            self.made.append(group)
            group.on_counts = self.lander.poke
            self.tallies.extend(group.start(self.db_path, self.run_id, feed, min(self.children, len(group.procs))))
        return group


async def _shut_down(
    loop: asyncio.AbstractEventLoop, group: WorkerGroup | None, writer: GroupWriter, lander: Lander
) -> None:
    """End a run's processes and threads, landing every part written: the children report their end
    (or are stopped), the parts already written land while the writer analyses its last answers
    (`flush`), and the last landing happens the moment the writer has written its last group."""
    if group is not None and not group.all_done():
        group.cancel()
    if group is not None:
        await loop.run_in_executor(None, group.close)
    lander.flush()
    await loop.run_in_executor(None, writer.close)
    await loop.run_in_executor(None, lander.close)
    if group is not None:
        await loop.run_in_executor(None, group.reap)


async def _share_with_children(
    config: BatchConfig,
    pool: ServerPool,
    feed: WorkFeed,
    *,
    spawn: _Spawn,
    writer: GroupWriter,
    cancel: asyncio.Event | None,
    report: Callable[[], None],
) -> list[str | None]:
    """This process's part of a `--workers` run: capture from the feed, spawn the children once its
    first request is in flight (its bytes in the socket: `pool.generation_sent`), then capture beside
    them until every child is done, taking up work a child gave back (it died or was stopped alone),
    and pass a cancel or a stop on to them."""
    from tokview.batch.capture_loop import capture_all
    from tokview.batch.workers import FeedTodo

    todo = FeedTodo(feed)
    outcomes: list[str | None] = []
    group: WorkerGroup | None = None
    cancelled = stopped = False

    def settle(outcome: str | None) -> None:
        nonlocal cancelled, stopped
        if outcome is None:
            return
        outcomes.append(outcome)
        if outcome == INTERRUPTED:
            cancelled = True
            if group is not None:
                group.cancel()
        else:  # a full disk, too many failures: this process takes no more work, nor do the others
            stopped = True
            feed.close()

    capture = asyncio.create_task(capture_all(config, pool, todo, writer, cancel=cancel, report=report))
    sent = asyncio.create_task(pool.generation_sent.wait())
    try:
        await asyncio.wait({capture, sent}, return_when=asyncio.FIRST_COMPLETED)
        if not capture.done() and feed:  # a request is in flight and work is left to share
            group = await spawn(feed)
        settle(await capture)
    finally:
        sent.cancel()
        if not capture.done():
            capture.cancel()
            await asyncio.gather(capture, return_exceptions=True)
    if group is None:
        return outcomes
    cancelled_at = time.monotonic() if cancelled else None
    while not group.all_done() or (not cancelled and not stopped and todo):
        if cancel is not None and cancel.is_set() and not cancelled:
            cancelled, cancelled_at = True, time.monotonic()
            group.cancel()
        if not cancelled and not stopped and todo:
            settle(await capture_all(config, pool, todo, writer, cancel=cancel, report=report))
            continue
        await asyncio.sleep(0.02)
        report()
    if not cancelled and cancel is not None and cancel.is_set():  # set as the last child ended: before the close
        cancelled, cancelled_at = True, time.monotonic()
    await asyncio.get_running_loop().run_in_executor(None, group.close)
    if cancelled_at is not None:
        group.stopped_with_the_run(cancelled_at)
    return [t.error or t.outcome for t in group.tallies] + outcomes + ([INTERRUPTED] if cancelled else [])
