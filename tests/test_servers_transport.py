"""The small HTTP/1.1 transport a batch's captures go over: framing, keep-alive, failures, limits, headers.

Each test scripts a real TCP server on 127.0.0.1 (raw bytes, so every framing and every way of hanging
up can be produced) and talks to it through `ServerClient`, the way captures do. The simulator tests
check that both transports give the same captures.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from tokview.servers.errors import CaptureFailed, Retryable
from tokview.servers.http import REQUEST_SENT, ServerClient, dumps, loads, plain_http_origin
from tokview.sim.config import SimConfig
from tokview.sim.server import start_simulator

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


class Scripted:
    """A TCP server whose every connection runs `handler(reader, writer, connection_number)`."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.open_now = 0
        self.most_open = 0
        self.requests: list[bytes] = []

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        try:
            await self.handler(reader, writer, self.connections)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.open_now -= 1
            writer.close()

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        body = await reader.readexactly(length)
        self.requests.append(head + body)
        return head + body


@asynccontextmanager
async def scripted(handler_factory: Callable[[Scripted], Handler]):
    server = Scripted(lambda r, w, n: asyncio.sleep(0))
    server.handler = handler_factory(server)
    tcp = await asyncio.start_server(server._serve, "127.0.0.1", 0)
    port = tcp.sockets[0].getsockname()[1]
    try:
        yield server, f"http://127.0.0.1:{port}"
    finally:
        tcp.close()


def ok(body: bytes = b'{"ok": true}', extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s" % (
        len(body),
        extra,
        body,
    )


def keep_answering(server: Scripted, answer: Callable[[int], bytes] = lambda n: ok()) -> Handler:
    async def handler(reader, writer, conn):
        while True:
            await server.read_request(reader)
            writer.write(answer(conn))
            await writer.drain()

    return handler


async def test_keep_alive_reuses_one_connection_for_sequential_requests() -> None:
    async with scripted(keep_answering) as (server, url):
        client = ServerClient(url)
        assert client._fast is not None
        for _ in range(5):
            assert await client.post_json("/v1/completions", {"prompt": [1, 2, 3]}) == {"ok": True}
        await client.aclose()
    assert server.connections == 1
    assert len(server.requests) == 5


@pytest.mark.parametrize("fast", [True, False])
async def test_a_request_in_flight_is_told_before_its_answer_comes(fast: bool) -> None:
    """`REQUEST_SENT` is called as the request goes out, while the server still holds the answer (a
    `--workers` batch spawns its children then), once per request, and only in the context that set it."""
    release = asyncio.Event()

    def held(server: Scripted) -> Handler:
        async def handler(reader, writer, conn):
            while True:
                await server.read_request(reader)
                await release.wait()
                writer.write(ok())
                await writer.drain()

        return handler

    told: list[int] = []
    async with scripted(held) as (server, url):
        client = ServerClient(url, fast=fast)
        assert (client._fast is not None) == fast
        token = REQUEST_SENT.set(lambda: told.append(len(server.requests)))
        try:
            answer = asyncio.create_task(client.post_json("/v1/completions", {"prompt": [1]}))
        finally:
            REQUEST_SENT.reset(token)
        for _ in range(2000):  # 10 s at most: a request never told fails here, not at the suite's timeout
            if told:
                break
            assert not answer.done()
            await asyncio.sleep(0.005)
        assert told, "the request was never told as sent"
        assert not answer.done()
        release.set()
        assert await answer == {"ok": True}
        assert await client.post_json("/v1/completions", {"prompt": [2]}) == {"ok": True}  # not in that context
        await client.aclose()
    assert len(told) == 1


async def test_chunked_body_with_extensions_and_trailers() -> None:
    def factory(server):
        async def handler(reader, writer, conn):
            await server.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            for part in (b'{"ids": [1,', b" 2, 3]", b"}"):
                writer.write(b"%x;ext=1\r\n%s\r\n" % (len(part), part))
                await writer.drain()
                await asyncio.sleep(0.01)
            writer.write(b"0\r\nx-trailer: yes\r\n\r\n")
            await server.read_request(reader)  # the connection is kept for a second request
            writer.write(ok(b"[4]"))

        return handler

    async with scripted(factory) as (server, url):
        client = ServerClient(url)
        assert await client.get_json("/a") == {"ids": [1, 2, 3]}
        assert await client.get_json("/b") == [4]
        await client.aclose()
    assert server.connections == 1


async def test_a_body_that_arrives_byte_by_byte() -> None:
    body = dumps({"token_ids": list(range(500)), "text": "é" * 50})

    def factory(server):
        async def handler(reader, writer, conn):
            await server.read_request(reader)
            for b in ok(body):
                writer.write(bytes([b]))
                if b % 7 == 0:
                    await writer.drain()
            await writer.drain()

        return handler

    async with scripted(factory) as (_, url):
        client = ServerClient(url)
        assert await client.get_json("/x") == {"token_ids": list(range(500)), "text": "é" * 50}
        await client.aclose()


async def test_a_body_framed_by_the_close_of_the_connection() -> None:
    def factory(server):
        async def handler(reader, writer, conn):
            await server.read_request(reader)
            writer.write(b'HTTP/1.0 200 OK\r\ncontent-type: application/json\r\n\r\n{"old": "server"}')
            await writer.drain()
            writer.close()

        return handler

    async with scripted(factory) as (server, url):
        client = ServerClient(url)
        assert await client.get_json("/x") == {"old": "server"}
        assert await client.get_json("/x") == {"old": "server"}  # a new connection each time
        await client.aclose()
    assert server.connections == 2


async def test_informational_answer_before_the_real_one() -> None:
    def factory(server):
        async def handler(reader, writer, conn):
            await server.read_request(reader)
            writer.write(b"HTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\n" + ok(b"7"))

        return handler

    async with scripted(factory) as (_, url):
        client = ServerClient(url)
        assert await client.get_json("/x") == 7
        await client.aclose()


async def test_connection_close_header_is_honoured() -> None:
    async with scripted(lambda server: keep_answering(server, lambda n: ok(extra=b"connection: close\r\n"))) as (
        server,
        url,
    ):
        client = ServerClient(url)
        for _ in range(3):
            assert await client.get_json("/x") == {"ok": True}
        await client.aclose()
    assert server.connections == 3


async def test_bytes_past_an_answers_length_never_answer_the_next_request() -> None:
    """A server (or a broken gateway) that writes more than its content-length: the rest stayed in the connection's
    buffer and answered the next request on it, and every answer after it was one request late (a batch stored one
    prompt's answer under the next prompt). A connection with bytes left over is not used again."""

    def factory(server):
        async def handler(reader, writer, conn):
            while True:
                request = await server.read_request(reader)
                asked = request.rsplit(b"\r\n\r\n", 1)[1]
                stray = ok(b'"stray"')
                writer.write(ok(asked) + stray)  # one write: both arrive in one read
                await writer.drain()

        return handler

    async with scripted(factory) as (server, url):
        client = ServerClient(url, concurrency=1)
        for k in range(4):
            assert await client.post_json("/v1/completions", {"q": k}) == {"q": k}
        await client.aclose()
    assert server.connections == 4


async def test_a_head_whose_lines_end_in_a_bare_lf_is_read() -> None:
    """RFC 9112 lets a recipient accept a bare LF as a line end: waiting for a CR LF that never came said "timed out"
    of a server that had answered at once."""

    def factory(server):
        async def handler(reader, writer, conn):
            while True:
                await server.read_request(reader)
                writer.write(b'HTTP/1.1 200 OK\ncontent-type: application/json\ncontent-length: 8\n\n{"a": 1}')
                await writer.drain()
                await server.read_request(reader)  # a chunked body whose lines end in LF too, a trailer with them
                writer.write(b'HTTP/1.1 200 OK\ntransfer-encoding: chunked\n\n4\n{"a"\n4\n: 1}\n0\nx-t: 1\n\n')
                await writer.drain()

        return handler

    async with scripted(factory) as (server, url):
        client = ServerClient(url, timeout=5)
        for _ in range(4):
            assert await client.get_json("/x") == {"a": 1}
        await client.aclose()
    assert server.connections == 1


async def test_an_answer_compressed_though_none_was_asked_for_is_read_as_it_stands_for() -> None:
    """tokview asks for no compression; a gateway that compresses anyway was read as text ("not JSON ('\\x1f\\x8b…')"),
    and retried. gzip and deflate are undone; another coding is a failure that names it, not retried."""
    import gzip
    import zlib

    codings = iter([b"gzip", b"deflate", b"br"])

    def factory(server):
        async def handler(reader, writer, conn):
            while True:
                await server.read_request(reader)
                coding = next(codings)
                body = gzip.compress(b'{"ok": 1}') if coding == b"gzip" else zlib.compress(b'{"ok": 1}')
                writer.write(ok(body, extra=b"content-encoding: " + coding + b"\r\n"))
                await writer.drain()

        return handler

    async with scripted(factory) as (server, url):
        client = ServerClient(url)
        assert await client.post_json("/v1/completions", {}) == {"ok": 1}
        assert await client.post_json("/v1/completions", {}) == {"ok": 1}
        with pytest.raises(CaptureFailed, match="compressed as 'br'"):
            await client.post_json("/v1/completions", {})
        await client.aclose()
    assert all(b"\r\naccept-encoding: identity\r\n" in request for request in server.requests)
    assert len(server.requests) == 3  # the unreadable coding was not asked again


async def test_an_error_in_an_unreadable_coding_is_still_classified_by_its_status() -> None:
    """A 503 whose body came as `br`: its status says to retry; the coding only costs the reason its text."""

    def factory(server):
        async def handler(reader, writer, conn):
            while True:
                await server.read_request(reader)
                body = b"\x1b\x00not brotli"
                writer.write(
                    b"HTTP/1.1 503 Service Unavailable\r\ncontent-encoding: br\r\ncontent-length: %d\r\n\r\n%s"
                    % (len(body), body)
                )
                await writer.drain()

        return handler

    async with scripted(factory) as (_, url):
        client = ServerClient(url)
        with pytest.raises(Retryable, match="503"):
            await client.post_json("/v1/completions", {})
        await client.aclose()


async def test_a_kept_alive_connection_the_server_closed_is_replaced_without_a_failure() -> None:
    """The server answers one request per connection but says nothing (no `connection: close`)."""

    def factory(server):
        async def handler(reader, writer, conn):
            await server.read_request(reader)
            writer.write(ok(b"%d" % conn))
            await writer.drain()
            writer.close()

        return handler

    async with scripted(factory) as (_, url):
        client = ServerClient(url)
        assert await client.get_json("/x") == 1
        await asyncio.sleep(0.05)  # the close reaches the client while the connection idles
        assert await client.get_json("/x") == 2
        assert await client.get_json("/x") == 3  # no sleep: the request may meet the close in flight
        await client.aclose()


async def test_a_close_mid_body_is_a_retryable_lost_connection() -> None:
    def factory(server):
        async def handler(reader, writer, conn):
            await server.read_request(reader)
            writer.write(ok(b'{"token_ids": [1, 2, 3]}')[:-6])
            await writer.drain()
            await asyncio.sleep(0.05)  # the client has the head and part of the body
            writer.transport.abort()

        return handler

    async with scripted(factory) as (server, url):
        client = ServerClient(url)
        with pytest.raises(Retryable) as exc:
            await client.post_json("/v1/completions", {"prompt": [1]})
        await client.aclose()
    assert "connection lost during POST" in exc.value.reason
    assert not exc.value.connection
    assert server.connections == 1  # part of the answer had arrived: not sent again


@pytest.mark.parametrize("garbage", [b"SSH-2.0-OpenSSH_9.6\r\n\r\n", b"HTTP/1.1 abc\r\n\r\n", b"x" * 70_000])
async def test_an_answer_that_is_not_http_is_a_lost_connection(garbage: bytes) -> None:
    def factory(server):
        async def handler(reader, writer, conn):
            await server.read_request(reader)
            writer.write(garbage)
            await writer.drain()
            await asyncio.sleep(1)

        return handler

    async with scripted(factory) as (_, url):
        client = ServerClient(url)
        with pytest.raises(Retryable, match="connection lost"):
            await client.get_json("/x")
        await client.aclose()


async def test_bad_chunk_size_is_a_lost_connection() -> None:
    def factory(server):
        async def handler(reader, writer, conn):
            await server.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n")
            await writer.drain()
            await asyncio.sleep(1)

        return handler

    async with scripted(factory) as (_, url):
        client = ServerClient(url)
        with pytest.raises(Retryable, match="bad chunk size"):
            await client.get_json("/x")
        await client.aclose()


async def test_silence_is_a_timeout_and_trickling_bytes_within_the_deadline_are_not() -> None:
    """Trickling past the deadline is a timeout too: tests/test_request_deadline.py."""

    def factory(server):
        async def handler(reader, writer, conn):
            await server.read_request(reader)
            if conn == 1:
                await asyncio.sleep(5)  # nothing at all
                return
            for b in ok(b'{"slow": "but alive"}'):  # one byte every 4 ms: ~0.3 s in all, within the deadline
                writer.write(bytes([b]))
                await writer.drain()
                await asyncio.sleep(0.004)

        return handler

    async with scripted(factory) as (_, url):
        client = ServerClient(url, timeout=0.2)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(Retryable, match=r"timed out after 0.2s waiting for GET"):
            await client.get_json("/x")
        assert loop.time() - started < 1.0
        await client.aclose()
        client = ServerClient(url, timeout=3)
        assert await client.get_json("/x") == {"slow": "but alive"}
        await client.aclose()


async def test_refused_connection_counts_against_the_server() -> None:
    async with scripted(keep_answering) as (_, url):
        pass  # closed: nothing listens on that port any more
    client = ServerClient(url, timeout=1)
    with pytest.raises(Retryable) as exc:
        await client.post_json("/v1/completions", {})
    await client.aclose()
    assert exc.value.connection
    assert exc.value.reason.startswith(f"cannot connect to {url}")


async def test_at_most_concurrency_connections_at_once() -> None:
    def factory(server):
        async def handler(reader, writer, conn):
            while True:
                await server.read_request(reader)
                await asyncio.sleep(0.02)
                writer.write(ok())
                await writer.drain()

        return handler

    async with scripted(factory) as (server, url):
        client = ServerClient(url, concurrency=2)
        results = await asyncio.gather(*(client.get_json("/x") for _ in range(7)))
        await client.aclose()
    assert results == [{"ok": True}] * 7
    assert server.most_open == 2
    assert server.connections == 2


async def test_headers_sent_bearer_key_and_basic_auth(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKVIEW_API_KEY", "sk-secret-key")
    async with scripted(keep_answering) as (server, url):
        client = ServerClient(url)
        await client.post_json("/v1/completions", {"prompt": [1], "logit_bias": {5: 1.0}})
        audit = client.audit_request("POST", "/v1/completions", {"prompt": [1]})
        await client.aclose()
        with_user = url.replace("http://", "http://alice:pa%20ss@")
        basic = ServerClient(with_user)
        await basic.get_json("/v1/models")
        await basic.aclose()
    head, _, body = server.requests[0].partition(b"\r\n\r\n")
    lines = head.decode().lower().split("\r\n")
    assert lines[0] == "post /v1/completions http/1.1"
    assert f"host: {url.removeprefix('http://')}" in lines
    assert "authorization: bearer sk-secret-key" in lines
    assert "content-type: application/json" in lines
    assert f"content-length: {len(body)}" in lines
    assert "user-agent: tokview" in lines
    assert loads(body) == {"prompt": [1], "logit_bias": {"5": 1.0}}
    assert "sk-secret-key" not in str(audit)
    assert audit["headers"]["content-type"] == "application/json"
    basic_head = server.requests[1].split(b"\r\n\r\n")[0].decode()
    assert f"authorization: Basic {base64.b64encode(b'alice:pa ss').decode()}" in basic_head
    assert "sk-secret-key" not in basic_head  # the URL's credentials win over the key


def test_https_and_proxies_go_to_httpx(monkeypatch: pytest.MonkeyPatch) -> None:
    assert plain_http_origin("http://127.0.0.1:8000/prefix") == ("127.0.0.1", 8000, "/prefix")
    assert plain_http_origin("http://example.org") == ("example.org", 80, "")
    assert plain_http_origin("https://example.org") is None
    monkeypatch.setenv("HTTP_PROXY", "http://proxy:3128")
    assert plain_http_origin("http://127.0.0.1:8000") is None
    assert ServerClient("http://127.0.0.1:8000")._fast is None


def test_json_bodies_orjson_with_the_standard_library_as_fallback() -> None:
    assert loads(b'{"a": [1, 2.5, "\\u00e9"]}') == {"a": [1, 2.5, "é"]}
    assert loads(b'{"x": NaN, "big": 123456789012345678901234567890}')["big"] == 123456789012345678901234567890
    assert loads(dumps({1: [2**70]})) == {"1": [2**70]}
    with pytest.raises(ValueError):
        loads(b"not json")


async def test_an_answer_nested_deeper_than_pythons_json_reads_is_a_malformed_answer() -> None:
    """orjson refuses it, Python's json then raised RecursionError (no ValueError): out of the retry and failure
    handling, it ended the whole run. The same body in an error answer, an event stream and the proxy's recorder."""
    from tokview.proxy.recorder import _parsed_json
    from tokview.proxy.sse import data_of
    from tokview.servers.errors import error_message

    deep = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(ValueError, match="nested too deeply"):
        loads(deep)
    async with scripted(lambda server: keep_answering(server, lambda n: ok(deep))) as (_, url):
        client = ServerClient(url)
        with pytest.raises((Retryable, CaptureFailed)):
            await client.post_json("/v1/completions", {"prompt": [1, 2, 3]})
        await client.aclose()
    assert data_of(b"data: " + deep) is None
    assert _parsed_json(deep) is None
    assert error_message(deep, 40).startswith("[[[")


async def _capture_both(sim_url: str, kimi_tok: Any, path: str, body: dict[str, Any]) -> list[Any]:
    answers = []
    for fast in (True, False):
        client = ServerClient(sim_url, fast=fast)
        assert (client._fast is not None) == fast
        answers.append(await client.post_json(path, body))
        await client.aclose()
    return answers


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
async def test_both_transports_give_the_same_answers(kimi_tok: Any, kind: str) -> None:
    ids = kimi_tok.render([{"role": "user", "content": "What is 6 times 7?"}], template_kwargs={"thinking": True})
    with start_simulator(SimConfig(kind=kind)) as sim:
        if kind == "vllm":
            body = {"prompt": ids, "max_tokens": 64, "temperature": 0.0, "return_token_ids": True, "seed": 1}
            fast, slow = await _capture_both(sim.url, kimi_tok, "/v1/completions", body)
            assert fast["choices"][0]["token_ids"] == slow["choices"][0]["token_ids"]
        else:
            body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 64, "temperature": 0.0}}
            fast, slow = await _capture_both(sim.url, kimi_tok, "/generate", body)
            assert fast["output_ids"] == slow["output_ids"]
            assert fast["text"] == slow["text"]
            assert fast["meta_info"]["finish_reason"] == slow["meta_info"]["finish_reason"]
            return
        for answer in (fast, slow):
            answer.pop("id"), answer.pop("created")
        assert fast == slow


async def test_the_info_endpoints_are_asked_at_once() -> None:
    """`detect` asks the four info endpoints together (one after another they were four round trips at every
    start): the server holds each until all four are in, and answers them."""
    from tokview.servers.features import INFO_PATHS, detect
    from tokview.servers.retry import RetryPolicy

    waiting: list[bytes] = []
    all_in = asyncio.Event()

    def held_until_all_in(server: Scripted) -> Handler:
        async def handler(reader, writer, conn):
            while True:
                request = await server.read_request(reader)
                waiting.append(request.split(b" ")[1])
                if len(waiting) == len(INFO_PATHS):
                    all_in.set()
                try:
                    await asyncio.wait_for(all_in.wait(), 5)
                except TimeoutError:
                    pass  # asked one after another: answer, so the test fails on its assertion, not a hang
                writer.write(ok(b'{"version": "0.32.0"}'))
                await writer.drain()

        return handler

    async with scripted(held_until_all_in) as (_, url):
        client = ServerClient(url, concurrency=4)
        try:
            info = await detect(client, RetryPolicy(retries=0), endpoints=False)
        finally:
            await client.aclose()
    assert all_in.is_set()
    assert sorted(waiting) == sorted(p.encode() for p in INFO_PATHS)
    assert info.kind == "vllm" and info.version == "0.32.0"


async def test_a_dead_server_is_unreachable_once_with_no_ask_left_running() -> None:
    from tokview.servers.errors import ServerUnreachable
    from tokview.servers.features import detect
    from tokview.servers.retry import RetryPolicy

    async with scripted(keep_answering) as (_, url):
        pass  # closed: nothing listens on its port any more
    client = ServerClient(url, connect_timeout=1)
    try:
        with pytest.raises(ServerUnreachable):
            await detect(client, RetryPolicy(retries=0), endpoints=False)
    finally:
        await client.aclose()
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert others == []


@pytest.mark.parametrize("reply", [b"\x00\xffGARBAGE\r\n\r\n", b""])
async def test_a_port_that_gives_no_http_answer_is_said_so_not_an_unknown_http_server(reply: bytes) -> None:
    """A port some other program listens on (it closes at once, or answers bytes that are not HTTP) was said to
    "answer HTTP but be neither SGLang nor vLLM", sending the user after the URL's path or --backend."""
    from tokview.core.profiles import get_profile
    from tokview.servers import ServerPool, ServerUnreachable

    def not_http(server: Scripted) -> Handler:
        async def handler(reader, writer, conn):
            await server.read_request(reader)
            writer.write(reply)
            await writer.drain()

        return handler

    async with scripted(not_http) as (_, url):
        pool = ServerPool(url, profile=get_profile("kimi-k2.5"), retries=0, timeout=5)
        with pytest.raises(ServerUnreachable) as refused:
            await pool.start()
    said = str(refused.value)
    assert "gave no HTTP answer: connection lost during GET" in said, said
    assert "answers HTTP" not in said
