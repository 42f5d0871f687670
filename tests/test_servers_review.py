"""Review fixes in the servers layer, over real sockets: URL validation, credentials and the API key
kept out of every stored or printed string, a trailing /v1, servers of unknown kind, and malformed
response shapes (a small Starlette app on 127.0.0.1 serves the shapes no simulator quirk makes).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from loopback import serve_asgi
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tokview.cli import main
from tokview.core.profiles import get_profile
from tokview.servers import CaptureFailed, CaptureRequest, ServerPool, ServerUnreachable
from tokview.servers.doctor import run_doctor
from tokview.servers.urls import public_url, server_url_notes, validate_server_url
from tokview.sim import SimConfig, start_simulator

KIMI = get_profile("kimi-k2.5")
QUESTION = [{"role": "user", "content": "What is 6 times 7?"}]
API_KEY = "sk-review-KEY-0123456789"
PASSWORD = "pw-s3cret-4567"


@contextmanager
def serve(routes: dict[str, Any]) -> Iterator[tuple[str, list[dict[str, str]]]]:
    """A real HTTP server on a free port: `routes` maps a path to a JSON answer or to a function of
    (path, headers) -> (status, JSON). Unlisted paths answer 404. Yields (url, headers seen)."""
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


def echo_credentials(path: str, headers: dict[str, str]) -> tuple[int, Any]:
    """A 401 whose message quotes whatever credentials came in, as some gateways do."""
    auth = headers.get("authorization", "")
    decoded = base64.b64decode(auth[6:]).decode() if auth.startswith("Basic ") else ""
    return 401, {"error": {"message": f"rejected {auth} ({decoded}); key {API_KEY} is not valid here"}}


VLLM_INFO = {"/version": {"version": "0.32.0"}, "/v1/models": {"data": [{"id": "m"}]}}


# -- item 16: one URL validator, never a traceback -----------------------------------------------
@pytest.mark.parametrize(
    "url, why",
    [
        ("http://127.0.0.1:99999", "port 99999 is out of range"),
        ("http://", "no host"),
        ("127.0.0.1:8000", "http:// or https://"),
        ("ftp://h", "http:// or https://"),
        ("", "empty"),
        ("http://h:8000?token=x", "query"),
    ],
)
def test_bad_urls_are_one_line_value_errors(url: str, why: str) -> None:
    with pytest.raises(ValueError, match=why) as info:
        validate_server_url(url)
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match=why):
        ServerPool(url, profile=KIMI)


def test_validator_normalises_and_keeps_credentials_only_where_needed() -> None:
    assert validate_server_url(" http://127.0.0.1:8000/ ") == "http://127.0.0.1:8000"
    assert validate_server_url(f"http://tok:{PASSWORD}@h:8000") == f"http://tok:{PASSWORD}@h:8000"
    assert public_url(f"http://tok:{PASSWORD}@h:8000/v1/") == "http://h:8000"
    with pytest.raises(ValueError) as info:
        validate_server_url(f"http://tok:{PASSWORD}@h:99999")
    assert PASSWORD not in str(info.value)


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999", "http://", f"http://u:{PASSWORD}@127.0.0.1:70000"])
def test_doctor_cli_bad_url_is_exit_1_one_line(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--server", url, "--timeout", "1"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("tokview: error: bad server URL") and "\n" not in err  # worded as batch and ui
    assert PASSWORD not in err


async def test_run_doctor_rejects_a_bad_url_before_httpx() -> None:
    with pytest.raises(ValueError, match="out of range"):
        await run_doctor("http://127.0.0.1:99999", profile=KIMI)


# -- items 12 and 13: credentials and the API key -------------------------------------------------
async def test_url_credentials_sent_as_auth_and_never_stored(kimi_tok: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKVIEW_API_KEY", API_KEY)

    def completions(path: str, headers: dict[str, str]) -> tuple[int, Any]:
        if headers.get("authorization") != "Basic " + base64.b64encode(f"tok:{PASSWORD}".encode()).decode():
            return echo_credentials(path, headers)
        return 200, {"choices": [{"token_ids": [5, 6, 163586], "text": "ok", "finish_reason": "stop"}]}

    with serve({**VLLM_INFO, "/v1/completions": completions, "/v1/chat/completions": echo_credentials}) as (url, _):
        authed = url.replace("http://", f"http://tok:{PASSWORD}@")
        async with ServerPool(authed, backend="vllm", tokenizer=kimi_tok, profile=KIMI, retries=0, timeout=5.0) as pool:
            cap = await pool.capture(CaptureRequest(messages=QUESTION, settings={"max_new_tokens": 3}))
            with pytest.raises(CaptureFailed) as failed:
                await pool.capture(CaptureRequest(messages=QUESTION, mode="chat", settings={"max_new_tokens": 3}))
            info = pool.server_info()
    assert cap.output_ids == [5, 6, 163586]  # Basic auth reached the server
    stored = json.dumps([cap.to_dict(), info, failed.value.reason, str(failed.value)], default=str)
    assert cap.server_url == url and cap.raw_request["url"] == url + "/v1/completions"
    assert "HTTP 401" in failed.value.reason and "rejected" in failed.value.reason
    assert PASSWORD not in stored and API_KEY not in stored and "tok:" not in stored


async def test_doctor_sends_the_api_key_and_never_prints_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKVIEW_API_KEY", API_KEY)
    routes = {
        **VLLM_INFO,
        "/v1/chat/completions": echo_credentials,
        "/v1/completions": echo_credentials,
        "/tokenize": echo_credentials,
    }
    with serve(routes) as (url, seen):
        report = await run_doctor(url, profile=KIMI, timeout=5.0, retries=0, default_tokenizer=False)
    assert seen and all(h.get("authorization") == f"Bearer {API_KEY}" for h in seen)
    out = report.render_text() + json.dumps(report.to_dict())
    assert "rejected" in out and "HTTP 401" in out  # the server's message is shown…
    assert API_KEY not in out  # …with the key masked


# -- item 23: a trailing /v1, and servers that are neither SGLang nor vLLM --------------------------
async def test_trailing_v1_is_dropped_with_a_note(kimi_tok: Any) -> None:
    with start_simulator(SimConfig(kind="vllm")) as sim:
        async with ServerPool(sim.url + "/v1/", tokenizer=kimi_tok, profile=KIMI, timeout=5.0) as pool:
            cap = await pool.capture(CaptureRequest(messages=QUESTION, settings={"max_new_tokens": 20}))
            (info,) = pool.server_info()
        report = await run_doctor(sim.url + "/v1", tokenizer=kimi_tok, profile=KIMI, timeout=5.0)
    assert info["url"] == sim.url and info["kind"] == "vllm" and "/v1" in info["notes"][0]
    assert cap.server_url == sim.url and cap.output_ids
    assert report.info.kind == "vllm" and "note: dropped the trailing /v1" in report.render_text()


def test_server_url_notes_say_what_the_validator_changed() -> None:
    assert server_url_notes("http://h:8000/v1/") == [
        "dropped the trailing /v1 from the server URL: tokview adds /v1/... and /generate itself"
    ]
    assert server_url_notes("http://h:8000") == [] and validate_server_url("http://h:8000/v1") == "http://h:8000"
    with pytest.raises(ValueError, match="bad server URL"):
        server_url_notes("http://h:99999/v1")


def test_doctor_cli_tells_the_user_about_a_dropped_v1(capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI validates before the doctor's client sees the URL; the note must still reach the user."""
    with start_simulator(SimConfig(kind="vllm")) as sim:
        assert main(["doctor", "--server", sim.url + "/v1", "--json", "--timeout", "5"]) == 0
        out, err = capsys.readouterr()
        assert main(["doctor", "--server", sim.url + "/v1/", "--timeout", "5"]) == 0
        text = capsys.readouterr().out
    data = json.loads(out)
    assert data["url"] == sim.url and len(data["notes"]) == 1 and "trailing /v1" in data["notes"][0]
    assert err.strip() == f"tokview: note: {data['notes'][0]}"
    assert text.count("note: dropped the trailing /v1") == 1


async def test_unknown_kind_fails_start_clearly_unless_backend_given() -> None:
    anything = {p: {"ok": True} for p in ("/get_model_info", "/version", "/v1/models", "/health")}
    with serve(anything) as (url, _):
        with pytest.raises(ServerUnreachable) as info:
            async with ServerPool(url, profile=KIMI, retries=0, timeout=5.0):
                pass
        async with ServerPool(url, backend="vllm", profile=KIMI, retries=0, timeout=5.0) as pool:
            assert pool.server_info()[0]["healthy"]
    assert "neither SGLang nor vLLM" in info.value.reason and "--backend" in info.value.reason


# -- item 21: malformed shapes are failures with a reason, never a crash -----------------------------
SGLANG_INFO = {"/get_model_info": {"model_path": "m", "is_generation": True}}
GEN_OK = {"output_ids": [5, 163586], "text": "x", "meta_info": {"finish_reason": {"type": "stop"}}}


@pytest.mark.parametrize(
    "backend, mode, routes, reason",
    [
        (
            "sglang",
            "raw",
            {"/generate": {**GEN_OK, "meta_info": {"finish_reason": "abort"}}},
            "SGLang aborted the request on POST /generate: no message",
        ),
        ("sglang", "raw", {"/generate": {**GEN_OK, "meta_info": "oops"}}, "meta_info is not an object"),
        ("sglang", "raw", {"/generate": {**GEN_OK, "meta_info": {"finish_reason": 7}}}, "finish_reason is a int"),
        ("sglang", "raw", {"/generate": {**GEN_OK, "text": ["x"]}}, "text is not a string"),
        ("vllm", "raw", {"/v1/completions": {"choices": [{"token_ids": ["a", "b"]}]}}, "token_ids are not a list"),
        ("vllm", "raw", {"/v1/completions": {"choices": ["x"]}}, "choices[0] is not an object"),
        ("vllm", "chat", {"/v1/chat/completions": {"choices": ["x"]}}, "choices[0] is not an object"),
        (
            "vllm",
            "chat",
            {"/v1/chat/completions": {"prompt_token_ids": [1], "choices": [{"message": "hi", "token_ids": [5]}]}},
            "choices[0].message is not an object",
        ),
        (
            "vllm",
            "chat",
            {
                "/v1/chat/completions": {
                    "prompt_token_ids": [1],
                    "choices": [{"message": {"content": "a"}, "token_ids": [5, None]}],
                }
            },
            "output token ids are not a list",
        ),
        (
            "vllm",
            "chat",
            {
                "/v1/chat/completions": {
                    "prompt_token_ids": [1],
                    "choices": [{"message": {"content": {"a": 1}}, "token_ids": [5]}],
                }
            },
            "message.content is not a string",
        ),
    ],
)
async def test_malformed_shapes_are_capture_failures(
    kimi_tok: Any, backend: str, mode: str, routes: dict[str, Any], reason: str
) -> None:
    info = SGLANG_INFO if backend == "sglang" else VLLM_INFO
    with serve({**info, **routes}) as (url, _):
        async with ServerPool(
            url, backend=backend, tokenizer=kimi_tok, profile=KIMI, retries=1, backoff=0.01, timeout=5.0
        ) as pool:
            with pytest.raises(CaptureFailed) as failed:
                await pool.capture(CaptureRequest(messages=QUESTION, mode=mode, settings={"max_new_tokens": 5}))
    assert reason in failed.value.reason
