"""A real ASGI server on a free 127.0.0.1 port, for tests that replay or script server answers."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn


@contextmanager
def serve_asgi(app: Any) -> Iterator[str]:
    """Run `app` under uvicorn in a thread; yields its base URL and stops it on exit."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_level="error",
            lifespan="off",
            access_log=False,
            timeout_graceful_shutdown=0.2,  # type: ignore[arg-type]  # uvicorn waits a float of seconds; typed int
        )
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.005)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@contextmanager
def serve_json(routes: dict[str, Any]) -> Iterator[tuple[str, list[dict[str, str]]]]:
    """A scripted JSON server: `routes` maps a path to a JSON answer or to a function of
    (path, headers) -> (status, JSON); unlisted paths answer 404. Yields (url, headers seen), each
    seen entry being the request's headers plus its "path"."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    seen: list[dict[str, str]] = []

    async def endpoint(request: Request) -> JSONResponse:
        headers = dict(request.headers)
        seen.append({"path": request.url.path, **headers})
        answer = routes.get(request.url.path)
        if answer is None:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        status, body = answer(request.url.path, headers) if callable(answer) else (200, answer)
        return JSONResponse(body, status_code=status)

    app = Starlette(routes=[Route("/{path:path}", endpoint, methods=["GET", "POST"])])
    with serve_asgi(app) as url:
        yield url, seen
