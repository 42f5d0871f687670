"""Where export files land: symlinks, FIFOs, stdout, sidecars that land with the data, selection of
approved samples, row ids and a metadata schema that stay stable across runs."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from builders import SETTINGS, kimi, make_capture, profile, put

from tokview.cli import main
from tokview.core.analysis import analyze
from tokview.core.record import sample_id_for
from tokview.export import ExportError, export
from tokview.export import output as output_module
from tokview.store import Store

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def store(sample_store):
    """conftest's store with run1 and the samples p1, p2 (at tmp_path/x.duckdb)."""
    return sample_store


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _export(store, fmt, out, **kw):
    return export(store, fmt, out, select=kw.pop("select", "all"), tokenizer=kimi(), profile=profile(), **kw)


# -- symlinks, FIFOs, stdout, never replace a non-regular file --------------------------------------------


def test_out_through_a_symlink_writes_its_target_and_keeps_the_link(store, tmp_path):
    real_dir = tmp_path / "data"
    real_dir.mkdir()
    target = real_dir / "train.jsonl"
    target.write_text("old\n")
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    result = _export(store, "speculators", link)
    assert link.is_symlink()
    assert os.readlink(link) == str(target)
    assert len(_jsonl(target)) == 2
    assert result.out == target
    assert (real_dir / "train.manifest.json").is_file()  # sidecars live beside the data they describe
    dangling = tmp_path / "dangling.jsonl"
    dangling.symlink_to(real_dir / "new.jsonl")
    _export(store, "speculators", dangling)
    assert dangling.is_symlink()
    assert len(_jsonl(real_dir / "new.jsonl")) == 2


def test_out_to_a_fifo_streams_and_keeps_the_fifo(store, tmp_path):
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    result = _export(store, "speculators", fifo)
    reader.join(timeout=60)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)  # not replaced by a regular file
    rows = [json.loads(line) for line in received[0].decode().splitlines()]
    assert len(rows) == 2
    assert result.manifest["data_sha256"] == hashlib.sha256(received[0]).hexdigest()
    assert json.loads((tmp_path / "pipe.manifest.json").read_text())["counts"]["exported"] == 2


def test_out_dash_streams_to_stdout_without_sidecars(store, tmp_path):
    store.close()
    cmd = [
        sys.executable,
        "-c",
        "import sys; from tokview.cli import main; sys.exit(main())",
        "export",
        "--db",
        str(tmp_path / "x.duckdb"),
        "--out",
        "-",
        "--select",
        "all",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["primary_id"] for line in done.stdout.splitlines()] == ["p1", "p2"]
    assert "no sidecars" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.duckdb"]


def test_a_socket_or_a_sidecar_that_is_not_a_file_is_never_replaced(store, tmp_path):
    sock_path = tmp_path / "s.jsonl"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    try:
        with pytest.raises(ExportError, match="not a regular file"):
            _export(store, "speculators", sock_path)
        assert stat.S_ISSOCK(os.stat(sock_path).st_mode)
    finally:
        sock.close()
    (tmp_path / "t.manifest.json").mkdir()
    with pytest.raises(ExportError, match="t.manifest.json is not a regular file"):
        _export(store, "speculators", tmp_path / "t.jsonl")
    assert not (tmp_path / "t.jsonl").exists()


def test_a_parent_that_is_a_file_is_named(store, tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ExportError, match=f"{tmp_path / 'afile'} is a file, not a folder"):
        _export(store, "speculators", tmp_path / "afile" / "sub" / "t.jsonl")


def test_format_and_out_suffix_must_agree(store, tmp_path, capsys):
    store.close()
    db = str(tmp_path / "x.duckdb")
    code = main(["export", "--db", db, "--format", "parquet", "--out", str(tmp_path / "x.jsonl")])
    err = capsys.readouterr().err
    assert code != 0
    assert len(err.strip().splitlines()) == 1
    assert "writes Parquet" in err
    assert "x.parquet" in err
    code = main(["export", "--db", db, "--format", "sharegpt", "--out", str(tmp_path / "x.parquet")])
    err = capsys.readouterr().err
    assert code != 0
    assert "writes JSONL" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.duckdb"]


def test_an_export_never_overwrites_the_store_it_reads(store, tmp_path, capsys):
    """`--out` naming the store (directly, through a link, as Parquet, or its WAL) is refused in one line
    and the store is left as it was: it once became a JSONL file."""
    store.close()
    db = tmp_path / "x.duckdb"
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    (tmp_path / "link.jsonl").symlink_to(db)
    for fmt, out in (
        ("speculators", db),
        ("speculators", tmp_path / "link.jsonl"),
        ("parquet", tmp_path / "x.duckdb.parquet"),  # not the store: a control
        ("sharegpt", tmp_path / "x.duckdb.wal"),
    ):
        code = main(["export", "--db", str(db), "--format", fmt, "--select", "all", "--out", str(out)])
        err = capsys.readouterr().err
        if out.name.endswith(".parquet"):
            assert code == 0, err
            continue
        assert code == 1, err
        assert len(err.strip().splitlines()) == 1, err
        assert "would overwrite the store it exports" in err
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    assert not (tmp_path / "x.duckdb.wal").exists()
    with Store(db) as again:
        assert again.count_samples() == 2
    parts = tmp_path / "x.duckdb.parts"
    shutil.rmtree(parts, ignore_errors=True)  # a file at the folder's own name failed every later batch of the store
    assert main(["export", "--db", str(db), "--select", "all", "--out", str(parts)]) == 1
    err = capsys.readouterr().err
    assert f"--out {parts} is the parts folder of the store it exports, or inside it ({parts})" in err
    assert not parts.exists()
    other = tmp_path / "other.duckdb"
    with Store(other):
        pass
    assert main(["export", "--db", str(db), "--select", "all", "--out", str(tmp_path / "other.duckdb.parts")]) == 1
    assert "is the parts folder of the DuckDB database" in capsys.readouterr().err  # another store's too
    parts.mkdir()
    assert main(["export", "--db", str(db), "--select", "all", "--out", str(parts)]) == 1
    err = capsys.readouterr().err  # its hint named a file inside the parts folder, which is then refused
    assert f"is a directory: give a file name (e.g. {tmp_path / 'train.jsonl'})" in err, err
    assert main(["export", "--db", str(db), "--select", "all", "--out", str(parts / "x.jsonl")]) == 1
    err = capsys.readouterr().err  # named as what it is, with its folder (it said "--out x.jsonl would overwrite")
    assert f"--out {parts / 'x.jsonl'} is the parts folder of the store it exports, or inside it ({parts})" in err
    assert not (parts / "x.jsonl").exists()


def test_an_empty_out_is_named_empty_not_the_working_directory(store, tmp_path, capsys):
    store.close()
    assert main(["export", "--db", str(tmp_path / "x.duckdb"), "--out", ""]) == 1
    assert capsys.readouterr().err == "tokview: error: --out is empty: give a file name (or - for standard output)\n"


# -- sidecars land with the data; stale temp files are cleaned ------------------------------------------


def test_a_kill_at_any_rename_never_leaves_new_data_beside_an_old_manifest(store, tmp_path, monkeypatch):
    out = tmp_path / "train.jsonl"
    real_replace = os.replace
    renames = []
    monkeypatch.setattr(output_module.os, "replace", lambda a, b: renames.append(b) or real_replace(a, b))
    _export(store, "speculators", out)
    n = len(renames)
    assert n == 4
    assert Path(renames[-1]) == out  # manifest, token counts, errors first; the data last
    for crash_at in range(n):
        _export(store, "sharegpt", out)  # the "old" export: sharegpt data + its manifest
        calls = []

        def dies(a, b, crash_at=crash_at):
            if len(calls) == crash_at:
                raise KeyboardInterrupt  # killed here
            calls.append(b)
            return real_replace(a, b)

        monkeypatch.setattr(output_module.os, "replace", dies)
        with pytest.raises(KeyboardInterrupt):
            _export(store, "speculators", out)
        monkeypatch.setattr(output_module.os, "replace", real_replace)
        manifest = json.loads((tmp_path / "train.manifest.json").read_text())
        data_is_new = "input_ids" in _jsonl(out)[0]
        assert not data_is_new  # the data is renamed last: a kill before it keeps the old data
        digest = hashlib.sha256(out.read_bytes()).hexdigest()
        if manifest["format"] == "speculators":  # new manifest, old data: the manifest's hash tells
            assert manifest["data_sha256"] != digest
        else:
            assert manifest["data_sha256"] == digest
        assert not list(tmp_path.glob("*.partial"))
    result = _export(store, "speculators", out)
    assert result.manifest["data_sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()


def test_partial_files_of_a_killed_export_are_cleaned_up(store, tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".train.jsonl.{dead.stdout.strip()}.x1.partial"
    stale_manifest = tmp_path / f".train.manifest.json.{dead.stdout.strip()}.x2.partial"
    old_style = tmp_path / ".train.jsonl.abc123.partial"  # a tokview before this fix named them without a pid
    live = tmp_path / f".train.jsonl.{os.getppid()}.x3.partial"  # another export running now: left alone
    for p in (stale, stale_manifest, old_style, live):
        p.write_bytes(b"x" * 1000)
    _export(store, "speculators", tmp_path / "train.jsonl")
    assert not stale.exists()
    assert not stale_manifest.exists()
    assert not old_style.exists()
    assert live.exists()


# -- approved exports only valid samples unless --include-invalid ----------------------------------------


def test_select_approved_leaves_out_invalid_samples_and_says_why(tmp_path, capsys):
    db = tmp_path / "r.duckdb"
    with Store(db) as s:
        good = put(s, "good", make_capture())
        cut = put(s, "cut", make_capture(finish_reason="length", stop=False))
        put(s, "pending", make_capture())
        s.record_verdict(good, "approved")
        s.record_verdict(cut, "approved")
        result = _export(s, "speculators", tmp_path / "a.jsonl", select="approved")
        assert [r["primary_id"] for r in _jsonl(tmp_path / "a.jsonl")] == ["good"]
        assert result.left_out["invalid"] == 1
        assert "truncated" in result.left_out["by_reason"]
        assert result.manifest["counts"]["left_out"] == result.left_out
        both = _export(s, "speculators", tmp_path / "b.jsonl", select="approved", include_invalid=True)
        assert both.exported == 2
        assert not both.left_out
        assert both.manifest["include_invalid"] is True  # a reader of the manifest knows invalid rows are in
        assert "include_invalid" not in result.manifest
    code = main(["export", "--db", str(db), "--out", str(tmp_path / "c.jsonl"), "--select", "approved"])
    err = capsys.readouterr().err
    assert code == 0
    assert "left out 1 approved samples that are invalid (1 truncated" in err
    assert "--include-invalid" in err
    code = main(
        ["export", "--db", str(db), "--out", str(tmp_path / "d.jsonl"), "--select", "approved", "--include-invalid"]
    )
    assert code == 0
    assert len(_jsonl(tmp_path / "d.jsonl")) == 2
    capsys.readouterr()
    for select in ("valid", "all"):  # silently ignored before: it only means something for approved samples
        out = tmp_path / f"{select}.jsonl"
        code = main(["export", "--db", str(db), "--out", str(out), "--select", select, "--include-invalid"])
        err = capsys.readouterr().err
        assert code != 0 and not out.exists()
        assert err.count("\n") == 1 and "--include-invalid goes with --select approved" in err, err


# -- ids and metadata that stay stable across runs --------------------------------------------------------


def test_gen_n_is_the_samples_generation_index_and_metadata_has_one_schema(tmp_path):
    with Store(tmp_path / "m.duckdb") as s:
        put(s, "p", make_capture(), run_id="run1", index=0)
        other = make_capture()
        other.settings = {"temperature": 0.7, "seed": 3}  # another run: other settings, no usage
        other.usage = {}
        for index in (0, 1):
            sid = sample_id_for("p", other.settings, index)
            s.put_sample(
                sid, "p", "run2", other, analyze(other, profile(), kimi()), gen_index=index, profile="kimi-k2.5"
            )
        _export(s, "speculators", tmp_path / "s.jsonl")
    rows = _jsonl(tmp_path / "s.jsonl")
    by_sample = {r["metadata"]["tokview_sample_id"]: r for r in rows}
    assert by_sample[sample_id_for("p", SETTINGS, 0)]["id"] == "p_gen0"
    assert by_sample[sample_id_for("p", other.settings, 0)]["id"] == "p_gen0@run2"  # another run's generation 0
    assert by_sample[sample_id_for("p", other.settings, 1)]["id"] == "p_gen1"
    assert [r["metadata"]["idx"] for r in rows] == [0, 0, 1]

    def shape(value):
        if isinstance(value, dict):
            return {k: shape(v) for k, v in sorted(value.items())}
        return "number" if isinstance(value, (int, float)) and not isinstance(value, bool) else type(value).__name__

    shapes = [shape(r["metadata"]) for r in rows]
    assert all(set(s) == set(shapes[0]) for s in shapes)  # the same keys in every row…
    for key in ("sampling_params", "usage"):
        assert all(set(s[key]) == set(shapes[0][key]) for s in shapes)  # …down to the nested ones
        for sub in shapes[0][key]:
            assert len({s[key][sub] for s in shapes} - {"NoneType"}) <= 1, (key, sub)  # one type, or null


def test_text_formats_keep_specforge_ids_and_stay_unique_across_runs(tmp_path):
    with Store(tmp_path / "t.duckdb") as s:
        put(s, "p", make_capture(), run_id="run1", index=0)
        put(s, "p", make_capture(), run_id="run1", index=1)
        other = make_capture()
        other.settings = {"temperature": 0.7}
        s.put_sample(
            sample_id_for("p", other.settings, 0),
            "p",
            "run2",
            other,
            analyze(other, profile(), kimi()),
            gen_index=0,
            profile="kimi-k2.5",
        )
        _export(s, "sharegpt", tmp_path / "g.jsonl")
    assert [r["id"] for r in _jsonl(tmp_path / "g.jsonl")] == ["p", "p@run2", "p_gen1"]


def test_branches_of_one_runs_conversation_get_row_ids_show_takes(tmp_path, capsys):
    """A proxied session's two next turns from one history share prompt, turn and index in one run: the export wrote
    `X#turn1_gen0` and `X#turn1_gen0@RUN`, and `tokview show` found both samples behind either id. Each is now
    `…@SAMPLE_ID`, which names one; another run's sample still gets `@RUN`."""
    from tokview.cli import main

    db = tmp_path / "b.duckdb"
    with Store(db) as s:
        branches = []
        for k in range(2):
            capture = make_capture(question=f"branch {k}")
            branches.append(f"proxy:r1:{k}")
            s.put_sample(branches[-1], "session:S", "r1", capture, analyze(capture, profile(), kimi()), turn=1)
        capture = make_capture(question="other run")
        s.put_sample("proxy:r2:0", "session:S", "r2", capture, analyze(capture, profile(), kimi()), turn=1)
        _export(s, "speculators", tmp_path / "s.jsonl")
    ids = {r["metadata"]["tokview_sample_id"]: r["id"] for r in _jsonl(tmp_path / "s.jsonl")}
    assert ids == {
        "proxy:r1:0": "session:S#turn1_gen0@proxy:r1:0",
        "proxy:r1:1": "session:S#turn1_gen0@proxy:r1:1",
        "proxy:r2:0": "session:S#turn1_gen0@r2",
    }
    capsys.readouterr()
    for sample_id, row_id in ids.items():
        assert main(["show", "--db", str(db), row_id, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["sample_id"] == sample_id


def test_a_trajectory_gives_the_bare_id_to_the_run_every_other_format_gives_it(tmp_path):
    """Two runs of one prompt, the older named after the newer: the trajectory gave its bare `p_gen0` to the older
    (the first in its order), the speculators export to the first by name, so one id named two samples."""
    with Store(tmp_path / "r.duckdb") as s:
        for run in ("zz-older", "aa-newer"):  # stored in this order: zz-older's samples are the older
            capture = make_capture(question=f"asked in {run}")
            s.put_sample(f"{run}:p", "p", run, capture, analyze(capture, profile(), kimi()), gen_index=0)
        _export(s, "speculators", tmp_path / "s.jsonl")
        _export(s, "trajectory", tmp_path / "t.jsonl")
    speculators = {r["id"]: r["metadata"]["tokview_sample_id"] for r in _jsonl(tmp_path / "s.jsonl")}
    assert speculators == {"p_gen0": "aa-newer:p", "p_gen0@zz-older": "zz-older:p"}
    trajectory = {r["id"]: r["input_ids"] for r in _jsonl(tmp_path / "t.jsonl")}
    assert set(trajectory) == set(speculators)
    by_sample = {r["metadata"]["tokview_sample_id"]: r["input_ids"] for r in _jsonl(tmp_path / "s.jsonl")}
    for row_id, sample_id in speculators.items():
        assert trajectory[row_id] == by_sample[sample_id]  # the same id names the same served ids


def test_a_failure_later_captured_is_not_in_errors_jsonl(store, tmp_path):
    store.put_failure("p9", "p9@s_gen0", "run1", "HTTP 500 after 3 retries")
    sid = put(store, "p3", make_capture())
    store.put_failure("p3", sid, "run1", "HTTP 500 after 3 retries")
    put(store, "p3", make_capture())  # the resumed run got it
    _export(store, "speculators", tmp_path / "s.jsonl")
    assert [e["id"] for e in _jsonl(tmp_path / "s.errors.jsonl")] == ["p9"]


def test_a_failed_export_leaves_no_partial_file(store, tmp_path, monkeypatch):
    from dataclasses import replace

    from tokview.export.formats import specforge_row
    from tokview.export.registry import FORMATS

    out_dir = tmp_path / "out"
    out_dir.mkdir()
    rows = []

    def fails_on_the_second_row(item, prof, tok):
        if rows:
            raise OSError("No space left on device")
        rows.append(item.sample_id)
        return specforge_row(item, prof, tok)

    monkeypatch.setitem(FORMATS, "specforge", replace(FORMATS["specforge"], build_row=fails_on_the_second_row))
    # one row is already in the temp file: an ExportError (one line for the CLI and the app), no file left
    with pytest.raises(ExportError, match="No space left"):
        _export(store, "specforge", out_dir / "sf.jsonl")
    assert len(rows) == 1
    assert list(out_dir.iterdir()) == []


def test_exported_data_has_the_mode_of_any_new_file(store, tmp_path):
    old = os.umask(0o022)
    try:
        for fmt, name in (("speculators", "s.jsonl"), ("sharegpt", "g.jsonl"), ("parquet", "p.parquet")):
            result = _export(store, fmt, tmp_path / name)
            assert stat.S_IMODE(result.out.stat().st_mode) == 0o644, fmt  # mkstemp alone gives 0600
            assert stat.S_IMODE(result.manifest_path.stat().st_mode) == 0o644
    finally:
        os.umask(old)


def test_out_is_a_directory_or_nothing_is_selected(store, tmp_path, capsys):
    with pytest.raises(ExportError, match="is a directory"):
        export(store, "speculators", tmp_path, tokenizer=kimi(), profile=profile())
    assert not (tmp_path.parent / f"{tmp_path.name}.partial").exists()
    with pytest.raises(ExportError, match="no samples match"):
        _export(store, "speculators", tmp_path / "new" / "dir" / "a.jsonl", select="approved")
    assert not (tmp_path / "new").exists()  # nothing selected: no directories made either
    store.close()
    code = main(["export", "--db", str(tmp_path / "x.duckdb"), "--format", "parquet", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 1
    assert "is a directory" in err
    assert len(err.strip().splitlines()) == 1


def test_an_export_reads_the_runs_own_toml_profile_not_the_builtin_of_its_name(tmp_path):
    """A .toml profile that inherits a built-in's name (here: Kimi's layout, but turns end on <|im_user|>)
    was swapped for the built-in at export: the stop id became answer text in the text formats."""
    import dataclasses

    from tokview.core.profiles import load_profile_toml, profile_fields

    toml = tmp_path / "p.toml"
    toml.write_text('base = "kimi-k2.5"\nstop_ids = [163587]\n')
    custom = load_profile_toml(toml)
    assert custom.name == "kimi-k2.5"
    cap = make_capture(stop=False)
    cap = dataclasses.replace(cap, output_ids=[*cap.output_ids, 163587], matched_stop=163587)
    with Store(tmp_path / "s.duckdb") as store:
        store.put_run("run1", settings=dict(SETTINGS), profile=custom.name, profile_def=profile_fields(custom))
        analysis = analyze(cap, custom, kimi())
        assert "no_stop_token" not in [f.code for f in analysis.findings]
        sid = sample_id_for("p1", SETTINGS, 0, None)
        store.put_sample(sid, "p1", "run1", cap, analysis, gen_index=0, profile=custom.name)
        assert store.runs()[0]["profile_def"]["stop_ids"] == [163587]
    # no --profile: the run's recorded profile, not the built-in of the same name
    code = main(
        ["export", "--db", str(tmp_path / "s.duckdb"), "--format", "sharegpt", "--select", "all"]
        + ["--out", str(tmp_path / "x.jsonl")]
    )
    assert code == 0
    row = json.loads((tmp_path / "x.jsonl").read_text().splitlines()[0])
    answer = row["conversations"][-1]
    assert "<|im_user|>" not in json.dumps(answer)


def test_a_proxied_requests_token_budget_is_its_rows_max_tokens():
    """The proxy keeps a request's settings under the names its client sent (`max_tokens`,
    `max_completion_tokens`); the rows' `sampling_params.max_tokens` read only batch's `max_new_tokens`: null."""
    from tokview.export.formats import sampling_params

    assert sampling_params({"max_tokens": 300, "temperature": 0})["max_tokens"] == 300
    assert sampling_params({"max_completion_tokens": 50})["max_tokens"] == 50
    assert sampling_params({"max_new_tokens": 7, "max_tokens": 9})["max_tokens"] == 7
    assert sampling_params({"max_tokens": 4096, "max_completion_tokens": 512})["max_tokens"] == 512  # as served
    assert sampling_params({})["max_tokens"] is None


@pytest.mark.parametrize(("fmt", "name"), [("speculators", "s.jsonl"), ("parquet", "p.parquet")])
def test_an_id_outside_the_vocabulary_is_never_exported_even_with_select_all(tmp_path, fmt, name):
    """`--select all` selects samples with error findings too, and exported one with `unknown_token_id`'s ids:
    a trainer's embedding lookup fails on such an id, or reads another row's junk."""
    with Store(tmp_path / "o.duckdb") as s:
        put(s, "fine", make_capture())
        odd = make_capture("another question")
        odd.output_ids = [*odd.output_ids[:-1], 10_000_000, odd.output_ids[-1]]
        put(s, "odd", odd)
        result = _export(s, fmt, tmp_path / name)
    assert (result.exported, result.refused) == (1, {"ids_outside_vocabulary": 1})


@pytest.mark.parametrize(("fmt", "name"), [("speculators", "s.jsonl"), ("parquet", "p.parquet")])
def test_a_top_k_alternative_outside_the_vocabulary_is_never_exported(tmp_path, fmt, name):
    """`--logprobs K` and `score --top-k K` keep the ids a server names as alternatives, which were checked only to be
    ints of 32 bits: a server's 999,999 went out in `output_top_ids` / `target_top_ids` to a top-K distillation
    trainer, which indexes its logits by them. The served alternatives are an `unknown_token_id` error too."""

    def with_tops(question: str, field: str) -> Any:
        capture = make_capture(question)
        n = len(capture.output_ids)
        setattr(capture, field, [[5, 6]] * (n - 1) + [[999_999, 5]])
        if field == "target_top_ids":
            capture.target_top_logprobs = [[-0.1, -2.0]] * n
        else:
            capture.output_top_logprobs = [[-0.1, -2.0]] * n
        return capture

    served = with_tops("served alternatives", "output_top_ids")
    analysis = analyze(served, profile(), kimi())
    hit = next(f for f in analysis.findings if f.code == "unknown_token_id")
    assert list(hit.positions) == [len(served.prompt_ids) + len(served.output_ids) - 1]
    assert "top-K alternatives" in hit.detail
    with Store(tmp_path / "o.duckdb") as s:
        put(s, "fine", make_capture())
        put(s, "served", served)
        put(s, "target", with_tops("a scoring target's alternatives", "target_top_ids"))
        result = _export(s, fmt, tmp_path / name)
    assert (result.exported, result.refused) == (1, {"ids_outside_vocabulary": 2})


def test_the_left_out_line_does_not_promise_include_invalid_exports_an_id_outside_the_vocabulary(tmp_path, capsys):
    db = tmp_path / "v.duckdb"
    with Store(db) as s:
        odd = make_capture("another question")
        odd.output_ids = [*odd.output_ids[:-1], 10_000_000, odd.output_ids[-1]]
        s.record_verdict(put(s, "odd", odd), "approved")
        s.record_verdict(put(s, "fine", make_capture()), "approved")
    assert main(["export", "--db", str(db), "--out", str(tmp_path / "a.jsonl"), "--select", "approved"]) == 0
    err = capsys.readouterr().err
    assert "--include-invalid exports them but the 1 with unknown_token_id (an id outside the vocabulary" in err


@pytest.mark.parametrize(("fmt", "name"), [("speculators", "s.jsonl"), ("parquet", "p.parquet")])
def test_an_export_where_every_sample_is_refused_fails_and_keeps_the_file_there(tmp_path, fmt, name, capsys):
    """Every selected sample refused (here: ids outside the vocabulary) exited 0 and replaced the data file a trainer
    reads, and its manifest, with empty ones."""
    db, out = tmp_path / "r.duckdb", tmp_path / name
    with Store(db) as s:
        put(s, "fine", make_capture())
    assert main(["export", "--db", str(db), "--format", fmt, "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file() and p.name.startswith(out.stem)}
    with Store(db) as s:
        s.query("SELECT 1")
        s._file.write([("UPDATE samples SET output_ids = list_concat(output_ids, [10000000])", [])])
    capsys.readouterr()
    assert main(["export", "--db", str(db), "--format", fmt, "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "every one of the 1 selected samples was refused (refused: 1 ids_outside_vocabulary)" in err, err
    assert len(err.strip().splitlines()) == 1
    after = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file() and p.name.startswith(out.stem)}
    assert after == before


@pytest.mark.parametrize("edit", ["cut, stored whole", "cut, past a key named ''"])
@pytest.mark.parametrize(("fmt", "name"), [("speculators", "s.jsonl"), ("parquet", "p.parquet")])
def test_a_row_whose_prompt_ids_do_not_add_up_is_refused_never_exported_short(tmp_path, fmt, name, edit, capsys):
    """A row edited by hand to hold only the end of its prompt was exported with the short prompt (its `prompt_len`
    column saying otherwise) when it named no key turn, or named '' (read as no key by the JSONL path)."""
    db = tmp_path / "c.duckdb"
    with Store(db) as s:
        put(s, "fine", make_capture("a question long enough to cut the first ids of"))
        key = "NULL" if edit == "cut, stored whole" else "''"
        s._file.write(
            [(f"UPDATE samples SET prompt_ids = prompt_ids[4:], prompt_from = {key}, prompt_from_len = 3", [])]
        )
    capsys.readouterr()
    assert main(["export", "--db", str(db), "--format", fmt, "--select", "all", "--out", str(tmp_path / name)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "sample " in err, err
    assert not (tmp_path / name).exists()


def test_a_tokenizer_named_with_another_vocabulary_is_refused(tmp_path, qwen_tok_dir, capsys):
    """`--tokenizer` naming another vocabulary than the runs were made with skipped every check: the export exited 0
    with its text formats decoded by the wrong tokens. The vocabulary a batch run records decides."""
    from tokview.batch.identity import vocab_fingerprint

    db = tmp_path / "v.duckdb"
    with Store(db) as s:
        s.put_run("run1", settings={"tokenizer": vocab_fingerprint(kimi())}, profile="kimi-k2.5")
        put(s, "p1", make_capture())
    out = tmp_path / "o.jsonl"
    argv = ["export", "--db", str(db), "--format", "sharegpt", "--out", str(out), "--tokenizer"]
    assert main([*argv, str(qwen_tok_dir)]) == 1
    err = capsys.readouterr().err.strip()
    assert f"--tokenizer {qwen_tok_dir} has another vocabulary than the runs were made with" in err, err
    assert len(err.splitlines()) == 1 and not out.exists()
    assert main([*argv, str(kimi().source)]) == 0


def test_the_by_tag_line_prints_a_tags_terminal_escapes_escaped(tmp_path, capsys):
    db = tmp_path / "t.duckdb"
    with Store(db) as s:
        s.add_note(put(s, "p1", make_capture()), "", tags=["x\x1b]0;PWNED\x07"])
    assert main(["export", "--db", str(db), "--out", str(tmp_path / "t.jsonl")]) == 0
    err = capsys.readouterr().err
    assert "\x1b" not in err and "by tag: 1 x\\x1b]0;pwned\\x07" in err, err


@pytest.mark.parametrize(
    "edit",
    [
        "output_ids = list_concat([NULL::INTEGER], output_ids[2:])",
        "output_ids = list_concat([-5], output_ids[2:])",
        "settings = '{not json'",
        "settings = '[1, 2]'",
        "raw_response = '{'",
        "endpoint = NULL",
    ],
)
@pytest.mark.parametrize("fmt", ["speculators", "specforge", "parquet"])
def test_a_damaged_row_is_one_line_naming_its_sample_never_an_internal_error(tmp_path, fmt, edit, capsys):
    """Rows edited by hand (or by another tool) into values tokview never writes ended exports with exit 70."""
    db = tmp_path / "d.duckdb"
    with Store(db) as s:
        sid = put(s, "p1", make_capture())
        s._file.write([(f"UPDATE samples SET {edit}", [])])
    capsys.readouterr()
    out = tmp_path / ("d.parquet" if fmt == "parquet" else "d.jsonl")
    code = main(["export", "--db", str(db), "--format", fmt, "--select", "all", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code in (0, 1), err
    if code == 1:
        assert len(err.splitlines()) == 1 and f"sample {sid}" in err, err


@pytest.mark.parametrize("out", ["/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"])
def test_out_naming_stdout_appends_to_the_file_it_is_redirected_to_never_replaces_it(store, tmp_path, out):
    """`export --out /dev/stdout >> log.jsonl` opened /dev/stdout by name, found the file and replaced it: its
    earlier lines were gone and sidecars appeared beside it. The descriptor is written to, as `--out -` does."""
    store.close()
    log = tmp_path / "log.jsonl"
    log.write_text('{"earlier": true}\n')
    cmd = [sys.executable, "-c", "import sys; from tokview.cli import main; sys.exit(main())", "export"]
    cmd += ["--db", str(tmp_path / "x.duckdb"), "--out", out, "--select", "all"]
    with open(log, "ab") as appended:
        done = subprocess.run(cmd, stdout=appended, stderr=subprocess.PIPE, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert lines[0] == {"earlier": True} and [r["primary_id"] for r in lines[1:]] == ["p1", "p2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.jsonl", "x.duckdb"]


@pytest.mark.parametrize("flag", ["--max-acceptance", "--max-nll"])
def test_an_infinite_threshold_is_refused_the_manifest_is_strict_json(store, tmp_path, flag, capsys):
    store.close()
    assert main(["export", "--db", str(tmp_path / "x.duckdb"), flag, "inf", "--out", str(tmp_path / "i.jsonl")]) == 1
    assert f"{flag} must be a finite number, not inf" in capsys.readouterr().err


def test_a_profile_named_on_the_command_line_is_the_one_every_sample_is_exported_with(store, tmp_path):
    """`--profile` (whose help says the default is the run's) was ignored for samples with a stored profile: the
    export was byte for byte the default one and its manifest named the stored profile."""
    store.close()
    db = str(tmp_path / "x.duckdb")
    assert main(["export", "--db", db, "--format", "specforge", "--out", str(tmp_path / "a.jsonl")]) == 0
    assert (
        main(["export", "--db", db, "--format", "specforge", "--profile", "plain", "--out", str(tmp_path / "b.jsonl")])
        == 0
    )
    manifest = json.loads((tmp_path / "b.manifest.json").read_text())
    assert manifest["profile"] == "plain"
    assert json.loads((tmp_path / "a.manifest.json").read_text())["profile"] == "kimi-k2.5"


def test_out_through_a_descriptor_open_on_a_store_is_refused(store, tmp_path):
    """`--out /dev/fd/N` wrote through the descriptor whatever it had open: the store itself (or another DuckDB file)
    got JSON lines over its header. Its file is checked as a named --out is."""
    store.close()
    db = tmp_path / "x.duckdb"
    before = db.read_bytes()
    cmd = [sys.executable, "-c", "import sys; from tokview.cli import main; sys.exit(main())", "export"]
    fd = os.open(db, os.O_WRONLY | os.O_APPEND)
    try:
        done = subprocess.run(
            [*cmd, "--db", str(db), "--out", f"/dev/fd/{fd}", "--select", "all"],
            capture_output=True,
            text=True,
            timeout=120,
            pass_fds=(fd,),
        )
    finally:
        os.close(fd)
    assert done.returncode == 1, done.stderr
    assert f"--out /dev/fd/{fd} would overwrite the store it exports" in done.stderr, done.stderr
    assert db.read_bytes() == before


def test_an_export_over_another_formats_leaves_none_of_its_sidecars(store, tmp_path):
    """specforge, then speculators to the same --out: the old SpecForge template stayed beside the new rows, which
    no manifest mentioned; the other way round, the old errors file stayed."""
    out = tmp_path / "train.jsonl"
    _export(store, "specforge", out)
    assert (tmp_path / "train.specforge_template.json").exists()
    _export(store, "speculators", out)
    assert not (tmp_path / "train.specforge_template.json").exists()
    assert (tmp_path / "train.errors.jsonl").exists()
    _export(store, "specforge", out)
    assert not (tmp_path / "train.errors.jsonl").exists()
    assert (tmp_path / "train.specforge_template.json").exists() and (tmp_path / "train.manifest.json").exists()


def test_the_summary_names_every_sidecar_written_the_errors_file_too(tmp_path, capsys):
    db = tmp_path / "e.duckdb"
    with Store(db) as s:
        put(s, "fine", make_capture())
    assert main(["export", "--db", str(db), "--out", str(tmp_path / "train.jsonl")]) == 0
    said = capsys.readouterr()
    line = next(x for x in (said.out + said.err).splitlines() if "sidecars" in x)
    assert "train.errors.jsonl" in line and (tmp_path / "train.errors.jsonl").is_file()


def test_a_threshold_that_leaves_everything_out_says_why(tmp_path, capsys):
    """`--max-nll` on a store never scored said only "no samples match": now it says none has a target score."""
    db = tmp_path / "t.duckdb"
    with Store(db) as s:
        put(s, "fine", make_capture())
    assert main(["export", "--db", str(db), "--max-nll", "1.0", "--out", str(tmp_path / "x.jsonl")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.endswith("1 with no target score (run `tokview score` first)"), err


def test_an_export_whose_sidecars_are_another_exports_is_refused_and_leaves_them(store, tmp_path):
    """`t2.json` and `t2.jsonl` share `t2.manifest.json` and `t2.token_freq.json`: the second export replaced the
    first one's manifest (and deleted its SpecForge template) while its data stayed, described by the wrong
    manifest. It is refused; once the first export's data is gone its sidecars are no one's and are replaced."""
    _export(store, "specforge", tmp_path / "t2.json")
    before = {p.name: p.read_bytes() for p in tmp_path.glob("t2.*")}
    assert {"t2.json", "t2.manifest.json", "t2.specforge_template.json"} <= set(before)
    with pytest.raises(ExportError, match=r"t2\.manifest\.json beside it describes t2\.json, another export"):
        _export(store, "speculators", tmp_path / "t2.jsonl")
    assert {p.name: p.read_bytes() for p in tmp_path.glob("t2.*")} == before
    _export(store, "specforge", tmp_path / "t2.json")  # the same export again replaces its own files
    (tmp_path / "t2.json").unlink()
    _export(store, "speculators", tmp_path / "t2.jsonl")
    assert json.loads((tmp_path / "t2.manifest.json").read_text())["data"] == "t2.jsonl"


def test_a_renamed_copy_of_an_export_is_replaced_and_a_sidecars_name_is_no_data_name(store, tmp_path):
    """Copies `v1.*` of `t.*` hold a manifest naming t.jsonl: no export of the name v1 owns it, so an export to
    v1.jsonl replaces it (it was refused as another export's). `--out t.manifest.json` wrote data over t.jsonl's
    manifest: a sidecar's name is refused as a data file's."""
    _export(store, "speculators", tmp_path / "t.jsonl")
    for path in list(tmp_path.glob("t.*")):
        shutil.copy(path, tmp_path / ("v1" + path.name[1:]))
    _export(store, "speculators", tmp_path / "v1.jsonl")
    assert json.loads((tmp_path / "v1.manifest.json").read_text())["data"] == "v1.jsonl"
    before = (tmp_path / "t.manifest.json").read_bytes()
    for name in ("t.manifest.json", "t.token_freq.json", "t.errors.jsonl", "t.specforge_template.json"):
        with pytest.raises(ExportError, match=r"is named as an export's .* file"):
            _export(store, "speculators" if name.endswith("l") else "specforge", tmp_path / name)
    assert (tmp_path / "t.manifest.json").read_bytes() == before


def test_an_export_never_overwrites_a_prompts_file_a_run_was_generated_from(tmp_path, capsys):
    """`--out prompts.jsonl` replaced 1,200 prompts with the 30 samples exported so far: the run could not go on."""
    from tokview.sim import SimConfig, start_simulator

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"Say {i}."}) + "\n" for i in range(4)))
    before = prompts.read_bytes()
    db = tmp_path / "s.duckdb"
    with start_simulator(SimConfig(kind="vllm")) as sim:
        args = ["--server", sim.url, "--db", str(db), "--workers", "1", "--max-new-tokens", "16", "--limit", "2"]
        assert main(["batch", str(prompts), *args]) == 0
    capsys.readouterr()
    (tmp_path / "link.jsonl").symlink_to(prompts)
    for out in (prompts, tmp_path / "link.jsonl"):
        code = main(["export", "--db", str(db), "--select", "all", "--out", str(out)])
        err = capsys.readouterr().err
        assert code == 1, err
        assert len(err.strip().splitlines()) == 1, err
        assert "is the prompts file run batch-" in err and "choose another file" in err, err
    assert prompts.read_bytes() == before
    assert main(["export", "--db", str(db), "--select", "all", "--out", str(tmp_path / "train.jsonl")]) == 0


def test_a_compressed_out_name_is_refused_in_one_line(store, tmp_path, capsys):
    """`--out x.jsonl.gz` wrote plain JSONL under a gzip name: `load_dataset` (and gzip) failed on it."""
    store.close()
    db = str(tmp_path / "x.duckdb")
    assert main(["export", "--db", db, "--out", str(tmp_path / "x.jsonl.gz")]) == 1
    err = capsys.readouterr().err.strip()
    assert "names a compressed file, but tokview writes JSONL uncompressed" in err and len(err.splitlines()) == 1
    assert f"use {tmp_path / 'x.jsonl'} and compress it afterwards (`gzip" in err
    assert main(["export", "--db", db, "--format", "parquet", "--out", str(tmp_path / "x.jsonl.zst")]) == 1
    err = capsys.readouterr().err.strip()
    assert f"writes Parquet: use {tmp_path / 'x.parquet'} (Parquet compresses its columns itself)" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.duckdb"]


def test_a_replaced_export_keeps_its_mode_and_an_upper_case_parquet_name_its_sidecars(store, tmp_path):
    """A 0600 training file came out 0644 when exported again over itself; `T.PARQUET` got `T.manifest.json`, the
    name a `T.jsonl` export's manifest takes, where the README names Parquet's sidecars after the full name."""
    out = tmp_path / "private.jsonl"
    out.write_text("old\n")
    out.chmod(0o4600)  # a setuid bit is no permission a data file keeps
    _export(store, "speculators", out)
    assert stat.S_IMODE(out.stat().st_mode) == 0o600 and out.read_text() != "old\n"
    assert stat.S_IMODE((tmp_path / "private.manifest.json").stat().st_mode) == 0o600  # new beside a private file
    _export(store, "parquet", tmp_path / "T.PARQUET")
    assert (tmp_path / "T.PARQUET.manifest.json").exists() and not (tmp_path / "T.manifest.json").exists()


def test_a_folder_no_file_can_be_made_in_is_named_not_the_temp_file(store, tmp_path, monkeypatch):
    """`--out /proc/version` said `No such file or directory: '/proc/.version.18994….partial'`: a name the user never
    gave, for a file that exists."""
    import tempfile

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise FileNotFoundError(2, "No such file or directory", str(tmp_path / ".t.jsonl.1.x.partial"))

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    with pytest.raises(output_module.OutputError) as caught:
        _export(store, "speculators", tmp_path / "t.jsonl")
    assert f"no file can be made in {tmp_path} (No such file or directory)" in str(caught.value)
    assert ".partial" not in str(caught.value)
