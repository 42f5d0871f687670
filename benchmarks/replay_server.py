"""A loopback server that replays one long generation, so a client benchmark measures the client.

    python benchmarks/replay_server.py --upstream http://127.0.0.1:PORT --port 0 --ready-file F

`tokview sim` renders templates, samples 2,000 ids and encodes JSON in Python: on a 2-core box it
would be the bottleneck and every client would look equally fast. This server asks the simulator
once per endpoint for a full-length answer and then serves that answer again for every later
generation request, with the request's own prompt ids echoed (so tokview's prompt checks hold).
Anything else (probes, short test generations, /tokenize, /version …) is passed to the simulator.
It is plain asyncio over HTTP/1.1 keep-alive: no framework, so its own cost stays small.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import socket
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

REPLAY_PATHS = {"/v1/completions", "/v1/chat/completions"}
MIN_REPLAY_TOKENS = 100
"""Shorter generations are probes (tokview and SpecForge send max_tokens 1–16): passed through."""


class Replayer:
    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.cached: dict[str, dict] = {}
        self.first: dict[str, float] = {}
        """Wall-clock time of the first request and the first replayed generation since the last
        `GET /_bench/first` (which returns and clears them): start-up-to-first-request timing."""

    def forward(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes, str]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=120)
        try:
            conn.request(
                method,
                path,
                body=body or None,
                headers={"content-type": headers.get("content-type", "application/json")},
            )
            r = conn.getresponse()
            return r.status, r.read(), r.getheader("content-type") or "application/json"
        finally:
            conn.close()

    async def answer(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes, str]:
        if path == "/_bench/first":
            first, self.first = self.first, {}
            return 200, json.dumps(first).encode(), "application/json"
        self.first.setdefault("any", time.time())
        request = None
        if method == "POST" and path in REPLAY_PATHS:
            try:
                request = json.loads(body)
            except ValueError:
                request = None
        replay = (
            isinstance(request, dict)
            and not request.get("stream")
            and int(request.get("max_tokens") or 0) >= MIN_REPLAY_TOKENS
        )
        if not replay:
            return await asyncio.to_thread(self.forward, method, path, body, headers)
        self.first.setdefault("generation", time.time())
        if path not in self.cached:
            status, raw, ctype = await asyncio.to_thread(self.forward, method, path, body, headers)
            if status != 200:
                return status, raw, ctype
            self.cached[path] = json.loads(raw)
        data = self.cached[path]
        prompt = request.get("prompt")
        if isinstance(prompt, list) and all(isinstance(i, int) for i in prompt):
            data = dict(data)
            choices = [dict(c) for c in data.get("choices") or []]
            for c in choices:
                if "prompt_token_ids" in c:
                    c["prompt_token_ids"] = prompt
            data["choices"] = choices
            if "prompt_token_ids" in data:
                data["prompt_token_ids"] = prompt
            if isinstance(data.get("usage"), dict):  # the counts a real server would report for this prompt
                usage = dict(data["usage"])
                usage["prompt_tokens"] = len(prompt)
                usage["total_tokens"] = len(prompt) + int(usage.get("completion_tokens") or 0)
                data["usage"] = usage
            return 200, json.dumps(data).encode(), "application/json"
        if "_bytes" not in data:
            data["_bytes"] = json.dumps({k: v for k, v in data.items() if k != "_bytes"}).encode()
        return 200, data["_bytes"], "application/json"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                body = await reader.readexactly(int(headers.get("content-length") or 0))
                status, payload, ctype = await self.answer(method, target.split("?", 1)[0], body, headers)
                writer.write(
                    f"HTTP/1.1 {status} {http.client.responses.get(status, 'OK')}\r\n"
                    f"content-type: {ctype}\r\ncontent-length: {len(payload)}\r\n"
                    f"connection: keep-alive\r\n\r\n".encode()
                    + payload
                )
                await writer.drain()
                if headers.get("connection", "").lower() == "close":
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            writer.close()


async def serve(upstream: str, port: int, ready_file: Path | None) -> None:
    replayer = Replayer(upstream)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    server = await asyncio.start_server(replayer.handle, sock=sock, limit=1 << 24, backlog=1024)
    bound = sock.getsockname()[1]
    if ready_file:
        ready_file.write_text(str(bound))
    else:
        print(bound, flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ready-file", type=Path)
    args = parser.parse_args()
    try:
        asyncio.run(serve(args.upstream, args.port, args.ready_file))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
