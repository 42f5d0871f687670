"""Tags as export selectors: `export --tag T` / `--without-tag T` (repeatable, compared without case, selected
in SQL), a `tags` list column in Parquet, and the manifest's counts by tag."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from builders import kimi, make_capture, profile, put

from tokview.cli import main
from tokview.export import ExportError, export
from tokview.store.export_rows import live_tags


@pytest.fixture
def tagged(sample_store):
    """p1 tagged 'Hard' (a note), p2 approved with 'hard' and 'math', p3's 'math' undone, p4 a verdict tagged
    'old' then a later verdict without tags (only the latest verdict's tags are live)."""
    s = sample_store
    put(s, "p3", make_capture(answer="three"))
    put(s, "p4", make_capture(answer="four"))
    ids = {r[0]: r[1] for r in s.query("SELECT prompt_id, sample_id FROM samples")}
    s.add_note(ids["p1"], "", tags=["Hard"])
    s.record_verdict(ids["p2"], "approved", tags=["hard", "math"])
    s.add_note(ids["p3"], "", tags=["math"])
    s.undo_latest(ids["p3"])
    s.record_verdict(ids["p4"], "approved", tags=["old"])
    s.record_verdict(ids["p4"], "approved")
    return s


def _prompts(path: Path) -> list[str]:
    return [json.loads(line)["primary_id"] for line in path.read_text().splitlines()]


def _export(store, out, fmt="speculators", **kw):
    return export(store, fmt, out, select="all", tokenizer=kimi(), profile=profile(), **kw)


def test_tag_selects_the_samples_carrying_it_without_case(tagged, tmp_path):
    _export(tagged, tmp_path / "a.jsonl", tags=["HARD"])
    assert _prompts(tmp_path / "a.jsonl") == ["p1", "p2"]


def test_repeated_tags_select_samples_carrying_all_of_them(tagged, tmp_path):
    _export(tagged, tmp_path / "a.jsonl", tags=["hard", "Math"])
    assert _prompts(tmp_path / "a.jsonl") == ["p2"]


def test_without_tag_leaves_out_the_samples_carrying_any_of_them(tagged, tmp_path):
    _export(tagged, tmp_path / "a.jsonl", without_tags=["math"])
    assert _prompts(tmp_path / "a.jsonl") == ["p1", "p3", "p4"]  # p3's math was undone
    _export(tagged, tmp_path / "b.jsonl", without_tags=["math", "HARD"])
    assert _prompts(tmp_path / "b.jsonl") == ["p3", "p4"]


def test_a_superseded_verdicts_tags_do_not_select(tagged, tmp_path):
    with pytest.raises(ExportError, match="no samples match --select all --tag old"):
        _export(tagged, tmp_path / "a.jsonl", tags=["old"])


def test_the_live_tags_in_sql_are_the_tags_a_sample_shows(tagged):
    """The SQL rule and `load_sample` (what the app and `show` display) must never disagree."""
    shown = {
        r[0]: sorted({t.lower() for t in tagged.load_sample(r[0]).tags})
        for r in tagged.query("SELECT sample_id FROM samples")
    }
    in_sql = {sid: [] for sid in shown}
    for sid, tag in tagged.query(f"SELECT sample_id, tag FROM ({live_tags()}) ORDER BY tag"):
        in_sql[sid].append(tag)
    assert in_sql == shown


def test_the_manifest_counts_exported_samples_by_tag(tagged, tmp_path):
    result = _export(tagged, tmp_path / "a.jsonl")
    assert result.manifest["counts"]["by_tag"] == {"hard": 2, "math": 1}
    assert "tags" not in result.manifest  # no tag selection
    result = _export(tagged, tmp_path / "b.jsonl", tags=["Hard"], without_tags=["math"])
    assert result.manifest["counts"]["by_tag"] == {"hard": 1}
    assert result.manifest["tags"] == {"with": ["Hard"], "without": ["math"]}  # as asked for


@pytest.mark.parametrize("tag", ["İzmir", "ΣΑΣ"])
def test_a_tag_whose_lower_case_python_and_duckdb_spell_otherwise_selects(sample_store, tmp_path, tag):
    """Python lowers 'İ' to 'i̇' and 'ΣΑΣ' to 'σας', DuckDB to 'i' and 'σασ': `--tag İzmir` matched nothing and
    `--without-tag ΣΑΣ` left the sample in."""
    ids = [r[0] for r in sample_store.query("SELECT sample_id FROM samples ORDER BY prompt_id")]
    sample_store.add_note(ids[0], "", tags=[tag])
    _export(sample_store, tmp_path / "a.jsonl", tags=[tag])
    assert _prompts(tmp_path / "a.jsonl") == ["p1"]
    _export(sample_store, tmp_path / "b.jsonl", without_tags=[tag])
    assert "p1" not in _prompts(tmp_path / "b.jsonl")


def test_parquet_has_a_tags_list_column(tagged, tmp_path):
    out = tmp_path / "a.parquet"
    _export(tagged, out, fmt="parquet")
    rows = (
        duckdb.connect().execute(f"SELECT primary_id, tags FROM read_parquet('{out}') ORDER BY primary_id").fetchall()
    )
    assert rows == [("p1", ["hard"]), ("p2", ["hard", "math"]), ("p3", []), ("p4", [])]


def test_cli_tag_and_without_tag(tagged, tmp_path, kimi_tok_dir, capsys):
    db = tagged.path
    tagged.close()
    base = ["export", "--db", str(db), "--select", "all", "--tokenizer", str(kimi_tok_dir), "--profile", "kimi-k2.5"]
    out = tmp_path / "a.jsonl"
    assert main([*base, "--tag", "hard", "--without-tag", "MATH", "--out", str(out)]) == 0
    assert _prompts(out) == ["p1"]
    assert "by tag: 1 hard" in capsys.readouterr().err  # the summary says what the manifest counts
    assert main([*base, "--tag", "nope", "--out", str(tmp_path / "b.jsonl")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "no samples match --select all --tag nope" in err[0]
    assert main([*base, "--tag", " ", "--out", str(tmp_path / "c.jsonl")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "a tag cannot be empty" in err
    assert not (tmp_path / "c.jsonl").exists()


@pytest.mark.parametrize("fmt", ["speculators", "parquet", "trajectory"])
def test_a_sample_reviewed_otherwise_after_it_was_selected_is_not_exported(sample_store, tmp_path, monkeypatch, fmt):
    """The ids are picked in one query and the rows read in chunks later; another process may write in between (a
    file is held at most a second at a time). A sample rejected in that gap was exported under `--select approved`;
    it is counted as `no_longer_selected` now."""
    from tokview.store import export_rows

    ids = [r[0] for r in sample_store.query("SELECT sample_id FROM samples ORDER BY prompt_id")]
    for sample_id in ids:
        sample_store.record_verdict(sample_id, "approved")
    picked = export_rows.selected_keys

    def then_rejected(store, selection, **kw):
        keys = picked(store, selection, **kw)
        store.record_verdict(ids[0], "rejected", reason="late")  # committed after the ids were picked
        return keys

    monkeypatch.setattr(export_rows, "selected_keys", then_rejected)
    out = tmp_path / ("a.parquet" if fmt == "parquet" else "a.jsonl")
    result = export(sample_store, fmt, out, select="approved", tokenizer=kimi(), profile=profile())
    assert result.refused == {"no_longer_selected": 1}
    assert result.exported == len(ids) - 1
    if fmt == "parquet":
        got = duckdb.connect().execute(f"SELECT primary_id FROM read_parquet('{out}')").fetchall()
        assert "p1" not in {r[0] for r in got}
    elif fmt == "speculators":
        assert "p1" not in _prompts(out)


@pytest.mark.parametrize("fmt", ["parquet", "trajectory"])
def test_a_table_leaves_out_a_sample_reviewed_otherwise_after_its_rows_were_checked(
    sample_store, tmp_path, monkeypatch, fmt
):
    """A table format reads its rows again when it writes the file, after every chunk was checked: a sample rejected
    in between (for the first chunk, the whole loop) was written. It is left out, and the tallies are made again."""
    from tokview.export import writer

    ids = [r[0] for r in sample_store.query("SELECT sample_id FROM samples ORDER BY prompt_id")]
    for sample_id in ids:
        sample_store.record_verdict(sample_id, "approved")
    tally, calls = writer._tally, []

    def then_rejected(row, *args):
        calls.append(row["sample_id"])
        if len(calls) == len(ids):  # every row checked: the first is rejected before the table is written
            sample_store.record_verdict(ids[0], "rejected", reason="late")
        return tally(row, *args)

    monkeypatch.setattr(writer, "_tally", then_rejected)
    out = tmp_path / ("a.parquet" if fmt == "parquet" else "a.jsonl")
    result = export(sample_store, fmt, out, select="approved", tokenizer=kimi(), profile=profile())
    assert result.refused == {"no_longer_selected": 1}
    assert result.exported == len(ids) - 1
    kept = sample_store.rows_for(ids[1:])
    assert sum(result.freq.values()) == sum(len(r["output_ids"]) for r in kept)  # the tallies without it
    if fmt == "parquet":
        got = duckdb.connect().execute(f"SELECT sample_id FROM read_parquet('{out}')").fetchall()
    else:
        got = [
            (t["sample_id"],) for line in out.read_text().splitlines() for t in json.loads(line)["metadata"]["turns"]
        ]
    assert ids[0] not in {r[0] for r in got} and len(got) == len(ids) - 1


def test_tags_are_grouped_in_python_as_duckdb_compares_them():
    """`load_sample` and the tag dialog grouped tags by Python's lower case: 'İzmir' and 'izmir' were two tags there
    and one in SQL, 'ΣΑΣ' and 'σας' one there and two in SQL."""
    from tokview.store.queries import caseless_tags, sql_lower

    assert caseless_tags(["İzmir", "izmir", "ΣΑΣ", "σας"]) == ["izmir", "σας", "ΣΑΣ"]
    chars = [chr(c) for c in range(1, 0x3000)]
    lowered = duckdb.connect().execute("SELECT lower(unnest(?::VARCHAR[]))", [chars]).fetchall()
    assert [sql_lower(c) for c in chars] == [r[0] for r in lowered]
