"""The search box on agent traffic: a streamed answer's tool calls (stored only in its packed chunks) are found, in a
new store, in a store upgraded from schema 11 (filled a batch at a time, resumed after a kill), after a merge from
one, and from a part an older tokview wrote."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from agent_harness import Task, run_tasks

from tokview.proxy.serve import ProxyConfig, start_proxy
from tokview.sim.config import SimConfig
from tokview.sim.server import start_simulator
from tokview.store import SampleFilter, Store

TASKS = [
    Task("weather-stream", "What is the weather in Reykjavik, streamed?", ("get_weather",), True),
    Task("arith", "Compute with your tools: add, multiply and count.", ("add", "multiply", "word_count")),
]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, kimi_tok, kimi_profile) -> Iterator[Path]:
    db = tmp_path_factory.mktemp("search") / "agent.duckdb"
    with start_simulator(SimConfig(kind="vllm", quirks={"tool-calls": "each"})) as sim:
        config = ProxyConfig([sim.url], listen="127.0.0.1:0", db=str(db), tokenizer=kimi_tok, profile=kimi_profile)
        with start_proxy(config) as proxy:
            run_tasks(proxy.url + "/v1", sim.cfg.model_name, TASKS)
    yield db


def _calling(db: Path, name: str) -> set[str]:
    """The samples whose answer calls `name` (read from the stored bodies, as the app reads a sample)."""
    with Store(db) as store:
        ids = [r[0] for r in store.query("SELECT sample_id FROM samples")]
        return {i for i in ids if any(c["name"] == name for c in store.load_sample(i).capture.tool_calls or [])}


def _ids(db: Path, text: str) -> set[str]:
    with Store(db) as store:
        return set(store.reads.sample_ids_page(SampleFilter(text=text), None, 0, 1000))


def test_a_streamed_answers_tool_calls_are_found_by_name_and_arguments(recorded) -> None:
    """A streamed answer's calls live only in its packed chunks: the search found none of them."""
    streamed = _calling(recorded, "get_weather")
    assert streamed, "the streamed task called no tool"
    with Store(recorded) as store:
        packed = store.query("SELECT count(*) FROM samples WHERE raw_response LIKE '%chunks_zlib64%'")[0][0]
    assert packed, "no answer was stored packed: the case this test is for"
    assert _ids(recorded, "get_weather") >= streamed
    assert _ids(recorded, "GET_WEATHER") >= streamed  # without case, as the rest of the search
    assert _calling(recorded, "multiply") <= _ids(recorded, "multiply")
    with Store(recorded) as store:
        arguments = {c["arguments"] for i in streamed for c in store.load_sample(i).capture.tool_calls or []}
    assert arguments == {'{"city": "Paris"}'}  # what the simulated model calls it with, whatever the prompt
    assert _ids(recorded, '"city": "paris"') == streamed


def _as_schema_11(db: Path) -> None:
    """Make `db` what a tokview of schema 11 wrote: no tool-calls text, no version-12 row."""
    conn = duckdb.connect(str(db))
    conn.execute("UPDATE samples SET tool_calls_text = NULL")
    conn.execute("DELETE FROM schema_version WHERE version = 12")
    conn.close()


def test_a_store_upgraded_from_schema_11_finds_its_calls(recorded, tmp_path) -> None:
    old = tmp_path / "old.duckdb"
    shutil.copy(recorded, old)
    _as_schema_11(old)
    assert _ids(old, "get_weather") == _ids(recorded, "get_weather")  # the open migrated it, filling the column
    with Store(old) as store:
        assert store.query("SELECT count(*) FROM samples WHERE tool_calls_text IS NULL") == [(0,)]
        assert store.query("SELECT max(version) FROM schema_version") == [(12,)]


def test_samples_merged_from_an_older_store_have_their_calls_found(recorded, tmp_path, monkeypatch) -> None:
    """A schema-11 source has no such column: the merged rows' calls are read from their bodies."""
    from tokview.store import schema

    source = tmp_path / "v11.duckdb"
    with monkeypatch.context() as m:
        m.setattr(schema, "MIGRATIONS", [v for v in schema.MIGRATIONS if v[0] <= 11])
        m.setattr(schema, "LATEST_VERSION", 11)
        Store(source).close()
    conn = duckdb.connect(str(source))
    conn.execute(f"ATTACH '{recorded}' AS new (READ_ONLY)")
    columns = [
        r[0]
        for r in conn.execute(
            "SELECT column_name FROM duckdb_columns() WHERE database_name = "
            "current_database() AND table_name = 'samples'"
        ).fetchall()
    ]
    listed = ", ".join(columns)
    for table in ("runs", "samples", "findings"):
        shared = listed if table == "samples" else "*"
        conn.execute(f"INSERT INTO {table} SELECT {shared} FROM new.{table}")
    conn.close()
    into = tmp_path / "into.duckdb"
    with Store(into) as store:
        store.merge(source)
    assert _ids(into, "get_weather") == _ids(recorded, "get_weather")


def test_a_part_an_older_tokview_wrote_lands_with_its_calls_found(recorded, tmp_path) -> None:
    """A part left by a run killed before an upgrade has no `tool_calls_text`: its rows landed with none."""
    import builders

    from tokview.store.part_sink import PartSink
    from tokview.store.sample_rows import SampleIdentity

    with Store(recorded) as store:
        sid = next(iter(_calling(recorded, "get_weather")))
        capture = store.load_sample(sid).capture
    with Store(tmp_path / "new.duckdb") as store:
        sink = PartSink(store.path)
        record = sink.sample_record(
            SampleIdentity("old-part", "p1", "run1"),
            capture,
            builders.analyze(capture, builders.profile(), builders.kimi()),
        )
        del record["tool_calls_text"]
        sink.write_part([record])
        assert store.ingest()[0] == 1
    assert _ids(tmp_path / "new.duckdb", "get_weather") == {"old-part"}


def test_a_lone_surrogate_in_an_old_rows_arguments_never_keeps_the_store_from_opening(tmp_path) -> None:
    """An older tokview stored a server's `\\ud83d` escape in a call's arguments as it came: the upgrade decoded it to
    a lone surrogate, DuckDB refused it, the upgrade rolled back, and every later open failed the same way."""
    from tokview.store.tool_call_text import body_tool_calls_text, tool_calls_text

    body = '{"choices": [{"message": {"tool_calls": [{"function": {"name": "f", "arguments": "half \\ud83d"}}]}}]}'
    assert body_tool_calls_text("vllm-chat", body, None) == "f half \\ud83d"
    assert body_tool_calls_text("vllm-chat", "[" * 5000 + "]" * 5000, None) == ""  # deeper than Python reads
    assert tool_calls_text([{"name": "g", "arguments": "\ud800 é"}]) == "g \\ud800 é"
    db = tmp_path / "old.duckdb"
    Store(db).close()
    conn = duckdb.connect(str(db))
    conn.execute(
        "INSERT INTO samples (sample_id, prompt_id, prompt_ids, output_ids, valid, n_errors, codes, prompt_len, "
        "output_len, supervised, created_at, endpoint, raw_response) VALUES ('s', 'p', [1], [2], true, 0, [], 1, 1, 1, now(), "
        "'vllm-chat', ?)",
        [body],
    )
    conn.execute("DELETE FROM schema_version WHERE version = 12")
    conn.close()
    assert _ids(db, "half \\ud83d") == {"s"}


def test_an_upgrade_a_kill_cut_short_goes_on_at_the_next_open(recorded, tmp_path, monkeypatch) -> None:
    """The fill commits a batch at a time (one transaction held every filled value in memory: gigabytes on a big agent
    store); the rows a kill left unfilled are filled by the next open."""
    from tokview.store import tool_call_text

    old = tmp_path / "cut.duckdb"
    shutil.copy(recorded, old)
    _as_schema_11(old)
    monkeypatch.setattr(tool_call_text, "FILL_BATCH", 1)
    calls = 0
    real = tool_call_text._write

    def killed_after_two(conn, values):
        nonlocal calls
        calls += 1
        if calls > 2:
            raise KeyboardInterrupt
        real(conn, values)

    monkeypatch.setattr(tool_call_text, "_write", killed_after_two)
    with pytest.raises(KeyboardInterrupt):
        Store(old)
    conn = duckdb.connect(str(old))
    nulls = conn.execute("SELECT count(*) FROM samples WHERE tool_calls_text IS NULL").fetchall()[0][0]
    total = conn.execute(  # the rows whose bodies may hold calls: the others are filled '' in one statement first
        "SELECT count(*) FROM samples WHERE contains(coalesce(raw_response, ''), 'tool_calls') "
        "OR contains(coalesce(raw_response, ''), 'chunks_zlib64')"
    ).fetchall()[0][0]
    version = conn.execute("SELECT max(version) FROM schema_version").fetchall()[0][0]
    conn.close()
    assert version == 12 and total > 2 and nulls == total - 2  # the column and the two batches done are kept
    monkeypatch.setattr(tool_call_text, "_write", real)
    assert _ids(old, "get_weather") == _ids(recorded, "get_weather")
