"""`tokview stats` and `tokview export` on the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from builders import make_capture, put

from tokview.store import Store

ROOT = Path(__file__).resolve().parents[1]
TOKVIEW = [sys.executable, "-c", "import sys; from tokview.cli import main; sys.exit(main())"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*TOKVIEW, *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


def _db(tmp_path: Path) -> Path:
    db = tmp_path / "s.duckdb"
    with Store(db) as store:
        a = put(store, "p1", make_capture())
        put(store, "p2", make_capture(finish_reason="length", stop=False))
        put(store, "p3", make_capture(answer="yes"))
        store.record_verdict(a, "approved")
        store.put_failure("p4", None, "run1", "HTTP 503 after 3 retries")
    return db


def test_stats_text_and_json(tmp_path):
    db = _db(tmp_path)
    text = _cli("stats", "--db", str(db))
    assert text.returncode == 0, text.stderr
    assert "samples   3  (pending 2, approved 1, rejected 0)" in text.stdout
    assert "HTTP 503 after 3 retries" in text.stdout
    assert "truncated [error]" in text.stdout
    assert "prompts   3  (+1 with failures only)" in text.stdout  # p4 failed: said beside `failures 1`
    js = json.loads(_cli("stats", "--db", str(db), "--json").stdout)
    assert (js["prompts"], js["prompts_failed_only"]) == (3, 1)
    assert js["invalid"] == 1
    assert js["failures"]["total"] == 1
    assert js["output_len"]["max"] >= js["output_len"]["p50"]
    missing = _cli("stats", "--db", str(tmp_path / "none.duckdb"))
    assert missing.returncode == 1
    assert "not found" in missing.stderr


def test_export_cli_selects_and_writes_sidecars(tmp_path):
    db = _db(tmp_path)
    out = tmp_path / "out" / "train.jsonl"
    done = _cli("export", "--db", str(db), "--out", str(out), "--select", "approved")
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert len(out.read_text().splitlines()) == 1
    manifest = json.loads((out.parent / "train.manifest.json").read_text())
    assert manifest["counts"]["exported"] == 1
    assert manifest["select"] == "approved"
    assert json.loads((out.parent / "train.token_freq.json").read_text())
    valid = _cli("export", "--db", str(db), "--out", str(tmp_path / "v.parquet"), "--format", "parquet")
    assert valid.returncode == 0
    assert "exported 2 of 2" in valid.stderr
    none = _cli("export", "--db", str(db), "--out", str(tmp_path / "n.jsonl"), "--run", "nope")
    assert none.returncode == 1
    assert "no samples match" in none.stderr
    assert "Traceback" not in none.stderr


def test_stats_samples_lists_ids_that_show_takes(tmp_path, capsys):
    from tokview.cli import main

    db = _db(tmp_path)
    assert main(["stats", "--db", str(db), "--samples"]) == 0
    out = capsys.readouterr().out.splitlines()
    listed = [line.split("\t") for line in out[out.index(next(x for x in out if x.startswith("sample ids"))) + 1 :]]
    assert "sample ids (all 3;" in out[-4]
    with Store(db) as store:
        stored = {r.sample_id: r for r in store.samples_page(limit=10)}
    assert sorted(row[0] for row in listed) == sorted(stored)
    by_id = {row[0]: row for row in listed}
    truncated = next(r for r in stored.values() if r.finish_reason == "length")
    assert by_id[truncated.sample_id][1:] == ["pending", "invalid", "length", ",".join(truncated.codes)]
    assert main(["show", "--db", str(db), listed[0][0]]) == 0  # the listed id is what show takes
    capsys.readouterr()
    for outside in ("-5", "100000"):  # clamped to the first or last position without a word, once
        assert main(["show", "--db", str(db), listed[0][0], "--from", outside]) == 1
        assert f"--from {outside} is outside the sample's positions 0.." in capsys.readouterr().err
    assert main(["stats", "--db", str(db), "--samples", "--limit", "2", "--json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert js["samples"] == 3
    assert len(js["sample_list"]) == 2
    assert set(js["sample_list"][0]) == {"sample_id", "status", "valid", "finish_reason", "codes"}
    assert main(["stats", "--db", str(db), "--samples", "--limit", "0"]) == 1
    capsys.readouterr()
    assert main(["stats", "--db", str(db), "--samples", "--limit", str(10**23), "--json"]) == 0  # all of them
    assert len(json.loads(capsys.readouterr().out)["sample_list"]) == 3
    assert main(["stats", "--db", str(db), "--limit", "2"]) == 1  # no list to limit: said, not ignored
    assert "--limit counts the listed samples: give --samples too" in capsys.readouterr().err


def test_a_missing_database_names_the_flag(tmp_path, capsys):
    from tokview.cli import main

    missing = tmp_path / "none.duckdb"
    for argv in (["stats", "--db", str(missing)], ["export", "--db", str(missing), "--out", str(tmp_path / "o.jsonl")]):
        assert main(argv) == 1
        assert f"database not found: {missing} (pass --db PATH)" in capsys.readouterr().err
    assert not missing.exists()


def test_stats_into_a_closed_pipe_exits_quietly(tmp_path):
    # `tokview stats | head`: the reader goes away before tokview writes; no "Broken pipe" error line
    db = _db(tmp_path)
    proc = subprocess.Popen(
        [*TOKVIEW, "stats", "--db", str(db), "--samples"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT
    )
    proc.stdout.close()  # the reader is gone before the first write
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141
    assert err == "", err


def test_failures_are_listed_by_reason_class(tmp_path):
    db = tmp_path / "f.duckdb"
    with Store(db) as store:
        for i in range(3):
            store.put_failure(
                f"p{i}", None, "run1", f"HTTP 500 from POST /generate: worker {i} crashed (gave up after 4 attempts)"
            )
        store.put_failure(
            "p9",
            None,
            "run1",
            "over_max_length: the prompt has 9000 tokens; the server's "
            "max_model_len is 2048, which leaves no room for output",
        )
    out = _cli("stats", "--db", str(db))
    lines = [line.strip() for line in out.stdout.splitlines()]
    assert any(
        line.startswith("3  HTTP 500 from POST /generate  (e.g. HTTP 500 from POST /generate: worker") for line in lines
    ), out.stdout
    assert any(line.startswith("1  over_max_length  (e.g. over_max_length: the prompt has 9000") for line in lines)
    js = json.loads(_cli("stats", "--db", str(db), "--json").stdout)
    assert js["failures"]["by_class"] == {"HTTP 500 from POST /generate": 3, "over_max_length": 1}


def test_an_id_stats_lists_escaped_is_taken_by_show_as_printed(tmp_path, capsys):
    """A sample id holding a control character or a bidi override is listed escaped (the terminal stays safe), so it
    could not be pasted into `show`: it said "no sample". `show` now reads the escapes back when the id as given is
    not stored."""
    from tokview.cli import main

    db = tmp_path / "odd.duckdb"
    with Store(db) as store:
        odd = put(store, "odd\x1b]0;owned\x07\u202e\tid", make_capture())
    assert main(["stats", "--db", str(db), "--samples"]) == 0
    [line] = [x for x in capsys.readouterr().out.splitlines() if x.startswith("odd")]
    printed = line.split("\t")[0]
    assert "\x1b" not in printed and printed != odd
    assert main(["show", "--db", str(db), printed]) == 0
    assert "owned" in capsys.readouterr().out
    assert main(["show", "--db", str(db), printed + "x"]) == 1
    capsys.readouterr()
    assert main(["show", "--db", str(db), "nope\\ud800"]) == 1  # read back, a lone surrogate: no stored id holds one
    assert "no sample 'nope\\\\ud800'" in capsys.readouterr().err


def test_an_empty_store_says_n_a_and_json_is_strict(tmp_path, capsys):
    """An empty store printed `p50 None … mean None`; a NaN a store held went into `--json` as `NaN`, which strict
    JSON readers refuse (`jq`)."""
    import dataclasses
    import math

    from tokview.cli import main

    db = tmp_path / "e.duckdb"
    Store(db).close()
    assert main(["stats", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "None" not in out and "output_len p50 n/a  p90 n/a" in out
    capture = make_capture()
    with Store(db) as store:
        sid = put(store, "odd", dataclasses.replace(capture, output_logprobs=[math.nan] * len(capture.output_ids)))

    def strict(token: str) -> None:
        raise AssertionError(f"not JSON: {token}")

    assert main(["show", "--db", str(db), sid, "--json"]) == 0
    assert json.loads(capsys.readouterr().out, parse_constant=strict)["capture"]["output_logprobs"][0] is None
    assert main(["stats", "--db", str(db), "--json"]) == 0
    json.loads(capsys.readouterr().out, parse_constant=strict)
