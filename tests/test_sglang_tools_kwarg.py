"""`--chat-template-kwargs` with `tools` on SGLang's chat endpoint: SGLang renders with
`apply_chat_template(..., tools=tools, **chat_template_kwargs)`, so every such request fails there. `--backend sglang`
refused it before the run; with the default `--backend auto` the run sent it anyway (the simulator took it). Now each
capture on SGLang fails with the reason before any request (as `--logprobs` on its chat endpoint does), and the
simulator answers such a body with SGLang's 400."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tokview.cli import main
from tokview.errors import ExitCode
from tokview.sim import SimConfig, start_simulator
from tokview.store import Store


@pytest.fixture(scope="module")
def sglang() -> Iterator[Any]:
    with start_simulator(SimConfig(kind="sglang")) as running:
        yield running


def test_auto_backend_on_sglang_fails_each_capture_with_the_reason(sglang, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "messages": [{"role": "user", "content": "hi"}]}) + "\n")
    db = tmp_path / "s.duckdb"
    argv = ["batch", str(prompts), "--server", sglang.url, "--db", str(db), "--mode", "chat"]
    code = main([*argv, "--chat-template-kwargs", '{"tools": []}', "--retries", "0"])
    err = capsys.readouterr().err
    assert code == ExitCode.FAILURES
    assert "may not set tools with --mode chat on SGLang" in err
    with Store(db) as store:
        assert store.count_samples() == 0
    assert main([*argv, "--mode", "raw", "--chat-template-kwargs", '{"tools": []}']) == 0  # the raw path renders here


def test_the_simulator_refuses_a_tools_template_kwarg_as_sglang_does(sglang):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    with_tools = {**body, "chat_template_kwargs": {"tools": []}}
    refused = httpx.post(f"{sglang.url}/v1/chat/completions", json=with_tools, timeout=30)
    assert refused.status_code == 400
    assert "multiple values for keyword argument 'tools'" in refused.text
    assert httpx.post(f"{sglang.url}/v1/chat/completions", json=body, timeout=30).status_code == 200
