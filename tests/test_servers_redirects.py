"""Redirects from a gateway in front of the server, through both transports (the small one and httpx).

A 307/308 on the same server (scheme, host and port: FastAPI's trailing-slash redirect, a gateway moving a
path) is followed, the body re-sent, at most `MAX_REDIRECTS` times; anything else fails in one line that
names the redirect and its Location, and no request (so no credential) ever goes to another server.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from loopback import serve_asgi

from tokview.servers.errors import CaptureFailed
from tokview.servers.http import MAX_REDIRECTS, ServerClient

TRANSPORTS = pytest.mark.parametrize("fast", [True, False], ids=["small-transport", "httpx"])


@contextmanager
def gateway(redirects: dict[str, tuple[int, str]]) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A server answering `redirects[path]` = (status, location) with that redirect, any other path with
    what it was sent (method, path, body, authorization) as JSON, or as a one-event SSE stream when asked."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    seen: list[dict[str, Any]] = []

    async def endpoint(request: Request) -> Response:
        body = (await request.body()).decode()
        where = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        seen.append({"method": request.method, "path": where, "auth": request.headers.get("authorization")})
        if request.url.path in redirects:
            status, location = redirects[request.url.path]
            return Response(b"", status_code=status, headers={"location": location})
        echo = {"method": request.method, "path": where, "body": body}
        if "text/event-stream" in request.headers.get("accept", ""):
            import json

            text = f"data: {json.dumps(echo)}\n\ndata: [DONE]\n\n"
            return Response(text.encode(), media_type="text/event-stream")
        return JSONResponse(echo)

    app = Starlette(routes=[Route("/{path:path}", endpoint, methods=["GET", "POST"])])
    with serve_asgi(app) as url:
        yield url, seen


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@TRANSPORTS
async def test_a_307_on_the_same_server_is_followed_with_the_body_and_credentials(fast: bool) -> None:
    with gateway({"/v1/completions": (307, "/v2/completions?via=gateway")}) as (url, seen):
        client = ServerClient(url.replace("http://", "http://alice:secret@"), fast=fast)
        try:
            answer = await client.post_json("/v1/completions", {"prompt": [1, 2]})
        finally:
            await client.aclose()
    assert answer == {"method": "POST", "path": "/v2/completions?via=gateway", "body": '{"prompt":[1,2]}'}
    assert [s["path"] for s in seen] == ["/v1/completions", "/v2/completions?via=gateway"]
    assert all(s["auth"] == _basic("alice", "secret") for s in seen)


@TRANSPORTS
async def test_a_308_on_a_get_and_a_301_on_a_get_are_followed(fast: bool) -> None:
    moves = {"/v1/models": (308, "/v1/models/"), "/v1/models/": (301, "/models")}
    with gateway(moves) as (url, seen):
        client = ServerClient(url, fast=fast)
        try:
            answer = await client.get_json("/v1/models")
        finally:
            await client.aclose()
    assert answer["path"] == "/models"
    assert len(seen) == 3


@TRANSPORTS
async def test_a_redirect_loop_stops_after_the_limit_and_names_the_location(fast: bool) -> None:
    with gateway({"/v1/completions": (307, "/v1/completions")}) as (url, seen):
        client = ServerClient(url, fast=fast)
        try:
            with pytest.raises(CaptureFailed) as failed:
                await client.post_json("/v1/completions", {"prompt": [1]})
        finally:
            await client.aclose()
    assert len(seen) == MAX_REDIRECTS + 1
    reason = failed.value.reason
    assert "307" in reason, reason
    assert f"{MAX_REDIRECTS} redirects" in reason, reason
    assert f"{url}/v1/completions" in reason, reason
    assert "not JSON" not in reason
    assert "\n" not in reason


@TRANSPORTS
async def test_a_redirect_to_another_server_is_not_followed_and_no_credential_goes_there(fast: bool) -> None:
    with (
        gateway({}) as (other, other_seen),
        gateway({"/v1/completions": (307, other + "/v1/completions")}) as (
            url,
            seen,
        ),
    ):
        client = ServerClient(url.replace("http://", "http://alice:secret@"), fast=fast)
        try:
            with pytest.raises(CaptureFailed) as failed:
                await client.post_json("/v1/completions", {"prompt": [1]})
        finally:
            await client.aclose()
    assert other_seen == []
    assert len(seen) == 1
    reason = failed.value.reason
    assert reason.startswith("HTTP 307 from POST /v1/completions: redirected to another server"), reason
    assert f"{other}/v1/completions" in reason, reason
    assert f"--server {other}" in reason, reason
    assert "secret" not in reason
    assert "alice" not in reason


@TRANSPORTS
async def test_a_302_on_a_post_is_not_followed_as_a_get(fast: bool) -> None:
    """A 301/302/303 turns a POST into a GET without its body: never what a generation request means."""
    with gateway({"/v1/completions": (302, "/elsewhere")}) as (url, seen):
        client = ServerClient(url, fast=fast)
        try:
            with pytest.raises(CaptureFailed, match=r"^HTTP 302 from POST /v1/completions: redirected to .*/elsewhere"):
                await client.post_json("/v1/completions", {"prompt": [1]})
        finally:
            await client.aclose()
    assert len(seen) == 1


@TRANSPORTS
async def test_a_redirect_without_a_location_or_with_terminal_escapes_fails_in_one_safe_line(fast: bool) -> None:
    """A Location is percent-encoded where it is not printable ASCII, as a browser does: shown that way too."""
    moves = {"/a": (307, ""), "/b": (307, "http://127.0.0.2:9/\x1b]0;pwned\x07"), "/c": (307, "/d\x1b[2J")}
    with gateway(moves) as (url, seen):
        client = ServerClient(url, fast=fast)
        try:
            with pytest.raises(CaptureFailed, match="without a Location"):
                await client.post_json("/a", {})
            with pytest.raises(CaptureFailed) as escaped:
                await client.post_json("/b", {})
            followed = await client.post_json("/c", {})
        finally:
            await client.aclose()
    reason = escaped.value.reason
    assert "\x1b" not in reason, reason
    assert "\x07" not in reason, reason
    assert "http://127.0.0.2:9/%1B]0;pwned%07" in reason, reason
    assert followed["path"] == seen[-1]["path"] == "/d\x1b[2J"  # sent as /d%1B[2J, decoded by the server


async def test_a_stream_redirected_on_the_same_server_is_followed() -> None:
    with gateway({"/v1/chat/completions": (307, "/gw/v1/chat/completions")}) as (url, seen):
        client = ServerClient(url)
        try:
            chunks = [c async for c in client.stream_sse("/v1/chat/completions", {"stream": True})]
        finally:
            await client.aclose()
    assert chunks == [{"method": "POST", "path": "/gw/v1/chat/completions", "body": '{"stream":true}'}]
    assert len(seen) == 2


async def test_a_stream_redirected_to_another_server_names_the_redirect() -> None:
    with gateway({}) as (other, other_seen), gateway({"/v1/chat/completions": (308, other + "/x")}) as (url, _):
        client = ServerClient(url)
        try:
            with pytest.raises(CaptureFailed, match=r"^HTTP 308 from POST /v1/chat/completions: redirected to ano"):
                _ = [c async for c in client.stream_sse("/v1/chat/completions", {"stream": True})]
        finally:
            await client.aclose()
    assert other_seen == []


@pytest.mark.parametrize("shape", ["elsewhere", "loop", "nowhere"])
@pytest.mark.parametrize("command", ["batch", "proxy", "doctor"])
def test_a_server_redirecting_everything_is_named_by_the_kind_probe(tmp_path, capsys, command, shape) -> None:
    """With the kind detected (the default), a gateway redirecting every path (to another server, in a loop, or with
    no Location) was "neither SGLang nor vLLM: pass --backend", though the fix is --server: the probe's one line
    names the redirect (as a run with --backend did)."""
    from prompt_files import prompts_file

    from tokview.cli import main

    elsewhere = "http://127.0.0.1:9/"

    class Everywhere(dict):  # every path redirects
        def __contains__(self, path: object) -> bool:
            return True

        def __getitem__(self, path: str) -> tuple[int, str]:
            if shape == "loop":
                return 307, path
            return 307, "" if shape == "nowhere" else elsewhere + path.lstrip("/")

    with gateway(Everywhere()) as (url, _):
        if command == "batch":
            prompts = prompts_file(tmp_path / "p.jsonl", 1)
            code = main(["batch", str(prompts), "--server", url, "--db", str(tmp_path / "s.duckdb")])
        elif command == "proxy":
            code = main(["proxy", "--server", url, "--listen", "127.0.0.1:0", "--db", str(tmp_path / "s.duckdb")])
        else:
            code = main(["doctor", "--server", url])
    said = capsys.readouterr()
    text = said.err + said.out
    assert code != 0
    expected = {
        "elsewhere": "redirected to another server, http://127.0.0.1:9/",
        "loop": "still redirected after",
        "nowhere": "a redirect without a Location",
    }
    assert expected[shape] in text, text
    assert "neither SGLang nor vLLM" not in text
    assert "Traceback" not in text
