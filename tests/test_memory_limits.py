"""Limits on what one request may hold in memory.

An answer longer than the response size limit is refused as soon as that is known and the rest is
never read (a 300 MB body took 2.3 GB and was stored whole); a prompt whose text is over the prompt
size limit is a failure naming the limit, never tokenized or sent (a 50 MB prompt against a server
reporting a 4M context peaked at 10 GB). Driven through `tokview batch` with a real proxy on 127.0.0.1
in front of the simulator (tests/drip_server.py), the limits lowered through their environment variables.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from drip_server import Served, flood, is_generation, serve_proxy
from loopback import serve_asgi
from starlette.applications import Starlette
from starlette.routing import Route

from tokview.servers.errors import CaptureFailed
from tokview.servers.http import ServerClient
from tokview.store import Store

ROOT = Path(__file__).resolve().parents[1]
TOKVIEW = [sys.executable, "-c", "import sys; from tokview.cli import main; sys.exit(main())"]
MIB = 1 << 20
FLOOD = 96 * MIB
"""Far more than a loopback socket buffers, so a client that stops reading stops the server early."""


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TOKVIEW, *args], capture_output=True, text=True, timeout=60, cwd=ROOT, env={**os.environ, **env}
    )


@pytest.mark.parametrize("framed", [True, False], ids=["content-length", "chunked"])
def test_an_answer_over_the_size_limit_is_a_failure_and_is_not_read(vllm_sim, tmp_path, framed):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hello"}\n')
    served = Served()
    flooding = lambda path, body: flood(served, FLOOD, framed=framed) if is_generation(path, body) else None  # noqa: E731
    with serve_proxy(vllm_sim.url, flooding) as url:
        done = _cli(
            "batch", str(prompts), "--server", url, "--db", str(tmp_path / "b.duckdb"), "--max-new-tokens", "20",
            "--summary-json", env={"TOKVIEW_MAX_RESPONSE_MB": "1"},
        )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert json.loads(done.stdout)["failed"] == 1
    with Store(tmp_path / "b.duckdb") as store:
        reasons = [f["reason"] for f in store.failures()]
    assert len(reasons) == 1, reasons
    assert "1,048,576-byte limit" in reasons[0], reasons
    assert "TOKVIEW_MAX_RESPONSE_MB" in reasons[0], reasons
    if framed:
        assert f"is {FLOOD:,} bytes, over the 1,048,576-byte limit" in reasons[0]  # refused on its content-length
    assert len(served.sent) == 1  # refused for good, not asked again
    assert served.hung_up == [True]
    assert served.sent[0] < FLOOD // 2  # the client stopped reading


def test_the_httpx_transport_refuses_an_answer_over_the_limit_too(monkeypatch):
    monkeypatch.setenv("TOKVIEW_MAX_RESPONSE_MB", "1")
    served = Served()

    async def endpoint(request):
        return flood(served, FLOOD, framed=False)

    app = Starlette(routes=[Route("/{path:path}", endpoint, methods=["GET", "POST"])])

    async def ask(url: str) -> None:
        client = ServerClient(url, fast=False)
        try:
            await client.post_json("/v1/completions", {"prompt": [1]})
        finally:
            await client.aclose()

    import asyncio

    with serve_asgi(app) as url, pytest.raises(CaptureFailed, match=r"passed the 1,048,576-byte limit"):
        asyncio.run(ask(url))
    assert served.sent[0] < FLOOD // 2


def test_a_prompt_over_the_size_limit_is_a_failure_naming_the_limit_and_is_never_sent(vllm_sim, tmp_path):
    prompts = tmp_path / "p.jsonl"
    big = "word " * (MIB // 2)  # 2.5 MiB of text
    prompts.write_text(json.dumps({"id": "big", "prompt": big}) + '\n{"id": "small", "prompt": "hello"}\n')
    sent: list[int] = []

    def count(path: str, body: object) -> None:
        if is_generation(path, body):
            sent.append(len(json.dumps(body)))

    with serve_proxy(vllm_sim.url, count) as url:
        done = _cli(
            "batch", str(prompts), "--server", url, "--db", str(tmp_path / "b.duckdb"), "--max-new-tokens", "20",
            "--summary-json", env={"TOKVIEW_MAX_PROMPT_MB": "1"},
        )  # fmt: skip
    assert done.returncode == 3, done.stderr
    summary = json.loads(done.stdout)
    assert (summary["ok"], summary["failed"]) == (1, 1)
    with Store(tmp_path / "b.duckdb") as store:
        reasons = [f["reason"] for f in store.failures()]
    assert len(reasons) == 1, reasons
    assert reasons[0].startswith("prompt_too_large: the prompt has 2,621,44"), reasons
    assert "over the 1,048,576-byte limit (TOKVIEW_MAX_PROMPT_MB=1)" in reasons[0], reasons
    assert len(sent) == 1
    assert max(sent) < 10_000  # only the small prompt went to the server


def test_recent_renders_hold_no_huge_prompt_and_no_copy_of_it_as_a_key(kimi_tok):
    from tokview.core.tokenizer import RecentRenders, TokenizerAdapter

    renders = RecentRenders(size=64, max_bytes=10_000)
    renders.put(("ids", b"a"), list(range(100)))  # 3,600 bytes as Python ints
    renders.put(("ids", b"b"), list(range(100)))
    renders.put(("ids", b"huge"), list(range(1_000)))  # over the budget by itself: not kept
    assert renders.get(("ids", b"huge")) is None
    assert renders.get(("ids", b"a")) is not None
    renders.put(("ids", b"c"), list(range(100)))  # 10,800 > 10,000: the oldest goes
    assert renders.get(("ids", b"a")) is None
    assert renders.get(("ids", b"c")) is not None

    tok = TokenizerAdapter(kimi_tok.tok, source=kimi_tok.source, loaded_by=kimi_tok.loaded_by)
    messages = [{"role": "user", "content": "word " * 20_000}]
    assert tok.render_length(messages) == len(tok.render(messages))
    keys = [key for _, (key, _template) in tok._renders._entries]
    assert keys
    assert all(len(key) == 32 for key in keys)  # a digest, not the 100 kB conversation again


@pytest.mark.parametrize("value", ["64MB", "0", "-1", "nan", "inf"])
def test_a_size_limit_that_is_no_number_of_mib_is_refused_before_anything_runs(tmp_path, value):
    """It silently kept the 8 MiB default: the long prompts a team raised the limit for then failed, row by row."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hello"}\n')
    db = tmp_path / "b.duckdb"
    done = _cli(
        "batch", str(prompts), "--server", "http://127.0.0.1:9", "--db", str(db), env={"TOKVIEW_MAX_PROMPT_MB": value}
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert (
        done.stderr.strip() == f"tokview: error: TOKVIEW_MAX_PROMPT_MB must be a number of MiB above 0, not {value!r}"
    )
    assert not db.exists()


@pytest.mark.parametrize("value", ["512M", "0", "-3", "nan", "inf"])
@pytest.mark.parametrize("command", ["batch", "doctor", "proxy", "demo"])
def test_a_response_limit_that_is_not_a_number_of_mib_is_said_in_one_line(command, value, vllm_sim, tmp_path):
    """`TOKVIEW_MAX_RESPONSE_MB=512M` silently kept the 128 MiB default (the answers it was set for then failed as
    too large): now one line, exit 1, before anything is stored."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hello"}\n')
    db = tmp_path / "b.duckdb"
    argv = {
        "batch": ["batch", str(prompts), "--server", vllm_sim.url, "--db", str(db)],
        "doctor": ["doctor", "--server", vllm_sim.url],
        "proxy": ["proxy", "--server", vllm_sim.url, "--db", str(db), "--listen", "127.0.0.1:0"],
        "demo": ["demo", "--no-ui", "--db", str(db)],
    }[command]
    done = _cli(*argv, env={"TOKVIEW_MAX_RESPONSE_MB": value})
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().endswith(f"TOKVIEW_MAX_RESPONSE_MB must be a number of MiB above 0, not {value!r}")
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert not db.exists()
