"""A server started with `--api-key` that refuses tokview's key: `doctor` and `batch` say so and name
TOKVIEW_API_KEY. SGLang answers 401 on every path but /health and /metrics, so its kind could not be read: batch said
"neither SGLang nor vLLM … pass --backend", doctor "could not tell SGLang from vLLM" and "see its log"."""

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

KEY = "sk-right-key-123456"


@pytest.fixture(scope="module", params=["sglang", "vllm"])
def keyed(request) -> Iterator[Any]:
    with start_simulator(SimConfig(kind=request.param, api_key=KEY)) as running:
        yield running


def test_the_simulator_guards_the_paths_its_server_does(keyed):
    kind = keyed.cfg.kind
    assert httpx.get(f"{keyed.url}/health", timeout=10).status_code == 200
    assert httpx.get(f"{keyed.url}/v1/models", timeout=10).status_code == 401
    assert httpx.get(f"{keyed.url}/v1/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=10).is_success
    info = "/get_model_info" if kind == "sglang" else "/version"
    assert httpx.get(f"{keyed.url}{info}", timeout=10).status_code == (401 if kind == "sglang" else 200)


def test_doctor_and_batch_name_the_key(keyed, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TOKVIEW_API_KEY", "sk-wrong-key-999999")
    monkeypatch.delenv("TOKVIEW_DEBUG", raising=False)
    assert main(["doctor", "--server", keyed.url]) == ExitCode.FAILURES
    said = capsys.readouterr().out
    assert "set TOKVIEW_API_KEY" in said
    assert "see its log" not in said and "sk-wrong-key-999999" not in said
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "messages": [{"role": "user", "content": "hi"}]}) + "\n")
    code = main(["batch", str(prompts), "--server", keyed.url, "--db", str(tmp_path / "s.duckdb"), "--retries", "0"])
    err = capsys.readouterr().err
    assert code != ExitCode.OK
    assert "401" in err and "sk-wrong-key-999999" not in err
    # SGLang's info endpoints refuse too (the kind is unknown), vLLM's OpenAI routes: either way the run stops at its
    # probe naming the key, before a run is recorded (vLLM's every request failed with a 401, under a run id of its
    # own that the fixed key's run did not resume)
    assert "TOKVIEW_API_KEY" in err and "neither SGLang nor vLLM" not in err
    assert len(err.strip().splitlines()) == 1, err
    with Store(tmp_path / "s.duckdb") as store:
        assert store.query("SELECT count(*) FROM runs") == [(0,)]
        assert store.query("SELECT count(*) FROM failures") == [(0,)]
    monkeypatch.setenv("TOKVIEW_API_KEY", KEY)
    main(["doctor", "--server", keyed.url])
    said = capsys.readouterr().out
    assert "✓ Server kind" in said and "TOKVIEW_API_KEY" not in said
