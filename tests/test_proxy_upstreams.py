"""`tokview proxy --server A --server B`: a conversation stays on one server, and a server that refuses connections
is passed over.

Round-robin sent one session's turns to the servers in turn (each turn missed the other's prefix cache; two servers
of other builds would render one conversation two ways), and every other request to a dead server, answered 502
while a healthy one was up. Two simulators and the proxy on real sockets."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from tokview.proxy.serve import ProxyConfig, start_proxy
from tokview.sim.config import SimConfig
from tokview.sim.server import start_simulator
from tokview.store import Store


@pytest.fixture
def two(tmp_path, kimi_tok, kimi_profile) -> Iterator[tuple[Any, Any, Any]]:
    with start_simulator(SimConfig(kind="vllm")) as a, start_simulator(SimConfig(kind="vllm")) as b:
        config = ProxyConfig(
            [a.url, b.url],
            listen="127.0.0.1:0",
            db=str(tmp_path / "p.duckdb"),
            tokenizer=kimi_tok,
            profile=kimi_profile,
        )
        with start_proxy(config) as proxy:
            proxy.db = config.db  # type: ignore[attr-defined]
            yield a, b, proxy


def _ask(proxy: Any, messages: list[dict[str, str]], **headers: str) -> httpx.Response:
    body = {"model": "tokview-sim", "messages": messages, "max_tokens": 30, "temperature": 0}
    return httpx.post(proxy.url + "/v1/chat/completions", json=body, headers=headers, timeout=30)


def _servers_by_session(db: str) -> dict[str, set[str]]:
    with Store(db) as store:
        rows = store.query("SELECT prompt_id, server_url FROM samples")
    found: dict[str, set[str]] = {}
    for prompt_id, url in rows:
        found.setdefault(prompt_id, set()).add(url)
    return found


def test_each_conversation_stays_on_one_server_and_conversations_spread(two) -> None:
    a, b, proxy = two
    for name in ("s1", "s2", "s3", "s4", "s5", "s6"):
        history = [{"role": "user", "content": f"task {name}"}]
        for turn in range(3):
            answer = _ask(proxy, history, **{"x-tokview-session": name})
            assert answer.status_code == 200
            history += [answer.json()["choices"][0]["message"], {"role": "user", "content": f"go on {turn}"}]
    for task in range(8):  # unnamed, no system message: turn 0 sends [user], later turns [user, assistant, …]
        unnamed = [{"role": "user", "content": f"an unnamed task {task}"}]
        for turn in range(3):
            answer = _ask(proxy, unnamed)
            unnamed += [answer.json()["choices"][0]["message"], {"role": "user", "content": f"next {turn}"}]
    proxy.stop()
    servers = _servers_by_session(proxy.db)
    assert all(len(urls) == 1 for urls in servers.values()), servers
    assert len(servers) == 14 and set().union(*servers.values()) == {a.url, b.url}, servers


def test_a_server_that_refuses_connections_is_passed_over(two) -> None:
    a, b, proxy = two
    b.stop()
    codes = [_ask(proxy, [{"role": "user", "content": f"question {k}"}]).status_code for k in range(8)]
    proxy.stop()
    assert codes == [200] * 8
    with Store(proxy.db) as store:
        assert store.query("SELECT DISTINCT server_url FROM samples") == [(a.url,)]
        assert store.query("SELECT count(*) FROM failures") == [(0,)]


def test_every_server_refusing_is_a_502_recorded_as_a_failure(two) -> None:
    a, b, proxy = two
    a.stop()
    b.stop()
    answer = _ask(proxy, [{"role": "user", "content": "anyone?"}])
    proxy.stop()
    assert answer.status_code == 502 and "unreachable" in answer.text
    with Store(proxy.db) as store:
        assert store.query("SELECT count(*) FROM failures") == [(1,)]


def test_one_dead_url_given_twice_is_tried_twice_then_answered_502(tmp_path, kimi_tok, kimi_profile) -> None:
    """Upstreams are told apart by position: found by equality, a URL given twice was the first one each time, and
    the failover never ran out of upstreams to try."""
    with start_simulator(SimConfig(kind="vllm")) as sim:
        url = sim.url
        config = ProxyConfig(
            [url, url], listen="127.0.0.1:0", db=str(tmp_path / "p.duckdb"), tokenizer=kimi_tok, profile=kimi_profile
        )
        with start_proxy(config) as proxy:
            sim.stop()
            answer = _ask(proxy, [{"role": "user", "content": "anyone?"}])
    assert answer.status_code == 502


def test_a_user_with_a_lone_surrogate_is_forwarded_as_with_one_upstream(two) -> None:
    """Valid JSON the servers read (`"\\ud800"`): the upstream choice encoded it strictly, a 500 and a traceback, and
    nothing recorded."""
    _, _, proxy = two
    raw = (
        b'{"model": "tokview-sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "user": "\\ud800"}'
    )
    answer = httpx.post(proxy.url + "/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    proxy.stop()
    assert answer.status_code != 500, answer.text
    with Store(proxy.db) as store:
        samples, failures = store.query("SELECT (SELECT count(*) FROM samples), (SELECT count(*) FROM failures)")[0]
    assert samples + failures == 1


@contextmanager
def _live_and_dead(tmp_path: Any, kimi_tok: Any, kimi_profile: Any) -> Iterator[tuple[Any, Any]]:
    """(proxy, its app) in front of a live simulator and, as upstream 1, a dead host: a socket that listens and never
    accepts, its queue full, so a connection to it never comes."""
    import socket

    from tokview.proxy import app as proxy_app

    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(0)  # never accepted: once its queue is full a connection never comes
    fillers: list[socket.socket] = []
    while len(fillers) < 8:  # fill its queue: the next connection then waits for an accept that never comes
        try:
            fillers.append(socket.create_connection(hole.getsockname(), timeout=0.3))
        except TimeoutError:
            break
    dead = f"http://127.0.0.1:{hole.getsockname()[1]}"
    try:
        with start_simulator(SimConfig(kind="vllm")) as alive:
            config = ProxyConfig(
                [alive.url],
                listen="127.0.0.1:0",
                db=str(tmp_path / "p.duckdb"),
                tokenizer=kimi_tok,
                profile=kimi_profile,
            )
            with start_proxy(config) as proxy:
                app = proxy.app
                app.upstreams.append(proxy_app.Upstream(dead, "vllm"))  # a second upstream that went dark
                app._down_until.append(0.0)
                app._down_streak.append(0)
                app._stale.append(False)
                app._probe_after.append(0.0)
                app._probe_failed.append(False)
                yield proxy, app
    finally:
        for s in fillers:
            s.close()
        hole.close()


def test_a_host_whose_connections_never_come_is_passed_over_for_long(tmp_path, kimi_tok, kimi_profile, monkeypatch):
    """A dead host (no answer to a connection): each try stalls its request for the connect timeout, so passing it over
    for 5 s stalled a request every 15 s."""
    import time

    from tokview.proxy import wire

    monkeypatch.setattr(wire, "CONNECT_TIMEOUT_S", 0.5)
    with _live_and_dead(tmp_path, kimi_tok, kimi_profile) as (proxy, app):
        waits = []
        for k in range(6):
            began = time.monotonic()
            reply = _ask(proxy, [{"role": "user", "content": f"question {k}"}])
            waits.append(time.monotonic() - began)
            assert reply.status_code == 200
        assert sum(w > 0.45 for w in waits) <= 1, waits  # one stall at most, then it is passed over
        assert app._down_until[1] - time.monotonic() > 30


def test_a_client_that_gives_up_during_a_connect_to_a_dead_host_still_gets_it_passed_over(
    tmp_path, kimi_tok, kimi_profile, monkeypatch
):
    """A harness whose own timeout is shorter than the connect's cancelled the connect, and nothing found the host
    dead: each of its requests stalled on it again. The connect now goes on without the request."""
    import time

    from tokview.proxy import wire

    monkeypatch.setattr(wire, "CONNECT_TIMEOUT_S", 1.0)
    with _live_and_dead(tmp_path, kimi_tok, kimi_profile) as (proxy, app):
        app._down_until[0] = time.monotonic() + 3600  # the live one passed over: the request goes to the dead
        body = {"model": "tokview-sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        with pytest.raises(httpx.TimeoutException):
            httpx.post(proxy.url + "/v1/chat/completions", json=body, timeout=0.3)
        assert app._down_until[1] == 0.0  # not known dead yet: the connect is still under way
        deadline = time.monotonic() + 10
        while app._down_until[1] == 0.0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert app._down_until[1] - time.monotonic() > 30  # passed over as a dead host is
        app._down_until[0] = 0.0
        began = time.monotonic()
        assert _ask(proxy, [{"role": "user", "content": "again"}]).status_code == 200
        assert time.monotonic() - began < 0.9  # no stall on the dead host


def test_one_outage_met_by_many_requests_at_once_is_one_step_of_the_backoff() -> None:
    """Each request in flight counted the outage again: twelve requests that met one dead host at once passed it over
    for 5 minutes, not 60 s."""
    import time

    from tokview.proxy.app import DOWN_AFTER_TIMEOUT_S, DOWN_S, ProxyApp, Upstream, _Exchange
    from tokview.proxy.wire import UpstreamNotConnected

    app = ProxyApp([Upstream("http://127.0.0.1:1", "vllm"), Upstream("http://127.0.0.1:2", "vllm")], None)
    ex = _Exchange("POST", "/v1/chat/completions", {}, b"{}", app.upstreams[1], upstream_index=1)
    for _ in range(12):
        app._connection_refused(ex, UpstreamNotConnected("no connection within 10 s", refused=False))
    assert app._down_streak[1] == 1
    assert DOWN_AFTER_TIMEOUT_S - 1 < app._down_until[1] - time.monotonic() <= DOWN_AFTER_TIMEOUT_S
    app._down_until[1] = 0.0  # the pass-over ran out, and the host still refuses: the next step, doubled
    app._connection_refused(ex, UpstreamNotConnected("cannot connect", refused=True))
    assert app._down_streak[1] == 2
    assert 2 * DOWN_S - 1 < app._down_until[1] - time.monotonic() <= 2 * DOWN_S
    app._connected(ex)
    assert app._down_streak[1] == 0


def test_a_long_outage_stays_at_the_longest_pass_over_and_a_long_shared_start_still_spreads() -> None:
    """The backoff's exponent grew without end (a float overflow after ~1,000 steps, then every request to that
    upstream raised); and the affinity key was cut to 8 kB, so conversations sharing a 10 kB system prompt had one."""
    import time

    from tokview.proxy.app import DOWN_MAX_S, ProxyApp, Upstream, _Exchange
    from tokview.proxy.wire import UpstreamNotConnected

    app = ProxyApp([Upstream("http://127.0.0.1:1", "vllm"), Upstream("http://127.0.0.1:2", "vllm")], None)
    ex = _Exchange("POST", "/v1/chat/completions", {}, b"{}", app.upstreams[1], upstream_index=1)
    for _ in range(1100):
        app._down_until[1] = 0.0
        app._connection_refused(ex, UpstreamNotConnected("cannot connect", refused=True))
    assert app._down_until[1] - time.monotonic() <= DOWN_MAX_S
    system = {"role": "system", "content": "x" * 10_000}
    keys = set()
    for task in ("a", "b"):
        body = json.dumps({"messages": [system, {"role": "user", "content": task}]}).encode()
        keys.add(app._affinity(_Exchange("POST", "/v1/chat/completions", {}, body, app.upstreams[0])))
    assert len(keys) == 2


async def test_a_connect_its_request_gave_up_on_is_kept_for_the_next_request() -> None:
    """The connection a cancelled request's connect went on to make was closed when it came: the next request paid
    for a connect again (on a slow link, the very wait its client gave up on). It is kept, and a pool closed
    meanwhile closes it instead."""
    import asyncio

    from tokview.proxy.wire import UpstreamPool

    accepted: list[asyncio.StreamWriter] = []
    answered = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal answered
        accepted.append(writer)
        while await reader.readuntil(b"\r\n\r\n"):
            answered += 1
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            await writer.drain()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        for closed_meanwhile in (False, True):
            accepted.clear()
            pool = UpstreamPool(f"http://127.0.0.1:{port}")
            asking = asyncio.ensure_future(pool.request("GET", "/health", [], b""))
            await asyncio.sleep(0)  # the connect has begun, not ended
            asking.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asking
            if closed_meanwhile:
                pool.close()
            for _ in range(100):
                await asyncio.sleep(0.01)
                if accepted and (pool._idle or closed_meanwhile):
                    break
            assert len(accepted) == 1
            if closed_meanwhile:
                assert pool._idle == []
                continue
            assert len(pool._idle) == 1  # kept, nothing sent on it
            response = await pool.request("GET", "/health", [], b"")
            assert response.status == 200 and response.reused
            assert len(accepted) == 1 and answered == 1  # the kept connection carried it
            response.close()
            pool.close()
    finally:
        server.close()
        for writer in accepted:
            writer.close()


def test_a_server_down_at_start_is_passed_over_until_it_answers_not_a_refused_start(tmp_path, kimi_tok, kimi_profile):
    """`--server DEAD --server LIVE` exited 2 ("server unreachable"): one node of a fleet down kept the proxy from
    starting. It starts on the others, the dead one passed over (its kind theirs); all dead still fails the start."""
    import socket
    import time

    from tokview.servers.errors import ServerUnreachable

    with socket.socket() as s:  # a port nobody listens on: refused at once
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    with start_simulator(SimConfig(kind="sglang")) as alive:
        config = ProxyConfig(
            [dead, alive.url],
            listen="127.0.0.1:0",
            db=str(tmp_path / "p.duckdb"),
            tokenizer=kimi_tok,
            profile=kimi_profile,
            timeout=2,
        )
        with start_proxy(config) as proxy:
            first = proxy.app.upstreams[0]
            assert (first.url, first.kind) == (dead, "sglang") and first.down is not None
            assert "cannot connect" in first.down or "refused" in first.down.lower(), first.down
            assert proxy.app._down_until[0] > time.monotonic()
            for n in range(4):
                assert _ask(proxy, [{"role": "user", "content": f"hi {n}"}]).status_code == 200
        with Store(tmp_path / "p.duckdb") as store:
            assert store.query("SELECT count(*) FROM samples") == [(4,)]
            (run,) = store.runs()
            settings = run["settings"] if isinstance(run["settings"], dict) else json.loads(run["settings"])
            assert settings["model"] == alive.cfg.model_name  # the dead one, which named none, not counted
    with pytest.raises(ServerUnreachable):
        start_proxy(ProxyConfig([dead], listen="127.0.0.1:0", timeout=1)).__enter__()
