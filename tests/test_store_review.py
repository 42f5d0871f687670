"""Store review fixes: credentials never reach the file, failures cleared on success, DuckDB errors are StoreErrors."""

from __future__ import annotations

import pytest
from test_store_fixtures import make_capture, put

from tokview.store import Store, StoreError
from tokview.store.records import scrub


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "t.duckdb") as s:
        yield s


def test_scrub_strips_url_userinfo_and_masks_the_env_key(monkeypatch):
    monkeypatch.setenv("TOKVIEW_API_KEY", "sk-envkey")
    assert scrub("http://user:tok3n@10.0.0.1:8000/v1") == "http://10.0.0.1:8000/v1"
    assert scrub("POST https://tok3n@h/generate failed") == "POST https://h/generate failed"
    assert scrub({"reason": "401: bad key sk-envkey"}) == {"reason": "401: bad key [redacted]"}
    assert scrub("Authorization: Bearer abc.def") == "Authorization: Bearer [redacted]"
    assert scrub("http://127.0.0.1:8000/generate") == "http://127.0.0.1:8000/generate"  # nothing to hide


def test_credentials_never_reach_the_database_file(store, monkeypatch, tmp_path):
    monkeypatch.setenv("TOKVIEW_API_KEY", "sk-envkey")
    cap = make_capture()
    cap.server_url = "http://alice:tok3n@127.0.0.1:8000"
    cap.raw_request["url"] = "http://alice:tok3n@127.0.0.1:8000/v1/chat/completions"
    put(store, "p1", cap)
    store.put_run("run1", server_info=[{"url": "http://alice:tok3n@127.0.0.1:8000", "kind": "vllm"}])
    store.put_failure(
        "p2", "p2@x_gen0", "run1", "HTTP 401: invalid api key sk-envkey", server="http://alice:tok3n@127.0.0.1:8000"
    )
    dump = " ".join(
        str(v)
        for table in ("samples", "runs", "failures")
        for row in store.query(f"SELECT * FROM {table}")
        for v in row
    )
    assert "tok3n" not in dump and "sk-envkey" not in dump and "alice" not in dump
    assert "127.0.0.1:8000" in dump


def test_a_stored_sample_clears_its_earlier_failures(store):
    store.put_failure("p1", "p1@s_gen0", "run1", "HTTP 500 after 3 retries")
    store.put_failure("p2", "p2@s_gen0", "run1", "HTTP 500 after 3 retries")
    put_id = put(store, "p1", make_capture())
    store.put_failure("p1", put_id, "run1", "HTTP 500 after 3 retries")
    put(store, "p1", make_capture())
    assert store.stats()["failures"]["total"] == 2  # the p1 failure (same sample id) went, p2's stays
    assert [r[0] for r in store.query("SELECT prompt_id FROM failures ORDER BY 1")] == ["p1", "p2"]


def test_duckdb_errors_become_store_errors(store, tmp_path):
    with pytest.raises(StoreError, match="Parser Error|syntax"):
        store.query("SELEC 1")
    with pytest.raises(StoreError):
        store.execute(f"COPY (SELECT 1 AS a) TO '{tmp_path}' (FORMAT parquet)")  # a directory
    with pytest.raises(StoreError):
        store._tx([("INSERT INTO nope VALUES (1)", [])])
    assert store.query("SELECT 1") == [(1,)]  # the connection is still usable


PROSE = "Explain the basic idea of a bearer token; my page is https://alice@example.com/x"


def test_ordinary_prose_is_stored_unchanged_while_secrets_are_masked(tmp_path, monkeypatch):
    """Payloads keep every word a person wrote; only secret-named keys and known secret values go."""
    monkeypatch.setenv("TOKVIEW_API_KEY", "sk-envkey")
    cap = make_capture(question=PROSE + " (key sk-envkey)")
    cap.raw_request = {
        "url": "http://bob:pw-s3cret@127.0.0.1:8000/v1/chat/completions",
        "headers": {"Authorization": "Bearer abc.def"},
        "body": {"messages": cap.messages},
    }
    cap.raw_response = {"choices": [{"message": {"content": "a basic idea: " + PROSE}}]}
    with Store(tmp_path / "p.duckdb", server_urls=["http://carol:c4rol-pw@127.0.0.1:8000"]) as store:
        sid = put(store, "p1", cap)
        cap2 = make_capture(question="carol's password is c4rol-pw")
        put(store, "p2", cap2)
        got = store.load_sample(sid).capture
        assert got.messages[-1]["content"] == PROSE + " (key [redacted])"
        assert got.raw_request["body"]["messages"][-1]["content"] == PROSE + " (key [redacted])"
        assert got.raw_response["choices"][0]["message"]["content"] == "a basic idea: " + PROSE
        assert got.raw_request["headers"]["Authorization"] == "[redacted]"
        assert got.raw_request["url"] == "http://127.0.0.1:8000/v1/chat/completions"
        assert "pw-s3cret" not in str(got.raw_request)
        other = store.load_sample(put(store, "p2", cap2)).capture
        assert other.messages[-1]["content"] == "[redacted]'s password is [redacted]"  # the configured URL's


def test_put_sample_new_skips_the_lookup_and_none_still_checks(store):
    from test_store_fixtures import SETTINGS, kimi, profile

    from tokview.core.analysis import analyze
    from tokview.core.record import sample_id_for

    cap = make_capture()
    analysis = analyze(cap, profile(), kimi())
    sid = sample_id_for("p1", SETTINGS, 0, None)
    store.put_failure("p1", sid, "run1", "HTTP 500 after 3 retries")
    store.put_sample(sid, "p1", "run1", cap, analysis, new=True)
    assert store.stats()["failures"]["total"] == 0  # a new sample still clears its earlier failures
    with pytest.raises(StoreError):  # new=True is a plain INSERT: no lookup, so a wrong claim is refused
        store.put_sample(sid, "p1", "run1", cap, analysis, new=True)
    store.record_verdict(sid, "approved")
    store.put_sample(sid, "p1", "run1", cap, analysis)  # None: looked up, upserted, status kept
    assert store.count_samples() == 1 and store.load_sample(sid).status == "approved"


def test_a_version_1_file_migrates_to_2_with_its_data_and_a_failures_index(tmp_path):
    import duckdb

    from tokview.store.schema import LATEST_VERSION, MIGRATIONS

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
