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
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

REPLAY_PATHS = {"/v1/completions", "/v1/chat/completions"}
MIN_REPLAY_TOKENS = 100
PROMPT_IDS, PROMPT_TOKENS, TOTAL_TOKENS = "@@prompt_ids@@", "@@prompt_tokens@@", "@@total_tokens@@"
"""Placeholders in a pre-encoded answer for what each request changes."""
"""Shorter generations are probes (tokview and SpecForge send max_tokens 1–16): passed through."""


class Replayer:
    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.cached: dict[str, dict] = {}
        self.templates: dict[str, bytes] = {}
        self.completion_tokens: dict[str, int] = {}
        self.first: dict[str, float] = {}
        """Wall-clock time of the first request, the first replayed generation and the last replayed
        generation sent, since the last `GET /_bench/first` (which returns and clears them): a
        client's start-up to its first request, and its tail after the last answer."""

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
        prompt = request.get("prompt")
        if isinstance(prompt, list) and all(isinstance(i, int) for i in prompt):
            return 200, self.with_prompt(path, prompt), "application/json"
        data = self.cached[path]
        if "_bytes" not in data:
            data["_bytes"] = json.dumps({k: v for k, v in data.items() if k != "_bytes"}).encode()
        return 200, data["_bytes"], "application/json"

    def with_prompt(self, path: str, prompt: list[int]) -> bytes:
        """The cached answer with this request's prompt ids echoed and its usage counts, as a real
        server would report them. The body is encoded once, with placeholders where the per-request
        values go, so a request costs a few byte replacements instead of encoding 2,000 ids again."""
        template = self.templates.get(path)
        if template is None:
            data = dict(self.cached[path])
            data.pop("_bytes", None)
            choices = [dict(c) for c in data.get("choices") or []]
            for c in choices:
                if "prompt_token_ids" in c:
                    c["prompt_token_ids"] = PROMPT_IDS
            data["choices"] = choices
            if "prompt_token_ids" in data:
                data["prompt_token_ids"] = PROMPT_IDS
            if isinstance(data.get("usage"), dict):
                usage = dict(data["usage"])
                self.completion_tokens[path] = int(usage.get("completion_tokens") or 0)
                usage.update(prompt_tokens=PROMPT_TOKENS, total_tokens=TOTAL_TOKENS)
                data["usage"] = usage
            template = self.templates[path] = json.dumps(data).encode()
        n = len(prompt)
        return (
            template.replace(b'"%s"' % PROMPT_IDS.encode(), json.dumps(prompt).encode())
            .replace(b'"%s"' % PROMPT_TOKENS.encode(), b"%d" % n)
            .replace(b'"%s"' % TOTAL_TOKENS.encode(), b"%d" % (n + self.completion_tokens.get(path, 0)))
        )

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
                if "generation" in self.first:
                    self.first["last"] = time.time()
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
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # inherited: no Nagle wait on a split write
    sock.bind(("127.0.0.1", port))
    server = await asyncio.start_server(replayer.handle, sock=sock, limit=1 << 24, backlog=1024)
    bound = sock.getsockname()[1]
    if ready_file:
        ready_file.write_text(str(bound))
    else:
        print(bound, flush=True)
    async with server:
        await server.serve_forever()


@contextmanager
def replay_servers(output_tokens: int = 2000, tokenizer: str | None = None) -> Iterator[tuple[str, int]]:
    """`tokview sim` and this replay server in front of it, each its own process; yields (URL, replay pid).

    The replay server's pid lets a benchmark read how much CPU the server spent (`server_cpu_s`), to
    tell whether the server, not the client, was the limit. `tokenizer`: the simulator's tokenizer folder
    (default: the built-in Kimi layout)."""
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp, socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        sim_port = s.getsockname()[1]
        s.close()
        procs = [
            subprocess.Popen(
                [py, "-m", "tokview", "sim", "--port", str(sim_port), "--output-tokens", str(output_tokens)]
                + (["--tokenizer", tokenizer] if tokenizer else []),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        ]
        try:
            _wait_http(f"http://127.0.0.1:{sim_port}/v1/models", procs[0])
            ready = Path(tmp) / "replay.port"
            replay = subprocess.Popen(
                [py, __file__, "--upstream", f"http://127.0.0.1:{sim_port}", "--ready-file", str(ready)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            procs.append(replay)
            deadline = time.monotonic() + 60
            while not (ready.exists() and ready.read_text().strip()):
                if replay.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("the replay server did not start")
                time.sleep(0.05)
            yield f"http://127.0.0.1:{int(ready.read_text())}", replay.pid
        finally:
            for p in procs:
                p.kill()
                p.wait()


def _wait_http(url: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the simulator exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{url} did not answer")


def server_cpu_s(pid: int) -> float:
    """CPU seconds a process has used so far, its ended threads included: read from Linux's per-process CPU clock
    (nanoseconds; clockid `(~pid << 3) | 2`, CPUCLOCK_SCHED), else from /proc's utime + stime, which count in
    10 ms ticks: a 12-request phase of ~8 ms each read ±1 tick, ±10%, there."""
    import os
    import time

    try:
        return time.clock_gettime(((~pid) << 3) | 2)
    except (OSError, OverflowError):  # not Linux, or the process is gone
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
