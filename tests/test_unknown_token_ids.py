"""An id the tokenizer does not have (a gateway that mutated it, a server with another vocabulary) is an
error finding, `unknown_token_id`, naming its positions: the sample is invalid, the export leaves it out,
and `audit` flags a dataset row that carries one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hostile_proxy import hostile_proxy, proxy_url

from tokview.core.analysis import analyze
from tokview.core.record import Capture
from tokview.sim import SimConfig, start_simulator
from tokview.store import Store

ROOT = Path(__file__).resolve().parents[1]
TOKVIEW = [sys.executable, "-c", "import sys; from tokview.cli import main; sys.exit(main())"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*TOKVIEW, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TOKVIEW_DEBUG": ""},
    )


@pytest.mark.parametrize("family", ["kimi", "qwen"])
def test_ids_past_the_vocabulary_are_an_error_naming_each_position(family, request):
    tok, profile = request.getfixturevalue(f"{family}_tok"), request.getfixturevalue(f"{family}_profile")
    prompt = tok.render([{"role": "user", "content": "hi"}], template_kwargs=profile.template_kwargs(True))
    answer = tok.encode("Okay") + [profile.think_close_id] + tok.encode("yes")
    output = answer + [999999, tok.vocab_size] + [profile.stop_ids[0]]
    prompt_with_bad = [*prompt[:2], tok.vocab_size + 7, *prompt[2:]]
    capture = Capture(prompt_ids=prompt_with_bad, output_ids=output, finish_reason="stop")
    analysis = analyze(capture, profile, tok)
    found = [f for f in analysis.findings if f.code == "unknown_token_id"]
    assert len(found) == 1
    assert found[0].severity == "error"
    assert not analysis.valid
    n = len(prompt_with_bad)
    assert found[0].positions == (2, n + len(answer), n + len(answer) + 1)
    assert "999999" in found[0].detail
    assert f"{tok.vocab_size:,}" in found[0].detail
    clean = analyze(Capture(prompt_ids=prompt, output_ids=answer + [profile.stop_ids[0]]), profile, tok)
    assert "unknown_token_id" not in clean.codes


def _batch(prompts: Path, url: str, db: Path) -> subprocess.CompletedProcess:
    return _cli("batch", str(prompts), "--server", url, "--db", str(db), "--workers", "1", "--max-new-tokens", "200")


def test_a_mutated_output_id_is_stored_invalid_and_not_exported(tmp_path):
    """A gateway changed the first output id to 999999 (the Kimi-layout vocabulary has 163,840 ids)."""
    mutated, clean = tmp_path / "mutated.jsonl", tmp_path / "clean.jsonl"
    for path, names in ((mutated, ("m0", "m1")), (clean, ("c0", "c1"))):
        path.write_text("".join(json.dumps({"id": n, "prompt": f"Question {n}?"}) + "\n" for n in names))
    db = tmp_path / "s.duckdb"
    with start_simulator(SimConfig(kind="vllm")) as sim:
        with hostile_proxy(sim.url, "output-id-out-of-vocab") as proxy:
            assert _batch(mutated, proxy_url(proxy), db).returncode == 0
        assert _batch(clean, sim.url, db).returncode == 0
    with Store(db) as store:
        valid = dict(store.query("SELECT prompt_id, valid FROM samples"))
        flagged = store.query(
            "SELECT s.prompt_id, f.positions, len(s.prompt_ids) FROM findings f JOIN samples s USING (sample_id) "
            "WHERE f.code = 'unknown_token_id' ORDER BY 1"
        )
    assert valid == {"m0": False, "m1": False, "c0": True, "c1": True}
    assert [(p, list(pos)) for p, pos, _ in flagged] == [(p, [n]) for p, _, n in flagged]  # the first output id
    assert [p for p, _, _ in flagged] == ["m0", "m1"]
    out = tmp_path / "out.jsonl"
    exported = _cli("export", "--db", str(db), "--out", str(out))
    assert exported.returncode == 0, exported.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 2
    assert all(999999 not in line["input_ids"] for line in lines)


def test_audit_flags_a_dataset_row_with_an_id_the_tokenizer_does_not_have(tmp_path, kimi_tok):
    ok = kimi_tok.encode("hello there")
    rows = [
        {"id": "good", "input_ids": [*ok, *ok], "loss_mask": [0] * len(ok) + [1] * len(ok)},
        {"id": "bad", "input_ids": [*ok, 999999, *ok], "loss_mask": [0] * len(ok) + [1] * (len(ok) + 1)},
    ]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = _cli("audit", str(data), "--db", str(tmp_path / "a.duckdb"), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["by_code"]["unknown_token_id"] == 1
    assert report["invalid"] >= 1
    with Store(tmp_path / "a.duckdb") as store:
        (positions,) = store.query(
            "SELECT f.positions FROM findings f JOIN samples s USING (sample_id) "
            "WHERE f.code = 'unknown_token_id' AND s.prompt_id = 'bad'"
        )[0]
    assert list(positions) == [len(ok)]


def test_top_k_alternatives_in_the_models_padding_rows_are_logits_not_unknown_ids(qwen_tok_dir, qwen_profile, tmp_path):
    """Qwen3's model has 151,936 logit rows for its tokenizer's 151,669 tokens: a server's top-K ranges over them all,
    so an alternative in the padding is no impossible id (a distillation trainer indexes the logits by it). An output
    id there is still one: no text stands for it."""
    import dataclasses
    import shutil

    from tokview.core.finding_context import vocabulary_of
    from tokview.core.findings import unknown_alternatives
    from tokview.core.tokenizer import load_tokenizer, padded_vocab_size

    folder = tmp_path / "qwen3"
    shutil.copytree(qwen_tok_dir, folder)
    plain = load_tokenizer(folder)
    size = plain.vocab_size
    assert plain.model_vocab_size == size  # no config.json: the tokenizer's length
    (folder / "config.json").write_text(json.dumps({"vocab_size": size + 267}))
    tok = load_tokenizer(folder)
    assert tok.model_vocab_size == size + 267
    prompt = tok.render([{"role": "user", "content": "hi"}], template_kwargs=qwen_profile.template_kwargs(True))
    answer = tok.encode("yes") + [qwen_profile.stop_ids[0]]
    padded = [[answer[k], size + 5] for k in range(len(answer))]
    capture = Capture(prompt_ids=prompt, output_ids=answer, finish_reason="stop", output_top_ids=padded)
    assert "unknown_token_id" not in analyze(capture, qwen_profile, tok).codes
    past = [row if k != 1 else [answer[1], size + 267] for k, row in enumerate(padded)]
    analysis = analyze(dataclasses.replace(capture, output_top_ids=past), qwen_profile, tok)
    (found,) = [f for f in analysis.findings if f.code == "unknown_token_id"]
    assert found.positions == (len(prompt) + 1,)
    assert unknown_alternatives(vocabulary_of(tok), [[-1, 3]]) == [0]
    as_output = analyze(Capture(prompt_ids=prompt, output_ids=[size + 5, *answer]), qwen_profile, tok)
    assert "unknown_token_id" in as_output.codes
    for config in ({"vocab_size": size + 70_000}, {"vocab_size": size - 1}, {"vocab_size": "151936"}, [1]):
        (folder / "config.json").write_text(json.dumps(config))  # another model's config: not believed
        assert padded_vocab_size(folder, size) == 0
    (folder / "config.json").write_text(json.dumps({"text_config": {"vocab_size": size + 64}}))
    assert padded_vocab_size(folder, size) == size + 64
