"""The benchmark's baseline: a minimal pass-through HTTP proxy on aiohttp (server and keep-alive client).

    python benchmarks/bare_forwarder.py --port PORT --upstream URL

Nothing is parsed or recorded: the request body goes up as it came, the answer's bytes come back read by
read. It is what "a bare aiohttp forwarder" costs (issue 24 item 5), with aiohttp's C HTTP parser, so the
proxy's figures are compared with a fair, light forwarder and not with a slow one.
"""

from __future__ import annotations

import argparse

from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

DROPPED = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive"})


def make_app(upstream: str) -> web.Application:
    session: ClientSession | None = None

    async def forward(request: web.Request) -> web.StreamResponse:
        nonlocal session
        if session is None:
            session = ClientSession(
                upstream,
                connector=TCPConnector(limit=0, keepalive_timeout=75),
                timeout=ClientTimeout(total=None),
                auto_decompress=False,
            )
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in DROPPED}
        async with session.request(
            request.method, request.rel_url, data=body, headers=headers, allow_redirects=False
        ) as answer:
            out = web.StreamResponse(
                status=answer.status,
                headers={k: v for k, v in answer.headers.items() if k.lower() not in DROPPED},
            )
            await out.prepare(request)
            async for piece in answer.content.iter_any():
                await out.write(piece)
            await out.write_eof()
            return out

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    args = parser.parse_args()
    web.run_app(make_app(args.upstream), host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
