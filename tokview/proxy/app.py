"""The proxy's forwarding: what it does to each request and answer (`wire` carries the bytes).

Per request: check the proxy key (when one is required), choose the upstream (a conversation stays on one; one
refusing connections is passed over), add the id fields on the two generation endpoints (`ids.inject`), forward,
and send back what the upstream sends as it arrives: a JSON answer whole with the added ids taken out
(`ids.strip_body`), a stream event by event with the id-only events dropped. Every other path goes through
untouched. When the client goes away the upstream request is closed at once (the server stops generating), and the
request is recorded as abandoned.
A finished generation is handed to the recorder just before its last byte goes out (a JSON body, a stream's
`[DONE]`: a harness that kills the proxy the moment it has its last answer must find it recorded), as the bytes that came
in (`recorder.Finished`): parsing them, the capture, the session and the analysis all happen in the
recorder (its threads, or its own process), never on the loop a client's bytes go through.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import itertools
import json
import re
import time
import zlib
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import unquote

import orjson

from tokview.errors import TokviewError, one_line
from tokview.proxy import ids
from tokview.proxy.capture import ENDPOINT_PATHS
from tokview.proxy.recorder import Failed, Finished, Recorder
from tokview.proxy.sessions import SESSION_HEADER
from tokview.proxy.sse import EventSplitter
from tokview.proxy.wire import (
    AnswerTooLarge,
    ClientGone,
    Request,
    Responder,
    UpstreamBrokeOff,
    UpstreamError,
    UpstreamNotConnected,
    UpstreamPool,
    UpstreamResponse,
)
from tokview.response_size import max_response_bytes
from tokview.secrets import Secrets, authorization_values, masked_query
from tokview.servers.codings import BodyDecoder, UnreadableCoding, decoded
from tokview.servers.errors import ServerUnreachable, error_message

if TYPE_CHECKING:
    from tokview.core.profiles import ModelProfile
    from tokview.proxy.recorder_process import RecorderProcess

PROXY_KEY_HEADER = "x-tokview-proxy-key"
DONE_EVENT = re.compile(rb"(?:\A|[\r\n])data: ?\[DONE\][\r\n]")
"""The line of the event that ends an OpenAI-compatible stream (vLLM and SGLang send it last), `data:` with or without
its space; never text inside a JSON string, whose newlines are escaped: a model's answer about SSE may well write
`data: [DONE]`."""
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "accept-encoding",
        "expect",
    }
)
"""Request headers never forwarded as they are (the pool sets length and host; the answer must come unencoded;
the front has answered a client's `Expect: 100-continue` itself and forwards the whole body)."""
STORED_HEADERS = ("content-type", "user-agent", "accept", SESSION_HEADER)
"""The only client headers a stored request keeps: never Authorization, cookies or keys."""


def utf8_header(value: str) -> str:
    """A header value (read as latin-1, as HTTP has it) as the UTF-8 text a client almost always means: the session
    `séance` was stored as `sÃ©ance`. Bytes that are no UTF-8 stay as read."""
    try:
        return value.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return value


@dataclass
class Upstream:
    """One server behind the proxy: its public URL, kind, the Authorization it is sent, and the stamp
    a capture made there carries."""

    url: str
    kind: str
    auth: str | None = None
    stamp: dict[str, Any] = field(default_factory=dict)
    max_model_len: int | None = None
    pool: UpstreamPool | None = None
    down: str | None = None
    """Why it did not answer the start-up probe (`serve._with_dead_passed_over`): passed over until it connects."""

    def connections(self) -> UpstreamPool:
        if self.pool is None:  # made inside the serving loop
            self.pool = UpstreamPool(self.url)
        return self.pool


_UNREAD = object()


@dataclass
class _Exchange:
    """One request as it goes through: what the recorder needs once it is over."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    upstream: Upstream
    upstream_index: int = 0
    """Its place in the proxy's upstreams (`ProxyApp._choose`)."""
    query: str = ""
    """The request's query string (stored with every value masked: a harness may put its key there)."""
    endpoint: str | None = None
    request: dict[str, Any] | None = None
    injection: ids.Injection | None = None
    started: float = field(default_factory=time.perf_counter)
    chunks_sent: int = 0
    parsed: Any = field(default_factory=lambda: _UNREAD)
    """The generation request's body as read (`ProxyApp._parsed`), `_UNREAD` until it is."""
    delivered: list[bytes] | None = None
    """A stream whose `data: [DONE]` the client is being sent: the pieces read so far. The client holds the
    whole answer then, so its leaving before the upstream's body ends (the `openai` client stops reading at
    `[DONE]`) is no abandonment: the answer is recorded."""
    recorded: bool = False
    """Handed to the recorder already (a stream's, just before its `[DONE]` went out): never handed twice."""
    too_large: str | None = None
    """Why the answer was forwarded without being held (it passed the most bytes one may hold): recorded as that."""


DOWN_S = 5.0
"""How long an upstream that refused a connection is passed over while another one is up (doubled each time in a
row)."""
DOWN_AFTER_TIMEOUT_S = 60.0
"""The same after a connection that did not come within `wire.CONNECT_TIMEOUT_S`: each try of a dead host stalls its
requests that long, so it is tried seldom."""
PROBE_AGAIN_S = 5.0
"""The longest an upstream back from failing to connect is probed, all its probe's calls together, before a request
goes to it (a host that no longer answers must not hold each request the start-up probe's 30 s)."""
QUICK_REFUSAL_S = 1.0
"""A probe that fails this fast met a server still down (refused): it holds no request, so the next one probes again."""
DOWN_MAX_S = 300.0
PROMPT_KEY = 2000
"""Characters (or ids) of a completion prompt that tie it to its conversation's upstream: past the system prompt and
tools most conversations of one harness share (keyed by 512, twenty conversations sharing 682 characters all went to
one server); a conversation whose first prompt is shorter may move once, after its first turn."""


UNRECORDED_GENERATIONS = frozenset({"/v1/responses", "/v1/messages", "/generate", "/inference/v1/generate"})
"""Generation endpoints the proxy forwards without recording (the Responses API, Anthropic-style messages, SGLang's
native and vLLM's token-in generate): a harness built on one of them recorded nothing, and nothing said why."""


def failure_text(exc: BaseException) -> str:
    return one_line(exc) if isinstance(exc, TokviewError) else f"{type(exc).__name__}: {one_line(exc)}"


def _server_words(described: tuple[object, ...]) -> str:
    kind, version, model = described
    return f"{kind} {version or '(version unknown)'} serving {model!r}"


class ProxyApp:
    def __init__(
        self,
        upstreams: list[Upstream],
        recorder: Recorder | RecorderProcess | None,
        *,
        profile: ModelProfile | None = None,
        key: str | None = None,
        say: Callable[[str], None] | None = None,
        probe: Callable[[Upstream], Awaitable[Upstream]] | None = None,
    ) -> None:
        self.upstreams, self.recorder, self.profile, self.key = upstreams, recorder, profile, key
        self.probe = probe
        """Detects an upstream again (its start-up probe): run when one that failed to connect is tried again."""
        self._probing: dict[int, asyncio.Task[None]] = {}
        self._stale = [upstream.down is not None for upstream in upstreams]
        """Upstreams to probe again before their next request: one failed to connect (it may come back as another
        server). Cleared only by a probe that succeeded: a request that connects says nothing of what answered."""
        self._probe_after = [0.0] * len(upstreams)
        """When an upstream whose probe failed may be probed again (a request that connects meanwhile goes on)."""
        self._probe_failed = [False] * len(upstreams)
        """Its last probe failed: a request that then gets an answer ends the need for one (said once), or a server
        too busy to answer a probe within PROBE_AGAIN_S stalled a request every DOWN_S, for good."""
        self.max_answer_bytes = max_response_bytes()
        """The most bytes of one answer held (to take its ids out, and for the recorder): past it a stream is
        forwarded on and recorded as a failure, a JSON answer refused with a 502."""
        self._next = itertools.cycle(range(len(upstreams)))
        self._down_until = [0.0] * len(upstreams)
        """When each upstream may be tried again after a connection to it failed (`time.monotonic`)."""
        self._down_streak = [0] * len(upstreams)
        """Connections to each upstream that failed in a row."""
        for i, upstream in enumerate(upstreams):  # dead at start: tried again after the first pass-over
            if upstream.down is not None:
                self._down_streak[i] = 1
                self._down_until[i] = time.monotonic() + DOWN_S
        self.say = say
        self.unrecorded: Counter[str] = Counter()
        """Requests to `UNRECORDED_GENERATIONS` forwarded, by path (the first of each path is said at once)."""

    async def aclose(self) -> None:
        for task in list(self._probing.values()):  # shielded from the requests that waited on it: ended here
            task.cancel()
        for upstream in self.upstreams:
            if upstream.pool is not None:
                upstream.pool.close()
                upstream.pool = None

    async def __call__(self, request: Request, client: Responder) -> None:
        """Answer one client request (`wire.Responder` calls this; a client gone mid-answer cancels it)."""
        headers = request.headers
        if self.key is not None and not self._authorised(headers):
            await _json_error(client, 401, UNAUTHORISED)
            return
        ex = _Exchange(request.method, request.path, headers, request.body, self.upstreams[0])
        ex.upstream_index = self._choose(ex)
        ex.upstream = self.upstreams[ex.upstream_index]
        ex.query = request.query
        try:
            await self._forward(ex, request.query, client)
        except ClientGone:
            self._left(ex, client)
        except asyncio.CancelledError:
            if not (client.lost or client.cut_by_shutdown):
                raise
            self._left(ex, client)  # the upstream request was closed on the way out

    def admit(self, headers: dict[str, str]) -> bytes | None:
        """The front's check on a request's head, before its body is read: with a key, an unauthorised client
        could otherwise make the proxy hold up to `wire.MAX_BODY` a connection. None: let in; else the 401's body."""
        if self.key is None or self._authorised(headers):
            return None
        return _error_body(401, UNAUTHORISED)

    def _authorised(self, headers: dict[str, str]) -> bool:
        assert self.key is not None
        given = headers.get(PROXY_KEY_HEADER)
        if given is None:
            auth = headers.get("authorization", "")
            given = auth[7:].strip() if auth[:7].lower() == "bearer " else None
        return given is not None and hmac.compare_digest(given.encode(), self.key.encode())

    # -- forwarding -----------------------------------------------------------------------------
    def _upstream_headers(self, ex: _Exchange) -> list[tuple[str, str]]:
        out = {k: v for k, v in ex.headers.items() if k not in HOP_BY_HOP and k != PROXY_KEY_HEADER}
        out["accept-encoding"] = "identity"
        if self.key is not None and "authorization" in out and PROXY_KEY_HEADER not in ex.headers:
            del out["authorization"]  # that was the proxy key: the upstream gets its own credentials
        if "authorization" not in out and ex.upstream.auth:
            out["authorization"] = ex.upstream.auth
        out.pop(SESSION_HEADER, None)
        return list(out.items())

    # -- which upstream ---------------------------------------------------------------------------
    def _choose(self, ex: _Exchange, tried: frozenset[int] = frozenset()) -> int:
        """The upstream for this request: one conversation's requests go to one server while it takes connections
        (its prefix cache holds the conversation, and one template renders it), others spread over the rest. A
        server that refused a connection is passed over for `DOWN_S`. Round-robin sent a session's turns to the
        servers in turn, and every other request to a dead one, answered 502 with a healthy server up."""
        n = len(self.upstreams)
        if n == 1:
            return 0
        key = self._affinity(ex)
        start = zlib.crc32(key) % n if key is not None else next(self._next)
        now = time.monotonic()
        order = [(start + k) % n for k in range(n) if (start + k) % n not in tried]
        up = [i for i in order if self._down_until[i] <= now]
        return (up or order or [start])[0]

    def _affinity(self, ex: _Exchange) -> bytes | None:
        """What ties a request to its conversation: the session header, else the request's `user`, else how the
        conversation starts: its messages up to the first user message (the same in every turn: the first two were
        `[user]` in turn 0 and `[user, assistant]` after), or a completion prompt's first `PROMPT_KEY` characters or
        ids (a conversation whose first prompt is shorter may move once, after its first turn)."""
        named = ex.headers.get(SESSION_HEADER)
        if named:
            return b"h" + named.encode("utf-8", "surrogatepass")
        request = self._parsed(ex)
        if request is None:
            return None
        user = request.get("user")
        if isinstance(user, str) and user:  # a lone surrogate escape is valid JSON the servers read
            return b"u" + user.encode("utf-8", "surrogatepass")
        messages = request.get("messages")
        if isinstance(messages, list):
            first_user = next((k for k, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"), 0)
            start: Any = messages[: first_user + 1]
        else:
            prompt = request.get("prompt")
            start = prompt[:PROMPT_KEY] if isinstance(prompt, (str, list)) else None
        if start is None:
            return None
        try:  # whole: cut to 8 kB, conversations sharing a long system prompt had one key
            return b"c" + orjson.dumps(start)
        except (TypeError, orjson.JSONEncodeError):  # a lone surrogate: Python's json writes it escaped
            try:
                return b"c" + json.dumps(start).encode()
            except (TypeError, ValueError, RecursionError):
                return None

    def _parsed(self, ex: _Exchange) -> dict[str, Any] | None:
        """The body of a generation request as the servers read it (once per request), None for another path or a
        body that is no JSON object; sets `ex.endpoint` on a generation path."""
        if ex.parsed is not _UNREAD:
            return cast(dict[str, Any] | None, ex.parsed)
        ex.parsed = None
        # the servers route a percent-encoded path as its decoded form (`/v1/chat/%63ompletions` generates too)
        endpoint = ENDPOINT_PATHS.get(unquote(ex.path)) if ex.method == "POST" else None
        if endpoint is None:
            return None
        ex.endpoint = endpoint  # a body that is no JSON object is still a generation request, recorded as failed
        try:
            request = _read_body(ex.body)
        except (RecursionError, ValueError):  # orjson's JSONDecodeError is one; RecursionError: nested too deep
            return None  # the upstream answers a broken body itself (recorded as a failure either way)
        parsed: dict[str, Any] | None = request if isinstance(request, dict) else None
        ex.parsed = parsed
        return parsed

    def _pool(self, i: int) -> UpstreamPool:
        pool = self.upstreams[i].connections()
        if pool.on_unreachable is None:  # made at its first request, inside the serving loop
            pool.on_unreachable = functools.partial(self._pass_over, i)
        return pool

    def _connection_refused(self, ex: _Exchange, error: UpstreamNotConnected) -> None:
        self._pass_over(ex.upstream_index, error)

    def _pass_over(self, i: int, error: UpstreamNotConnected) -> None:
        """Pass upstream `i` over: `DOWN_S` after a refusal, which answers at once; after a connection that did not
        come within its timeout, long enough that the next try is not a stall every few seconds (a dead host), and
        twice as long each time in a row, up to `DOWN_MAX_S`. A connection made resets it (`_connected`). Also told
        by the pool of a connect that failed after its request was cancelled (`UpstreamPool.on_unreachable`)."""
        self._stale[i] = True  # whatever the backoff: it may come back as another server, probed before any
        self._probe_failed[i], self._probe_after[i] = False, 0.0  # request (a slow probe before this outage aside)
        now = time.monotonic()
        if now < self._down_until[i]:  # another request of the same outage: one outage, one step of the backoff
            return
        self._down_streak[i] = min(self._down_streak[i] + 1, 16)  # 2 ** 1024 is past a float: a long outage raised
        first = DOWN_S if error.refused else DOWN_AFTER_TIMEOUT_S
        self._down_until[i] = now + min(DOWN_MAX_S, first * 2 ** (self._down_streak[i] - 1))

    async def _probe_again(self, i: int) -> None:
        """Detect upstream `i` again before a request goes to it after it failed to connect: it may be back as another
        server (restarted with another model, version or kind), whose answers were recorded under the old one's
        name, and whose requests got the old kind's id fields (a vLLM field sent to SGLang: HTTP 400 to the
        harness). One probe at a time per upstream; one that fails leaves the upstream as it was."""
        task = self._probing.get(i)
        if task is None:
            task = self._probing[i] = asyncio.ensure_future(self._probe(i))
            task.add_done_callback(lambda _: self._probing.pop(i, None))
        await asyncio.shield(task)

    async def _probe(self, i: int) -> None:
        assert self.probe is not None
        old = self.upstreams[i]
        began = time.monotonic()
        try:
            new = await asyncio.wait_for(self.probe(old), PROBE_AGAIN_S)  # four probes of 2 attempts each took 20 s
        except Exception as exc:
            slow = isinstance(exc, TimeoutError | ServerUnreachable)
            if isinstance(exc, ServerUnreachable) and time.monotonic() - began < QUICK_REFUSAL_S:
                self._probe_failed[i] = False  # still down, refused at once: the request fails as before, and the
                return  # next one probes again
            # too slow to answer the probe: taken as the server probed before if it answers a request meanwhile
            # (`_answering_unprobed`); not a server to forward to (another kind than --kind): said, probed again
            self._probe_after[i], self._probe_failed[i] = time.monotonic() + DOWN_S, slow
            if not slow and self.say is not None:
                self.say(f"tokview proxy: {old.url} is back, but {failure_text(exc)}: forwarded to as before")
            return
        self._probe_failed[i] = False
        before = (old.kind, old.stamp.get("server_version"), old.stamp.get("model"))
        after = (new.kind, new.stamp.get("server_version"), new.stamp.get("model"))
        old.kind, old.stamp, old.max_model_len, old.down = new.kind, new.stamp, new.max_model_len, None
        self._stale[i] = False  # answering as probed: its next requests go without a probe
        if before != after and self.say is not None:
            self.say(
                f"tokview proxy: {old.url} is back as {_server_words(after)} (was {_server_words(before)}): its "
                "answers are asked for and recorded as that server's from now on"
            )

    def _answering_unprobed(self, i: int) -> None:
        """Upstream `i` answers a request though its probe failed (a server too busy for the probe's calls): taken
        as the server probed at start, said once, and probed again only after it fails to connect again."""
        self._stale[i] = self._probe_failed[i] = False
        if self.say is not None:
            self.say(
                f"tokview proxy: {self.upstreams[i].url} answers again but could not be probed within "
                f"{PROBE_AGAIN_S:g} s: its answers are recorded as the server probed before"
            )

    def _connected(self, ex: _Exchange) -> None:
        self._down_streak[ex.upstream_index] = 0
        self._down_until[ex.upstream_index] = 0.0  # it is back: no longer passed over

    def _prepare(self, ex: _Exchange) -> bytes:
        """The body to send: the client's, or on a generation endpoint the same with the id fields added (for the
        kind of server `ex.upstream` is: prepared again when another one takes the request)."""
        request = self._parsed(ex)
        if request is None:
            return ex.body
        ex.request = request
        upstream = ex.upstream
        sent, ex.injection = ids.inject(request, upstream.kind, ex.endpoint, upstream.stamp.get("server_version"))
        if sent is request:
            return ex.body
        spliced = ids.with_fields(ex.body, ex.injection.fields, empty=not request)
        if spliced is not None:
            return spliced
        try:
            return orjson.dumps(sent)
        except orjson.JSONEncodeError:  # nested deeper than orjson writes (254), or a lone surrogate
            pass
        try:
            return json.dumps(sent, separators=(",", ":")).encode()  # ASCII: every character escaped as JSON allows
        except (RecursionError, ValueError):  # not to be re-written: sent as it came, so its answer has no ids
            ex.injection = None  # (the recorder records it as a failure: the upstream returned no ids)
            return ex.body

    async def _forward(self, ex: _Exchange, query: str, client: Responder) -> None:
        target = f"{ex.path}?{query}" if query else ex.path
        tried: set[int] = set()
        while True:
            i = ex.upstream_index
            if self._stale[i] and self.probe is not None and time.monotonic() >= self._probe_after[i]:
                await self._probe_again(i)
            content = self._prepare(ex)
            try:
                upstream = self._pool(ex.upstream_index)
                response = await upstream.request(ex.method, target, self._upstream_headers(ex), content)
                if self._probe_failed[i] and response.status == 200:  # an error says nothing of what answered
                    self._answering_unprobed(i)
                if self._down_streak[ex.upstream_index] or self._down_until[ex.upstream_index]:
                    self._connected(ex)
                break
            except UpstreamNotConnected as exc:  # nothing was sent: another upstream may take it
                self._connection_refused(ex, exc)
                tried.add(ex.upstream_index)  # by position: one URL given twice is two upstreams
                if len(tried) < len(self.upstreams):
                    ex.upstream_index = self._choose(ex, frozenset(tried))
                    ex.upstream = self.upstreams[ex.upstream_index]
                    continue
                error: UpstreamError = exc
            except UpstreamError as exc:
                error = exc
            # not connected: nothing was sent; else the request went and the upstream broke off before answering
            said = "unreachable" if isinstance(error, UpstreamNotConnected) else "broke off before answering"
            reason = f"upstream {ex.upstream.url} {said}: {error}"
            await _json_error(client, 502, f"tokview proxy: {reason}")
            self._failure(ex, reason)
            return
        try:
            if ex.endpoint is None:
                self._unrecorded(ex)
                await self._pass_through(response, client, upstream)
            elif response.status != 200:
                body = await response.read(self.max_answer_bytes)
                await client.whole(response.status, _response_headers(response, upstream), body, response.reason)
                self._failure(
                    ex, f"refused by the upstream: HTTP {response.status}: {error_message(_readable(response, body))}"
                )
            elif ex.request is None:  # accepted though it is no JSON object: nothing to record but that
                await self._pass_through(response, client, upstream)
                self._failure(ex, NOT_AN_OBJECT)
            elif b"text/event-stream" in response.header(b"content-type"):
                await self._relay_stream(ex, response, client, _decoder(response))
            else:
                await self._relay_json(ex, response, client, _decoder(response))
        except UnreadableCoding as exc:
            # its ids cannot be taken out of it: never sent on with ids the client did not ask for
            self._failure(ex, f"the upstream's answer cannot be read: {exc}")
            if not client.started:
                await _json_error(client, 502, f"tokview proxy: the upstream's answer cannot be read ({exc})")
            else:
                client.cut()
        except UpstreamError as exc:
            if ex.delivered is not None:  # it broke off after [DONE]: the client holds the whole answer, a sample
                self._record_later(ex, b"".join(ex.delivered), stream=True)
                client.cut()
                return
            # a JSON answer has no chunks: "after 0 chunks" said nothing
            cut = f"after {ex.chunks_sent} chunks" if ex.chunks_sent else "before it was whole"
            self._failure(ex, f"the upstream's answer broke off {cut}: {exc}")
            if not client.started:  # nothing sent yet: the harness gets an error, not a cut answer it might trust
                await _json_error(client, 502, f"tokview proxy: the upstream's answer broke off ({exc})")
            else:  # the answer is left incomplete (no final chunk): the client's connection is cut, as the
                client.cut()  # upstream cut the proxy's
        finally:
            response.close()

    async def _pass_through(self, response: UpstreamResponse, client: Responder, upstream: UpstreamPool) -> None:
        length = response.header(b"content-length")
        chunked = b"chunked" in response.header(b"transfer-encoding").lower()
        keep = length.isdigit() and not chunked
        headers = _response_headers(response, upstream)
        await client.start(response.status, headers, int(length) if keep else None, response.reason)
        while (piece := await response.next_piece()) is not None:
            await client.send(piece)
        await client.end()

    async def _relay_json(
        self, ex: _Exchange, response: UpstreamResponse, client: Responder, decoder: BodyDecoder | None
    ) -> None:
        raw = await response.read(self.max_answer_bytes)
        if decoder is not None:
            raw = decoder.feed(raw) + decoder.end()
        injection = ex.injection
        try:
            out = ids.strip_body(raw, injection) if injection is not None else raw
        except ValueError as exc:  # an id value cut short: the proxy cannot give the answer without its ids
            raise UpstreamBrokeOff(f"its answer is malformed ({exc})") from None
        if not client.lost:  # handed over before the answer goes out: a SIGKILL the moment the client has it (a
            # harness that kills the proxy after its last answer) lost it to a race the proxy lost now and then
            self._record_later(ex, raw, stream=False)
        await client.whole(response.status, _response_headers(response, decoder=decoder), out, response.reason)

    async def _relay_stream(
        self, ex: _Exchange, response: UpstreamResponse, client: Responder, decoder: BodyDecoder | None
    ) -> None:
        # No injection: the body could not be re-written (`_prepare`), so the stream is the upstream's own
        injection = ex.injection if ex.injection is not None else ids.Injection(ex.upstream.kind, (), True)
        await client.start(response.status, _response_headers(response, decoder=decoder), None, response.reason)
        splitter, limit = EventSplitter(), self.max_answer_bytes
        pieces: list[bytes] = []  # the stream as it came, parsed by the recorder once the client has it all
        held = 0
        while (piece := await response.next_piece()) is not None:
            if decoder is not None:
                piece = decoder.feed(piece)
            if ex.too_large is None:
                pieces.append(piece)
                held += len(piece)
                if held > limit:  # forwarded on, no longer held: the harness's run goes on, the answer is a failure
                    ex.too_large = (
                        f"its stream passed {limit / 2**20:g} MiB (TOKVIEW_MAX_RESPONSE_MB): forwarded, not held"
                    )
                    pieces, ex.delivered = [], None  # not held: no sample, however the stream ends
            whole = splitter.feed_whole(piece)
            if not whole:
                if splitter.pending > limit:  # no event ends: nothing can be forwarded whole, nor held
                    raise AnswerTooLarge(f"an event of its stream passed {limit / 2**20:g} MiB without an end")
                continue
            try:
                out, n = ids.strip_events(whole, injection)
            except ValueError as exc:  # an id value cut short in an event: the stream cannot go on unchanged
                raise UpstreamBrokeOff(f"its stream is malformed ({exc})") from None
            if out:
                if b"[DONE]" in out and DONE_EVENT.search(out) and ex.too_large is None and not client.lost:
                    ex.delivered = pieces  # handed over before `[DONE]` goes out, as a JSON answer is (`_relay_json`)
                    self._record_later(ex, b"".join(pieces), stream=True)
                await client.send(out)
                ex.chunks_sent += n
        if decoder is not None and (tail := decoder.end()):
            pieces.append(tail)
            splitter.feed_whole(tail)
        try:  # a last event with no blank line after it: its ids are taken out too
            rest = ids.strip_rest(splitter.rest(), injection)
        except ValueError as exc:
            raise UpstreamBrokeOff(f"its stream is malformed ({exc})") from None
        await client.end(rest)
        if ex.too_large is not None:
            self._failure(ex, f"the upstream's answer was not recorded: {ex.too_large}")
            return
        self._record_later(ex, b"".join(pieces), stream=True)

    # -- recording ------------------------------------------------------------------------------
    def _unrecorded(self, ex: _Exchange) -> None:
        path = unquote(ex.path)
        if self.recorder is None or ex.method != "POST" or path not in UNRECORDED_GENERATIONS:
            return
        self.unrecorded[path] += 1
        if self.unrecorded[path] == 1 and self.say is not None:
            self.say(
                f"tokview proxy: POST {path} forwarded, NOT recorded: tokview records /v1/chat/completions and "
                "/v1/completions (point the harness at one of them to record it)"
            )

    def _session_of(self, ex: _Exchange) -> tuple[str | None, str | None]:
        named = utf8_header(ex.headers.get(SESSION_HEADER) or "") or None
        user = ex.request.get("user") if ex.request else None
        return named, user if isinstance(user, str) and user else None

    def _failure(self, ex: _Exchange, reason: str) -> None:
        if self.recorder is None or ex.endpoint is None or ex.recorded:  # handed over whole at its `[DONE]`: what
            return  # broke after it (the body's end: a coding's trailer, bytes past the limit) is no failure of it
        named, user = self._session_of(ex)
        # the client's credentials and the upstream's, as an upstream may quote them back in its error: the
        # recorder knows neither (a client's Authorization is forwarded, never stored)
        known = authorization_values(ex.headers.get("authorization")) + authorization_values(ex.upstream.auth)
        self.recorder.take(Failed(Secrets.of(known).scrub(reason), ex.upstream.url, named, user))

    def _left(self, ex: _Exchange, client: Responder) -> None:
        """The client went away (or the proxy's shutdown closed it): after its stream's `[DONE]` the answer is
        whole and recorded, else abandoned."""
        if ex.delivered is not None:
            self._record_later(ex, b"".join(ex.delivered), stream=True)
            return
        if ex.too_large is not None:
            self._failure(ex, f"the upstream's answer was not recorded: {ex.too_large}")
            return
        who = "cut off by the proxy's shutdown" if client.cut_by_shutdown else "abandoned by the client"
        self._failure(ex, f"{who} after {ex.chunks_sent} chunks (the upstream request was closed)")

    def _record_later(self, ex: _Exchange, raw: bytes, *, stream: bool) -> None:
        """Hand the finished exchange over as the bytes that came in (the client has, or is being sent, every one
        of them), once."""
        if self.recorder is None or ex.request is None or ex.endpoint is None or ex.recorded:
            return
        ex.recorded = True
        named, user = self._session_of(ex)
        up = ex.upstream
        self.recorder.take(
            Finished(
                ex.endpoint,
                up.kind,
                up.url,
                up.stamp,
                up.max_model_len,
                ex.request,
                self._stored_request(ex),
                raw,
                stream,
                time.perf_counter() - ex.started,
                named,
                user,
                tuple(authorization_values(ex.headers.get("authorization"))),
            )
        )

    def _stored_request(self, ex: _Exchange) -> dict[str, Any]:
        headers = {k: v for k, v in ex.headers.items() if k in STORED_HEADERS}
        return {
            "method": ex.method,
            "url": ex.upstream.url + ex.path + (f"?{masked_query(ex.query)}" if ex.query else ""),
            "headers": headers,
            "body": ex.request,
            "injected": list(ex.injection.fields) if ex.injection else [],
        }


# -- answers ---------------------------------------------------------------------------------------------
HOP_BY_HOP_ANSWER = frozenset({b"content-length", b"transfer-encoding", b"connection", b"keep-alive"})
"""Answer headers the front sets itself (for the body as it sends it), never copied from the upstream."""


def _readable(response: UpstreamResponse, body: bytes) -> bytes:
    """An error body as the text it stands for when the upstream compressed it (for the failure's reason only: the
    client gets it as sent); as it came when it cannot be read."""
    coding = response.header(b"content-encoding")
    if not coding:
        return body
    try:
        return decoded(body, coding.decode("latin-1"), max_response_bytes())
    except UnreadableCoding:
        return body


def _decoder(response: UpstreamResponse) -> BodyDecoder | None:
    """How to undo the coding of an answer the upstream compressed though the proxy asked for none (a gateway's "gzip
    always"): its ids are taken out of the bytes it stands for. None for a plain answer."""
    coding = response.header(b"content-encoding")
    if not coding:
        return None
    # a stream is forwarded as it comes and held up to the limit by `_relay_stream` (past it: forwarded, a failure):
    # here only one read's decompression is bounded, or a gzipped stream past the limit was cut mid-answer
    stream = b"text/event-stream" in response.header(b"content-type")
    decoder = BodyDecoder(coding.decode("latin-1"), max_response_bytes(), whole=not stream)  # UnreadableCoding: not
    return decoder if decoder.active else None  # gzip or deflate


def _response_headers(
    response: UpstreamResponse, upstream: UpstreamPool | None = None, decoder: BodyDecoder | None = None
) -> list[tuple[bytes, bytes]]:
    """The upstream's headers the client gets (without `content-encoding` when the body goes out through `decoder`). A
    redirect that names the upstream (a FastAPI server's 307 for a trailing slash builds it from the host header the
    proxy sent) is made relative, as a reverse proxy's `proxy_redirect` does: the client follows it through the
    proxy, recorded, not to an upstream it may not reach."""
    headers = [
        (k, v)
        for k, v in response.headers
        if k not in HOP_BY_HOP_ANSWER and not (decoder is not None and k == b"content-encoding")
    ]
    if upstream is None or not any(k == b"location" for k, _ in headers):
        return headers
    origin = upstream.origin

    def relative(value: bytes) -> bytes:
        rest = value[len(origin) :]
        if not value.startswith(origin) or rest[:1] not in (b"", b"/", b"?"):
            return value  # another server's, or another port's (`…:8000` is a prefix of `…:80001`)
        return rest if rest[:1] == b"/" else b"/" + rest

    return [(k, relative(v) if k == b"location" else v) for k, v in headers]


_LONG_NUMBER = re.compile(rb"\d{19}")
"""Digits enough for an integer past 64 bits, which orjson reads as a float (a `seed` of 99999999999999999999999
went upstream as 1e+23): such a body is read by the standard library, whose integers are exact (a string holding
that many digits only costs it the slower reading)."""


def _read_body(body: bytes) -> Any:
    """A request body as the servers read it (Python's json), quickly (orjson) when orjson reads it the same. orjson
    refuses a lone surrogate escape (`"\\ud800"`), which Python's json reads: such a body was forwarded unread, so
    its generation was neither a sample nor a failure. ValueError when the servers' reading fails too."""
    if not _LONG_NUMBER.search(body):
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
    return json.loads(body)


UNAUTHORISED = "tokview proxy: missing or wrong proxy key (TOKVIEW_PROXY_KEY)"
NOT_AN_OBJECT = (
    "the request body is not a JSON object (or is nested too deep to read): its answer was passed through unrecorded"
)


def _error_body(status: int, message: str) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": "tokview_proxy", "code": status}})


async def _json_error(client: Responder, status: int, message: str) -> None:
    await client.whole(status, [(b"content-type", b"application/json")], _error_body(status, message))
