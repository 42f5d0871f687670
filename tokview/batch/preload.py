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
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

_started: dict[tuple[str, str | None, bool], Future] = {}
_lock = threading.Lock()


def _key(config: Any) -> tuple[str, str | None, bool]:
    return (str(config.tokenizer_dir), config.profile, bool(config.trust_remote_code))


def start(config: Any) -> Future | None:
    """Begin loading the tokenizer and profile `config` names (nothing when it carries loaded ones).

    Returns the load's future, which the caller may keep: whoever holds it last frees the tokenizer,
    and freeing a 160k-entry Rust vocabulary takes ~25 ms that `tokview batch` would rather leave to
    the end of the process (which it ends without tearing the heap down: `cli.main`)."""
    if config.tokenizer is not None or config.model_profile is not None:
        return None
    key = _key(config)
    future: Future = Future()
    with _lock:
        if key in _started:
            return _started[key]
        _started[key] = future

    def load() -> None:
        try:
            future.set_result(config.load_tokenizer_and_profile())
        except BaseException as exc:  # handed to whoever takes it: the same error, raised in the run
            future.set_exception(exc)

    threading.Thread(target=load, name="tokview-tokenizer", daemon=True).start()
    return future


def take(config: Any) -> Future | None:
    """The load `start` began for this config (once), or None."""
    with _lock:
        return _started.pop(_key(config), None)


def discard(config: Any) -> None:
    """Forget an untaken load, so a later run in this process loads the folder afresh."""
    take(config)
