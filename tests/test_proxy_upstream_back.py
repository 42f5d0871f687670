"""An upstream that failed to connect and came back as another server (another model, version, kind) is detected
again before a request goes to it: its answers were recorded under the old server's name, and a stream got the
old kind's id fields (vLLM's `return_token_ids` sent to SGLang: HTTP 400 to the harness)."""

from __future__ import annotations

from typing import Any

import httpx

from tokview.proxy.serve import ProxyConfig, start_proxy
from tokview.sim.config import SimConfig
from tokview.sim.server import start_simulator
from tokview.store import Store


def _ask(client: httpx.Client, url: str, model: str, *, stream: bool = False) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "Hi?"}], "max_tokens": 8, "stream": stream}
    return client.post(url + "/v1/chat/completions", json=body)


def test_an_upstream_restarted_as_another_server_is_recorded_as_that_server(tmp_path, kimi_tok, kimi_profile) -> None:
    said: list[str] = []
    db = tmp_path / "back.duckdb"
    with start_simulator(SimConfig(kind="vllm", model_name="old-ckpt", version="0.32.0")) as first:
        port, url = first.port, first.url
        config = ProxyConfig([url], listen="127.0.0.1:0", db=str(db), tokenizer=kimi_tok, profile=kimi_profile)
        config.say = said.append
        running = start_proxy(config)
        proxy: Any = running.__enter__()
        try:
            with httpx.Client(timeout=30) as client:
                assert _ask(client, proxy.url, "old-ckpt").status_code == 200
                first.stop()
                assert _ask(client, proxy.url, "old-ckpt").status_code == 502  # down: it failed to connect
                again = SimConfig(kind="sglang", model_name="new-ckpt", version="0.5.23", port=port)
                with start_simulator(again):
                    answered = _ask(client, proxy.url, "new-ckpt", stream=True)
                    assert answered.status_code == 200, answered.text
                    assert "data: [DONE]" in answered.text
        finally:
            running.__exit__(None, None, None)
    with Store(db) as store:
        rows = store.query("SELECT model, server_kind, server_version FROM samples ORDER BY created_at")
    assert rows == [("old-ckpt", "vllm", "0.32.0"), ("new-ckpt", "sglang", "0.5.23")]
    assert any("is back as sglang 0.5.23 serving 'new-ckpt'" in line for line in said), said


def test_a_sample_carries_the_model_its_answer_names() -> None:
    """An upstream restarted between two requests (no failed connection to notice) answers as its new model: the
    sample took the start-up probe's name, silently."""
    from tokview.proxy.capture import served_model

    assert served_model({"model": "new-ckpt", "choices": []}) == "new-ckpt"
    assert served_model([{"choices": []}, {"model": "new-ckpt"}, {"model": "other"}]) == "new-ckpt"
    assert served_model({"model": ""}) is None and served_model([]) is None and served_model("x") is None
