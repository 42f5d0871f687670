"""A tokenizer folder without a chat template is refused before a raw or dual batch starts: every row
is a conversation (a `prompt` row is one user turn) rendered locally with the template, so each would
fail on its own (`cannot render the prompt locally`) after the servers were probed and the store made.
`--mode chat` lets the server render, so it needs no local template."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOKVIEW = [sys.executable, "-c", "import sys; from tokview.cli import main; sys.exit(main())"]


@pytest.fixture
def folder_without_template(tmp_path, kimi_tok_dir) -> Path:
    folder = tmp_path / "no-template"
    shutil.copytree(kimi_tok_dir, folder)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("mode", ["raw", "dual"])
def test_a_raw_batch_with_a_tokenizer_without_a_chat_template_is_refused_up_front(
    folder_without_template, tmp_path, mode
):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "messages": [{"role": "user", "content": "hi"}]}) + "\n")
    db = tmp_path / "s.duckdb"
    argv = ["batch", str(prompts), "--server", "http://127.0.0.1:9", "--db", str(db)]
    argv += ["--tokenizer", str(folder_without_template), "--mode", mode]
    done = subprocess.run([*TOKVIEW, *argv], cwd=ROOT, capture_output=True, text=True, timeout=60)
    err = done.stderr.strip().splitlines()
    assert done.returncode == 1, done.stderr
    assert len(err) == 1, done.stderr  # not 2: no server was asked
    assert "no chat template" in err[0]
    assert "--mode chat" in err[0]
    assert str(folder_without_template) in err[0]
    assert not db.exists()
