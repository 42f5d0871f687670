"""The DuckDB store: round trips, resume anti-join, verdict history, filters, failures, migrations, and
DuckDB's errors surfacing as StoreErrors (the `store` fixture is conftest's empty store)."""

from __future__ import annotations

import duckdb
import pytest
from builders import kimi, make_capture, profile, put

from tokview.core.analysis import analyze
from tokview.store import LATEST_VERSION, SampleFilter, SchemaError, Store, StoreError, UnknownSample


def test_capture_round_trips_and_secrets_are_scrubbed(store, monkeypatch):
    monkeypatch.setenv("TOKVIEW_API_KEY", "sk-envkey")
    cap = make_capture()
    cap.raw_request["headers"] = {"Authorization": "Bearer sk-envkey", "note": "key sk-envkey inline"}
    sid = put(store, "p1", cap)
    got = store.load_sample(sid)
    assert got.capture.prompt_ids == cap.prompt_ids
    assert got.capture.output_ids == cap.output_ids
    assert got.capture.reasoning == cap.reasoning
    assert got.capture.usage == cap.usage
    assert got.capture.raw_request["api_key"] == "[redacted]"
    assert got.capture.raw_request["headers"]["Authorization"] == "[redacted]"
    assert "sk-envkey" not in got.capture.raw_request["headers"]["note"]
    assert got.status == "pending"
    assert got.valid
    assert got.n_errors == 0
    assert got.alignment
    assert set(got.alignment) <= {"kept", "partial", "hidden", "drift"}
    raw = store.query("SELECT raw_request FROM samples")[0][0]
    assert "sk-secret" not in raw
    assert "sk-envkey" not in raw


def test_findings_stored_with_codes_denormalised(store):
    sid = put(store, "p1", make_capture(finish_reason="length", stop=False))
    got = store.load_sample(sid)
    assert "truncated" in [f.code for f in got.findings]
    assert not got.valid
    assert got.n_errors >= 1
    row = store.samples_page()[0]
    assert "truncated" in row.codes
    assert row.n_errors == got.n_errors
    assert store.finding_codes() == sorted({f.code for f in got.findings})


def test_rewrite_is_idempotent_and_keeps_status(store):
    cap = make_capture()
    sid = put(store, "p1", cap)
    store.record_verdict(sid, "approved", who="ann")
    put(store, "p1", cap)
    assert store.count_samples() == 1
    assert store.load_sample(sid).status == "approved"
    assert len(store.load_sample(sid).findings) == len(analyze(cap, profile(), kimi()).findings)


def test_existing_sample_ids_is_an_anti_join(store):
    a = put(store, "p1", make_capture())
    assert store.existing_sample_ids([a, "nope", a]) == {a}
    assert store.existing_sample_ids([]) == set()


def test_verdict_history_and_undo(store):
    sid = put(store, "p1", make_capture())
    store.record_verdict(sid, "approved", who="ann", tags=("good",))
    store.record_verdict(sid, "rejected", reason="loops", note="reasoning repeats", tags=("loop",), who="bob")
    s = store.load_sample(sid)
    assert s.status == "rejected"
    assert s.tags == ["loop"]
    assert s.notes == ["reasoning repeats"]
    assert store.undo_verdict(sid) == "approved"
    assert store.load_sample(sid).status == "approved"
    assert store.undo_verdict(sid) == "pending"
    assert store.undo_verdict(sid) == "pending"  # nothing left to undo
    store.add_note(sid, "look again", who="ann", tags=("recheck",))
    s = store.load_sample(sid)
    assert [h["kind"] for h in s.history] == ["verdict", "verdict", "undo", "undo", "note"]
    assert "recheck" in s.tags
    assert "look again" in s.notes
    with pytest.raises(ValueError):
        store.record_verdict(sid, "maybe")
    with pytest.raises(UnknownSample):
        store.record_verdict("missing", "approved")


def test_filters_order_and_paging(store):
    ids = [put(store, f"p{i}", make_capture(answer="yes" if i % 2 else "no")) for i in range(6)]
    bad = put(store, "trunc", make_capture(finish_reason="length", stop=False), run_id="run2")
    store.record_verdict(ids[0], "approved")
    assert store.count_samples() == 7
    assert store.count_samples(SampleFilter(status="approved")) == 1
    assert store.count_samples(SampleFilter(run_id="run2")) == 1
    assert store.count_samples(SampleFilter(valid=False)) == 1
    assert [r.sample_id for r in store.samples_page(SampleFilter(code="truncated"))] == [bad]
    assert store.count_samples(SampleFilter(text="YES")) == 3
    assert store.count_samples(SampleFilter(text="trunc")) == 1
    page1 = store.samples_page(order_by="sample_id", offset=0, limit=4)
    page2 = store.samples_page(order_by="sample_id", offset=4, limit=4)
    assert [r.sample_id for r in page1 + page2] == sorted(ids + [bad])
    longest = store.samples_page(order_by="-output_len", limit=1)[0]
    assert longest.output_len == max(r.output_len for r in page1 + page2)
    with pytest.raises(ValueError):
        store.samples_page(order_by="output_ids; DROP TABLE samples")


def test_failures_runs_and_stats(store):
    store.put_run(
        "run1",
        settings={"temperature": 0},
        profile="kimi-k2.5",
        tokenizer_hash="abc",
        server_info=[{"url": "http://x", "kind": "vllm", "version": "0.16"}],
    )
    put(store, "p1", make_capture())
    put(store, "p2", make_capture(finish_reason="length", stop=False))
    store.put_failure("p3", "p3@x_gen0", "run1", "HTTP 500", server="http://x")
    st = store.stats()
    assert st["prompts"] == 2
    assert st["samples"] == 2
    assert st["valid"] == 1
    assert st["invalid"] == 1
    assert st["failures"] == {"total": 1, "by_reason": {"HTTP 500": 1}}
    assert st["findings"]["truncated"]["samples"] == 1
    assert st["truncated"] == 1
    assert st["output_len"]["max"] >= st["output_len"]["p50"] > 0
    runs = store.runs()
    assert runs[0]["run_id"] == "run1"
    assert runs[0]["samples"] == 2
    assert runs[0]["failures"] == 1
    assert runs[0]["server_info"][0]["kind"] == "vllm"


def test_schema_versioned_and_reopen(tmp_path):
    path = tmp_path / "v.duckdb"
    with Store(path) as s:
        put(s, "p1", make_capture())
    with Store(path) as s:
        assert s.count_samples() == 1
        assert s.query("SELECT max(version) FROM schema_version")[0][0] == LATEST_VERSION
    con = duckdb.connect(str(path))
    con.execute("INSERT INTO schema_version VALUES (999, 'future', now())")
    con.close()
    with pytest.raises(SchemaError):
        Store(path)


def test_memory_store_and_threads():
    import threading

    with Store(":memory:") as s:
        caps = [make_capture(answer=f"yes {i}") for i in range(8)]
        threads = [threading.Thread(target=put, args=(s, f"p{i}", c)) for i, c in enumerate(caps)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert s.count_samples() == 8


def test_ui_reads_go_through_store_methods(tmp_path, kimi_tok, kimi_profile):
    """run_ids / stored_conversations / length_distribution / finish_reasons: what the app's panels read."""
    from facts import KIMI_CHAIN_OUTPUT, KIMI_PROMPT_6X7

    from tokview.core.analysis import analyze
    from tokview.core.record import Capture

    messages = [{"role": "user", "content": "What is 6 times 7?"}]
    with Store(tmp_path / "s.duckdb") as store:
        for i, (out, finish) in enumerate([(KIMI_CHAIN_OUTPUT, "stop"), (KIMI_CHAIN_OUTPUT[:5], "length")]):
            cap = Capture(prompt_ids=KIMI_PROMPT_6X7, output_ids=out, finish_reason=finish, messages=messages)
            store.put_sample(f"s{i}", "p1", f"imported-{i}", cap, analyze(cap, kimi_profile, kimi_tok))
        store.put_run("imported-0")
        assert store.run_ids() == ["imported-0", "imported-1"]
        assert store.stored_conversations() == [("p1", messages, None)]
        assert store.length_distribution(163607) == ([18, 5], [9])
        assert store.finish_reasons() == {"stop": 1, "length": 1}
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
        chain = [*messages, {"role": "assistant", "content": "42."}, {"role": "user", "content": "And 6 times 8?"}]
        for turn, history in enumerate([messages, chain]):  # a chain: its latest turn's history, with its tools
            cap = Capture(
                prompt_ids=KIMI_PROMPT_6X7,
                output_ids=KIMI_CHAIN_OUTPUT,
                finish_reason="stop",
                messages=history,
                settings={"tools": tools},
            )
            store.put_sample(f"c{turn}", "p2", "imported-0", cap, analyze(cap, kimi_profile, kimi_tok), turn=turn)
        assert store.stored_conversations()[1] == ("p2", chain, tools)
        cap = Capture(prompt_ids=KIMI_PROMPT_6X7, output_ids=KIMI_CHAIN_OUTPUT, finish_reason="stop", messages=chain)
        store.put_sample("c2", "p2", "imported-0", cap, analyze(cap, kimi_profile, kimi_tok), turn=2)
        assert store.stored_conversations()[1] == ("p2", chain, None), "the latest turn's tools: it declared none"


def test_a_stored_sample_clears_its_earlier_failures(store, make_capture, put):
    store.put_failure("p1", "p1@s_gen0", "run1", "HTTP 500 after 3 retries")
    store.put_failure("p2", "p2@s_gen0", "run1", "HTTP 500 after 3 retries")
    put_id = put(store, "p1", make_capture())
    store.put_failure("p1", put_id, "run1", "HTTP 500 after 3 retries")
    put(store, "p1", make_capture())
    assert store.stats()["failures"]["total"] == 2  # the p1 failure (same sample id) went, p2's stays
    assert [r[0] for r in store.query("SELECT prompt_id FROM failures ORDER BY 1")] == ["p1", "p2"]


def test_duckdb_errors_become_store_errors(store, tmp_path, kimi_tok, kimi_profile, make_capture):
    from tokview.core.record import sample_id_for

    with pytest.raises(StoreError, match="Parser Error|syntax"):
        store.query("SELEC 1")
    with pytest.raises(StoreError):
        store.execute(f"COPY (SELECT 1 AS a) TO '{tmp_path}' (FORMAT parquet)")  # a directory
    cap = make_capture()
    analysis = analyze(cap, kimi_profile, kimi_tok)
    sid = sample_id_for("p1", cap.settings, 0, None)
    store.put_sample(sid, "p1", "run1", cap, analysis, new=True)
    with pytest.raises(StoreError):  # a write transaction that fails (the id is taken) is rolled back
        store.put_sample(sid, "p1", "run1", cap, analysis, new=True)
    assert store.query("SELECT 1") == [(1,)]  # the connection is still usable
    assert store.count_samples() == 1
    assert store.load_sample(sid).capture.output_ids == cap.output_ids


def test_put_sample_new_skips_the_lookup_and_none_still_checks(store, kimi_tok, kimi_profile, make_capture):
    from builders import SETTINGS

    from tokview.core.record import sample_id_for

    cap = make_capture()
    analysis = analyze(cap, kimi_profile, kimi_tok)
    sid = sample_id_for("p1", SETTINGS, 0, None)
    store.put_failure("p1", sid, "run1", "HTTP 500 after 3 retries")
    store.put_sample(sid, "p1", "run1", cap, analysis, new=True)
    assert store.stats()["failures"]["total"] == 0  # a new sample still clears its earlier failures
    with pytest.raises(StoreError):  # new=True is a plain INSERT: no lookup, so a wrong claim is refused
        store.put_sample(sid, "p1", "run1", cap, analysis, new=True)
    store.record_verdict(sid, "approved")
    store.put_sample(sid, "p1", "run1", cap, analysis)  # None: looked up, upserted, status kept
    assert store.count_samples() == 1
    assert store.load_sample(sid).status == "approved"


def test_a_version_1_file_migrates_to_2_with_its_data_and_a_failures_index(tmp_path):
    from tokview.store.schema import MIGRATIONS

    path = tmp_path / "v1.duckdb"
    conn = duckdb.connect(str(path))
    conn.execute("CREATE TABLE schema_version (version INTEGER, name VARCHAR, applied_at TIMESTAMP)")
    version, name, statements = MIGRATIONS[0]
    for sql in statements:
        conn.execute(sql)
    conn.execute("INSERT INTO schema_version VALUES (?, ?, now())", [version, name])
    conn.execute("INSERT INTO failures VALUES ('p1', 'p1@s_gen0', 'run1', 'HTTP 500', now(), NULL)")
    conn.close()
    with Store(path) as s:
        assert s.query("SELECT max(version) FROM schema_version") == [(LATEST_VERSION,)]
        assert s.query("SELECT index_name FROM duckdb_indexes() WHERE table_name = 'failures'") == [
            ("failures_sample_idx",)
        ]
        assert s.stats()["failures"]["total"] == 1


def test_a_new_store_in_one_script_has_the_schema_the_migrations_build_one_by_one(tmp_path):
    """A new file gets every migration in one transaction (`schema._create`): the same tables, columns,
    defaults, indexes, sequences and version rows as a version-1 file migrated step by step."""
    from tokview.store.schema import MIGRATIONS

    stepwise = tmp_path / "steps.duckdb"
    conn = duckdb.connect(str(stepwise))
    conn.execute("CREATE TABLE schema_version (version INTEGER, name VARCHAR, applied_at TIMESTAMP)")
    for version, name, statements in MIGRATIONS:  # each as its own transaction, statement by statement
        conn.execute("BEGIN TRANSACTION")
        for sql in statements:
            conn.execute(sql)
        conn.execute("INSERT INTO schema_version VALUES (?, ?, now())", [version, name])
        conn.execute("COMMIT")
    conn.close()
    Store(tmp_path / "new.duckdb").close()

    def catalog(path):
        con = duckdb.connect(str(path), read_only=True)
        try:
            return (
                con.execute(
                    "SELECT table_name, column_index, column_name, data_type, column_default, is_nullable "
                    "FROM duckdb_columns() WHERE schema_name = 'main' ORDER BY table_name, column_index"
                ).fetchall(),
                con.execute(
                    "SELECT table_name, index_name, sql FROM duckdb_indexes() ORDER BY table_name, index_name"
                ).fetchall(),
                con.execute("SELECT sequence_name, start_value FROM duckdb_sequences() ORDER BY 1").fetchall(),
                con.execute(
                    "SELECT table_name, constraint_type, constraint_text FROM duckdb_constraints() ORDER BY 1, 2, 3"
                ).fetchall(),
                con.execute("SELECT version, name FROM schema_version ORDER BY version").fetchall(),
            )
        finally:
            con.close()

    assert catalog(tmp_path / "new.duckdb") == catalog(stepwise)
    assert catalog(stepwise)[4][-1][0] == LATEST_VERSION


def test_search_finds_a_pasted_sample_id_and_a_raw_captures_text(tmp_path):
    """`_` and `%` are literal in a search (DuckDB's ILIKE needs ESCAPE to honour the backslash: a pasted
    sample id matched nothing), and a raw-mode capture's answer, kept only in `text`, is searched too."""
    import dataclasses

    from builders import make_capture, put

    from tokview.store import SampleFilter

    with Store(tmp_path / "s.duckdb") as store:
        sid = put(store, "p_1", make_capture())
        raw = dataclasses.replace(make_capture(answer="zebra crossing"), content=None, reasoning=None)
        raw.text = "zebra crossing"
        other = put(store, "p2", raw)
        assert [r.sample_id for r in store.samples_page(SampleFilter(text=sid))] == [sid]
        assert [r.sample_id for r in store.samples_page(SampleFilter(text="p_1"))] == [sid]
        assert store.samples_page(SampleFilter(text="p%1")) == []
        assert [r.sample_id for r in store.samples_page(SampleFilter(text="ZEBRA"))] == [other]
