"""The runs table holds absolute paths for the tokenizer folder and the prompts file, so export and show
work from any folder, and the recorded tokenizer hash tells another tokenizer now at that path."""

from __future__ import annotations

import json
import shutil

import pytest

from tokview.cli import main
from tokview.sim import SimConfig, start_simulator
from tokview.store import Store


@pytest.fixture(scope="module")
def sim():
    with start_simulator(SimConfig(kind="vllm")) as s:
        yield s


def test_relative_paths_are_stored_absolute_and_a_swapped_tokenizer_is_caught(
    sim, tmp_path, monkeypatch, capsys, kimi_tok_dir, qwen_tok_dir
):
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    shutil.copytree(kimi_tok_dir, work / "tokcopy")
    (work / "p.jsonl").write_text('{"id": "a", "prompt": "hello"}\n{"id": "b", "prompt": "hi there"}\n')
    db = tmp_path / "s.duckdb"
    monkeypatch.chdir(work)
    assert (
        main(
            [
                "batch",
                "p.jsonl",
                "--server",
                sim.url,
                "--db",
                str(db),
                "--tokenizer",
                "tokcopy",
                "--max-new-tokens",
                "60",
            ]
        )
        == 0
    ), capsys.readouterr().err
    with Store(db) as store:
        (run,) = store.runs()
    assert run["tokenizer_dir"] == str(work / "tokcopy")
    assert run["source"] == str(work / "p.jsonl")

    monkeypatch.chdir(elsewhere)
    elsewhere_tokcopy = elsewhere / "tokcopy"  # a folder of the same name here must not be picked up
    shutil.copytree(qwen_tok_dir, elsewhere_tokcopy)
    capsys.readouterr()
    export = ["export", "--db", str(db), "--format", "sharegpt", "--select", "all", "--out"]
    assert main([*export, str(tmp_path / "a.jsonl")]) == 0, capsys.readouterr().err

    shutil.rmtree(work / "tokcopy")
    shutil.copytree(qwen_tok_dir, work / "tokcopy")  # another tokenizer at the recorded path
    capsys.readouterr()
    assert main([*export, str(tmp_path / "b.jsonl")]) == 1
    err = capsys.readouterr().err
    assert f"the tokenizer at {work / 'tokcopy'} is not the one the run used" in err
    assert "--tokenizer" in err
    with Store(db) as store:
        sample_id = store.query("SELECT sample_id FROM samples ORDER BY sample_id LIMIT 1")[0][0]
    capsys.readouterr()
    assert main(["show", sample_id, "--db", str(db)]) == 1
    assert "is not the one the run used" in capsys.readouterr().err
    assert main(["show", sample_id, "--db", str(db), "--tokenizer", str(kimi_tok_dir)]) == 0  # named: used


def test_a_tokenizer_loaded_from_a_relative_path_records_where_it_is(tmp_path, monkeypatch, kimi_tok_dir):
    # the app loads its tokenizer itself and hands it to the batch runner: its source is what is stored
    from tokview.core.tokenizer import load_tokenizer

    shutil.copytree(kimi_tok_dir, tmp_path / "tokcopy")
    monkeypatch.chdir(tmp_path)
    assert load_tokenizer("tokcopy").source == tmp_path / "tokcopy"


def test_audit_records_the_dataset_by_absolute_path(tmp_path, monkeypatch):
    from builders import kimi, make_capture, profile, put

    from tokview.export import export
    from tokview.export.audit import audit

    with Store(tmp_path / "src.duckdb") as src:
        put(src, "p1", make_capture())
        export(src, "speculators", tmp_path / "d.jsonl", select="all", tokenizer=kimi(), profile=profile())
    monkeypatch.chdir(tmp_path)
    with Store(tmp_path / "a.duckdb") as store:
        audit(store, "d.jsonl", tokenizer=kimi(), profile=profile())
        (run,) = store.runs()
    assert run["source"] == str(tmp_path / "d.jsonl")


def test_a_recorded_folder_whose_template_changed_still_reads_the_runs_samples(
    tmp_path, kimi_tok_dir, vllm_sim, capsys
):
    """tokview rebuilds its own Kimi-layout folder in place when the layout's chat template changes between
    releases: every run an older tokview made with it was refused by `show` and `export` ("is not the one the run
    used"), and no folder could be named instead. The vocabulary the run recorded is what its ids need."""
    folder = tmp_path / "tok"
    shutil.copytree(kimi_tok_dir, folder)
    db = tmp_path / "s.duckdb"
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "messages": [{"role": "user", "content": "hi"}]}\n')
    argv = ["batch", str(prompts), "--server", vllm_sim.url, "--db", str(db), "--tokenizer", str(folder)]
    assert main([*argv, "--workers", "1"]) == 0, capsys.readouterr().err
    config = json.loads((folder / "tokenizer_config.json").read_text())  # a file the run's hash covers
    config["chat_template"] += "{# a new release #}"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    capsys.readouterr()
    assert main(["export", "--db", str(db), "--select", "all", "--out", str(tmp_path / "o.jsonl")]) == 0, (
        capsys.readouterr().err
    )
    with Store(db) as store:
        sample_id = store.query("SELECT sample_id FROM samples")[0][0]
    assert main(["show", sample_id, "--db", str(db)]) == 0, capsys.readouterr().err
