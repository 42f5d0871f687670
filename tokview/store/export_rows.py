"""The reads (and the one Parquet `COPY`) exports and `tokview score` make, so that neither
`tokview/export/` nor `tokview/batch/` writes SQL against the store's tables.

Why here: the selection rules (`--select`, `--run`, `--tag`, `--without-tag`, `--max-acceptance`,
`--max-nll`), the Parquet columns and the loss-mask rule in SQL are all statements about the store's
tables; when a column or a table changes, the statements that name it change in the store package, not
in the writers. Every function goes through `Store.query` / `Store.execute`, so each runs under the store's lock and
its DuckDB errors become `StoreError`s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from tokview.store import queries
from tokview.store.conversation_turns import runs_by_turn
from tokview.store.errors import StoreError
from tokview.store.prompt_refs import REF_COLUMNS, WHOLE_PROMPT_IDS, whole_prompts
from tokview.store.queries import INT64_MAX

if TYPE_CHECKING:
    from tokview.store.store import Store

SELECTIONS = {"valid": "valid AND status <> 'rejected'", "approved": "status = 'approved'", "all": "true"}
"""`--select` name → the rows it means (exports and `tokview score` share them)."""


class SampleKey(NamedTuple):
    """One selected sample, in export order."""

    sample_id: str
    prompt_id: str
    turn: int | None
    gen_index: int | None
    run_id: str | None


EXPORT_ORDER = "prompt_id, coalesce(turn, -1), coalesce(gen_index, 0), run_id, sample_id"

# The Parquet loss mask is built in SQL, 0 per prompt id and 1 per output id: the same rule as
# `core.segments.loss_mask` (tests/test_export_formats.py checks every exported row against it).
PARQUET_LOSS_MASK = "list_concat([0 FOR x IN s.prompt_ids], [1 FOR x IN s.output_ids])"

SIDE_COLUMN_GROUPS = {
    "output_logprobs": ("output_logprobs", "output_top_ids", "output_top_logprobs"),
    "target_logprobs": ("target_logprobs", "target_top_ids", "target_top_logprobs"),
    "acceptance_length": ("acceptance_length",),
    "mean_nll": ("mean_nll",),
}
"""Parquet side columns, written as a group when any exported sample has the group's first column."""

_IN_IDS = "JOIN (SELECT unnest(?::VARCHAR[]) AS sid) q ON s.sample_id = q.sid"


def live_tags() -> str:
    """SQL for (sample_id, tag) of every live tag, once per sample, in lower case: tags are compared without
    case (`--tag Hard` selects a sample tagged 'hard'), and exports write them in that form."""
    return (
        "SELECT DISTINCT sample_id, lower(tag) AS tag FROM "
        f"(SELECT v.sample_id, unnest(v.tags) AS tag FROM verdicts v WHERE {queries.LIVE_TAG_ROWS})"
    )


def normal_tags(tags: Sequence[str]) -> tuple[str, ...]:
    """Tags as a selection holds them: stripped, each once, in the order given. Compared without case in SQL
    (`Selection.where`: DuckDB's `lower` on both sides): Python's lower case of some letters is not DuckDB's
    ('İ' → 'i̇' against 'i', 'ΣΑΣ' → 'σας' against 'σασ'), and `--tag İzmir` matched nothing."""
    return tuple(dict.fromkeys(t.strip() for t in tags))


@dataclass(frozen=True)
class Selection:
    """Which samples an export (or a scoring pass) reads: a `--select` name plus its narrowing flags."""

    select: str = "valid"
    run: str | None = None
    max_acceptance: float | None = None
    max_nll: float | None = None
    tags: tuple[str, ...] = ()
    """A sample must carry every one of these (see `normal_tags`)."""
    without_tags: tuple[str, ...] = ()
    """A sample must carry none of these."""

    def where(self, *, thresholds: bool = True, valid_only: bool = False) -> tuple[str, list[Any]]:
        """The WHERE clause (without the keyword) and its parameters; ValueError on an unknown name. `valid_only`:
        the samples without an error finding among them (`--select approved` without `--include-invalid`)."""
        if self.select not in SELECTIONS:
            raise ValueError(f"unknown selection {self.select!r} (choose from {', '.join(SELECTIONS)})")
        where = SELECTIONS[self.select]
        params: list[Any] = []
        if self.run is not None:
            where += " AND run_id = ?"
            params.append(self.run)
        for tag, negate in [(t, "") for t in self.tags] + [(t, "NOT ") for t in self.without_tags]:
            where += f" AND sample_id {negate}IN (SELECT sample_id FROM ({live_tags()}) WHERE tag = lower(?))"
            params.append(tag)
        if thresholds and self.max_acceptance is not None:
            where += " AND acceptance_length <= ?"
            params.append(float(self.max_acceptance))
        if thresholds and self.max_nll is not None:
            where += " AND mean_nll <= ?"
            params.append(float(self.max_nll))
        if valid_only:
            where += " AND valid"
        return where, params


def selected_keys(store: Store, selection: Selection, *, valid_only: bool = False) -> list[SampleKey]:
    """The selected samples' keys in export order (by prompt, turn, generation, run, sample id)."""
    where, params = selection.where(valid_only=valid_only)
    rows = store.query(
        f"SELECT sample_id, prompt_id, turn, gen_index, run_id FROM samples WHERE {where} ORDER BY {EXPORT_ORDER}",
        params,
    )
    return [SampleKey(*r) for r in rows]


def still_selected(store: Store, sample_ids: list[str], where: tuple[str, list[Any]] | None) -> set[str]:
    """Those of `sample_ids` a selection's clause (`Selection.where`) still picks (all of them without one)."""
    if where is None or not sample_ids:
        return set(sample_ids)
    clause, params = where
    rows = store.query(
        f"SELECT sample_id FROM samples WHERE sample_id IN (SELECT unnest(?::VARCHAR[])) AND ({clause})",
        [sample_ids, *params],
    )
    return {r[0] for r in rows}


def invalid_codes(store: Store, selection: Selection) -> list[list[str]]:
    """The finding codes of each selected sample that is not valid (what `--select approved` leaves out)."""
    where, params = selection.where()
    return [
        list(codes or []) for (codes,) in store.query(f"SELECT codes FROM samples WHERE {where} AND NOT valid", params)
    ]


def score_candidates(store: Store, selection: Selection, limit: int | None = None) -> list[tuple[str, Any]]:
    """(sample_id, stored target_score JSON) of the selected samples that have output ids, oldest first."""
    where, params = selection.where()
    sql = f"SELECT sample_id, target_score FROM samples WHERE {where} AND output_len > 0 ORDER BY created_at, sample_id"
    if limit is not None:
        sql += f" LIMIT {min(int(limit), INT64_MAX)}"  # a huge --limit means all of them
    return [(r[0], r[1]) for r in store.query(sql, params)]


def probe_candidates(store: Store, selection: Selection, count: int = 20) -> list[str]:
    """The first `count` selected samples with an answer (no sort: a store of a million samples is not scanned for
    them): a probe of a target's vocabulary reads their ids back as text (`batch/vocabulary_probe.py`)."""
    where, params = selection.where()
    rows = store.query(f"SELECT sample_id FROM samples WHERE {where} AND output_len >= 4 LIMIT {int(count)}", params)
    return [r[0] for r in rows]


def without_output_count(store: Store, selection: Selection) -> int:
    """How many selected samples have no output ids (`max_tokens: 0`): nothing to score, said so in the summary."""
    where, params = selection.where()
    [(n,)] = store.query(f"SELECT count(*) FROM samples WHERE {where} AND output_len = 0", params)
    return int(n)


def token_ids(store: Store, sample_ids: list[str]) -> list[tuple[str, list[int], list[int]]]:
    """(sample_id, prompt ids, output ids) of these samples (what a scoring pass sends to the target)."""
    rows = store.query(
        f"SELECT s.sample_id, s.prompt_ids, s.output_ids, s.prompt_from, s.prompt_from_len, s.prompt_len FROM samples s "
        f"{_IN_IDS}",
        [sample_ids],
    )
    dicts = [dict(zip(("sample_id", "prompt_ids", "output_ids", *REF_COLUMNS, "prompt_len"), r)) for r in rows]
    whole_prompts(store, dicts)
    return [(d["sample_id"], list(d["prompt_ids"]), list(d["output_ids"])) for d in dicts]


def threshold_counts(store: Store, selection: Selection) -> dict[str, int]:
    """How many samples of the selection (before its thresholds) each threshold leaves out, and why."""
    where, params = selection.where(thresholds=False)
    checks: list[tuple[str, str, list[Any]]] = []
    if selection.max_acceptance is not None:
        checks += [
            ("left_out_no_spec_decode", "acceptance_length IS NULL", []),
            ("left_out_above_max_acceptance", "acceptance_length > ?", [float(selection.max_acceptance)]),
        ]
    if selection.max_nll is not None:
        checks += [
            ("left_out_not_scored", "mean_nll IS NULL", []),
            ("left_out_above_max_nll", "mean_nll > ?", [float(selection.max_nll)]),
        ]
    out: dict[str, int] = {}
    if checks:  # in all (each reason above counts on its own: a sample may be under two)
        kept, kept_params = selection.where()
        out["left_out"] = int(store.query(f"SELECT count(*) FROM samples WHERE {where}", params)[0][0]) - int(
            store.query(f"SELECT count(*) FROM samples WHERE {kept}", kept_params)[0][0]
        )
    for name, condition, extra in checks:
        out[name] = int(
            store.query(f"SELECT count(*) FROM samples WHERE {where} AND {condition}", params + extra)[0][0]
        )
    return out


def profile_names(store: Store, sample_ids: list[str]) -> list[str | None]:
    """The distinct profile names these samples were analysed with."""
    return [name for (name,) in store.query(f"SELECT DISTINCT s.profile FROM samples s {_IN_IDS}", [sample_ids])]


def served_layouts(store: Store, sample_ids: list[str]) -> list[tuple[str | None, str | None, int]]:
    """(settings JSON, profile name, how many) of these samples that have output ids: one query for a whole
    export (256 ids a query read each row's settings into Python, 10% of a 40,000-sample export)."""
    listed, ids = queries.ids_in(sample_ids)
    return [
        (settings, prof, n)
        for settings, prof, n in store.query(
            f"SELECT s.settings, s.profile, count(*) FROM samples s WHERE {listed} AND len(s.output_ids) > 0 "
            "GROUP BY s.settings, s.profile ORDER BY count(*) DESC, s.settings, s.profile",
            ids,
        )
    ]


def side_columns(store: Store, sample_ids: list[str]) -> list[str]:
    """The Parquet side columns any of these samples has (logprobs, top-K, target, spec-decode, NLL)."""
    if not sample_ids:
        return []
    checks = ", ".join(f"count(s.{group}) > 0" for group in SIDE_COLUMN_GROUPS)
    present = store.query(f"SELECT {checks} FROM samples s {_IN_IDS}", [sample_ids])[0]
    return [c for (_, cols), has in zip(SIDE_COLUMN_GROUPS.items(), present) if has for c in cols]


def tag_counts(store: Store, sample_ids: list[str]) -> dict[str, int]:
    """{tag: how many of these samples carry it}, tags in lower case, sorted."""
    if not sample_ids:
        return {}
    rows = store.query(
        f"SELECT t.tag, count(*) FROM ({live_tags()}) t JOIN (SELECT unnest(?::VARCHAR[]) AS sid) q "
        "ON t.sample_id = q.sid GROUP BY t.tag ORDER BY t.tag",
        [sample_ids],
    )
    return {tag: int(n) for tag, n in rows}


def write_parquet(store: Store, sample_ids: list[str], row_ids: list[str], target: Path) -> None:
    """DuckDB's own Parquet writer: the speculators columns (`id`, `input_ids`, `loss_mask`), tokview's
    review columns (with `tags`, a list, when any of these samples carries one) and the side columns any of
    these samples has, in export order, into `target`."""
    extra = "".join(f", s.{c}" for c in side_columns(store, sample_ids))
    tags = ", coalesce(t.tags, []::VARCHAR[]) AS tags" if tag_counts(store, sample_ids) else ""
    path = str(target).replace("'", "''")
    # rows stored as the ids past an earlier turn's (prompt_refs.py) read their whole prompt through the key turn
    whole = _whole_prompt_rows(store, sample_ids)
    store.execute(
        "COPY (SELECT q.rid AS id, s.prompt_id AS primary_id, s.sample_id, s.run_id, s.turn, "
        "list_concat(s.prompt_ids, s.output_ids) AS input_ids, "
        f"{PARQUET_LOSS_MASK} AS loss_mask, "
        f"s.prompt_len, s.output_len, s.finish_reason, s.status, s.valid, s.codes{tags}{extra} "
        f"FROM {whole} s JOIN (SELECT unnest(?::VARCHAR[]) AS sid, unnest(?::VARCHAR[]) AS rid) q "
        "ON s.sample_id = q.sid "
        f"LEFT JOIN (SELECT sample_id, list_sort(list(tag)) AS tags FROM ({live_tags()}) GROUP BY sample_id) t "
        "ON t.sample_id = s.sample_id "
        f"ORDER BY s.prompt_id, coalesce(s.turn, -1), coalesce(s.gen_index, 0), s.run_id, s.sample_id) "
        f"TO '{path}' (FORMAT parquet)",
        [sample_ids, row_ids],
    )


def _whole_prompt_rows(store: Store, sample_ids: list[str]) -> str:
    """What the Parquet export reads its rows from: `samples` itself, unless one of these samples is stored as the
    ids past an earlier turn's; then a subquery whose prompt_ids are whole, joined to those samples' key turns only
    (listed first: a join to every key turn in the store read all their ids, 0.15-0.3 s and 250 MB for one row of a
    100,000-row store). StoreError where the join would cut a prompt, or a row stored whole holds fewer or more
    prompt ids than its `prompt_len` (edited or damaged: `prompt_refs.whole_prompts` refuses it for the JSONL)."""
    cut = store.query(
        f"SELECT s.sample_id, len(s.prompt_ids), s.prompt_len FROM samples s {_IN_IDS} WHERE s.prompt_from IS NULL "
        "AND s.prompt_len IS NOT NULL AND len(s.prompt_ids) IS DISTINCT FROM s.prompt_len LIMIT 1",
        [sample_ids],
    )
    if cut:
        sample_id, held, length = cut[0]
        raise StoreError(
            f"sample {sample_id}: it holds {held or 0} prompt ids for a prompt of {length} (the row was edited or damaged)"
        )
    keys = [
        r[0]
        for r in store.query(
            f"SELECT DISTINCT s.prompt_from FROM samples s {_IN_IDS} WHERE s.prompt_from IS NOT NULL", [sample_ids]
        )
    ]
    if not keys:
        return "samples"
    broken = store.query(
        f"SELECT s.sample_id, s.prompt_from FROM samples s {_IN_IDS} LEFT JOIN (SELECT t.* FROM samples t "
        "JOIN (SELECT unnest(?::VARCHAR[]) AS kid) kq ON t.sample_id = kq.kid) k ON k.sample_id = s.prompt_from "
        "WHERE s.prompt_from IS NOT NULL AND (k.sample_id IS NULL OR k.prompt_from IS NOT NULL "
        "OR s.prompt_from_len IS NULL OR s.prompt_from_len < 0 OR s.prompt_len IS NULL "
        "OR len(k.prompt_ids) + len(k.output_ids) < s.prompt_from_len "
        "OR s.prompt_from_len + len(s.prompt_ids) != s.prompt_len) LIMIT 1",
        [sample_ids, keys],
    )
    if broken:
        sample_id, key_id = broken[0]
        raise StoreError(f"sample {sample_id}: its prompt ids do not add up with those of sample {key_id}")
    listed = ", ".join("'" + k.replace("'", "''") + "'" for k in keys)
    return (
        f"(SELECT s.* REPLACE ({WHOLE_PROMPT_IDS} AS prompt_ids) FROM samples s "
        f"LEFT JOIN (SELECT sample_id, prompt_ids, output_ids FROM samples WHERE sample_id IN ({listed})) k "
        "ON k.sample_id = s.prompt_from)"
    )


CONVERSATION_ORDER = "prompt_id, gen, run_started NULLS LAST, run_id, coalesce(turn, -1), sample_id"
"""A conversation's runs side by side, oldest first (by the run's start, or its first sample's time when the store
has no row for it; whatever the selection): a proxy restarted mid-session continues the session's turns in a run of
its own."""
_CONVERSATION_GEN = "CASE WHEN starts_with(s.sample_id, 'proxy:') THEN 0 ELSE coalesce(s.gen_index, 0) END"
"""Which conversation of its prompt a sample is: its generation index (each of a batch prompt's samples is a chain of
its own), but one for every generation of a proxy session. There a request's `n` > 1 choices are turns of the one
session, and a harness that goes on from choice 1 continues choice 1: keyed by generation, that next turn was joined
to choice 0's row (a prompt break) and choice 1 stood alone. In one conversation each choice past the first is a
branch, and the next turn goes on with the choice its prompt extends."""
ConversationKey = tuple[str | None, str, int, str, int | None]
"""(run_id, prompt_id, gen_index, sample_id, turn): one turn of one conversation."""


def conversation_turns(store: Store, sample_ids: list[str]) -> list[ConversationKey]:
    """These samples as turns of conversations, in conversation order.

    A conversation is every sample of one run with one prompt_id and generation index, its turns by `turn`:
    `tokview proxy` stores a session as prompt_id = the session id, turn = its turn index, and `tokview batch`
    stores a chain's turns as samples of one prompt with their turn index (`{prompt}#turn{t}` rows); a sample
    without a turn is a conversation of one turn. The runs of one prompt_id and generation index come one after
    another, oldest first, so a session a restarted proxy continued (its turns going on in the next run) can be
    joined up (`export.trajectory.build`)."""
    if not sample_ids:
        return []
    rows = store.query(
        f"SELECT run_id, prompt_id, gen, sample_id, turn FROM (SELECT s.run_id, s.prompt_id, {_CONVERSATION_GEN} "
        "AS gen, s.sample_id, s.turn, coalesce(r.started, b.began) AS run_started FROM samples s "
        "LEFT JOIN runs r ON r.run_id = s.run_id LEFT JOIN (SELECT run_id, min(created_at) AS began FROM samples "
        f"GROUP BY run_id) b ON b.run_id = s.run_id {_IN_IDS}) ORDER BY {CONVERSATION_ORDER}",
        [sample_ids],
    )
    return runs_in_turn_order([(r[0], r[1], int(r[2]), r[3], r[4]) for r in rows])


def runs_in_turn_order(turns: list[ConversationKey]) -> list[ConversationKey]:
    """Each conversation's runs as `CONVERSATION_ORDER` put them (by start), except that a run whose first turn goes
    on from another run's last turn comes right after that run (`chained_run_order`)."""
    out: list[ConversationKey] = []
    start = 0
    while start < len(turns):
        end = start
        while end < len(turns) and turns[end][1:3] == turns[start][1:3]:
            end += 1
        out.extend(_chained_runs(turns[start:end]))
        start = end
    return out


def _chained_runs(turns: list[ConversationKey]) -> list[ConversationKey]:
    runs: list[list[ConversationKey]] = []
    for turn in turns:
        if runs and runs[-1][0][0] == turn[0]:
            runs[-1].append(turn)
        else:
            runs.append([turn])
    return [turn for run in runs_by_turn(runs, lambda t: t[4]) for turn in run]
