"""A batch whose samples are all stored already, but by another run or another kind of server: a sample is its prompt,
settings and index, whichever server answered it, so the same command against an SGLang server into a vLLM run's
store (or under a new `--run`) stored nothing and said only "already stored"."""

from __future__ import annotations

import json

from tokview.cli import main
from tokview.sim import SimConfig, start_simulator

ROWS = [{"id": k, "messages": [{"role": "user", "content": q}]} for k, q in (("a", "What is 6 times 7?"), ("b", "Hi"))]


def test_samples_another_run_or_server_kind_answered_are_said_so(tmp_path, capsys) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    db = tmp_path / "s.duckdb"
    base = ["batch", str(prompts), "--db", str(db), "--workers", "1", "--max-new-tokens", "64"]
    with start_simulator(SimConfig(kind="vllm")) as vllm, start_simulator(SimConfig(kind="sglang")) as sglang:
        assert main([*base, "--server", vllm.url]) == 0
        capsys.readouterr()
        assert main([*base, "--server", vllm.url]) == 0  # a resume of its own run: nothing to say
        assert "note: the 2 already stored" not in capsys.readouterr().err
        assert main([*base, "--server", sglang.url]) == 0
        said = capsys.readouterr().err
        assert (
            "note: the 2 already stored are answers of vllm (run batch-" in said and "not of this sglang server" in said
        )
        assert main([*base, "--server", vllm.url, "--run", "again"]) == 0
        assert "note: the 2 already stored are other runs' samples" in capsys.readouterr().err
