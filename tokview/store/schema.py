"""The store's schema as an ordered list of migrations.

Why migrations rather than one CREATE script: a `tokview.duckdb` file outlives the tokview version
that made it (people keep months of curated samples), so a newer tokview must upgrade an older file
in place. Each migration runs once, in order, inside one transaction, and bumps `schema_version`
(a new file gets them all in one transaction).
Append new migrations; never edit an applied one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokview.errors import TokviewError
from tokview.store.connection import transaction
from tokview.store.token_data import MIGRATION_SQL as _SIDE_DATA_SQL
from tokview.store.tool_call_text import fill_tool_calls_text
from tokview.wording import first_of

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

MIGRATIONS: list[tuple[int, str, tuple[str, ...]]] = [
    (
        1,
        "samples, findings, failures, verdicts, runs",
        (
            """CREATE TABLE runs (
            run_id VARCHAR PRIMARY KEY,
            started TIMESTAMP,
            settings VARCHAR,            -- JSON: sampling params, mode, backend
            profile VARCHAR,
            tokenizer_dir VARCHAR,
            tokenizer_hash VARCHAR,
            template_hash VARCHAR,
            server_info VARCHAR,         -- JSON list: url, kind, version, features
            source VARCHAR               -- the prompts file or imported dataset
        )""",
            """CREATE TABLE samples (
            sample_id VARCHAR PRIMARY KEY,
            prompt_id VARCHAR NOT NULL,
            run_id VARCHAR,
            gen_index INTEGER,
            turn INTEGER,
            prompt_ids INTEGER[] NOT NULL,
            output_ids INTEGER[] NOT NULL,
            parsed_output_ids INTEGER[],
            finish_reason VARCHAR,
            matched_stop VARCHAR,        -- JSON (an id or a string)
            status VARCHAR NOT NULL DEFAULT 'pending',
            valid BOOLEAN NOT NULL,
            n_errors INTEGER NOT NULL,
            codes VARCHAR[] NOT NULL,    -- denormalised finding codes: the list view never joins
            prompt_len INTEGER NOT NULL,
            output_len INTEGER NOT NULL,
            supervised INTEGER NOT NULL,
            text VARCHAR,
            reasoning VARCHAR,
            content VARCHAR,
            reasoning_field VARCHAR,
            usage VARCHAR,
            settings VARCHAR,
            messages VARCHAR,
            endpoint VARCHAR,
            server_url VARCHAR,
            server_kind VARCHAR,
            server_version VARCHAR,
            model VARCHAR,
            output_logprobs DOUBLE[],
            raw_request VARCHAR,
            raw_response VARCHAR,
            parsed_raw_response VARCHAR,
            latency_s DOUBLE,
            alignment VARCHAR,           -- one letter per aligned id: k kept, p partial, h hidden, d drift
            profile VARCHAR,
            created_at TIMESTAMP NOT NULL
        )""",
            "CREATE INDEX samples_prompt_idx ON samples(prompt_id)",
            """CREATE TABLE findings (
            sample_id VARCHAR NOT NULL,
            code VARCHAR NOT NULL,
            severity VARCHAR NOT NULL,
            detail VARCHAR,
            positions INTEGER[]
        )""",
            "CREATE INDEX findings_sample_idx ON findings(sample_id)",
            """CREATE TABLE failures (
            prompt_id VARCHAR,
            sample_id VARCHAR,
            run_id VARCHAR,
            reason VARCHAR,
            "at" TIMESTAMP,
            server VARCHAR
        )""",
            """CREATE SEQUENCE verdict_seq START 1""",
            """CREATE TABLE verdicts (
            seq BIGINT DEFAULT nextval('verdict_seq'),
            sample_id VARCHAR NOT NULL,
            "at" TIMESTAMP NOT NULL,
            who VARCHAR,
            kind VARCHAR NOT NULL,       -- verdict | note | undo
            status VARCHAR,
            reason VARCHAR,
            note VARCHAR,
            tags VARCHAR[],
            undone BOOLEAN NOT NULL DEFAULT false
        )""",
            "CREATE INDEX verdicts_sample_idx ON verdicts(sample_id)",
        ),
    ),
    (
        2,
        "index failures by sample id",
        (
            # put_sample clears a sample's earlier failures on every write: without it, a full scan each
            "CREATE INDEX failures_sample_idx ON failures(sample_id)",
        ),
    ),
    (
        3,
        "verdicts record an approval that overrode an error finding",
        ("ALTER TABLE verdicts ADD COLUMN override BOOLEAN DEFAULT false",),
    ),
    (
        4,
        "one current failure per sample, with its attempt count",
        (
            # Reruns of a still-failing prompt used to add a row each (failures 240 for 80 missing
            # samples). A side table keeps the count, so `failures` keeps its columns for its readers.
            """CREATE TABLE failure_attempts (
            sample_id VARCHAR PRIMARY KEY,
            attempts INTEGER NOT NULL
        )""",
            "INSERT INTO failure_attempts SELECT sample_id, count(*) FROM failures WHERE sample_id IS NOT NULL "
            "GROUP BY sample_id",
            'DELETE FROM failures WHERE sample_id IS NOT NULL AND rowid NOT IN (SELECT arg_max(rowid, "at") '
            "FROM failures WHERE sample_id IS NOT NULL GROUP BY sample_id)",
        ),
    ),
    (5, "per-token side data: spec-decode metrics, top-K logprobs, target scores", _SIDE_DATA_SQL),
    (
        6,
        "raw bodies are stored without the id lists their row holds",
        # JSON: where in raw_request/raw_response/parsed_raw_response each id column goes back (elided_ids.py)
        ("ALTER TABLE samples ADD COLUMN raw_ids_at VARCHAR",),
    ),
    (
        7,
        "a run keeps its whole profile, not only its name",
        # JSON of the ModelProfile's fields: a .toml profile (GLM, a custom stop id) is read back as it was
        ("ALTER TABLE runs ADD COLUMN profile_def VARCHAR",),
    ),
    (
        8,
        "every verdict, note and tag row names the action that wrote it; actions can be undone as one",
        (
            # an action (one key press, one bulk action, one `tokview review`) groups the rows it wrote;
            # `undone_by` names the action that took a row back, so undoing that one brings the row back
            "ALTER TABLE verdicts ADD COLUMN action_id BIGINT",
            "ALTER TABLE verdicts ADD COLUMN undone_by BIGINT",
            """CREATE TABLE actions (
            action_id BIGINT PRIMARY KEY,  -- from verdict_seq: later actions have larger ids
            "at" TIMESTAMP NOT NULL,
            who VARCHAR,
            kind VARCHAR NOT NULL,       -- approved | rejected | tag | untag | note | undo
            detail VARCHAR,              -- the reason, the tags, the note
            samples INTEGER NOT NULL,
            source VARCHAR,              -- app | review | (older rows) before
            undone_by BIGINT
        )""",
            # older rows: the rows of one transaction (a bulk `tokview review`) share their timestamp and author
            'UPDATE verdicts SET action_id = g.first FROM (SELECT "at", who, kind, min(seq) AS first FROM verdicts '
            "WHERE kind IN ('verdict', 'note') GROUP BY ALL) g WHERE verdicts.kind IN ('verdict', 'note') "
            'AND verdicts."at" = g."at" AND verdicts.who IS NOT DISTINCT FROM g.who AND verdicts.kind = g.kind',
            'INSERT INTO actions SELECT action_id, any_value("at"), any_value(who), '
            "CASE WHEN any_value(kind) = 'note' THEN (CASE WHEN bool_and(coalesce(note, '') = '') THEN 'tag' ELSE "
            "'note' END) ELSE any_value(status) END, any_value(coalesce(reason, note)), count(DISTINCT sample_id), "
            "'before', CASE WHEN bool_and(undone) THEN 0 END FROM verdicts WHERE action_id IS NOT NULL GROUP BY action_id",
        ),
    ),
    (
        9,
        "a long stream's chunks may be stored packed in its raw body",
        # no column changes: `chunks_zlib64` in a stream's raw body (packed_chunks.py). The version is what makes
        # an older tokview refuse the store instead of reading such a stream as one without chunks
        (),
    ),
    (
        10,
        "an agent turn's prompt ids may be stored as the ids past an earlier turn's",
        (
            # prompt_from: the sample whose prompt + output ids begin this prompt (its first prompt_from_len);
            # prompt_ids then holds the rest (prompt_refs.py). NULL: prompt_ids is the whole prompt. IF NOT EXISTS:
            # DuckDB drops no column of an indexed table, so a store taken back to an older version by hand keeps them
            "ALTER TABLE samples ADD COLUMN IF NOT EXISTS prompt_from VARCHAR",
            "ALTER TABLE samples ADD COLUMN IF NOT EXISTS prompt_from_len INTEGER",
        ),
    ),
    (
        11,
        "a request's messages may be stored once, in the messages column",
        # no column changes: `raw_ids_at` may name the `messages` column (elided_ids.elide_messages). The version
        # is what makes an older tokview refuse the store instead of reading such a request as one without messages
        (),
    ),
    (
        12,
        "a sample's tool calls as searchable text",
        # one line per call, `name arguments`; '' for none; older rows are filled from their stored bodies by
        # `fill_tool_calls_text`, which `migrate` runs at every writable open (tool_call_text.py). IF NOT EXISTS: see 10
        ("ALTER TABLE samples ADD COLUMN IF NOT EXISTS tool_calls_text VARCHAR",),
    ),
]

LATEST_VERSION = MIGRATIONS[-1][0]


class SchemaError(TokviewError):
    """The database file was written by a newer tokview, or is not a tokview store."""

    title = "store schema"


TOKVIEW_TABLES = {"schema_version", "runs", "samples", "findings", "failures", "verdicts", "actions"}


_TABLES_AND_VIEWS = (
    "(SELECT schema_name, table_name AS name FROM duckdb_tables() WHERE database_name = current_database() "
    "UNION ALL SELECT schema_name, view_name FROM duckdb_views() WHERE NOT internal AND database_name = current_database())"
)
"""Every table and view of the store, what information_schema.tables lists, read from DuckDB's own catalog
functions (~0.5 ms; the information_schema views cost 3–6 ms on a new connection, at the start of
every batch). Only the store's own: other files this process has open are attached to the same instance
(`connection._attach`)."""


def refuse_foreign(conn: DuckDBPyConnection, path: str) -> None:
    """A DuckDB file that holds other tables is somebody else's data: never add tokview's tables to it.

    Empty files, tokview stores (a `schema_version` table beside `samples`) and a store whose creation never
    finished (an empty `schema_version` alone: what a kill during creation left before tokview created it in
    the same transaction as the rest) are fine: `migrate` creates or completes them."""
    tables = {r[0] for r in conn.execute(f"SELECT name FROM {_TABLES_AND_VIEWS} WHERE schema_name = 'main'").fetchall()}
    if not tables or {"schema_version", "samples"} <= tables or _unfinished_creation(conn, tables):
        return
    shown = first_of(sorted(tables))
    raise SchemaError(f"{path} is a DuckDB database but not a tokview store (it has tables {shown}): pass another --db")


def refuse_unmigrated(conn: DuckDBPyConnection, path: str) -> None:
    """A store opened read-only is read as it is: only when it has this tokview's schema (upgrading writes)."""
    version = current_version(conn)
    if version > LATEST_VERSION:
        raise SchemaError(
            f"{path} has schema version {version}, newer than this tokview understands ({LATEST_VERSION}): "
            "upgrade tokview"
        )
    if version == 0:
        raise SchemaError(f"{path} is read-only and holds no tokview store: pass another --db")
    if version < LATEST_VERSION and _changes_tables_after(version):
        raise SchemaError(
            f"{path} has schema version {version}; this tokview reads version {LATEST_VERSION} and upgrades a store "
            "in place, which needs it writable (open it once with write access, or use the tokview that made it)"
        )


def _changes_tables_after(version: int) -> bool:
    """Whether a migration after `version` changes a table. One that only marks what rows may hold (9: packed
    stream chunks) leaves an older store readable as it is: nothing it holds uses the newer format."""
    return any(statements for number, _, statements in MIGRATIONS if number > version)


def current_version(conn: DuckDBPyConnection) -> int:
    if not _one_number(conn, f"SELECT count(*) FROM {_TABLES_AND_VIEWS} WHERE name = 'schema_version'"):
        return 0
    return version_in(conn, "schema_version")


def version_in(conn: DuckDBPyConnection, table: str) -> int:
    """The highest version a `schema_version` table holds (`src.schema_version`: an attached store's); SchemaError
    when it holds none tokview wrote (no `version` column, text, an infinity), as every command refuses such a file."""
    import duckdb  # here, as this module's other readers of a connection: DuckDB is imported by whoever opened it

    try:
        return _one_number(conn, f"SELECT max(version) FROM {table}")
    except duckdb.BinderException:  # no `version` column: another tool's table of that name
        raise SchemaError(
            "this DuckDB file's schema_version has no version column: it is not a tokview store (pass another --db)"
        ) from None


def _one_number(conn: DuckDBPyConnection, sql: str) -> int:
    """The single number a count or max query returns (0 for no row or NULL)."""
    row = conn.execute(sql).fetchone()
    value = row[0] if row else None
    try:
        return int(value or 0)
    except (TypeError, ValueError, OverflowError):  # a `schema_version` tokview did not write (text, an infinity)
        raise SchemaError(
            f"this DuckDB file's schema_version holds {str(value)[:40]!r}, not a version tokview wrote: it is not a "
            "tokview store "
            "(pass another --db)"
        ) from None


def _unfinished_creation(conn: DuckDBPyConnection, tables: set[str]) -> bool:
    """Only `schema_version`, holding no row: no migration ever committed, so the file holds nothing at all."""
    if tables != {"schema_version"}:
        return False
    return _one_number(conn, "SELECT count(*) FROM schema_version") == 0


def migrate(conn: DuckDBPyConnection) -> int:
    """Bring the file up to LATEST_VERSION; return the version it had before."""
    before = current_version(conn)
    if before > LATEST_VERSION:
        raise SchemaError(
            f"this database has schema version {before}, newer than this tokview "
            f"understands ({LATEST_VERSION}): upgrade tokview"
        )
    if before == 0:
        _create(conn)
        return before
    for version, name, statements in MIGRATIONS:
        if version <= before:
            continue
        _in_transaction(conn, [*statements, _version_row(version, name)])
    fill_tool_calls_text(conn, commit_each=True)  # rows from before schema 12, also a fill a kill cut short
    return before


def _create(conn: DuckDBPyConnection) -> None:
    """A new store gets every migration in one transaction, sent as one script: the same schema and
    `schema_version` rows as applying them one by one, in three calls to DuckDB (BEGIN, the script, COMMIT)
    instead of ~30 (a new store opens in ~33 ms instead of ~38). `schema_version` is created in that
    transaction too: a process killed while it creates a store leaves a file with no table (or no file),
    never a half-made store."""
    _in_transaction(conn, creation_script())


def creation_script() -> list[str]:
    """What a new store runs: every migration's statements and `schema_version` row, in order."""
    statements = [_SCHEMA_VERSION_TABLE]
    statements += [sql for version, name, sqls in MIGRATIONS for sql in (*sqls, _version_row(version, name))]
    return statements


_SCHEMA_VERSION_TABLE = (
    "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER, name VARCHAR, applied_at TIMESTAMP)"
)
"""IF NOT EXISTS: a store whose creation an older tokview left unfinished already has it (empty)."""


def _version_row(version: int, name: str) -> str:
    quoted = name.replace("'", "''")
    return f"INSERT INTO schema_version VALUES ({int(version)}, '{quoted}', now())"


def _in_transaction(conn: DuckDBPyConnection, statements: list[str]) -> None:
    """The statements as one script in one transaction: one call to DuckDB between BEGIN and COMMIT."""
    with transaction(conn):
        conn.execute(";\n".join(statements))
