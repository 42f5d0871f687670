"""Raw bytes sent to a proxy and read back: what the proxy front's tests share (`tokview proxy`'s HTTP reading)."""

from __future__ import annotations

import socket


def exchange(url: str, raw: bytes, timeout: float = 10) -> bytes:
    """Send raw bytes and read until the proxy closes the connection (a hang fails on the socket's timeout)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(raw)
        parts = []
        while chunk := sock.recv(65536):
            parts.append(chunk)
    return b"".join(parts)
