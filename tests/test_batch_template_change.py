"""A raw run resumed with another chat template in its tokenizer folder is refused, not mixed.

Sample ids hold the vocabulary, not the template (an edited tokenizer_config.json must not turn a resume into a
second generation of every prompt). So a run resumed after its template changed skipped its stored prompts as done,
rendered the rest with the new template, and its record then named only the new one: one run, two templates."""

from __future__ import annotations

import shutil
from pathlib import Path

from tokview.cli import main
from tokview.errors import ExitCode
from tokview.store import Store

PROMPTS = Path(__file__).resolve().parents[1] / "sample_data" / "plain_prompts.jsonl"


def test_a_raw_run_resumed_with_another_template_is_refused(vllm_sim, kimi_tok_dir, tmp_path, capsys):
    folder = tmp_path / "tok"
    shutil.copytree(kimi_tok_dir, folder)
    db = tmp_path / "s.duckdb"
    argv = ["batch", str(PROMPTS), "--server", vllm_sim.url, "--db", str(db), "--tokenizer", str(folder)]
    assert main([*argv, "--limit", "1", "--workers", "1"]) == ExitCode.OK
    with Store(db) as store:
        [run] = store.runs()
    capsys.readouterr()

    template = folder / "chat_template.jinja"
    template.write_text(template.read_text() + "{# edited #}")
    assert main([*argv, "--limit", "2", "--workers", "1"]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert f"run {run['run_id']} rendered its prompts with another chat template" in err, err
    assert err.count("\n") == 1, err
    with Store(db) as store:
        assert store.query("SELECT count(*) FROM samples") == [(1,)]
        assert store.run(run["run_id"])["template_hash"] == run["template_hash"]  # the record still names the old

    assert "another store (--db)" in err
    other = [*argv[:5], str(tmp_path / "new.duckdb"), *argv[6:]]
    assert main([*other, "--limit", "2", "--workers", "1"]) == ExitCode.OK  # the new template's prompts, whole
    with Store(tmp_path / "new.duckdb") as store:
        assert store.query("SELECT count(*) FROM samples") == [(2,)]
        [new_run] = store.runs()
    assert new_run["template_hash"] != run["template_hash"]
