"""`tokview merge` of two stores that each hold a run of one name made with other settings: refused, not joined."""

from __future__ import annotations

from pathlib import Path

from tokview.cli import main
from tokview.store import Store

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ROOT / "sample_data" / "plain_prompts.jsonl"


def _batch(url: str, db: Path, *extra: str) -> None:
    default = [] if "--max-new-tokens" in extra else ["--max-new-tokens", "5"]  # a flag given twice is refused
    argv = ["batch", str(PROMPTS), "--server", url, "--db", str(db), "--run", "x", *default, *extra]
    assert main(argv) == 0


def test_a_run_name_made_with_other_settings_in_each_store_is_refused(tmp_path, vllm_sim, capsys):
    """The merge kept the target's run record (max_new_tokens 5) and copied the source's samples (made with 9) under
    it: `export --run x` wrote both, its manifest saying 5."""
    a, b = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    _batch(vllm_sim.url, a, "--limit", "2")
    _batch(vllm_sim.url, b, "--limit", "2", "--max-new-tokens", "9")
    capsys.readouterr()
    assert main(["merge", str(b), "--into", str(a)]) == 1
    said = capsys.readouterr().err
    assert "run x was made with other settings" in said and "max_new_tokens=9 vs 5" in said
    with Store(a) as store:
        assert store.query("SELECT count(*) FROM samples") == [(2,)]  # nothing of b's came in


def test_shards_of_one_run_still_merge(tmp_path, vllm_sim):
    a, b = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    _batch(vllm_sim.url, a, "--shard", "1/2")
    _batch(vllm_sim.url, b, "--shard", "2/2")
    assert main(["merge", str(b), "--into", str(a)]) == 0


def test_chat_shards_whose_tokenizer_folders_differ_only_in_template_merge(tmp_path, vllm_sim, kimi_tok_dir):
    """In chat mode the server renders the prompt: a resume with another template is taken, so is such a shard."""
    import shutil

    edited = tmp_path / "tok"
    shutil.copytree(kimi_tok_dir, edited)
    template = next(p for p in edited.iterdir() if p.name == "chat_template.jinja")
    template.write_text(template.read_text() + "{# edited #}")
    a, b = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    _batch(vllm_sim.url, a, "--shard", "1/2", "--mode", "chat", "--tokenizer", str(kimi_tok_dir))
    _batch(vllm_sim.url, b, "--shard", "2/2", "--mode", "chat", "--tokenizer", str(edited))
    assert main(["merge", str(b), "--into", str(a)]) == 0


def test_a_shard_made_with_a_setting_the_other_lacks_is_refused(tmp_path, vllm_sim, capsys):
    """Settings given only when asked for (`--chat-template-kwargs`, `--logprobs`) were compared only where both
    records held them: a thinking-off shard merged into a thinking-on run, the record naming neither."""
    a, b = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    _batch(vllm_sim.url, a, "--shard", "1/2")
    _batch(vllm_sim.url, b, "--shard", "2/2", "--chat-template-kwargs", '{"enable_thinking": false}')
    capsys.readouterr()
    assert main(["merge", str(b), "--into", str(a)]) == 1
    said = capsys.readouterr().err
    assert "chat_template_kwargs={'enable_thinking': False} vs None" in said, said
    with Store(a) as store:
        assert not store.query("SELECT count(*) FROM samples WHERE settings LIKE '%enable_thinking%'")[0][0]
