"""ServerPool: captures spread over several servers, with retries, eviction and re-probing.

Round-robin, preferring a server with a free slot; each server has its own concurrency cap.
A server that fails to connect `evict_after` times in a row is evicted and re-probed every
`reprobe_interval` seconds (and at once when no server is left), so one dead box in a fleet
slows a run by a few retries, not forever. The API key comes only from `TOKVIEW_API_KEY`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from tokview.core.profiles import ModelProfile
from tokview.core.record import Capture
from tokview.core.tokenizer import TokenizerError
from tokview.errors import UserError
from tokview.servers.capture import BACKENDS, capture_on
from tokview.servers.errors import CaptureFailed, KindMismatch, Retryable, RetryElsewhere, ServerUnreachable
from tokview.servers.features import (
    credentials_refused,
    detect,
    health,
    probe_endpoints,
    probe_template_kwargs,
    unknown_server,
)
from tokview.servers.http import REQUEST_SENT, ServerClient, scrub_reason
from tokview.servers.info import ServerInfo
from tokview.servers.registry import AUTO, CHOICES, kind_mismatch
from tokview.servers.request import CaptureRequest, resolve_settings
from tokview.servers.retry import RetryPolicy
from tokview.servers.urls import parse_server_url

if TYPE_CHECKING:
    from tokview.core.tokenizer import TokenizerAdapter


T = TypeVar("T")


@dataclass
class _Server:
    client: ServerClient
    info: ServerInfo | None = None
    semaphore: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(1))
    active: int = 0
    failures: int = 0
    """Consecutive connection failures."""
    evicted_at: float | None = None
    last_error: str | None = None
    probing: bool = False
    other_kind: str | None = None
    """Why the server is not the kind `--backend` names (`registry.kind_mismatch`): the run is refused at its start."""

    @property
    def healthy(self) -> bool:
        return self.info is not None and self.evicted_at is None


class ServerPool:
    def __init__(
        self,
        urls: list[str] | str,
        backend: str = "auto",
        *,
        tokenizer: TokenizerAdapter | None = None,
        profile: ModelProfile | None = None,
        concurrency: int = 8,
        timeout: float = 60.0,
        retries: int = 3,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        evict_after: int = 3,
        reprobe_interval: float = 30.0,
        connect_timeout: float | None = None,
        names_only: bool = False,
        probe_kwargs: dict[str, Any] | None = None,
    ) -> None:
        """`names_only`: the probe reads only the info endpoints (kind, version, model name, context length) and
        sends no generation: for a caller that needs to know which model it would talk to, not how to capture
        from it. `probe_kwargs`: the chat_template_kwargs the probe's 1-token requests render with, when there
        is no profile yet (the batch's resume shortcut probes while the tokenizer loads: see `adopt`)."""
        if isinstance(urls, str):
            urls = [urls]
        if not urls:
            raise ValueError("a server pool needs at least one URL")
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r} (known: {', '.join(BACKENDS)})")
        self.backend, self.tokenizer, self.profile = backend, tokenizer, profile
        self.concurrency = max(1, concurrency)
        # a server's Retry-After is waited at most `timeout`, what a request may take in all: a 429 saying "3600"
        # parked every request for the 120 s cap, with no line said, whatever `--timeout 4` asked
        waited = min(RetryPolicy.max_retry_after, max(timeout, 1.0))
        self.policy = RetryPolicy(retries=retries, backoff=backoff, max_backoff=max_backoff, max_retry_after=waited)
        self.probe_policy = RetryPolicy(
            retries=min(retries, 2), backoff=backoff, max_backoff=max_backoff, max_retry_after=waited
        )
        self.evict_after, self.reprobe_interval = evict_after, reprobe_interval
        self.names_only = names_only
        self.probe_kwargs = probe_template_kwargs(profile, probe_kwargs)
        self._ahead = probe_kwargs is not None and tokenizer is None
        """Probing ahead of the tokenizer (the batch's resume shortcut), until `adopt` gives it one."""
        for url in urls:
            parse_server_url(url)  # all of them before any client opens; ValueError with a one-line reason
        # ServerClient validates each URL (ValueError), strips credentials and reads TOKVIEW_API_KEY.
        self._servers = [
            _Server(
                ServerClient(u, timeout=timeout, concurrency=self.concurrency, connect_timeout=connect_timeout),
                semaphore=asyncio.Semaphore(self.concurrency),
            )
            for u in urls
        ]
        self._next = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self.generation_sent = asyncio.Event()
        """Set once the first capture's request is in flight (a `--workers` batch spawns its children then)."""
        self.retried = 0
        """Attempts this pool sent again after a retryable failure, and the last one's reason (scrubbed): a run whose
        every request waits on its backoff showed a progress line frozen at 0/N, as if nothing were happening."""
        self.last_retry: str | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Probe every server; raise ServerUnreachable when none answers, UserError when one is the other kind than
        `--backend` names (its info endpoints say so)."""
        await asyncio.gather(*(self._probe(s) for s in self._servers))
        if wrong := [s.other_kind for s in self._servers if s.other_kind]:  # a flag to change, not a server down
            await self.aclose()
            raise UserError(wrong[0])
        if not any(s.healthy for s in self._servers):
            reasons = "; ".join(f"{s.client.url}: {s.last_error}" for s in self._servers)
            await self.aclose()
            raise ServerUnreachable(f"no server answered ({reasons})")

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(s.client.aclose() for s in self._servers), return_exceptions=True)

    async def __aenter__(self) -> ServerPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def server_info(self) -> list[dict[str, Any]]:
        out = []
        for s in self._servers:
            d = (
                s.info.to_dict()
                if s.info
                else {"url": s.client.url, "kind": "unknown", "version": None, "model": None, "features": {}}
            )
            d.update(healthy=s.healthy, last_error=s.last_error, notes=list(s.client.notes))
            out.append(d)
        return out

    # -- capture -------------------------------------------------------------------------------
    async def capture(self, request: CaptureRequest, *, prefer: str | None = None) -> Capture:
        """Capture one generation, retrying over the pool; raises CaptureFailed with `.reason`. `prefer`: the URL of
        the server to send it to while that one is healthy (a chain's later turns go where its first went)."""
        settings = resolve_settings(request.settings, self.profile)
        told = REQUEST_SENT.set(None if self.generation_sent.is_set() else self.generation_sent.set)
        try:
            return await self.call(
                lambda client, info: capture_on(
                    client, info, backend=self.backend, request=request, settings=settings, tokenizer=self.tokenizer
                ),
                prefer=prefer,
            )
        finally:
            REQUEST_SENT.reset(told)

    async def call(self, fn: Callable[[ServerClient, ServerInfo], Awaitable[T]], *, prefer: str | None = None) -> T:
        """Run one request function on a picked server, with the pool's retries, eviction and caps.

        Captures and `tokview score`'s scoring requests both go through here."""

        first = True
        last: _Server | None = None

        async def attempt() -> T:
            # the preferred server is asked first only: a retry goes round the pool as any other would (a preferred
            # server answering 503 or gone took every retry of a chain's turn, and the whole chain failed), to
            # another server than the one that just failed when there is one (round-robin among requests in
            # flight sent a retry back to the replica answering garbage)
            nonlocal first, last
            server = await self._pick(prefer if first else None, avoid=last)
            first, last = False, server
            server.active += 1
            try:
                async with server.semaphore:
                    assert server.info is not None
                    result = await fn(server.client, server.info)
            except Retryable as exc:
                exc.url = server.client.url
                self._failed(server, exc)
                if isinstance(exc, RetryElsewhere) and not self._another_healthy(server):
                    raise CaptureFailed(exc.reason, status=exc.status, url=exc.url) from None
                raise
            except CaptureFailed as exc:
                if exc.url is None:  # the failure names its server (a speculators errors.jsonl row's `endpoint`)
                    exc.url = server.client.url
                raise
            finally:
                server.active -= 1
            server.failures = 0
            return result

        try:
            return await self.policy.run(attempt, on_retry=self._retrying)
        except CaptureFailed as exc:  # reasons built outside the HTTP layer may quote the server too
            for s in self._servers:
                scrub_reason(exc, s.client.secrets)
            raise

    async def _pick(self, prefer: str | None = None, avoid: _Server | None = None) -> _Server:
        self._reprobe_due()
        healthy = [s for s in self._servers if s.healthy]
        if not healthy:
            await asyncio.gather(*(self._probe(s) for s in self._servers if not s.probing))
            healthy = [s for s in self._servers if s.healthy]
        if not healthy:
            reasons = "; ".join(f"{s.client.url}: {s.last_error}" for s in self._servers)
            raise Retryable(f"no healthy server ({reasons})")
        if prefer is not None:  # even at its cap (its semaphore waits): its cache holds the conversation so far
            preferred = next((s for s in healthy if s.client.url == prefer), None)
            if preferred is not None:
                return preferred
        n = len(self._servers)
        order = [self._servers[(self._next + k) % n] for k in range(n)]
        if avoid is not None and self._another_healthy(avoid):  # a retry: another server first
            order = [s for s in order if s is not avoid]
        choice = next((s for s in order if s.healthy and s.active < self.concurrency), None) or next(
            s for s in order if s.healthy
        )
        self._next = (self._servers.index(choice) + 1) % n
        return choice

    def _retrying(self, exc: Retryable) -> None:
        self.retried += 1
        reason = exc.reason  # its server's, or none's ("no healthy server (…)"): scrubbed of every server's secrets
        for s in self._servers:
            reason = s.client.secrets.scrub(reason)
        self.last_retry = reason

    def _another_healthy(self, server: _Server) -> bool:
        """Whether a retry has somewhere else to go than `server`."""
        return any(s.healthy and s is not server for s in self._servers)

    def _failed(self, server: _Server, exc: Retryable) -> None:
        server.last_error = server.client.secrets.scrub(exc.reason)
        if not exc.connection:
            return
        server.failures += 1
        if server.failures >= self.evict_after and server.evicted_at is None:
            server.evicted_at = time.monotonic()

    def _reprobe_due(self) -> None:
        now = time.monotonic()
        for s in self._servers:
            if s.evicted_at is not None and not s.probing and now - s.evicted_at >= self.reprobe_interval:
                task = asyncio.create_task(self._probe(s))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _probe(self, server: _Server) -> None:
        """Detect features (first time) or check health (evicted server); reinstate on success."""
        server.probing = True
        quiet = REQUEST_SENT.set(None)  # a probe a capture started is no generation of its (its task's own context)
        try:
            if server.info is None:
                info = await detect(
                    server.client,
                    self.probe_policy,
                    self.profile,
                    self._probe_prompt_ids(),
                    endpoints=not self.names_only,
                    template_kwargs=self.probe_kwargs,
                )
                self._refuse_unknown(info)
                server.info = info
            elif not await health(server.client):
                raise ServerUnreachable(f"{server.client.url} is still not answering")
            server.evicted_at, server.failures = None, 0
        except CaptureFailed as exc:
            server.last_error = server.client.secrets.scrub(exc.reason)
            server.evicted_at = time.monotonic()
            if isinstance(exc, KindMismatch):
                server.other_kind = server.last_error
        finally:
            server.probing = False
            REQUEST_SENT.reset(quiet)

    def _refuse_unknown(self, info: ServerInfo) -> None:
        """CaptureFailed for a server of no kind tokview knows, unless this probe could not have told: it sent no
        generations (`names_only`), or it had no tokenizer yet, whose prompt ids a server known only by its raw
        probe needs (`probed_in_full` says so, and the run probes it again with the tokenizer)."""
        if (refused := credentials_refused(info)) is not None:  # every request would be refused: said once, here
            raise CaptureFailed(refused)
        if info.kind == "unknown" and self.backend == "auto" and not self.names_only and not self._ahead:
            hint = "give the server's root URL (not an API sub-path) or pass --backend sglang|vllm"
            raise CaptureFailed(unknown_server(info, hint))
        if self.backend != AUTO and (why := kind_mismatch(CHOICES[self.backend].server, info, "--backend")):
            raise KindMismatch(why)

    async def probe_generations(self) -> None:
        """Send the 1-token probe generations a `names_only` probe left out, to each server that answered it: the
        pool is then what `start` without `names_only` makes. Why: the batch's resume shortcut learns the model
        names first and, once its plan shows work left, probes the rest while the tokenizer loads. Raises
        ServerUnreachable (the pool closed) when no server is left."""
        if not self.names_only:
            return
        self.names_only = False
        await asyncio.gather(*(self._probe_generations(s) for s in self._servers if s.info is not None))
        if not any(s.healthy for s in self._servers):
            reasons = "; ".join(f"{s.client.url}: {s.last_error}" for s in self._servers)
            await self.aclose()
            raise ServerUnreachable(f"no server answered ({reasons})")

    async def _probe_generations(self, server: _Server) -> None:
        assert server.info is not None
        server.probing = True
        try:
            await probe_endpoints(
                server.client, self.probe_policy, server.info, self.profile, self._probe_prompt_ids(), self.probe_kwargs
            )
            self._refuse_unknown(server.info)
        except CaptureFailed as exc:  # as `_probe` leaves a server it refused: probed afresh when it is due
            server.info = None
            server.last_error = server.client.secrets.scrub(exc.reason)
            server.evicted_at = time.monotonic()
        finally:
            server.probing = False

    def probed_in_full(self) -> bool:
        """Whether this pool's probe found every server's features as a probe with the tokenizer would have: it
        sent the 1-token generations (not `names_only`), and each server that answered is of a known kind and
        gave its raw probe prompt ids of its own (its /tokenize or its chat answer; without a tokenizer there are
        no others, and a raw probe without any is skipped)."""
        if self.names_only:
            return False
        for s in self._servers:
            if s.info is None:  # it did not answer: the run's own probes of it come later, as they would
                continue
            details = s.info.details
            if s.info.kind == "unknown" and self.backend == "auto":
                return False
            if not (details.get("probe_prompt_ids") or details.get("tokenize_prompt_ids")):
                return False
        return True

    def adopt(self, tokenizer: TokenizerAdapter, profile: ModelProfile) -> bool:
        """Capture with `tokenizer` and `profile` from now on, if the probe this pool ran without them found what a
        probe with them would have (`probed_in_full`), rendering with the same chat_template_kwargs. False,
        changing nothing: probe a new pool.
        Why: `tokview batch` on a store it ran before probes while the tokenizer loads (~0.3 s of CPU); on a real
        server the probe's three 1-token generations otherwise came after the load."""
        if self.probe_kwargs != profile.template_kwargs(True) or not self.probed_in_full():
            return False
        self.tokenizer, self.profile, self._ahead = tokenizer, profile, False
        return True

    def _probe_prompt_ids(self) -> list[int] | None:
        if self.tokenizer is None or self.profile is None:
            return None
        try:
            return self.tokenizer.render([{"role": "user", "content": "hi"}], template_kwargs=self.probe_kwargs)
        except (TokenizerError, ValueError):
            return None
