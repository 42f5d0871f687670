"""`show --tokenizer` of another vocabulary than the sample's run was made with is refused in one line, as `export`
refuses it: it flagged a valid sample INVALID (unknown ids, a render mismatch, drift), a verdict about the folder
given, not the sample."""

from __future__ import annotations

import json

from tokview.cli import main
from tokview.errors import ExitCode


def _one_sample(vllm_sim, tmp_path) -> tuple[str, str]:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "messages": [{"role": "user", "content": "hi"}]}\n')
    db = str(tmp_path / "s.duckdb")
    assert main(["batch", str(prompts), "--server", vllm_sim.url, "--db", db]) == 0
    from tokview.store import Store

    with Store(db) as store:
        ((sample_id,),) = store.query("SELECT sample_id FROM samples")
    return db, sample_id


def test_show_refuses_a_tokenizer_of_another_vocabulary(vllm_sim, tmp_path, glm_tok_dir, capsys, monkeypatch):
    monkeypatch.delenv("TOKVIEW_DEBUG", raising=False)
    db, sample_id = _one_sample(vllm_sim, tmp_path)
    capsys.readouterr()
    assert main(["show", sample_id, "--db", db, "--tokenizer", str(glm_tok_dir)]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert f"--tokenizer {glm_tok_dir} has another vocabulary than the runs were made with" in err
    assert err.count("\n") == 1


def test_show_with_the_runs_own_tokenizer_named_still_shows_it_valid(vllm_sim, tmp_path, kimi_tok_dir, capsys):
    db, sample_id = _one_sample(vllm_sim, tmp_path)
    capsys.readouterr()
    assert main(["show", sample_id, "--db", db, "--tokenizer", str(kimi_tok_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["valid"] is True
