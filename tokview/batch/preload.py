"""The tokenizer loaded on a background thread while `tokview batch` starts up.

Loading the tokenizer (~0.1–0.15 s for a 160k-entry vocabulary) and the rest of the start-up
(importing the capture machinery and DuckDB, probing the servers, opening the store: ~0.15 s) do
not depend on each other. `tokenizers`' `from_file` holds the GIL for its whole parse (measured: a
second thread makes no progress meanwhile), and so does DuckDB's `connect` (measured against it), so
what overlaps is only the start-up's waiting: the server answering the probes, file reads and
hashing. `start` is called by the CLI as soon as the flags are parsed; `BatchConfig.
tokenizer_and_profile` takes the result (or the loading error, raised where it always was). A run
that ends without needing the tokenizer (a fully stored resume) leaves the load behind: it runs on
the other core and dies with the process.

The load itself waits for `release`: the runner releases it the moment its first probe request is
going out, and taking the load releases it too. Begun at once, its GIL-holding parse ran before the
first request and put it ~0.1 s later (start-up to the first request was 0.30-0.39 s, goal < 0.3);
released with the probe, it overlaps the probe's waiting on the servers instead.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokview.batch.config import BatchConfig
    from tokview.core.profiles import ModelProfile
    from tokview.core.tokenizer import TokenizerAdapter
    from tokview.servers import ServerPool

    Loaded = Future[tuple[TokenizerAdapter, ModelProfile]]
    """What a load's future holds: what `BatchConfig.load_tokenizer_and_profile` returned."""

_started: dict[tuple[str, str | None, bool], tuple[Loaded, threading.Event]] = {}
"""Each load begun and not yet taken: its future and its gate (set: the load may run)."""
_lock = threading.Lock()


def _key(config: BatchConfig) -> tuple[str, str | None, bool]:
    return (str(config.tokenizer_dir), config.profile, bool(config.trust_remote_code))


def start(config: BatchConfig) -> Loaded | None:
    """Begin loading the tokenizer and profile `config` names (nothing when it carries loaded ones).

    Returns the load's future, which the caller may keep: whoever holds it last frees the tokenizer,
    and freeing a 160k-entry Rust vocabulary takes ~25 ms that `tokview batch` would rather leave to
    the end of the process (which it ends without tearing the heap down: `cli.main`)."""
    if config.tokenizer is not None or config.model_profile is not None:
        return None
    key = _key(config)
    future: Loaded = Future()
    gate = threading.Event()
    with _lock:
        if key in _started:
            return _started[key][0]
        _started[key] = (future, gate)

    def load() -> None:
        gate.wait()
        if not future.set_running_or_notify_cancel():  # discarded before it was released
            return
        if config.tokenizer_dir is not None:  # the run record's file hash, on the other core meanwhile
            from tokview.core.tokenizer import start_files_fingerprint

            start_files_fingerprint(config.tokenizer_dir)
        try:
            future.set_result(config.load_tokenizer_and_profile())
        except BaseException as exc:  # handed to whoever takes it: the same error, raised in the run
            future.set_exception(exc)

    threading.Thread(target=load, name="tokview-tokenizer", daemon=True).start()
    return future


def release() -> None:
    """Let every load `start` began run: the run's first request is out."""
    with _lock:
        for _, gate in _started.values():
            gate.set()


PROBE_FIRST_TURNS = 8
"""Event-loop turns the probe is given before the loads are released: its first request is written in
the 6th (connect in the 2nd, measured on loopback); a few more cost microseconds."""


async def probe(pool: ServerPool, *, release_loads: bool = True) -> None:
    """`pool.start()`, releasing the loads `start` began once the probe's first request is written: the
    tokenizer's parse then overlaps the probe's waiting on the servers instead of coming before it.

    `release_loads=False` (a resume of a store that exists, which may find nothing left to do): the loads stay
    held until taken, so a resume that needs no tokenizer never pays its parse (which holds the GIL the plan's
    reading of the stored ids needs: 100,000 stored samples, nothing to do: 0.62-0.76 s of CPU and 123 MB held,
    0.88-0.90 s and 170 MB released)."""
    probing = asyncio.ensure_future(pool.start())
    try:
        for _ in range(PROBE_FIRST_TURNS):
            if probing.done():
                break
            await asyncio.sleep(0)
        if release_loads:
            release()
        await probing
    finally:
        if release_loads:
            release()
        if not probing.done():  # cancelled (Ctrl-C) before the probe ended: it ends with us
            probing.cancel()


def take(config: BatchConfig) -> Loaded | None:
    """The load `start` began for this config (once), released now if it was not yet, or None."""
    with _lock:
        started = _started.pop(_key(config), None)
    if started is None:
        return None
    future, gate = started
    gate.set()
    return future


def discard(config: BatchConfig) -> None:
    """Forget an untaken load, so a later run in this process loads the folder afresh; one not yet
    released is called off (its thread ends without loading)."""
    with _lock:
        started = _started.pop(_key(config), None)
    if started is not None:
        future, gate = started
        future.cancel()
        gate.set()
