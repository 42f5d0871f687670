"""The recorder's store side, opened where the recorder runs (this process or its recorder child).

Apart from `serve` so the recorder child (`recorder_process`) can open it without importing the server
that spawned it (the two imported each other)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tokview.proxy.late_store import LateStore
from tokview.proxy.recorder import Recorder

if TYPE_CHECKING:
    from tokview.core.tokenizer import TokenizerAdapter
    from tokview.proxy.app import Upstream
    from tokview.proxy.serve import ProxyConfig


def open_recorder_here(
    config: ProxyConfig,
    upstreams: list[Upstream],
    tok: TokenizerAdapter | None,
    say: Callable[[str], None] | None,
    *,
    threaded: bool = True,
) -> Recorder:
    """The store, the run row, the recorder and the sessions put back from the store, in this process.
    `threaded`: see `Recorder` (False in the recorder process, which records on its main thread)."""
    from tokview.core.profiles import profile_fields
    from tokview.errors import UserError
    from tokview.store.store import Store

    if config.profile is None:  # `serve.build` resolves one whenever the proxy records
        raise UserError(
            "the proxy records with a model profile: give --profile (or a tokenizer it can detect one from)"
        )
    # closed as each landing ends (linger 0): its checkpoint, which grows with the store, is then part of what the
    # landing took, which spaces the next one (`Recorder._landed`); it used to run 0.2 s later on a timer thread
    recorders: list[Recorder] = []

    def waiting(line: str) -> None:
        """The store's "waiting for STORE: in use by …", named as the proxy's other lines; quiet once the recorder
        has said NOT LANDING (each landing tried again said it again, every 10 s) until it lands again."""
        if say is not None and not (recorders and recorders[-1].not_landing):
            say(f"tokview proxy: {line}")

    from tokview.store.errors import StoreHeld

    profile = config.profile  # known not None here, also inside `recorder_of`

    run_fields = {
        "settings": {"mode": "proxy", "listen": config.listen, **_identity(config, tok, upstreams)},
        "profile": profile.name,
        "tokenizer_dir": str(tok.source) if tok is not None and getattr(tok, "source", None) else None,
        "tokenizer_hash": tok.fingerprint() if tok is not None else None,
        "template_hash": tok.template_hash() if tok is not None else None,
        "server_info": [{"url": u.url, "kind": u.kind, **u.stamp} for u in upstreams],
        "source": "tokview proxy",
        "profile_def": profile_fields(profile),
    }

    def opened() -> Store:
        store = Store(
            config.db or "",
            server_urls=config.servers,
            lock_timeout=config.lock_timeout,
            on_wait=None if say is None else waiting,
            linger=0,
        )
        store.put_run(config.run_id, **run_fields)  # type: ignore[arg-type]  # the fields put_run takes
        return store

    try:
        store = opened()
    except StoreHeld as exc:  # a notebook's connection kept the proxy from starting at all: it starts, lands later
        from tokview.store.parts import parts_dir
        from tokview.store.run_files import write_run_file

        # kept beside the parts: still held when the proxy stops, the next command records the run with its answers
        write_run_file(parts_dir(config.db or ""), config.run_id, run_fields)
        late = LateStore(config.db or "", config.servers, opened)
        recorder = Recorder(late, profile=profile, tokenizer=tok, run_id=config.run_id, say=say, threaded=threaded)  # type: ignore[arg-type]  # a Store's recording side
        recorders.append(recorder)
        recorder.held_at_start(exc)
        if say is not None:
            say(
                "tokview proxy: started without the store: conversations of earlier runs are not continued (their "
                "next turns start sessions of their own), and a killed proxy's leftover answers wait for the next start."
            )
        return recorder
    from tokview.proxy.sessions import LAST_NUMBER_SQL, restore_sessions
    from tokview.proxy.spool_folder import record_leftovers

    def recorder_of(run_id: str) -> Recorder:
        recorder = Recorder(store, profile=profile, tokenizer=tok, run_id=run_id, say=say, threaded=threaded)
        recorders.append(recorder)
        restore_sessions(recorder.sessions, store)
        recorder.keys_landed(recorder.sessions.whole_rows())  # restored rows stored whole, keys among them
        recorder.sessions.number_after(store.query(LAST_NUMBER_SQL, [f"proxy:{run_id}:s"])[0][0])
        return recorder

    record_leftovers(config.db or "", recorder_of, say or (lambda line: None))  # before its sessions are read
    return recorder_of(config.run_id)


def _identity(config: ProxyConfig, tok: TokenizerAdapter | None, upstreams: list[Upstream]) -> dict[str, Any]:
    """What `tokview merge` compares, as batch records it: the served model (when every upstream names the same
    one), the tokenizer's vocabulary fingerprint and special ids, the profile. Without them a proxy store could be
    merged with no batch store of its own model, and with any proxy store of another tokenizer."""
    from tokview.batch.identity import special_tokens_record, vocab_fingerprint

    models = {u.stamp.get("model") for u in upstreams if u.down is None}  # one down at start named none
    out: dict[str, Any] = {"model": models.pop()} if len(models) == 1 and None not in models else {}
    if tok is not None:
        out |= {"tokenizer": vocab_fingerprint(tok), **special_tokens_record(tok)}
    if config.profile is not None:
        out["profile"] = config.profile.name
    return out
