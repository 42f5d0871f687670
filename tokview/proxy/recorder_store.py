"""The recorder's store side, opened where the recorder runs (this process or its recorder child).

Apart from `serve` so the recorder child (`recorder_process`) can open it without importing the server
that spawned it (the two imported each other)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tokview.proxy.recorder import Recorder

if TYPE_CHECKING:
    from tokview.proxy.app import Upstream
    from tokview.proxy.serve import ProxyConfig


def open_recorder_here(
    config: ProxyConfig, upstreams: list[Upstream], tok: Any, say: Callable[[str], None] | None
) -> Recorder:
    """The store, the run row, the recorder and the sessions put back from the store, in this process."""
    from tokview.core.profiles import profile_fields
    from tokview.store.store import Store

    store = Store(config.db or "", server_urls=config.servers, lock_timeout=config.lock_timeout, on_wait=say)
    store.put_run(
        config.run_id,
        settings={"mode": "proxy", "listen": config.listen},
        profile=config.profile.name if config.profile is not None else None,
        tokenizer_dir=str(tok.source) if tok is not None and getattr(tok, "source", None) else None,
        tokenizer_hash=tok.fingerprint() if tok is not None else None,
        template_hash=tok.template_hash() if tok is not None else None,
        server_info=[{"url": u.url, "kind": u.kind, **u.stamp} for u in upstreams],
        source="tokview proxy",
        profile_def=profile_fields(config.profile) if config.profile is not None else None,
    )
    recorder = Recorder(store, profile=config.profile, tokenizer=tok, run_id=config.run_id, say=say)
    from tokview.proxy.sessions import RESTORE_SQL, restore

    restore(recorder.sessions, store.query(RESTORE_SQL, [recorder.sessions.max_sessions]))
    return recorder
