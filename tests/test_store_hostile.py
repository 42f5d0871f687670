"""The store against hostile input: odd parts, server text no encoder takes, read-only stores,
exports aimed at other stores, closed pipes. Driven through the real commands where a user meets them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from builders import kimi, make_capture, profile, put

from tokview.cli import main
from tokview.core.analysis import analyze
from tokview.store import SampleIdentity, Store
from tokview.store.parts import DAMAGED_DIR, complete_parts, dumps_lines

ROOT = Path(__file__).resolve().parents[1]
TOKVIEW = [sys.executable, "-c", "import sys; from tokview.cli import main; sys.exit(main())"]


def _record(store: Store, sid: str, prompt: str = "p1") -> dict:
    cap = make_capture("what is the answer")
    return store.sample_record(SampleIdentity(sid, prompt, "run1", gen_index=0), cap, analyze(cap, profile(), kimi()))


def _ids(db: Path) -> list[str]:
    with Store(db) as store:
        return sorted(r[0] for r in store.query("SELECT sample_id FROM samples"))


# -- a lone surrogate from a server never stops a part being written ------------------------------------


def test_a_lone_surrogate_in_a_failure_reason_is_written_and_landed_as_its_escape(tmp_path):
    """A server error body `{"error": "\\ud800"}` parses to a str holding a lone surrogate: orjson refused it
    and the exception killed the batch's writer thread. It is stored as the escape the server sent."""
    db = tmp_path / "s.duckdb"
    with Store(db) as store:
        sample = _record(store, "a")
        sample["text"] = "answer \ud800 end"
        store.write_part(
            [sample], [{"prompt_id": "p2", "sample_id": "b", "run_id": "run1", "reason": 'HTTP 500: {"e": "\ud800x"}'}]
        )
        assert store.ingest() == (1, 1)
        assert store.query("SELECT text FROM samples")[0][0] == "answer \\ud800 end"
        assert store.query("SELECT reason FROM failures")[0][0] == 'HTTP 500: {"e": "\\ud800x"}'
    assert main(["stats", "--db", str(db)]) == 0


def test_dumps_lines_escapes_surrogates_anywhere_and_leaves_other_text_alone():
    line = dumps_lines([{"k\udfff": ["\ud83d", {"x": "ok é \U0001f600"}], "n": 5}])
    assert json.loads(line) == {"k\\udfff": ["\\ud83d", {"x": "ok é \U0001f600"}], "n": 5}


# -- items 7 and 17: a part that cannot land is set aside, everything else lands -------------------------


def test_a_type_invalid_line_is_set_aside_and_every_other_line_and_part_lands(tmp_path):
    db = tmp_path / "s.duckdb"
    with Store(db) as store:
        store.write_part([_record(store, "a")])
        bad = _record(store, "b")
        bad["prompt_ids"] = "oops"
        store.write_part([_record(store, "c"), bad, _record(store, "d")])
        store.write_part([_record(store, "e")])
        bad_part = complete_parts(store.parts_dir)[0][1]
    result = subprocess.run([*TOKVIEW, "stats", "--db", str(db)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert f"1 damaged part(s) set aside in {db}.parts/{DAMAGED_DIR} (2 whole lines of them kept)" in result.stderr
    assert _ids(db) == ["a", "c", "d", "e"]
    aside = Path(f"{db}.parts") / DAMAGED_DIR / bad_part.name
    assert aside.read_bytes().count(b"\n") == 3  # the original, whole, for a person to look at
    assert complete_parts(Path(f"{db}.parts")) == ([], [])


def test_a_failure_line_of_the_wrong_type_is_set_aside_and_the_rest_lands(tmp_path):
    db = tmp_path / "s.duckdb"
    with Store(db) as store:
        store.write_part([_record(store, "a")], [{"prompt_id": "p1", "sample_id": "x", "reason": "HTTP 500"}])
        parts_dir = store.parts_dir
    odd = parts_dir / "part-00000000000000000009-1-000002.failures.jsonl"
    odd.write_text(json.dumps({"prompt_id": "p", "sample_id": "y", "reason": "r", "at": "not a time"}) + "\n")
    assert main(["stats", "--db", str(db)]) == 0
    with Store(db) as store:
        assert store.query("SELECT sample_id FROM failures") == [("x",)]
    assert _ids(db) == ["a"]
    assert (parts_dir / DAMAGED_DIR / odd.name).is_file()


def test_odd_parts_a_directory_and_a_null_reason_cause_no_error_on_later_commands(tmp_path, capsys):
    db = tmp_path / "s.duckdb"
    with Store(db) as store:
        put(store, "p0", make_capture())
        store.write_part([_record(store, "a")])
        parts_dir = store.parts_dir
    (parts_dir / "part-00000000000000000009-1-000001.samples.jsonl").mkdir()
    (parts_dir / "part-00000000000000000009-1-000002.failures.jsonl").write_text(
        json.dumps({"prompt_id": "p", "sample_id": "y", "run_id": "r", "reason": None, "server": None}) + "\n"
    )
    for argv in (["stats", "--db", str(db)], ["stats", "--db", str(db), "--json"]):
        assert main(argv) == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    assert "internal error" not in err
    assert err.count("000001.samples.jsonl in ") == 1 and "is not a file: set aside" in err  # said, once
    out = tmp_path / "o.jsonl"
    assert main(["export", "--db", str(db), "--select", "all", "--out", str(out)]) == 0
    errors = [json.loads(line) for line in (tmp_path / "o.errors.jsonl").read_text().splitlines()]
    assert [e["metadata"]["sample_id"] for e in errors] == ["y"]
    assert errors[0]["metadata"]["error"]  # says no reason was recorded, never null
    assert (parts_dir / DAMAGED_DIR / "part-00000000000000000009-1-000001.samples.jsonl").is_dir()
    assert len(_ids(db)) == 2


# -- an export into a pipe the reader closed ends like `stats | head` ------------------------------------


def test_export_to_a_pipe_the_reader_closes_exits_141_quietly(tmp_path):
    db = tmp_path / "s.duckdb"
    with Store(db) as store:
        store.write_part([_record(store, f"s{i}", f"p{i}") for i in range(200)])  # ~1 MB: more than a pipe holds
    proc = subprocess.Popen(
        [*TOKVIEW, "export", "--db", str(db), "--select", "all", "--out", "-"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
    )
    assert json.loads(proc.stdout.readline())["id"]  # `| head -1`
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141
    assert err == "", err
    assert not list(tmp_path.glob("*.partial"))


# -- an export never overwrites another store or any DuckDB file -----------------------------------------


def test_an_export_onto_another_store_or_duckdb_file_is_refused_and_changes_nothing(tmp_path, capsys):
    import hashlib

    import duckdb

    db, other = tmp_path / "s.duckdb", tmp_path / "other.duckdb"
    for path in (db, other):
        with Store(path) as store:
            put(store, "p1", make_capture())
    plain = tmp_path / "plain.db"  # any DuckDB file, not a store
    with duckdb.connect(str(plain)) as con:
        con.execute("CREATE TABLE t AS SELECT 42 AS x")
    (tmp_path / "other.duckdb.parts").mkdir()
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in (other, plain)}
    for fmt, out in (
        ("speculators", other),
        ("parquet", plain.with_suffix(".parquet")),  # a control: a new file
        ("sharegpt", plain),
        ("speculators", tmp_path / "other.duckdb.wal"),
        ("speculators", tmp_path / "other.duckdb.parts" / "x.jsonl"),
    ):
        code = main(["export", "--db", str(db), "--format", fmt, "--select", "all", "--out", str(out)])
        err = capsys.readouterr().err
        if out.suffix == ".parquet":
            assert code == 0, err
            continue
        assert code == 1, err
        assert len(err.strip().splitlines()) == 1, err
        assert "refusing to overwrite" in err, err
        assert "choose another file" in err, err
    assert {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in (other, plain)} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [
            "s.duckdb",
            "other.duckdb",
            "other.duckdb.parts",
            "plain.db",
            "plain.parquet",
            "plain.parquet.manifest.json",
            "plain.parquet.token_freq.json",
        ]
    )
    assert list((tmp_path / "other.duckdb.parts").iterdir()) == []


# -- a store on a read-only file system is read without writing ------------------------------------------


def test_a_store_on_a_read_only_file_system_is_read_and_its_parts_reported(read_only_mount, tmp_path, capsys):
    where, make_read_only = read_only_mount
    db = where / "s.duckdb"
    with Store(db) as store:
        sid = put(store, "p1", make_capture())
        store.write_part([_record(store, "left-in-a-part")])
    make_read_only()
    for argv in (
        ["stats", "--db", str(db)],
        ["stats", "--db", str(db), "--json"],
        ["show", "--db", str(db), sid],
        ["export", "--db", str(db), "--select", "all", "--out", str(tmp_path / "o.jsonl")],
        ["export", "--db", str(db), "--select", "all", "--format", "parquet", "--out", str(tmp_path / "o.parquet")],
    ):
        code = main(argv)
        err = capsys.readouterr().err
        assert code == 0, (argv, err)
        assert f"1 part(s) beside {db} are not landed: the store is read-only" in err, err
    assert len((tmp_path / "o.jsonl").read_text().splitlines()) == 1  # what is landed; the part stays a part
    with Store(tmp_path / "shard.duckdb") as shard:
        put(shard, "p2", make_capture())
    assert main(["merge", str(tmp_path / "shard.duckdb"), "--into", str(db)]) == 1
    err = capsys.readouterr().err  # it was DuckDB's refusal of an INSERT, under "cannot merge shard.duckdb"
    assert err.endswith(f"\ntokview: error: {db} cannot be written (read-only): nothing merged; pass another --into\n")
    assert len(complete_parts(Path(f"{db}.parts"))[0]) == 1
    with Store(db) as store:
        assert store.read_only
        with pytest.raises(Exception, match="read-only"):
            store.record_verdict(sid, "approved")


def test_a_read_only_store_of_an_older_schema_is_read_when_no_table_changed_since(read_only_mount, monkeypatch):
    """Schema 9 only marks that a stream's chunks may be stored packed: a version-8 store holds none, so it reads
    as it is where it cannot be upgraded (read here as a tokview of schema 9). Version 7 lacks the actions table of
    version 8: refused, as before. Schema 10 adds the columns of prompts stored past a key turn: every older store is
    refused read-only by this tokview (opened once with write access, it is upgraded). Schema 11 only marks that a
    request's messages may be stored once, in their column: a version-10 store read as it was, until schema 12
    added the column of the answer's tool calls as text, which refuses every older store read-only again."""
    import duckdb

    from tokview.store import LATEST_VERSION, schema
    from tokview.store.schema import MIGRATIONS, SchemaError

    where, make_read_only = read_only_mount
    assert [n for n, _, statements in MIGRATIONS if not statements] == [9, 11] and LATEST_VERSION == 12
    for version in (9, 10):
        db = where / f"v{version}.duckdb"
        Store(db).close()
        conn = duckdb.connect(str(db))
        conn.execute("DELETE FROM schema_version WHERE version > ?", [version])
        conn.close()
    for version in (8, 7):
        db = where / f"v{version}.duckdb"
        with Store(db) as store:
            sid = put(store, "p1", make_capture())
        conn = duckdb.connect(str(db))
        conn.execute("DELETE FROM schema_version WHERE version > ?", [version])  # the version's row is its mark
        conn.close()
    monkeypatch.setattr(schema, "MIGRATIONS", [m for m in MIGRATIONS if m[0] <= 9])
    monkeypatch.setattr(schema, "LATEST_VERSION", 9)
    make_read_only()
    with Store(where / "v8.duckdb") as store:
        assert store.read_only
        assert store.load_sample(sid).capture.output_ids == make_capture().output_ids
    with pytest.raises(SchemaError, match="schema version 7; this tokview reads version 9"):
        Store(where / "v7.duckdb")
    monkeypatch.undo()
    with pytest.raises(SchemaError, match="schema version 9; this tokview reads version 12"):
        Store(where / "v9.duckdb")
    with pytest.raises(SchemaError, match="schema version 10; this tokview reads version 12"):
        Store(where / "v10.duckdb")


# -- one training file never mixes two vocabularies -------------------------------------------------------


def test_an_export_across_runs_of_two_tokenizers_is_refused_even_with_tokenizer(
    tmp_path, capsys, kimi_tok_dir, kimi_tok, qwen_tok_dir, qwen_tok
):
    db = tmp_path / "s.duckdb"
    with Store(db) as store:
        store.put_run("r1", tokenizer_dir=str(kimi_tok_dir), tokenizer_hash=kimi_tok.fingerprint(), profile="kimi-k2.5")
        store.put_run("r2", tokenizer_dir=str(qwen_tok_dir), tokenizer_hash=qwen_tok.fingerprint(), profile="kimi-k2.5")
        put(store, "p1", make_capture(), run_id="r1")
        put(store, "p2", make_capture(), run_id="r2")
    out = tmp_path / "o.jsonl"
    base = ["export", "--db", str(db), "--select", "all", "--out", str(out)]
    for extra in ([], ["--tokenizer", str(kimi_tok_dir)]):  # with --tokenizer too: the refusal asks for --run
        assert main(base + extra) == 1
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1, err
        assert "--run" in err, err
        assert "r1, r2" in err, err
        assert not out.exists()
    assert main([*base, "--run", "r1"]) == 0
    assert len(out.read_text().splitlines()) == 1


# -- low items: what merge and export say about a path that is not a store --------------------------------


def test_merge_and_export_name_a_file_or_folder_that_is_not_a_store(tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "a", "prompt": "x"}\n')
    folder = tmp_path / "runs"
    folder.mkdir()
    into = tmp_path / "m.duckdb"
    cases = (
        (["merge", str(prompts), "--into", str(into)], f"{prompts} is not a DuckDB database"),
        (["merge", str(folder), "--into", str(into)], f"{folder} is a directory"),
        (["export", "--db", str(folder), "--out", str(tmp_path / "o.jsonl")], f"{folder} is a directory"),
    )
    for argv, said in cases:
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert said in err, err
        assert "read-only" not in err, err
        assert len(err.strip().splitlines()) == 1, err
    assert prompts.read_text() == '{"id": "a", "prompt": "x"}\n'


def test_a_store_deleted_while_open_is_said_gone_and_never_made_again(tmp_path):
    """The sessions screen polls its store every second: with the file moved away, each poll's open made an empty
    DuckDB file at the path (and failed on its missing tables), so a later `tokview ui` or `batch` found an empty
    "store" there."""
    from tokview.store.errors import StoreError

    db = tmp_path / "gone.duckdb"
    store = Store(db)
    put(store, "p", make_capture())
    store._file.release(force=True)
    db.rename(tmp_path / "moved.duckdb")
    with pytest.raises(StoreError, match="is gone \\(deleted or moved while tokview had it open\\)"):
        store.query("SELECT count(*) FROM samples")
    assert not db.exists()
    store.close()


def test_a_part_this_process_cannot_read_is_set_aside_and_the_others_land(tmp_path, monkeypatch, capsys):
    """A part of mode 000 (another user's, or chmod'ed) made every landing fail, the good parts' too: `batch` on the
    store exited 1 each time and `merge` left the good parts out. (Root reads anything: os.access says what an
    unprivileged process would be told.)"""
    import os

    db = tmp_path / "u.duckdb"
    with Store(db) as store:
        put(store, "p0", make_capture())
        parts_dir = store.parts_dir
        store.write_part([_record(store, "good", "pg")])
        [good] = parts_dir.glob("*.samples.jsonl")
        store.write_part([_record(store, "locked", "pl")])
        [bad] = [p for p in parts_dir.glob("*.samples.jsonl") if p != good]
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != bad and real_access(path, mode))
    assert main(["stats", "--db", str(db)]) == 0
    assert "cannot be read: set aside" in capsys.readouterr().err
    assert (parts_dir / DAMAGED_DIR / bad.name).exists() and not good.exists()
    assert "good" in _ids(db) and "locked" not in _ids(db)
