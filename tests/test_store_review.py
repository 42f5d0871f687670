"""Store review fixes: credentials never reach the file, failures cleared on success, DuckDB errors are StoreErrors."""

from __future__ import annotations

import pytest

from tokview.store import Store, StoreError
from tokview.store.records import scrub

from test_store_fixtures import make_capture, put


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
    store.put_failure("p2", "p2@x_gen0", "run1", "HTTP 401: invalid api key sk-envkey",
                      server="http://alice:tok3n@127.0.0.1:8000")
    dump = " ".join(str(v) for table in ("samples", "runs", "failures")
                    for row in store.query(f"SELECT * FROM {table}") for v in row)
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
