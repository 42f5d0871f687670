"""Secrets a server echoes back (a Basic-auth header in base64, a short password) never reach doctor's
output, and with both URL credentials and TOKVIEW_API_KEY the user is told which one is sent."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from test_servers_review import VLLM_INFO, serve

from tokview.cli import main
from tokview.core.profiles import get_profile
from tokview.servers.doctor import run_doctor
from tokview.servers.urls import Secrets, parse_server_url, server_url_notes

KIMI = get_profile("kimi-k2.5")


def echo_header(path: str, headers: dict[str, str]) -> tuple[int, Any]:
    """A gateway 401 quoting the raw header and its decoded form, as the tester's proxy did."""
    auth = headers.get("authorization", "")
    decoded = base64.b64decode(auth[6:]).decode() if auth.startswith("Basic ") else ""
    return 401, {"error": {"message": f"denied header={auth!r} decoded={decoded!r}"}}


ROUTES = {**VLLM_INFO, "/v1/chat/completions": echo_header, "/v1/completions": echo_header, "/tokenize": echo_header}


@pytest.mark.parametrize("user, password", [("alice", "hunter2pw"), ("alice", "p4"), ("bo", "x")])
async def test_doctor_never_prints_an_echoed_basic_header_or_a_short_password(monkeypatch, user, password):
    monkeypatch.delenv("TOKVIEW_API_KEY", raising=False)
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    with serve(ROUTES) as (url, seen):
        authed = url.replace("http://", f"http://{user}:{password}@")
        report = await run_doctor(authed, profile=KIMI, timeout=5.0, retries=0, default_tokenizer=False)
    assert any(h.get("authorization") == f"Basic {token}" for h in seen)  # it was sent…
    out = report.render_text() + json.dumps(report.to_dict())
    assert "denied header=" in out  # …the server's message is shown…
    assert token not in out and token.rstrip("=") not in out and "Basic ***" in out  # …never the header
    assert f"{user}:{password}" not in out and f":{password}'" not in out and f"'{password}'" not in out


def test_scrub_masks_header_values_but_keeps_words():
    secrets = Secrets.for_server(parse_server_url("http://al:p4@h:1"), None)
    assert secrets.scrub("Basic authentication required") == "Basic authentication required"
    assert secrets.scrub("got 'Bearer sk-abc123XYZ'") == "got 'Bearer ***'"
    assert secrets.scrub("decoded='al:p4' pw=p4 and p4p4 stays") == "decoded='***' pw=*** and p4p4 stays"


async def test_url_credentials_and_api_key_say_which_is_sent(monkeypatch, capsys):
    monkeypatch.setenv("TOKVIEW_API_KEY", "sk-both-0123456789")
    with serve(ROUTES) as (url, seen):
        authed = url.replace("http://", "http://alice:hunter2pw@")
        notes = server_url_notes(authed)
        report = await run_doctor(authed, profile=KIMI, timeout=5.0, retries=0, default_tokenizer=False, notes=notes)
    assert seen and all(h.get("authorization", "").startswith("Basic ") for h in seen)
    (note,) = [n for n in report.notes if "TOKVIEW_API_KEY" in n]
    assert "sends the URL's user:password (Basic auth) and NOT the TOKVIEW_API_KEY bearer token" in note
    assert "hunter2pw" not in note and "sk-both" not in note
    assert report.render_text().count("TOKVIEW_API_KEY are both set") == 1
    monkeypatch.delenv("TOKVIEW_API_KEY")
    assert not [n for n in server_url_notes(authed) if "TOKVIEW_API_KEY" in n]


def test_batch_prints_which_credential_is_sent(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("TOKVIEW_API_KEY", "sk-both-0123456789")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hi"}\n')
    code = main(
        [
            "batch",
            str(prompts),
            "--server",
            "http://alice:hunter2pw@127.0.0.1:9",
            "--db",
            str(tmp_path / "x.duckdb"),
            "--retries",
            "0",
            "--timeout",
            "2",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "tokview: note: http://127.0.0.1:9: user:password in the URL and TOKVIEW_API_KEY" in err
    assert "hunter2pw" not in err and "sk-both" not in err
