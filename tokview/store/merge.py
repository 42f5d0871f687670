"""Which store made elsewhere (a Slurm array task, another box) may land in this one, and what tells them apart.

Idempotent by sample id: merging the same file twice adds nothing. A store of another model,
tokenizer vocabulary or profile is refused in one line (its samples would mix into the training
set unnoticed), and so is one whose runs recorded other special ids for the same vocabulary (a
`</think>` special in one folder and not the other: same sample ids, another decoding). The rows
themselves land in `landing.py`: the source attached read-only, everything in one transaction.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokview.core.record import changed_settings
from tokview.errors import TokviewError

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

    from tokview.store.connection import Database

IDENTITY_KEYS = ("model", "tokenizer", "profile")
SPECIAL_KEY, SPECIAL_IDS_KEY = "tokenizer_special", "tokenizer_special_ids"
"""Keys a run's stored settings add beside its sample settings (never in sample ids): the fingerprint of
the tokenizer's special id set and the set itself as ranges ("0-2,163584-163605"), to name what differs."""
SHOWN_IDS = 8


class MergeRefused(TokviewError):
    """The source store cannot be merged (not a tokview store, or made with another model/tokenizer/profile)."""

    title = "merge refused"


def runs_with_data_sql(schema: str) -> str:
    """(settings, profile) of every run in `schema` that has samples or failures (a run of another model
    whose every request failed would otherwise land its failures unchecked)."""
    return (
        f"SELECT r.settings, r.profile FROM {schema}.runs r WHERE EXISTS "
        f"(SELECT 1 FROM {schema}.samples s WHERE s.run_id = r.run_id) OR EXISTS "
        f"(SELECT 1 FROM {schema}.failures f WHERE f.run_id = r.run_id)"
    )


def _settings(text: str | None) -> dict[str, Any]:
    try:
        data = json.loads(text or "{}")
    except (TypeError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def identity_of(settings: dict[str, Any], profile: str | None = None) -> tuple[Any, ...]:
    """(model, tokenizer vocabulary, profile) of a run's settings: what decides "the same data"."""
    return (settings.get("model"), settings.get("tokenizer"), settings.get("profile") or profile)


def _unknown(identity: tuple[Any, ...]) -> bool:
    """A run that recorded neither model nor tokenizer (a proxy run before they were recorded)."""
    return identity[:2] == (None, None)


def _belongs(identity: tuple[Any, ...], ours: set[tuple[Any, ...]]) -> bool:
    """A source identity the target takes: one the target holds; with only unknown runs of its profile there (old
    proxy runs), any of that profile (the source's own mix is checked apart); an unknown one beside runs of its
    profile."""
    known = {o for o in ours if not _unknown(o)}
    if not _unknown(identity) and known:
        return identity in known
    return any(not conflicting(identity, o) for o in ours)


def conflicting(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    """Two identities of different data. A run that recorded neither model nor tokenizer (a `tokview proxy` run
    before proxy runs recorded them) is known by its profile alone: compared by that, so a store holding old and new
    proxy runs, or an old proxy store beside a new one, still merges."""
    if _unknown(a) or _unknown(b):
        return bool(a[2] != b[2])
    return a != b


def identities(conn: DuckDBPyConnection, schema: str) -> set[tuple[Any, ...]]:
    """(model, tokenizer vocabulary, profile) of every run in a store that has samples or failures."""
    return {identity_of(_settings(s), p) for s, p in conn.execute(runs_with_data_sql(schema)).fetchall()}


def special_sets(rows: list[tuple[Any, ...]]) -> dict[tuple[Any, ...], dict[str, str]]:
    """identity → {special fingerprint: its id ranges} of the `runs_with_data_sql` rows that recorded one
    (runs written before the record existed add nothing, so they are compared as before)."""
    out: dict[tuple[Any, ...], dict[str, str]] = {}
    for text, profile in rows:
        data = _settings(text)
        if isinstance(data.get(SPECIAL_KEY), str):
            ranges = data.get(SPECIAL_IDS_KEY)
            out.setdefault(identity_of(data, profile), {})[data[SPECIAL_KEY]] = (
                ranges if isinstance(ranges, str) else ""
            )
    return out


def stored_special_sets(store: Database) -> dict[tuple[Any, ...], dict[str, str]]:
    """`special_sets` of an open Store's runs (what a resume compares its tokenizer with)."""
    return special_sets(store.query(runs_with_data_sql("main")))


def id_ranges(ids: Iterable[int]) -> str:
    """Sorted ids as "a-b,c" (Kimi's 256 special ids are two ranges, not 256 numbers in every run row)."""
    spans: list[list[int]] = []
    for i in sorted(set(ids)):
        if spans and spans[-1][1] == i - 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in spans)


def ids_of_ranges(text: str) -> set[int]:
    """The ids of an `id_ranges` text; a malformed part (hand-edited) is skipped."""
    out: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        try:
            out.update(range(int(first), int(last or first) + 1))
        except ValueError:
            continue
    return out


def special_difference(
    ranges_a: str, ranges_b: str, name_a: str, name_b: str, piece: Callable[[int], str] | None = None
) -> str:
    """ "163606, 163607 special only in A; 5 only in B": the ids whose special flag differs, at most
    SHOWN_IDS of each side; `piece(id)` adds the token's text where a tokenizer is at hand."""
    a, b = ids_of_ranges(ranges_a), ids_of_ranges(ranges_b)
    parts = []
    for ids, where in ((a - b, name_a), (b - a, name_b)):
        if ids:
            shown = [f"{i} {piece(i)}" if piece else str(i) for i in sorted(ids)[:SHOWN_IDS]]
            more = f" and {len(ids) - SHOWN_IDS} more" if len(ids) > SHOWN_IDS else ""
            parts.append(f"{', '.join(shown)}{more} special only in {where}")
    return "; ".join(parts) or "the recorded special id sets differ"


def _check_special_tokens(conn: DuckDBPyConnection, source: Path, target_name: str) -> None:
    """Refuse a source whose runs recorded other special ids than the target's runs of the same model,
    vocabulary and profile (their sample ids are the same, their decoding and reasoning split are not)."""
    theirs = special_sets(conn.execute(runs_with_data_sql("src")).fetchall())
    ours = special_sets(conn.execute(runs_with_data_sql("main")).fetchall())
    for identity, sets in sorted(theirs.items(), key=str):
        mine = ours.get(identity, {})
        other = sorted(set(sets) - set(mine))
        if mine and other:
            ours_ranges = mine[sorted(mine)[0]]
            raise MergeRefused(
                f"{source} holds samples or failures of {_describe(identity)} made with other special tokens "
                f"than {target_name} ({special_difference(ours_ranges, sets[other[0]], target_name, str(source))}): "
                "merge refused"
            )
        if not mine and len(sets) > 1:
            a, b = sorted(sets)[:2]
            raise MergeRefused(
                f"{source} mixes runs of {_describe(identity)} made with other special tokens "
                f"({special_difference(sets[a], sets[b], 'one', 'the other')}): merge refused"
            )


def shared_columns(conn: DuckDBPyConnection, table: str) -> list[str]:
    """The columns of `table` both stores have, in the source's order (a source may be of an older schema)."""
    return [
        r[0]
        for r in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_catalog = 'src' AND "
            "table_name = ? AND column_name IN (SELECT column_name FROM information_schema.columns "
            "WHERE table_catalog = current_database() AND table_schema = 'main' AND table_name = ?) "
            "ORDER BY ordinal_position",
            [table, table],
        ).fetchall()
    ]


def _describe(identity: tuple[Any, ...]) -> str:
    """Every key, an unknown one too: a shard whose server never answered its probe (a refused key) holds failures
    of model unknown, and leaving that out read as two equal identities side by side."""
    if all(v is None for v in identity):
        return "unknown identity"
    return ", ".join(f"{k} {'unknown' if v is None else v}" for k, v in zip(IDENTITY_KEYS, identity))


def refuse_unmergeable(conn: DuckDBPyConnection, source: Path, target_name: str) -> set[str]:
    """MergeRefused unless the attached `src` is a tokview store this tokview reads, of the target's model,
    tokenizer, profile and special tokens; returns the source's tables (an older one lacks some)."""
    # here: the schema imports DuckDB, the special-id helpers do not
    from tokview.store.schema import LATEST_VERSION, SchemaError, version_in

    tables = {
        r[0]
        for r in conn.execute("SELECT table_name FROM information_schema.tables WHERE table_catalog = 'src'").fetchall()
    }
    if not {"schema_version", "samples", "runs"} <= tables:
        raise MergeRefused(f"{source} is not a tokview store")
    try:
        version = version_in(conn, "src.schema_version")
    except SchemaError:  # another tool's table of that name: text, no version column, an infinity
        raise MergeRefused(
            f"{source} is not a tokview store (its schema_version holds no version tokview wrote)"
        ) from None
    if version > LATEST_VERSION:  # its rows may hold what this tokview cannot read (see schema.py)
        raise MergeRefused(
            f"{source} was written by a newer tokview (schema version {version}; this one understands "
            f"{LATEST_VERSION}): upgrade tokview to merge it"
        )
    theirs, ours = identities(conn, "src"), identities(conn, "main")
    if ours:
        foreign = sorted((t for t in theirs if not _belongs(t, ours)), key=str)
        if foreign:
            # a run of a known tokenizer but no model: its servers never answered the probe (a refused key)
            keyless = foreign[0][0] is None and not _unknown(foreign[0])
            hint = (
                " (no server answered its run's probe: leave that store out or run its shard again)" if keyless else ""
            )
            raise MergeRefused(
                f"{source} holds samples or failures of {_describe(foreign[0])}, {target_name} holds "
                f"{_describe(sorted(ours, key=str)[0])}{hint}: merge refused"
            )
    known_ours = {o for o in ours if not _unknown(o)}
    if not known_ours and any(conflicting(a, b) for a in theirs for b in theirs):
        raise MergeRefused(f"{source} mixes {len(theirs)} models/tokenizers/profiles: merge refused")
    _check_special_tokens(conn, source, target_name)
    _check_shared_runs(conn, source, target_name)
    return tables


def _check_shared_runs(conn: DuckDBPyConnection, source: Path, target_name: str) -> None:
    """MergeRefused when a run both stores name was made with other settings in each (`batch --run x` in two stores,
    two max_new_tokens): the merge kept the target's record and copied the source's samples under it, so an export of
    the run said one setting of samples made with another. Shards of one run share every setting."""
    rows = conn.execute(
        "SELECT r.run_id, m.settings, r.settings, m.template_hash, r.template_hash FROM src.runs r "
        "JOIN main.runs m ON m.run_id = r.run_id"
    ).fetchall()
    for run_id, ours_text, theirs_text, our_template, their_template in rows:
        ours, theirs = _settings(ours_text), _settings(theirs_text)
        said = [f"{k}={theirs.get(k)!r} vs {ours.get(k)!r}" for k in changed_settings(ours, theirs)]
        rendered_here = ours.get("mode") in ("raw", "dual")  # chat: the server renders, as a resume allows (run_record)
        if not said and rendered_here and our_template and their_template and our_template != their_template:
            said = [f"chat template {their_template} vs {our_template}"]
        if said:
            raise MergeRefused(
                f"run {run_id} was made with other settings in {source} than in {target_name} ({'; '.join(said)}): "
                "merge refused (give one of the runs another --run name)"
            )
