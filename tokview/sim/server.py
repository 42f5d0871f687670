"""Run the simulator: a Starlette app under uvicorn on 127.0.0.1, in a background thread.

The socket is bound (and listening) before the thread starts, so `sim.url` is usable the moment
`start_simulator` returns; we still wait for uvicorn's `started` so the first request is not
queued behind startup. Stopping releases stalled requests and gives in-flight ones a second.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from tokview.core.profiles import ModelProfile, ProfileError, detect_profile, get_profile, with_tokenizer_stops
from tokview.errors import UserError
from tokview.sim import faults, sglang, vllm
from tokview.sim.common import SimState, SimStats
from tokview.sim.config import SimConfig, SimConfigError

if TYPE_CHECKING:
    import uvicorn

    from tokview.core.tokenizer import TokenizerAdapter


LISTEN_HINT = "choose another --port (0 picks a free one)"


class CannotListen(UserError):
    """The simulator's address is taken or not allowed: the user's to change (`--port`), not a bug. Raised
    worded for the user, so every caller of `launch` (the command, the demo, a test) shows the same line."""

    title = "cannot listen"


@lru_cache(maxsize=8)
def _tokenizer_and_profile(path: str) -> tuple[TokenizerAdapter, ModelProfile]:
    """Load once per process: tests start many simulators over the same tokenizer."""
    from tokview.core.tokenizer import load_tokenizer

    tok = load_tokenizer(path)
    return tok, detect_profile(tok)


def tokenizer_for(cfg: SimConfig) -> tuple[TokenizerAdapter, ModelProfile]:
    if cfg.tokenizer_dir is None:
        from tokview.core.profiles import default_tokenizer_dir

        path = default_tokenizer_dir(cfg.profile, think_special=cfg.think_special)
    else:
        path = Path(cfg.tokenizer_dir).expanduser().absolute()
    tokenizer, detected = _tokenizer_and_profile(str(path))
    return tokenizer, detected if cfg.profile is None else served_profile(cfg.profile, tokenizer)


def served_profile(name: str, tokenizer: TokenizerAdapter) -> ModelProfile:
    """The profile the simulator serves its tokenizer as; SimConfigError when its ids are not this tokenizer's
    (its think delimiters would be other tokens, and every answer a malformed one)."""
    from tokview.core.profiles import check_tool_layout_fits
    from tokview.core.resolve import check_profile_fits

    try:
        wanted = get_profile(name)
        check_profile_fits(wanted, tokenizer, name)  # its stop ids too: gpt-oss's on a Kimi vocabulary are no ids
        check_tool_layout_fits(wanted, tokenizer, name)  # `qwen3`'s hermes calls under a template that writes XML
        profile = with_tokenizer_stops(wanted, tokenizer)
    except ProfileError as exc:
        raise SimConfigError(str(exc)) from None
    named = [(profile.think_open, profile.think_open_id), (profile.think_close, profile.think_close_id)]
    for text, token_id in named:
        if token_id is not None and tokenizer.token_to_id(text) != token_id:
            raise SimConfigError(
                f"profile {profile.name}: {text} is id {token_id} there, {tokenizer.token_to_id(text)} in this "
                "tokenizer: serve it with its own tokenizer"
            )
    return profile


class _CountRequests:
    """ASGI middleware: count every HTTP request per path."""

    def __init__(self, app: ASGIApp, stats: SimStats) -> None:
        self.app, self.stats = app, stats

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.stats.requests[scope["path"]] += 1
        await self.app(scope, receive, send)


class _RequireKey:
    """ASGI middleware: the API key check of a server started with `--api-key` (SGLang's `add_api_key_middleware`:
    every path but /health and /metrics; vLLM's: its /v1 paths)."""

    def __init__(self, app: ASGIApp, kind: str, key: str) -> None:
        self.app, self.kind, self.expected = app, kind, f"Bearer {key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self._guarded(scope["path"]):
            given = dict(scope.get("headers") or []).get(b"authorization")
            if given != self.expected:
                await JSONResponse({"error": "Unauthorized"}, status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _guarded(self, path: str) -> bool:
        if self.kind == "vllm":
            return path.startswith("/v1")
        return not path.startswith(("/health", "/metrics"))


async def _http_error(request: Request, exc: Exception) -> Response:
    """FastAPI's JSON for unknown paths and wrong methods (both real servers are FastAPI apps)."""
    assert isinstance(exc, HTTPException)  # the only exception class it is registered for
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)


def _refused_request(kind: str) -> Callable[[Request, Exception], Awaitable[Response]]:
    """A 400 in the server family's error shape for a request the simulator cannot take (nested deeper than
    Python's json reads, a lone surrogate in its text), as a real server refuses it: it was a 500 and a traceback
    on the simulator's stderr."""

    async def refused(request: Request, exc: Exception) -> Response:
        what = "nested too deeply" if isinstance(exc, RecursionError) else f"{type(exc).__name__}: {exc}"[:300]
        return faults.error_response(kind, 400, f"invalid request: {what}", "BadRequestError")

    return refused


SURFACES = {"sglang": sglang.routes, "vllm": vllm.routes}
"""Server kind → the routes of its HTTP surface."""


def build_app(state: SimState) -> ASGIApp:
    routes = SURFACES[state.cfg.kind](state)
    refused = _refused_request(state.cfg.kind)
    # Only what the request alone causes: a TypeError may be the simulator's own bug, which must stay a 500.
    handlers = {HTTPException: _http_error, RecursionError: refused, UnicodeError: refused}
    app: ASGIApp = Starlette(routes=routes, exception_handlers=handlers)
    if state.cfg.api_key:
        app = _RequireKey(app, state.cfg.kind, state.cfg.api_key)
    return _CountRequests(app, state.stats)


class Simulator:
    """A running simulator: `url`, `stats`, `state`; `stop()` shuts it down."""

    def __init__(
        self, cfg: SimConfig, state: SimState, server: uvicorn.Server, thread: threading.Thread, port: int
    ) -> None:
        self.cfg, self.state, self._server, self._thread, self.port = cfg, state, server, thread, port
        self.url = f"http://{cfg.host}:{port}"

    @property
    def stats(self) -> SimStats:
        return self.state.stats

    @property
    def profile(self) -> ModelProfile:
        return self.state.profile

    @property
    def tokenizer(self) -> TokenizerAdapter:
        return self.state.tokenizer

    def stop(self) -> None:
        self.state.released.set()
        self._server.should_exit = True
        self._thread.join(timeout=10)

    def __enter__(self) -> Simulator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def launch(cfg: SimConfig) -> Simulator:
    """Start a simulator and return it running (call `.stop()` when done)."""
    import uvicorn

    tokenizer, profile = tokenizer_for(cfg)
    # a quirk that would never act on this tokenizer is refused, not left idle
    cfg.check_tokenizer(profile, tokenizer)
    state = SimState(cfg, tokenizer, profile)
    faults.install_log_filter()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted sockets inherit it. Without it every response after a connection's first waited ~40 ms: uvicorn
    # writes the headers and the body apart, Nagle holds the body until the headers are acknowledged, and a
    # keep-alive client delays that acknowledgement (asyncio sets TCP_NODELAY itself only on sockets made with
    # proto IPPROTO_TCP, and this one is made with proto 0).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((cfg.host, cfg.port))
    except OSError as exc:
        sock.close()
        raise CannotListen(f"cannot listen on {cfg.host}:{cfg.port}: {exc.strerror or exc}: {LISTEN_HINT}") from None
    sock.listen(128)
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        build_app(state), log_level="warning", lifespan="off", access_log=False, timeout_graceful_shutdown=1, ws="none"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"tokview-sim-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError("the simulator's server did not start")
        time.sleep(0.005)
    return Simulator(cfg, state, server, thread, port)


@contextmanager
def start_simulator(cfg: SimConfig | None = None) -> Iterator[Simulator]:
    """`with start_simulator(SimConfig(kind="sglang")) as sim: httpx.get(sim.url + "/health")`."""
    sim = launch(cfg or SimConfig())
    try:
        yield sim
    finally:
        sim.stop()
