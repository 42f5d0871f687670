"""`tokview proxy` against hostile or unusual clients and upstreams: a clear HTTP error, never a hang, a request
smuggled past the proxy, or a generation left running upstream. Each case was found by sending it.

- a negative chunk size (`-6`, which `int(…, 16)` reads) looped the event loop forever: every client hung;
- a bare LF inside a header value was forwarded as it came: a new header line (or a second request) to an
  upstream that splits lines on LF;
- a client gone before the upstream's head left the upstream connection open: the generation ran to its end;
- a Content-Length `isdigit()` accepts and `int()` refuses (`²`) dropped the connection with a traceback;
- two Content-Lengths, a coding other than chunked, `0x` chunk sizes, chunk data not ended by CRLF were read
  one way by the proxy where an upstream could read them another;
- lines ending in bare LF waited for the idle timeout; a head over the limit got through when it came in one read;
- an HTTP/1.0 client asking for keep-alive got no `connection: keep-alive` and waited for the connection to end;
- an answer with a cut id array was a 500 with a traceback; `"return_token_ids": 1` had the client's ids taken
  out; a client's own sglext flag lost its sglext chunk; a percent-encoded generation path went unrecorded; a
  request nested deeper than orjson writes was a 500; a streamed one nested too deep to re-write at all was a 500
  after the upstream had generated;
- with a key (`--allow-remote`), a client without it had its whole body read (up to 1 GiB a connection) and a
  `100 Continue` before the 401; a key a header cannot carry (a trailing newline, non-ASCII) refused every client;
- an integer past 64 bits in a request went upstream as a float; a redirect naming the upstream sent the client
  around the proxy.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import orjson
import pytest
from proxy_front import exchange

from tokview.proxy.app import NOT_AN_OBJECT
from tokview.proxy.serve import ProxyConfig, start_proxy
from tokview.sim.config import SimConfig
from tokview.sim.server import start_simulator
from tokview.store import Store


@pytest.fixture
def proxy(vllm_sim) -> Iterator[Any]:
    with start_proxy(ProxyConfig([vllm_sim.url], listen="127.0.0.1:0", db=None)) as running:
        yield running


MARK = b"hostile-test"
"""In the body of the test's own generation: the probes the proxy sends at start-up are answered as usual."""


class _Upstream:
    """A scripted upstream: answers each request with `answer`; a POST whose body holds MARK with `post_answer` when
    given, or never when `hold_posts` (a generation that never answers). Keeps every request (`received`) and says
    when a held request's connection closed (`held_closed`)."""

    def __init__(self, answer: bytes, hold_posts: bool = False, post_answer: bytes | None = None) -> None:
        self.answer, self.hold_posts, self.post_answer = answer, hold_posts, post_answer
        self.received: list[bytes] = []
        self.held_closed = threading.Event()
        self.url = ""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        holding = False
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (int(x.split(b":")[1]) for x in head.split(b"\r\n") if x.lower().startswith(b"content-length:")), 0
                )
                request = head + await reader.readexactly(length)
                self.received.append(request)
                if MARK in request and self.hold_posts:
                    holding = True
                    await reader.read()  # until the proxy closes it
                    break
                marked = MARK in request and self.post_answer is not None
                writer.write(self.post_answer if marked else self.answer)  # type: ignore[arg-type]
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        if holding:
            self.held_closed.set()
        writer.close()


@contextmanager
def _upstream(answer: bytes, hold_posts: bool = False, post_answer: bytes | None = None) -> Iterator[_Upstream]:
    up = _Upstream(answer, hold_posts, post_answer)
    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(asyncio.start_server(up.handle, "127.0.0.1", 0))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    up.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield up
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


MODELS = b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 37\r\n\r\n{"object":"list","data":[{"id":"m"}]}'
CHAT = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"


def _chat(vllm_sim: Any, **extra: Any) -> dict[str, Any]:
    return {"model": vllm_sim.cfg.model_name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, **extra}


def test_a_negative_chunk_size_is_refused_and_other_clients_are_still_served(proxy) -> None:
    raw = CHAT + b"transfer-encoding: chunked\r\n\r\n-6\r\nabcdef\r\n0\r\n\r\n"
    assert _status(exchange(proxy.url, raw)) == 400
    assert httpx.get(proxy.url + "/v1/models", timeout=5).status_code == 200


@pytest.mark.parametrize(
    "framing",
    [
        b"transfer-encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n",
        b"transfer-encoding: chunked\r\n\r\n1_0\r\n" + b"a" * 16 + b"\r\n0\r\n\r\n",
        b"transfer-encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n",
        b"transfer-encoding: gzip\r\ncontent-length: 2\r\n\r\n{}",
        b"transfer-encoding: chunked\r\ncontent-length: 2\r\n\r\n0\r\n\r\n",
        b"content-length: 2\r\ncontent-length: 3\r\n\r\n{}x",
        b"content-length: \xc2\xb2\r\n\r\n{}",
        b"content-length: " + b"9" * 5000 + b"\r\n\r\n{}",
        b"content-length: 99999999999\r\n\r\n{}",
    ],
    ids=[
        "0x",
        "underscore",
        "no-crlf-after-data",
        "gzip",
        "chunked-and-length",
        "two-lengths",
        "superscript",
        "5000-digits",
        "too-large",
    ],
)
def test_framing_an_upstream_could_read_another_way_is_refused(proxy, framing) -> None:
    got = exchange(proxy.url, CHAT + framing)
    assert _status(got) in (400, 413) and b"connection: close" in got.lower()


def test_a_bad_length_behind_a_good_request_is_answered_not_left_hanging(vllm_sim, proxy) -> None:
    body = orjson.dumps(_chat(vllm_sim))
    good = CHAT + b"content-length: %d\r\n\r\n%s" % (len(body), body)
    got = exchange(proxy.url, good + CHAT + b"content-length: \xc2\xb2\r\n\r\n{}")
    assert got.startswith(b"HTTP/1.1 200 ") and b"HTTP/1.1 400 " in got


@pytest.mark.parametrize(
    "header",
    [b"x-a: 1\ntransfer-encoding: chunked", b"x-a: 1\rauthorization: Bearer injected", b"x-a: a\x00b"],
    ids=["bare-lf", "bare-cr", "nul"],
)
def test_a_header_value_holding_a_line_break_or_nul_is_refused_and_never_forwarded(header) -> None:
    with _upstream(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}") as up:
        with start_proxy(ProxyConfig([up.url], listen="127.0.0.1:0", db=None, kind="vllm")) as proxy:
            got = exchange(proxy.url, b"GET /v1/models HTTP/1.1\r\nhost: x\r\n" + header + b"\r\n\r\n")
            assert _status(got) == 400
            assert httpx.get(proxy.url + "/v1/models").status_code == 200  # the next request is forwarded
    assert all(b"injected" not in r and b"chunked" not in r for r in up.received)


def test_lines_ending_in_bare_lf_and_a_head_over_the_limit_get_their_answer_at_once(proxy) -> None:
    assert _status(exchange(proxy.url, b"GET /v1/models HTTP/1.1\nhost: x\n\n", timeout=5)) == 400
    huge = b"GET /v1/models HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 70_000 + b"\r\n\r\n"
    assert _status(exchange(proxy.url, huge, timeout=5)) == 431


def test_an_http10_client_asking_for_keep_alive_is_told_and_kept(proxy) -> None:
    host, port = proxy.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        answers = []
        for _ in range(2):
            sock.sendall(b"GET /v1/models HTTP/1.0\r\nconnection: keep-alive\r\n\r\n")
            got = b""
            while b"\r\n\r\n" not in got:
                got += sock.recv(65536)
            head, _, body = got.partition(b"\r\n\r\n")
            length = int(next(x for x in head.split(b"\r\n") if x.lower().startswith(b"content-length")).split(b":")[1])
            while len(body) < length:
                body += sock.recv(65536)
            answers.append(head.lower())
    assert all(a.startswith(b"http/1.1 200 ") and b"connection: keep-alive" in a for a in answers)


def test_a_client_gone_before_the_upstreams_head_closes_the_upstream_request() -> None:
    with (
        _upstream(MODELS, hold_posts=True) as up,
        start_proxy(ProxyConfig([up.url], listen="127.0.0.1:0", db=None, kind="vllm")) as proxy,
    ):
        body = b'{"model":"m","messages":[{"role":"user","content":"%s"}]}' % MARK
        host, port = proxy.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(CHAT + b"content-length: %d\r\n\r\n%s" % (len(body), body))
            deadline = time.monotonic() + 10
            while not any(MARK in r for r in up.received) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert any(MARK in r for r in up.received)  # upstream, waiting for its answer
        assert up.held_closed.wait(10), "the upstream request was left open after the client went away"


def test_an_answer_with_a_cut_id_array_is_a_502_not_a_traceback() -> None:
    cut = b'{"choices":[{"index":0,"message":{"role":"assistant","content":"x"},"token_ids":[1,2,3'
    answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(cut), cut)
    with (
        _upstream(answer) as up,
        start_proxy(ProxyConfig([up.url], listen="127.0.0.1:0", db=None, kind="vllm")) as proxy,
    ):
        got = httpx.post(proxy.url + "/v1/chat/completions", json={"model": "m", "messages": []})
    assert got.status_code == 502 and "malformed" in got.json()["error"]["message"]


def test_a_negative_chunk_size_from_the_upstream_breaks_off_the_answer() -> None:
    bad = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n-6\r\n"
    with (
        _upstream(MODELS, post_answer=bad) as up,
        start_proxy(ProxyConfig([up.url], listen="127.0.0.1:0", db=None, kind="vllm")) as proxy,
    ):
        marked = {"model": "m", "messages": [{"role": "user", "content": MARK.decode()}]}
        got = httpx.post(proxy.url + "/v1/chat/completions", json=marked, timeout=10)
        assert got.status_code == 502
        assert httpx.get(proxy.url + "/v1/models", timeout=10).status_code == 200  # and still serving


@pytest.mark.parametrize("value", [1, "true", "yes"])
def test_a_client_asking_for_ids_in_words_the_server_reads_as_true_gets_them(vllm_sim, proxy, value) -> None:
    body = _chat(vllm_sim, return_token_ids=value)
    direct = httpx.post(vllm_sim.url + "/v1/chat/completions", json=body).json()
    through = httpx.post(proxy.url + "/v1/chat/completions", json=body).json()
    assert direct["choices"][0]["token_ids"] and through["choices"][0]["token_ids"] == direct["choices"][0]["token_ids"]


def test_a_request_nested_deeper_than_orjson_writes_is_forwarded(vllm_sim, proxy) -> None:
    nested: Any = "deep"
    for _ in range(300):
        nested = {"a": nested}
    body = json.dumps({**_chat(vllm_sim), "metadata": nested})
    direct = httpx.post(
        vllm_sim.url + "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
    )
    through = httpx.post(proxy.url + "/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert through.status_code == direct.status_code != 500


def test_an_sglang_client_asking_for_its_own_sglext_ids_keeps_them(kimi_tok, kimi_profile) -> None:
    with start_simulator(SimConfig(kind="sglang")) as sglang:
        body = _chat(sglang, stream=True, return_input_ids_in_sglext=True)
        direct = httpx.post(sglang.url + "/v1/chat/completions", json=body).content
        with start_proxy(ProxyConfig([sglang.url], listen="127.0.0.1:0", db=None)) as proxy:
            through = httpx.post(proxy.url + "/v1/chat/completions", json=body).content
    assert direct.count(b'"sglext"') == through.count(b'"sglext"') >= 1
    assert b'"output_ids"' not in through


def test_a_percent_encoded_generation_path_is_recorded(vllm_sim, tmp_path, kimi_tok, kimi_profile) -> None:
    db = str(tmp_path / "p.duckdb")
    config = ProxyConfig([vllm_sim.url], listen="127.0.0.1:0", db=db, tokenizer=kimi_tok, profile=kimi_profile)
    with start_proxy(config) as proxy:
        for path in ("/v1/chat/completions", "/v1/chat/%63ompletions"):
            assert httpx.post(proxy.url + path, json=_chat(vllm_sim)).status_code == 200
    with Store(db) as store:
        assert store.query("SELECT count(*) FROM samples") == [(2,)]


def test_a_client_without_the_key_is_refused_before_its_body_is_read(vllm_sim) -> None:
    config = ProxyConfig([vllm_sim.url], listen="127.0.0.1:0", db=None, key="s3cret")
    with start_proxy(config) as proxy:
        host, port = proxy.url.removeprefix("http://").split(":")
        sock = socket.create_connection((host, int(port)), timeout=10)
        sock.sendall(CHAT + b"expect: 100-continue\r\ncontent-length: 1073741824\r\n\r\n")
        answer = b""
        while b"\r\n\r\n" not in answer:
            got = sock.recv(65536)
            if not got:
                break
            answer += got
        sock.close()
        assert _status(answer) == 401 and b"100 Continue" not in answer and b"connection: close" in answer
        ok = httpx.post(
            proxy.url + "/v1/chat/completions", json=_chat(vllm_sim), headers={"authorization": "Bearer s3cret"}
        )
        assert ok.status_code == 200


@pytest.mark.parametrize("key", ["s3cret\n", " s3cret", "cl\u00e9"])
def test_a_key_no_header_can_carry_is_refused_at_start(vllm_sim, key) -> None:
    from tokview.errors import UserError

    with (
        pytest.raises(UserError, match="printable ASCII"),
        start_proxy(ProxyConfig([vllm_sim.url], listen="127.0.0.1:0", db=None, key=key)),
    ):
        pass


def test_a_stream_too_deep_to_rewrite_is_relayed_with_its_ids_asked_not_a_500() -> None:
    """Past Python's recursion limit neither orjson nor json writes the body back: the id field is written into the
    client's own bytes instead (never re-serialised), and the upstream's stream reaches the client unchanged."""
    events = b'data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
    stream = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n%s" % (
        len(events),
        events,
    )
    head = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"' + MARK + b'"}],"x":'
    body = head + b"[" * 1010 + b"]" * 1010 + b"}"
    with (
        _upstream(MODELS, post_answer=stream) as up,
        start_proxy(ProxyConfig([up.url], listen="127.0.0.1:0", db=None, kind="vllm")) as proxy,
    ):
        got = httpx.post(proxy.url + "/v1/chat/completions", content=body, timeout=10)
        sent = next(r for r in up.received if MARK in r)
    assert got.status_code == 200 and got.content == events
    assert sent.endswith(body[:-1] + b',"return_token_ids":true}')


def test_an_integer_past_64_bits_reaches_the_upstream_exact(vllm_sim) -> None:
    """orjson reads such an integer as a float: the re-written body said `1e+23` where the client said
    99999999999999999999999 (the servers' pydantic then reads another value, or refuses it)."""
    seen: list[bytes] = []
    answer = b'{"choices":[{"index":0,"message":{"role":"assistant","content":"x"},"token_ids":[1]}]}'
    reply = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(answer), answer)
    body = b'{"model":"m","messages":[{"role":"user","content":"' + MARK + b'"}],"seed":99999999999999999999999}'
    with (
        _upstream(MODELS, post_answer=reply) as up,
        start_proxy(ProxyConfig([up.url], listen="127.0.0.1:0", db=None, kind="vllm")) as proxy,
    ):
        assert httpx.post(proxy.url + "/v1/chat/completions", content=body, timeout=10).status_code == 200
        seen = [r for r in up.received if MARK in r]
    sent = json.loads(seen[0].split(b"\r\n\r\n", 1)[1])
    assert sent["seed"] == 99999999999999999999999 and sent["return_token_ids"] is True


def test_a_redirect_naming_the_upstream_sends_the_client_back_through_the_proxy() -> None:
    """FastAPI answers a trailing slash with a 307 built from the host header the proxy sent: forwarded as it was,
    the client followed it to the upstream itself (unrecorded, or unreachable from a remote harness)."""
    with (
        _upstream(MODELS) as up,
        start_proxy(ProxyConfig([up.url], listen="127.0.0.1:0", db=None, kind="vllm")) as proxy,
    ):
        for location, relayed in (
            (up.url + "/v1/chat/completions", "/v1/chat/completions"),
            (up.url + "?a=1", "/?a=1"),
            (up.url + "9/v1/models", up.url + "9/v1/models"),  # another port: not this upstream, left alone
            ("https://elsewhere.example/x", "https://elsewhere.example/x"),
        ):
            up.answer = (
                b"HTTP/1.1 307 Temporary Redirect\r\nlocation: %s\r\ncontent-length: 0\r\n\r\n" % location.encode()
            )
            got = httpx.post(proxy.url + "/v1/chat/completions/", json={"model": "m"}, timeout=10)
            assert (got.status_code, got.headers["location"]) == (307, relayed)


DEEP = b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"  # deeper than Python's json reads (RecursionError)


@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]", DEEP], ids=["broken", "array", "deep"])
def test_a_generation_request_that_is_no_json_object_is_recorded_as_a_failure(
    vllm_sim, tmp_path, kimi_tok, kimi_profile, body
) -> None:
    """Such a request was passed through and left no trace in the store: a harness sending broken bodies to the
    server looked, in the store, like a harness that sent nothing."""
    db = str(tmp_path / "p.duckdb")
    config = ProxyConfig([vllm_sim.url], listen="127.0.0.1:0", db=db, tokenizer=kimi_tok, profile=kimi_profile)
    with start_proxy(config) as proxy:
        url = proxy.url + "/v1/chat/completions"
        direct = httpx.post(vllm_sim.url + "/v1/chat/completions", content=body)
        through = httpx.post(url, content=body, headers={"content-type": "application/json"})
        assert through.status_code == direct.status_code >= 400
        assert httpx.post(url, json=_chat(vllm_sim)).status_code == 200
    with Store(db) as store:
        failures = store.failures()
        assert store.query("SELECT count(*) FROM samples") == [(1,)]
    assert len(failures) == 1, failures
    assert f"refused by the upstream: HTTP {direct.status_code}" in failures[0]["reason"], failures


def test_a_body_that_is_no_json_object_but_is_answered_is_passed_through_and_recorded_as_a_failure(
    tmp_path, kimi_tok, kimi_profile
) -> None:
    answer = b'{"id":"x","choices":[]}'
    ok = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(answer), answer)
    db = str(tmp_path / "p.duckdb")
    with _upstream(MODELS, post_answer=ok) as up:
        config = ProxyConfig(
            [up.url], listen="127.0.0.1:0", db=db, kind="vllm", tokenizer=kimi_tok, profile=kimi_profile
        )
        with start_proxy(config) as proxy:
            got = httpx.post(proxy.url + "/v1/chat/completions", content=b'["' + MARK + b'"]', timeout=10)
    assert got.status_code == 200 and got.content == answer
    with Store(db) as store:
        reasons = [f["reason"] for f in store.failures()]
    assert reasons == [NOT_AN_OBJECT]
    assert NOT_AN_OBJECT.startswith("the request body is not a JSON object")


def test_a_tls_hello_or_garbage_is_refused_at_once(proxy) -> None:
    """A client given an https:// base URL sends a TLS hello: it waited the 75 s idle timeout for a head that never
    ends, a connect timeout to the harness, where the upstream itself refuses at once."""
    hello = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(32)
    got = exchange(proxy.url, hello, timeout=5)
    assert _status(got) == 400 and b"https://" in got
    assert httpx.get(proxy.url + "/v1/models", timeout=5).status_code == 200


def test_a_chunk_declared_over_the_body_limit_is_refused_before_its_data(proxy) -> None:
    """The size was checked once a chunk's data had all come: a client declaring a huge chunk and sending on made the
    proxy hold everything it sent, without an answer (60 MB in a minute), where a Content-Length that large is a 413."""
    host, port = proxy.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(CHAT + b"transfer-encoding: chunked\r\n\r\nfffffffffffffff\r\n" + b"a" * 65536)
        got = sock.recv(65536)
    assert _status(got) == 413


def test_an_error_in_the_serving_loop_does_not_chain_uvloop_s_absence(monkeypatch) -> None:
    """Without uvloop, the loop ran inside the `except ImportError`: every traceback the proxy logged began with a
    false "No module named 'uvloop'" and "During handling of the above exception, another exception occurred"."""
    import sys

    from tokview.proxy.serve import run_loop

    monkeypatch.setitem(sys.modules, "uvloop", None)  # importing it raises ImportError

    async def fails() -> None:
        raise KeyError("the real error")

    with pytest.raises(KeyError) as raised:
        run_loop(fails())
    assert raised.value.__context__ is None


def test_accepts_the_system_refuses_are_said_once_in_a_while_not_a_traceback_each(capsys) -> None:
    """Out of file descriptors, asyncio logged "socket.accept() out of system resource" with a traceback once per
    waiting connection on every wake-up: 47,099 tracebacks (29 MB) in 7 s. Once per ACCEPT_ERROR_EVERY_S now, in a
    line saying what to do; the open-file limit is raised at start-up as far as the hard one allows."""
    import errno
    import resource

    from tokview.proxy.serve import _quiet_accept_errors, raise_open_file_limit

    loop = asyncio.new_event_loop()
    try:
        handle = _quiet_accept_errors()
        refused = OSError(errno.EMFILE, "Too many open files")
        for _ in range(1000):
            handle(loop, {"message": "socket.accept() out of system resource", "exception": refused})
    finally:
        loop.close()
    said = capsys.readouterr().err
    assert said.count("cannot accept a connection: Too many open files") == 1 and "Traceback" not in said
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))
        raise_open_file_limit()
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == min(hard, 65_536)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_connection_options_are_a_token_list_and_an_http10_client_gets_no_100_continue(vllm_sim, proxy) -> None:
    """`Connection: keep-alive, close` was kept open to the 75 s idle timeout (an exact string compare), and an
    HTTP/1.0 client expecting 100-continue was sent an `HTTP/1.1 100 Continue` it cannot read."""
    body = orjson.dumps(_chat(vllm_sim))
    closing = CHAT + b"connection: keep-alive, close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    started = time.monotonic()
    assert _status(exchange(proxy.url, closing, timeout=20)) == 200
    assert time.monotonic() - started < 10
    host, port = proxy.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        head = b"POST /v1/chat/completions HTTP/1.0\r\nhost: x\r\ncontent-type: application/json\r\n"
        sock.sendall(head + b"expect: 100-continue\r\ncontent-length: %d\r\n\r\n" % len(body))
        sock.settimeout(1.0)
        try:
            early = sock.recv(65536)
        except TimeoutError:
            early = b""
    assert b"100 Continue" not in early


def test_the_stored_stream_setting_is_the_stream_the_server_read() -> None:
    """`"stream": "false"` is answered whole (pydantic reads it false) but was stored as a stream (`bool("false")`)."""
    from tokview.proxy.capture import settings_of

    assert settings_of({"stream": "false"}, None, None)["stream"] is False
    assert settings_of({"stream": "true"}, None, None)["stream"] is True
    assert settings_of({}, None, None)["stream"] is False
