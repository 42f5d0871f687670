"""A store file's host instance (`store/connection.py`) is closed once it has attached the file HOST_ATTACHES times:
the memory a query over the whole store took stays in a living DuckDB instance after its DETACH, and a proxy's
recorder, which attaches its store for every landing, grew for as long as it ran (~90 MB every 12,000 requests)."""

from __future__ import annotations

from builders import kimi, make_capture, profile

from tokview.core.analysis import analyze
from tokview.store import Store, connection


def test_a_host_instance_is_closed_after_its_attaches_and_the_store_reads_on(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(connection, "HOST_ATTACHES", 3)
    monkeypatch.setattr(connection, "LINGER_S", 0.0)  # every operation attaches and detaches
    db = tmp_path / "s.duckdb"
    capture = make_capture()
    with Store(db) as store:
        store.put_run("r", profile="kimi-k2.5", tokenizer_hash="t")
        store.put_sample("s1", "p1", "r", capture, analyze(capture, profile(), kimi()), gen_index=0)
    real = str(db.resolve())
    hosts = []
    for _ in range(7):
        with Store(db) as store:
            assert store.query("SELECT count(*) FROM samples")[0][0] == 1
            hosts.append(connection._HOSTS[real])  # kept: an id() could come back for a new one
        connection.close_lingering_files()
    assert len({id(h) for h in hosts}) >= 2, "the instance was never replaced"
    assert real not in connection._HOSTS or connection._ATTACHES[real] < 3
