"""doctor, show and the export manifest say how the tokenizer was loaded (tokenizer.json, native tiktoken, …)."""

from __future__ import annotations

import json

import pytest
from facts import KIMI_CHAIN_OUTPUT, KIMI_PROMPT_6X7

from tokview.cli import main
from tokview.core.analysis import analyze
from tokview.core.kimi_layout import build_kimi_tiktoken_dir
from tokview.core.record import Capture
from tokview.core.tokenizer import load_tokenizer
from tokview.store import Store


@pytest.fixture(scope="module")
def tiktoken_dir(tmp_path_factory):
    return build_kimi_tiktoken_dir(tmp_path_factory.mktemp("kimi-tiktoken"))


@pytest.fixture()
def db(tmp_path, kimi_tok, kimi_profile):
    path = tmp_path / "t.duckdb"
    cap = Capture(
        prompt_ids=KIMI_PROMPT_6X7,
        output_ids=KIMI_CHAIN_OUTPUT,
        finish_reason="stop",
        reasoning="Okay, let me think about this carefully.",
        content="The answer is forty-two!",
        reasoning_field="reasoning",
        endpoint="vllm-chat",
        server_kind="vllm",
        server_version="0.32.0",
    )
    with Store(path) as store:
        store.put_sample("s1", "p1", "r1", cap, analyze(cap, kimi_profile, kimi_tok), profile="kimi-k2.5")
    return path


def test_show_text_and_json(db, capsys, tiktoken_dir):
    assert main(["show", "s1", "--db", str(db), "--tokenizer", str(tiktoken_dir)]) == 0
    assert f"  tokenizer {tiktoken_dir} (loaded from native tiktoken)" in capsys.readouterr().out.splitlines()
    assert main(["show", "s1", "--db", str(db), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tokenizer"]["loaded_by"] == "tokenizer.json"


def test_export_manifest(db, tmp_path, tiktoken_dir, kimi_profile):
    from tokview.export import export

    with Store(db) as store:
        result = export(
            store,
            "speculators",
            tmp_path / "out.jsonl",
            select="all",
            tokenizer=load_tokenizer(tiktoken_dir),
            profile=kimi_profile,
        )
    manifest = json.loads(result.manifest_path.read_text())
    assert manifest["tokenizer"]["loaded_by"] == "native tiktoken"


async def test_doctor_report(tiktoken_dir, kimi_profile):
    from tokview.servers.doctor import run_doctor
    from tokview.sim import SimConfig, start_simulator

    with start_simulator(SimConfig(kind="vllm")) as sim:
        report = await run_doctor(sim.url, tokenizer=load_tokenizer(tiktoken_dir), profile=kimi_profile, timeout=5.0)
    assert report.to_dict()["tokenizer"] == f"{tiktoken_dir} (loaded from native tiktoken)"
    assert f"tokenizer {tiktoken_dir} (loaded from native tiktoken)" in report.render_text().splitlines()[1]


def test_export_trust_remote_code_without_tokenizer_says_what_to_pass(db, tmp_path, capsys, kimi_tok_dir):
    """`export --trust-remote-code` with no --tokenizer says to pass --tokenizer, not --trust-remote-code again."""
    import shutil

    code_dir = tmp_path / "custom"
    code_dir.mkdir()
    shutil.copy(kimi_tok_dir / "tokenizer.json", code_dir / "tokenizer.json")
    (code_dir / "tokenization_custom.py").write_text("raise RuntimeError('never imported')\n")
    (code_dir / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "CustomTokenizer",
                "auto_map": {"AutoTokenizer": ["tokenization_custom.CustomTokenizer", None]},
            }
        )
    )
    with Store(db) as store:
        store.put_run("r1", profile="kimi-k2.5", tokenizer_dir=str(code_dir))
    argv = ["export", "--db", str(db), "--out", str(tmp_path / "o.jsonl"), "--trust-remote-code"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err == (
        f"tokview: error: the run's tokenizer folder {code_dir} ships its own tokenizer code, and "
        f"--trust-remote-code applies only to a folder named on the command line: pass --tokenizer "
        f"{code_dir} --trust-remote-code\n"
    )
