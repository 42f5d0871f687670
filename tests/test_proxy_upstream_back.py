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


def test_the_model_an_answer_names_is_read_from_a_body_or_a_streams_first_chunk_naming_one() -> None:
    """What the recorder holds against the start-up probe's name (said once when they differ: an alias the request
    gave, or a restart no failed connection showed)."""
    from tokview.proxy.capture import served_model

    assert served_model({"model": "new-ckpt", "choices": []}) == "new-ckpt"
    assert served_model([{"choices": []}, {"model": "new-ckpt"}, {"model": "other"}]) == "new-ckpt"
    assert served_model({"model": ""}) is None and served_model([]) is None and served_model("x") is None


def test_a_probe_of_an_upstream_that_hangs_is_bounded_and_not_repeated_at_every_request() -> None:
    """Four probe calls of two attempts each held a request 20 s on a host that accepts and never answers; a probe that
    failed was tried again by every request, and a request that connected cleared the need for one."""
    import asyncio
    import time

    from tokview.proxy import app as proxy_app
    from tokview.proxy.app import ProxyApp, Upstream

    probes: list[float] = []

    async def hangs(up: Upstream) -> Upstream:
        probes.append(time.monotonic())
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    async def scenario() -> float:
        up = Upstream("http://127.0.0.1:9", "vllm", down="refused at start")
        app = ProxyApp([up], None, probe=hangs)
        old = proxy_app.PROBE_AGAIN_S
        proxy_app.PROBE_AGAIN_S = 0.2
        try:
            started = time.monotonic()
            await app._probe_again(0)
            took = time.monotonic() - started
            assert app._stale[0] and app._probe_after[0] > time.monotonic()  # not again at once
            await app.aclose()
            return took
        finally:
            proxy_app.PROBE_AGAIN_S = old

    took = asyncio.run(scenario())
    assert took < 2 and len(probes) == 1


def test_an_upstream_answering_though_its_probe_timed_out_is_not_probed_at_every_request(
    tmp_path, kimi_tok, kimi_profile, monkeypatch
) -> None:
    """A server too busy to answer the probe's calls within the bound stayed "to probe": every DOWN_S one request waited
    the whole bound again, for good."""
    import asyncio
    import time

    from tokview.proxy import app as proxy_app

    monkeypatch.setattr(proxy_app, "PROBE_AGAIN_S", 0.3)
    said: list[str] = []
    with start_simulator(SimConfig(kind="vllm")) as sim:
        config = ProxyConfig([sim.url], listen="127.0.0.1:0", db=None, tokenizer=kimi_tok, profile=kimi_profile)
        config.say = said.append
        with start_proxy(config) as proxy, httpx.Client(timeout=30) as client:
            probes: list[float] = []

            async def busy(up: Any) -> Any:
                probes.append(time.monotonic())
                await asyncio.sleep(3600)

            proxy.app.probe = busy
            proxy.app._stale[0] = True  # as after a failed connection
            walls = []
            for _ in range(3):
                began = time.monotonic()
                assert _ask(client, proxy.url, sim.cfg.model_name).status_code == 200
                walls.append(time.monotonic() - began)
            proxy.app._probe_after[0] = 0.0  # past the wait a failed probe leaves: it would probe again if stale
            assert _ask(client, proxy.url, sim.cfg.model_name).status_code == 200
    assert len(probes) == 1 and walls[0] >= 0.3 and max(walls[1:]) < 0.3, (probes, walls)
    assert any("could not be probed within 0.3 s" in line for line in said), said


def test_a_probe_refused_at_once_is_tried_again_by_the_next_request_and_never_taken_as_answered() -> None:
    """A server still restarting refuses the probe: taken as "too slow to probe", the request that reached it once it
    was up cleared the need for a probe, and the server it came back as was never read."""
    import asyncio

    from tokview.proxy.app import ProxyApp, Upstream
    from tokview.servers.errors import ServerUnreachable

    async def refused(up: Upstream) -> Upstream:
        raise ServerUnreachable("connection refused")

    async def scenario() -> tuple[bool, bool, float]:
        app = ProxyApp([Upstream("http://127.0.0.1:9", "vllm", down="refused at start")], None, probe=refused)
        await app._probe_again(0)
        await app.aclose()
        return app._stale[0], app._probe_failed[0], app._probe_after[0]

    assert asyncio.run(scenario()) == (True, False, 0.0)


def test_a_failed_connection_after_a_slow_probe_makes_the_next_request_probe_again() -> None:
    """A probe that timed out left "taken as probed before if it answers": a restart within the wait after it was
    answered by the new server without a probe, and recorded under the old one's name."""
    import asyncio

    from tokview.proxy import app as proxy_app
    from tokview.proxy.app import ProxyApp, Upstream
    from tokview.proxy.wire import UpstreamNotConnected

    async def hangs(up: Upstream) -> Upstream:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    async def scenario() -> tuple[bool, bool, float]:
        app = ProxyApp([Upstream("http://127.0.0.1:9", "vllm", down="refused at start")], None, probe=hangs)
        await app._probe_again(0)
        assert app._probe_failed[0] and app._probe_after[0] > 0
        app._pass_over(0, UpstreamNotConnected("refused", refused=True))  # stopped for its restart
        await app.aclose()
        return app._stale[0], app._probe_failed[0], app._probe_after[0]

    old = proxy_app.PROBE_AGAIN_S
    proxy_app.PROBE_AGAIN_S = 0.2
    try:
        assert asyncio.run(scenario()) == (True, False, 0.0)
    finally:
        proxy_app.PROBE_AGAIN_S = old
