"""Credentials a server quotes back, in the places the first round of masking missed (a review that tried to make
them leak): a proxy's failure reasons, a message cut in the middle of a key, a password JSON-escaped, a model's own
text, a short or malformed API key. `tests/test_secrets.py` holds the rest."""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tokview.proxy.serve import ProxyConfig, start_proxy
from tokview.secrets import known_secrets, scrub_text
from tokview.servers.errors import error_message
from tokview.store import Store

INFO = {"/version": {"version": "0.32.0"}, "/v1/models": {"data": [{"id": "m", "max_model_len": 4096}]}}
PASSWORD = "Secr3tPW-long"
CLIENT_KEY = "CLIENTKEY-abc888xyz"


def _echo(path: str, headers: dict[str, str]) -> tuple[int, Any]:
    """A 400 quoting the Authorization it got, bare and decoded, as some gateways do."""
    auth = headers.get("authorization", "")
    token = auth.partition(" ")[2]
    decoded = base64.b64decode(token).decode() if auth.startswith("Basic ") else token
    return 400, {"error": {"message": f"bad token {token} for {decoded}"}}


def test_the_proxy_never_stores_the_upstreams_or_a_clients_credentials_an_upstream_quotes(
    tmp_path, json_server, kimi_tok, kimi_profile
):
    url, _ = json_server({**INFO, "/v1/chat/completions": _echo})
    upstream = url.replace("http://", f"http://alice:{PASSWORD}@")
    db = tmp_path / "p.duckdb"
    config = ProxyConfig([upstream], listen="127.0.0.1:0", db=str(db), tokenizer=kimi_tok, profile=kimi_profile)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with start_proxy(config) as proxy:
        assert httpx.post(proxy.url + "/v1/chat/completions", json=body).status_code == 400
        headers = {"authorization": f"Bearer {CLIENT_KEY}"}
        assert httpx.post(proxy.url + "/v1/chat/completions", json=body, headers=headers).status_code == 400
    with Store(db) as store:
        reasons = [r for (r,) in store.query("SELECT reason FROM failures")]
    assert len(reasons) == 2 and all(r.startswith("refused by the upstream: HTTP 400: bad token") for r in reasons)
    said = " ".join(reasons)
    pair = base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
    for secret in (PASSWORD, pair, CLIENT_KEY):
        assert secret not in said, said


def test_a_message_is_cut_before_a_key_not_through_it_and_written_unescaped(monkeypatch):
    key = "sk-proj-AbCdEf0123456789XYZ"
    monkeypatch.setenv("TOKVIEW_API_KEY", key)
    said = error_message(b'{"error": {"message": "' + b"x " * 140 + b"key=" + key.encode() + b'"}}')
    assert said.endswith("…") and len(said) <= 301
    assert "sk-proj" not in scrub_text(said)
    escaped = error_message('{"detail": [{"decoded": "dave:pässwörd-LONG"}]}'.encode())
    assert "pässwörd-LONG" in escaped  # as the server wrote it: the masking finds it
    assert "pässwörd" not in scrub_text(escaped, _secrets("dave", "pässwörd-LONG"))


def _secrets(user: str, password: str) -> Any:
    from tokview.secrets import Secrets, credential_values

    return Secrets.of(credential_values(user, password))


def test_a_short_api_key_masks_no_word_of_the_data(monkeypatch):
    """`TOKVIEW_API_KEY=test` replaced every `test` of the prompts (`Write a unit [redacted]`)."""
    monkeypatch.setenv("TOKVIEW_API_KEY", "test")
    assert known_secrets() == []
    assert scrub_text("error: key test is not valid") == "error: key [redacted] is not valid"
    monkeypatch.setenv("TOKVIEW_API_KEY", "e")
    assert scrub_text("the user sent e") == "the user sent e"
    assert scrub_text("key='e'") == "key='[redacted]'"
    monkeypatch.setenv("TOKVIEW_PROXY_KEY", "proxy-key-123456")
    assert known_secrets() == ["proxy-key-123456"]
    assert "proxy-key-123456" not in scrub_text("client sent proxy-key-123456")


def test_a_model_text_that_echoes_the_key_is_stored_masked(monkeypatch, make_capture, put, store):
    monkeypatch.setenv("TOKVIEW_API_KEY", "sk-LEAKME-abc123")
    cap = make_capture(answer="The answer is forty - two")
    cap.content = "KEY=sk-LEAKME-abc123"
    cap.reasoning = "R=sk-LEAKME-abc123"
    cap.model = "m-sk-LEAKME-abc123"
    sid = put(store, "p1", cap)
    got = store.load_sample(sid).capture
    assert (got.content, got.reasoning, got.model) == ("KEY=[redacted]", "R=[redacted]", "m-[redacted]")


@pytest.mark.parametrize("key", ["sk-abc\r\nX-Injected: yes", "sk-abc\r", "sk-äbc"])
def test_an_api_key_a_header_cannot_carry_is_refused_in_one_line(tmp_path, key):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "q", "prompt": "hi"}\n')
    done = subprocess.run(
        [sys.executable, "-m", "tokview", "batch", str(prompts), "--server", "http://127.0.0.1:9", "--db", "k.duckdb"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**__import__("os").environ, "TOKVIEW_API_KEY": key},
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("tokview: error: TOKVIEW_API_KEY holds a character a header cannot carry")
    assert "sk-" not in line
    assert not Path(tmp_path / "k.duckdb").exists()


def test_a_clients_credentials_an_upstream_quotes_in_a_whole_answer_are_not_stored(
    tmp_path, json_server, kimi_tok, kimi_profile
):
    """Only the failure path knew the client's Authorization: a 200 answer quoting it kept it in `raw_response`,
    `content` and the model name."""
    token = base64.b64encode(b"carol:ClientPassw0rd-X").decode()
    prompt = kimi_tok.render([{"role": "user", "content": "hi"}], template_kwargs={"thinking": True})
    out = [kimi_profile.think_close_id, *kimi_tok.encode("ok"), kimi_profile.stop_ids[0]]

    def answer(path: str, headers: dict[str, str]) -> tuple[int, Any]:
        quoted = headers.get("authorization", "").partition(" ")[2]
        message = {"role": "assistant", "content": f"you sent {quoted} (carol:ClientPassw0rd-X)"}
        choice = {"index": 0, "message": message, "finish_reason": "stop", "token_ids": out}
        return 200, {"model": f"echo-{quoted}", "prompt_token_ids": prompt, "choices": [choice]}

    url, _ = json_server({**INFO, "/v1/chat/completions": answer})
    db = tmp_path / "c.duckdb"
    config = ProxyConfig([url], listen="127.0.0.1:0", db=str(db), tokenizer=kimi_tok, profile=kimi_profile)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with start_proxy(config) as proxy:
        got = httpx.post(proxy.url + "/v1/chat/completions", json=body, headers={"authorization": f"Basic {token}"})
        assert token in got.text, "the client gets the upstream's answer as it is"
    with Store(db) as store:
        [row] = store.query("SELECT raw_response, content, model FROM samples")
    stored = " ".join(str(v) for v in row)
    assert token not in stored and "ClientPassw0rd-X" not in stored, stored
    assert "you sent [redacted]" in stored


def test_a_key_a_server_echoed_into_a_finding_or_an_objects_key_never_reaches_the_store(tmp_path, monkeypatch):
    """The API key was stored whole in two places: a finding's detail (`stopped_by_request` quotes the stop string a
    server names) and a response object's key (only values and secret-named keys were masked)."""
    import dataclasses
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from builders import kimi, make_capture, profile

    from tokview.core.analysis import analyze
    from tokview.core.finding_rules import Finding
    from tokview.secrets import scrub

    key = "sk-LEAKCHECK9f8e7d6c5b4a"
    monkeypatch.setenv("TOKVIEW_API_KEY", key)
    capture = make_capture()
    capture.raw_response = {"choices": [{"message": {"content": "x"}}], "extra": {key: 1, "kept": 2}}
    analysis = analyze(capture, profile(), kimi())
    quoted = Finding("stopped_by_request", "error", f"The request's stop string {key!r} ended the generation", (3,))
    analysis = dataclasses.replace(analysis, findings=[*analysis.findings, quoted])
    db = tmp_path / "k.duckdb"
    with Store(db) as store:
        store.put_sample("s1", "p1", "run1", capture, analysis)
        stored = store.load_sample("s1")
        (detail,) = [r for (r,) in store.query("SELECT detail FROM findings WHERE code = 'stopped_by_request'")]
    assert key not in detail and "[redacted]" in detail
    assert stored.capture.raw_response["extra"] == {"[redacted]": 1, "kept": 2}
    assert key.encode() not in db.read_bytes()
    assert scrub({f"Bearer {key}": 1}) == {"Bearer [redacted]": 1}
