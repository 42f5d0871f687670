"""Fault injection: the ways real servers fail, reproduced over a real socket.

Faults are counted so a retrying client can be tested end to end: `http-503=2` fails the first
two generation requests and lets the third through. Several counted faults are served in the order
of `FAULT_ORDER`, one per request (`http-503=2, malformed-json=1` fails requests 1-2 with 503 and
request 3 with a broken body). A bare flag (True) fails every generation request.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from tokview.sim.config import FAULT_ORDER

STALL_CAP_S = 600.0
"""A stalled request is released after this long even if the client never hangs up."""


class ConnectionDropped(Exception):
    """Raised inside a response so uvicorn aborts the connection mid-body (the drop-connection fault)."""


class _QuietDrop(logging.Filter):
    """Keep uvicorn from printing a traceback for the connections we drop on purpose."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        while exc is not None:
            if isinstance(exc, ConnectionDropped):
                return False
            exc = exc.__cause__ or exc.__context__
        return True


def install_log_filter() -> None:
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _QuietDrop) for f in logger.filters):
        logger.addFilter(_QuietDrop())


class FaultBook:
    """Which fault (if any) the next generation request gets."""

    def __init__(self, quirks: dict[str, Any]) -> None:
        self._left: dict[str, int | bool] = {}
        for name in FAULT_ORDER:
            value = quirks.get(name)
            if value is True or (isinstance(value, int) and not isinstance(value, bool) and value > 0):
                self._left[name] = value
        self._lock = threading.Lock()

    def take(self, streaming: bool) -> str | None:
        with self._lock:
            for name, left in self._left.items():
                if name == "stream-error" and not streaming:
                    continue
                if left is True:
                    return name
                if left > 0:
                    self._left[name] = left - 1
                    return name
        return None


def error_body(kind: str, status: int, message: str, err_type: str) -> dict[str, Any]:
    """The error JSON each server family sends (SGLang's flat shape is the recorded one)."""
    if kind == "sglang":
        return {"object": "error", "message": message, "type": err_type, "param": None, "code": status}
    return {"error": {"message": message, "type": err_type, "param": None, "code": status}}


STREAM_NOT_A_BOOL = "stream: Input should be a valid boolean"
"""The servers' request models refuse a `stream` pydantic does not read as a bool (HTTP 400)."""


def error_response(
    kind: str, status: int, message: str, err_type: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(error_body(kind, status, message, err_type), status_code=status, headers=headers)


def http_fault_response(kind: str, fault: str) -> Response | None:
    """The immediate response for status-code faults, or None for faults handled elsewhere."""
    if fault == "http-500":
        return error_response(kind, 500, "simulated internal server error (fault http-500)", "InternalServerError")
    if fault == "http-503":
        return error_response(
            kind, 503, "simulated overload: service unavailable (fault http-503)", "ServiceUnavailable"
        )
    if fault == "http-429":
        return error_response(
            kind,
            429,
            "simulated rate limit: too many requests (fault http-429)",
            "TooManyRequests",
            headers={"Retry-After": "0"},
        )
    return None


async def stall(request: Request, released: threading.Event, cap_s: float = STALL_CAP_S) -> None:
    """Hang until the client disconnects, the simulator stops, or `cap_s` passes."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + cap_s
    while loop.time() < deadline and not released.is_set():
        if await request.is_disconnected():
            return
        await asyncio.sleep(0.05)


async def wait_unless_released(seconds: float, released: threading.Event, step_s: float = 0.05) -> bool:
    """Sleep `seconds` (`--latency`), in steps, so that stopping the simulator ends the wait: False when it did. One
    sleep held a request past the server's graceful shutdown, which cancelled it with a traceback on stderr."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not released.is_set():
        left = deadline - loop.time()
        if left <= 0:
            return True
        await asyncio.sleep(min(left, step_s))
    return False


class DroppedResponse(Response):
    """Announces the full body, sends half of it, then aborts the connection."""

    def __init__(self, body: bytes, media_type: str = "application/json") -> None:
        super().__init__(content=body, media_type=media_type)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        await send({"type": "http.response.body", "body": self.body[: max(1, len(self.body) // 2)], "more_body": True})
        raise ConnectionDropped("simulated dropped connection (fault drop-connection)")


def malformed(body: bytes) -> bytes:
    """A body that starts like the real JSON but is cut off mid-object."""
    return body[: max(1, len(body) // 3)]
