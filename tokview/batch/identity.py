"""The tokenizer's vocabulary fingerprint, remembered by the hash of its files.

Sample ids include the vocabulary fingerprint (see `served_identity`), and computing it sorts and
hashes the whole id → token table: ~0.6 s for Kimi's 163,840 entries, paid before the first
request of every run. The files' own hash (`fingerprint()`, a few ms) decides whether a stored
answer still holds, so an edited tokenizer folder is fingerprinted again.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokview.core.file_digest import file_digest
from tokview.core.json_cache import cache_path, read_json_cache, write_json_cache

if TYPE_CHECKING:
    from collections.abc import Callable

    from tokview.batch.config import BatchConfig
    from tokview.core.tokenizer import TokenizerAdapter
    from tokview.store import Store


def cache_file() -> Path | None:
    return cache_path("vocab-fingerprints.json")


def vocab_fingerprint(tokenizer: TokenizerAdapter) -> str:
    """`tokenizer.vocab_fingerprint()`, read from the cache when the tokenizer files are unchanged."""
    if getattr(tokenizer, "source", None) is None:
        return tokenizer.vocab_fingerprint()
    key = tokenizer.fingerprint()
    known = read_json_cache(cache_file())
    cached = known.get(key)
    if isinstance(cached, str):
        return cached
    value = tokenizer.vocab_fingerprint()
    write_json_cache(cache_file(), {**known, key: value})  # a read-only home: computed each time
    return value


IDENTITY_SUFFIXES = (".json", ".jinja", ".model", ".txt", ".tiktoken", ".py", ".toml")
"""Files of a tokenizer folder that can change its vocabulary or the detected profile (never weights)."""


def identities_file() -> Path | None:
    return cache_path("run-identities.json")


def identity_key(config: BatchConfig) -> str | None:
    """A hash of everything that decides a batch's tokenizer fingerprint and profile name, read from files
    without loading the tokenizer: the folder's tokenizer files, `--profile` (and its .toml), the remote-code
    flag and tokview's version. None when the caller passed already loaded objects (the app)."""
    if config.tokenizer is not None or config.model_profile is not None:
        return None
    import hashlib

    from tokview import __version__
    from tokview.core import profiles

    directory = config.tokenizer_dir
    if directory is None:
        directory = profiles.default_tokenizer_dir(config.profile)
    try:
        resolved = Path(directory).resolve()
    except (RuntimeError, OSError):  # a symlink loop: no shortcut; loading the folder says what is wrong in one line
        return None
    h = hashlib.sha256()
    h.update(f"{__version__}\0{resolved}\0{config.trust_remote_code}\0{config.profile}\0".encode())
    try:
        h.update(Path(profiles.__file__).read_bytes())  # how a profile is detected
        if config.profile and Path(config.profile).is_file():
            h.update(Path(config.profile).read_bytes())
        for entry in sorted(os.scandir(directory), key=lambda e: e.name):
            if entry.name.endswith(IDENTITY_SUFFIXES) and entry.is_file():
                h.update(f"\0{entry.name}\0".encode())
                h.update(file_digest(entry.path))  # remembered: the verdict and slice cache hash them too
    except OSError:
        return None  # the ordinary path says what is wrong with the folder
    return h.hexdigest()[:32]


def known_identity(config: BatchConfig) -> dict[str, str] | None:
    """{"tokenizer": vocabulary fingerprint, "profile": name} remembered from an earlier run with the same
    tokenizer files and --profile, else None: what lets a resume skip loading the tokenizer."""
    known = known_run(config)
    return None if known is None else known[0]


def known_run(config: BatchConfig) -> tuple[dict[str, str], dict[str, Any] | None] | None:
    """`known_identity`, and the chat_template_kwargs that run's probe rendered with (None: not remembered), with
    which a resume probes the servers in full while the tokenizer loads (`ServerPool.adopt`)."""
    key = identity_key(config)
    if key is None:
        return None
    known = read_json_cache(identities_file()).get(key)
    if isinstance(known, dict) and isinstance(known.get("tokenizer"), str) and isinstance(known.get("profile"), str):
        probe_kwargs = known.get("probe_kwargs")
        return (
            {"tokenizer": known["tokenizer"], "profile": known["profile"]},
            probe_kwargs if isinstance(probe_kwargs, dict) else None,
        )
    return None


def remember_identity(
    config: BatchConfig, identity: dict[str, Any], probe_kwargs: dict[str, Any] | None = None
) -> None:
    """Note the tokenizer fingerprint and profile name a run computed (the tokenizer loaded), for `known_identity`,
    and the chat_template_kwargs its probe rendered with, for `known_run`."""
    key = identity_key(config)
    if key is None or not isinstance(identity.get("tokenizer"), str) or not isinstance(identity.get("profile"), str):
        return
    known = read_json_cache(identities_file())
    entry: dict[str, Any] = {"tokenizer": identity["tokenizer"], "profile": identity["profile"]}
    if probe_kwargs is not None:
        entry["probe_kwargs"] = probe_kwargs
    if known.get(key) != entry:
        write_json_cache(identities_file(), {**known, key: entry})  # a read-only home: resumes load the tokenizer


def special_tokens_record(tokenizer: TokenizerAdapter) -> dict[str, str]:
    """What a run's stored settings add about its tokenizer's special ids (`store.merge.SPECIAL_KEY`).

    Never part of the sample settings: sample ids hold only the vocabulary fingerprint, so adding this
    changes no stored id. Two folders alike but for `</think>`'s special flag record different values."""
    from tokview.store.merge import SPECIAL_IDS_KEY, SPECIAL_KEY, id_ranges

    ids = (i for i in tokenizer.special_ids | tokenizer.added_ids if tokenizer.is_special(i))
    return {SPECIAL_KEY: tokenizer.special_fingerprint(), SPECIAL_IDS_KEY: id_ranges(ids)}


def refuse_other_special_tokens(
    store: Store,
    settings: dict[str, Any],
    mine: dict[str, str],
    tokenizer_name: str,
    piece: Callable[[int], str] | None = None,
) -> None:
    """InputError, in one line naming the ids, when a stored run of the same model, vocabulary and profile
    recorded other special ids than `mine`: those runs' sample ids are this run's, so a resume would finish their
    prompts with a tokenizer that decodes and splits reasoning otherwise. Runs recorded before the record existed
    are not compared (they resume as before). `piece` adds each id's text where a tokenizer is at hand (a landing
    child has none)."""
    from tokview.batch.inputs import InputError
    from tokview.store.merge import (
        SPECIAL_IDS_KEY,
        SPECIAL_KEY,
        identity_of,
        special_difference,
        stored_special_sets,
    )

    known = stored_special_sets(store).get(identity_of(settings), {})
    other = sorted(set(known) - {mine[SPECIAL_KEY]}) if known else []
    if other:
        difference = special_difference(
            known[other[0]], mine[SPECIAL_IDS_KEY], "the stored runs", "this tokenizer", piece
        )
        raise InputError(
            f"this store's samples of the same model, vocabulary and profile were made with a tokenizer whose "
            f"special tokens differ from {tokenizer_name}'s ({difference}): resuming would mix the two; use that "
            "tokenizer or another --db"
        )
