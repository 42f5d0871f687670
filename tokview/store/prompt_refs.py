"""An agent turn's prompt ids stored as the ids past an earlier turn's: `prompt_from` names that turn's sample,
`prompt_from_len` how many of its ids (its prompt's, then its output's) begin this prompt, and `prompt_ids` holds
the rest.

Why: an agent harness sends its whole conversation with every request, so its prompts' ids, stored whole, grow
with the square of the session's length (100 turns of a 45,000-id context: 28 MB of ids for 2 MB of new ones),
and landing them cost the proxy's recorder most of its time on long contexts: an agent's row of 45,000 prompt ids
took 6.4 of the 12.9 ms of CPU its landing and checkpoint cost (24 rows landed six at a time), and DuckDB's
checkpoint rewrites every row of the table's last row group at each landing.

Only `tokview proxy` writes such rows (`proxy.sessions` decides, `proxy.recorder` marks the part line). The turn a
row refers to is always stored whole (a "key" turn: one join puts any prompt back), in the same part or an earlier
one (it was recorded first). Every reader of prompt ids puts them back: `whole_prompts` for rows read into Python
(`Store.load_sample`, `rows_for`, the sessions a proxy restores, `token_ids`), `WHOLE_PROMPT_IDS` in SQL (the
Parquet export). A row whose key turn is missing, or whose ids do not add up to its `prompt_len`, is an error that
names both samples, never a shorter prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokview.store.connection import Database
from tokview.store.errors import StoreError

REF_COLUMNS = ("prompt_from", "prompt_from_len")

PAST_KEY, PAST_LEN = "past_key", "past_len"
"""A part line's proposal, not columns: a row written whole that may be stored past this key turn by this many ids,
once the key has landed whole (`CUT_PAST_KEYS`). The proxy's recorder writes them when the key is written or about to
be but not seen landed yet: an agent's turns often come faster than the landings, and every such turn was stored
whole (12 turns of a 40,000-id context in 0.3 s: all 12 whole)."""
PAST_SPEC = f", '{PAST_KEY}': 'VARCHAR', '{PAST_LEN}': 'INTEGER'"
"""The proposal's fields in a landing's `read_json` columns (a line without them reads NULL: stored as it is)."""

CUT_PAST_KEYS = f"""
UPDATE _part_new SET prompt_ids = list_slice(_part_new.prompt_ids, _part_new.{PAST_LEN} + 1, len(_part_new.prompt_ids)),
    prompt_from = _part_new.{PAST_KEY}, prompt_from_len = _part_new.{PAST_LEN}
FROM (
    SELECT sample_id, list_concat(prompt_ids, output_ids) AS ids FROM samples
    WHERE prompt_from IS NULL AND sample_id IN (SELECT {PAST_KEY} FROM _part_new)
    UNION ALL
    SELECT sample_id, list_concat(prompt_ids, output_ids) FROM _part_new
    WHERE prompt_from IS NULL AND {PAST_KEY} IS NULL AND sample_id IN (SELECT {PAST_KEY} FROM _part_new)
) k
WHERE _part_new.{PAST_KEY} = k.sample_id AND _part_new.prompt_from IS NULL
    AND _part_new.prompt_len = len(_part_new.prompt_ids)
    AND _part_new.{PAST_LEN} BETWEEN 1 AND least(len(_part_new.prompt_ids), len(k.ids))
    AND list_slice(k.ids, 1, _part_new.{PAST_LEN}) = list_slice(_part_new.prompt_ids, 1, _part_new.{PAST_LEN})
"""
"""In a landing, after its new rows are in `_part_new`: each row proposing a key (`PAST_KEY`) is stored past it when
the key is stored whole (in the store, or landing now without a proposal of its own) and its first `PAST_LEN` ids
are the row's; otherwise the row stays whole. Checked here, against the ids as stored, so a row never names a key
that did not land whole (a key's line set aside, a replayed key whose id was stored already as a tail)."""

WHOLE_PROMPT_IDS = (
    "CASE WHEN s.prompt_from IS NULL THEN s.prompt_ids "
    "ELSE list_concat(list_concat(k.prompt_ids, k.output_ids)[1:s.prompt_from_len], s.prompt_ids) END"
)
"""A row's whole prompt ids in SQL, with its key turn joined as `k` (`export_rows.write_parquet`)."""


def whole_prompt(
    sample_id: str, tail: Sequence[int], key_id: str, key_len: Any, key: tuple[Any, ...] | None, prompt_len: int
) -> list[int]:
    """The prompt of `sample_id`: the first `key_len` ids of its key turn's prompt + output, then `tail`. `key`: the
    key turn's (prompt ids, output ids, prompt_from), None when the store does not hold it."""
    if not isinstance(key_len, int) or isinstance(key_len, bool) or key_len < 0:  # a hand-edited row's NULL
        raise StoreError(f"sample {sample_id}: it is stored past sample {key_id} by {key_len!r} ids, not a count")
    if key is None:
        raise StoreError(
            f"sample {sample_id}: its prompt begins with {key_len} ids of sample {key_id}, which this store does not "
            "hold (its line may have been set aside when it landed)"
        )
    if key[2] is not None:  # its ids are a tail themselves: never written so, and not these ids
        raise StoreError(f"sample {sample_id}: its key turn {key_id} is not stored whole")
    key_prompt, key_output = list(key[0] or ()), list(key[1] or ())
    head = (key_prompt + key_output)[:key_len]
    whole = head + list(tail)
    if len(head) != key_len or len(whole) != prompt_len:
        raise StoreError(
            f"sample {sample_id}: its prompt ids do not add up ({len(head)} of sample {key_id}'s and {len(tail)} of "
            f"its own, for {prompt_len})"
        )
    return whole


def whole_prompts(
    db: Database, rows: Sequence[dict[str, Any]], *, broken: list[tuple[dict[str, Any], str]] | None = None
) -> None:
    """Put the whole prompt ids back into rows (dicts of samples columns, changed in place) stored as the ids past an
    earlier turn's: their key turns are read in one query. A row then reads like one stored whole (`prompt_from`
    None). A row whose prompt cannot be put back raises StoreError, or, given `broken`, is listed there with why and
    left as it is (a restarted proxy skips it instead of refusing to start)."""
    keys = sorted({r["prompt_from"] for r in rows if r.get("prompt_from") is not None})
    for row in rows:  # a row stored whole holds its whole prompt: one that does not was cut by hand, never exported
        if row.get("prompt_from") is None and not _adds_up(row):
            exc = StoreError(
                f"sample {row.get('sample_id')}: it holds {len(row.get('prompt_ids') or ())} prompt ids for a prompt "
                f"of {row.get('prompt_len')} (the row was edited or damaged)"
            )
            if broken is None:
                raise exc
            broken.append((row, str(exc)))
    if not keys:
        return
    found = {
        sid: (prompt, output, key_from)
        for sid, prompt, output, key_from in db.query(
            "SELECT s.sample_id, s.prompt_ids, s.output_ids, s.prompt_from FROM samples s "
            "JOIN (SELECT unnest(?::VARCHAR[]) AS id) q ON s.sample_id = q.id",
            [keys],
        )
    }
    for row in rows:
        key_id = row.get("prompt_from")
        if key_id is None:
            continue
        try:
            row["prompt_ids"] = whole_prompt(
                row["sample_id"],
                row["prompt_ids"],
                key_id,
                row["prompt_from_len"],
                found.get(key_id),
                row["prompt_len"],
            )
        except StoreError as exc:
            if broken is None:
                raise
            broken.append((row, str(exc)))
            continue
        row["prompt_from"] = row["prompt_from_len"] = None


def _adds_up(row: dict[str, Any]) -> bool:
    """Whether a row stored whole holds as many prompt ids as its `prompt_len` says (a row without one: yes)."""
    length = row.get("prompt_len")
    return length is None or "prompt_ids" not in row or len(row["prompt_ids"] or ()) == length
