"""Resume: a re-run skips the samples already stored for the same prompts, settings and served model,
and only those. Sample ids carry the served model and the vocabulary's identity (not the tokenizer
files' bytes, nor the server's URL), so another model into the same store is a new run, and a named
run is never overwritten by another model's samples."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokview.batch import BatchConfig, InputError, run_batch
from tokview.sim import SimConfig, start_simulator
from tokview.store import Store

PROMPTS = Path(__file__).resolve().parents[1] / "sample_data" / "plain_prompts.jsonl"


@pytest.fixture
def config(kimi_tok, kimi_profile):
    """`config(url, **BatchConfig fields)`: the plain prompts against one server, Kimi tokenizer and profile."""

    def make(url: str, **kw) -> BatchConfig:
        kw.setdefault("tokenizer", kimi_tok)
        kw.setdefault("max_new_tokens", 60)
        kw.setdefault("timeout", 10.0)
        return BatchConfig(servers=[url], prompts_path=PROMPTS, model_profile=kimi_profile, **kw)

    return make


async def test_another_model_into_the_same_store_is_not_a_resume(tmp_path, config):
    with Store(tmp_path / "m.duckdb") as store:
        with start_simulator(SimConfig(kind="vllm", model_name="model-a")) as a:
            first = await run_batch(config(a.url, limit=3), store)
        with start_simulator(SimConfig(kind="vllm", model_name="model-b")) as b:
            second = await run_batch(config(b.url, limit=3), store)
        assert (first.ok, second.ok, second.resumed) == (3, 3, 0)
        assert first.run_id != second.run_id
        with start_simulator(SimConfig(kind="vllm", model_name="model-a")) as moved:  # same model, other port
            again = await run_batch(config(moved.url, limit=3), store)
        assert (again.ok, again.resumed, again.run_id) == (0, 3, first.run_id)
        models = {r["run_id"]: r["settings"]["model"] for r in store.runs()}
        assert models == {first.run_id: "model-a", second.run_id: "model-b"}


async def test_a_named_run_is_not_overwritten_by_another_model(tmp_path, config):
    with Store(tmp_path / "n.duckdb") as store:
        with start_simulator(SimConfig(kind="vllm", model_name="model-a")) as a:
            await run_batch(config(a.url, limit=2, run="mine"), store)
        with start_simulator(SimConfig(kind="vllm", model_name="model-b")) as b:
            with pytest.raises(InputError, match="run mine was made with other model"):
                await run_batch(config(b.url, limit=2, run="mine"), store)
        assert store.runs()[0]["settings"]["model"] == "model-a"


async def test_an_edited_tokenizer_config_still_resumes(tmp_path, config, kimi_tok, kimi_tok_dir):
    """Sample ids carry the vocabulary's identity, not the tokenizer files' bytes."""
    import json
    import shutil

    from tokview.core.tokenizer import load_tokenizer

    edited = tmp_path / "tok"
    shutil.copytree(kimi_tok_dir, edited)
    tok_config = json.loads((edited / "tokenizer_config.json").read_text())
    tok_config["model_max_length"] = 12345  # a config edit that changes no id's meaning
    (edited / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=1))
    other = load_tokenizer(edited)
    assert other.fingerprint() != kimi_tok.fingerprint()
    with Store(tmp_path / "v.duckdb") as store, start_simulator(SimConfig(kind="vllm")) as sim:
        first = await run_batch(config(sim.url, limit=3), store)
        again = await run_batch(config(sim.url, limit=3, tokenizer=other), store)
        assert (first.ok, again.ok, again.resumed, again.run_id) == (3, 0, 3, first.run_id)
        assert store.runs()[0]["tokenizer_hash"] == kimi_tok.fingerprint()  # the file hash is still recorded


def test_a_server_that_reports_no_model_adds_no_model_key(kimi_tok, kimi_profile):
    from tokview.batch.runner import served_identity

    class Reported:
        def __init__(self, *models):
            self.models = models

        def server_info(self):
            return [{"url": "http://127.0.0.1:1", "model": m} for m in self.models]

    assert "model" not in served_identity(Reported(None), kimi_tok, kimi_profile)
    named = served_identity(Reported("kimi"), kimi_tok, kimi_profile)
    assert named == {"model": "kimi", "tokenizer": kimi_tok.vocab_fingerprint(), "profile": kimi_profile.name}


def test_a_run_name_asked_for_other_settings_is_refused_with_nothing_left_to_do(
    tmp_path, vllm_sim, capsys, monkeypatch
):
    """The samples were all stored (by the default run, same settings), so the shortcut said "0 + 6 already stored"
    and exit 0 for `--run mine` with another --max-new-tokens than run mine was made with; with work left, refused."""
    from tokview.cli import main

    prompts, db = Path(__file__).resolve().parents[1] / "sample_data" / "plain_prompts.jsonl", tmp_path / "r.duckdb"
    base = ["batch", str(prompts), "--server", vllm_sim.url, "--db", str(db), "--limit", "2"]
    assert main([*base]) == 0  # the default run: max_new_tokens 1024
    assert main([*base, "--run", "mine", "--max-new-tokens", "7"]) == 0
    capsys.readouterr()
    assert main([*base, "--run", "mine"]) == 1  # 1024 again: every sample is stored, but run mine was made with 7
    assert "run mine was made with other max_new_tokens" in capsys.readouterr().err
    monkeypatch.setattr("tokview.batch.identity.identities_file", lambda: None)  # no shortcut: the plan's own path
    assert main([*base, "--run", "mine"]) == 1
    assert "run mine was made with other max_new_tokens" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "changed"),
    [
        (["--logprobs", "2"], "logprobs (logprobs=None; now logprobs=2)"),
        (["--chat-template-kwargs", '{"x": 1}'], "chat_template_kwargs (chat_template_kwargs=None;"),
        (["--history", "file"], "history (history='served'; now history='file')"),
    ],
)
def test_a_named_run_resumed_with_a_setting_it_was_made_without_is_refused(tmp_path, vllm_sim, capsys, extra, changed):
    """`--logprobs` and `--chat-template-kwargs` are in a run's settings only when given, and its history was not in
    them at all: a resume of `--run day1` with one of them added generated every prompt again into day1 (new sample
    ids), where another --max-new-tokens was refused."""
    from tokview.cli import main
    from tokview.store import Store

    prompts, db = Path(__file__).resolve().parents[1] / "sample_data" / "plain_prompts.jsonl", tmp_path / "r.duckdb"
    base = ["batch", str(prompts), "--server", vllm_sim.url, "--db", str(db), "--limit", "2", "--run", "day1"]
    assert main(base) == 0
    capsys.readouterr()
    assert main([*base, *extra]) == 1
    assert f"run day1 was made with other {changed}" in capsys.readouterr().err
    with Store(db) as store:
        assert store.query("SELECT count(*) FROM samples") == [(2,)]
