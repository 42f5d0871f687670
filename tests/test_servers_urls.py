"""Server URLs: one validator for batch, doctor and the UI (one-line errors, never a traceback, never
a password in the message), credentials kept only where a request needs them, and a trailing /v1
dropped with a note the user sees (tokview adds /v1/... and /generate itself)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tokview.cli import main
from tokview.core.profiles import get_profile
from tokview.servers import CaptureRequest, ServerPool
from tokview.servers import urls as urls_module
from tokview.servers.doctor import run_doctor
from tokview.servers.urls import BadServerURL, public_url, server_url_notes, validate_server_url
from tokview.sim import SimConfig, start_simulator

KIMI = get_profile("kimi-k2.5")
QUESTION = [{"role": "user", "content": "What is 6 times 7?"}]
PASSWORD = "pw-s3cret-4567"


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
    with pytest.raises(BadServerURL, match=why) as info:
        validate_server_url(url)
    assert "\n" not in str(info.value)
    with pytest.raises(BadServerURL, match=why):
        ServerPool(url, profile=KIMI)


def test_validator_normalises_and_keeps_credentials_only_where_needed() -> None:
    assert validate_server_url(" http://127.0.0.1:8000/ ") == "http://127.0.0.1:8000"
    assert validate_server_url(f"http://tok:{PASSWORD}@h:8000") == f"http://tok:{PASSWORD}@h:8000"
    assert public_url(f"http://tok:{PASSWORD}@h:8000/v1/") == "http://h:8000"
    with pytest.raises(BadServerURL) as info:
        validate_server_url(f"http://tok:{PASSWORD}@h:99999")
    assert PASSWORD not in str(info.value)
    for url in (
        f"http://h:8000/?api_key={PASSWORD}",
        f"http://h:8000/?a=1&key={PASSWORD}",
        f"http://h:8000/#{PASSWORD}",
    ):
        with pytest.raises(BadServerURL, match="query or fragment") as info:  # a key in the query is a key too
            validate_server_url(url)
        assert PASSWORD not in str(info.value)
        assert "http://h:8000/" in str(info.value)


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999", "http://", f"http://u:{PASSWORD}@127.0.0.1:70000"])
def test_doctor_cli_bad_url_is_exit_1_one_line(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--server", url, "--timeout", "1"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("tokview: error: bad server URL")
    assert "\n" not in err  # worded as batch and ui
    assert PASSWORD not in err


async def test_run_doctor_rejects_a_bad_url_before_httpx() -> None:
    with pytest.raises(BadServerURL, match="out of range"):
        await run_doctor("http://127.0.0.1:99999", profile=KIMI)


async def test_trailing_v1_is_dropped_with_a_note(kimi_tok: Any) -> None:
    with start_simulator(SimConfig(kind="vllm")) as sim:
        async with ServerPool(sim.url + "/v1/", tokenizer=kimi_tok, profile=KIMI, timeout=5.0) as pool:
            cap = await pool.capture(CaptureRequest(messages=QUESTION, settings={"max_new_tokens": 20}))
            (info,) = pool.server_info()
        report = await run_doctor(sim.url + "/v1", tokenizer=kimi_tok, profile=KIMI, timeout=5.0)
    assert info["url"] == sim.url
    assert info["kind"] == "vllm"
    assert "/v1" in info["notes"][0]
    assert cap.server_url == sim.url
    assert cap.output_ids
    assert report.info.kind == "vllm"
    assert "note: dropped the trailing /v1" in report.render_text()


def test_server_url_notes_say_what_the_validator_changed() -> None:
    assert server_url_notes("http://h:8000/v1/") == [
        "dropped the trailing /v1 from the server URL: tokview adds /v1/... and /generate itself"
    ]
    assert server_url_notes("http://h:8000") == []
    assert validate_server_url("http://h:8000/v1") == "http://h:8000"
    with pytest.raises(BadServerURL, match="bad server URL"):
        server_url_notes("http://h:99999/v1")


def test_doctor_cli_tells_the_user_about_a_dropped_v1(capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI validates before the doctor's client sees the URL; the note must still reach the user."""
    with start_simulator(SimConfig(kind="vllm")) as sim:
        assert main(["doctor", "--server", sim.url + "/v1", "--json", "--timeout", "5"]) == 0
        out, err = capsys.readouterr()
        assert main(["doctor", "--server", sim.url + "/v1/", "--timeout", "5"]) == 0
        text = capsys.readouterr().out
    data = json.loads(out)
    assert data["url"] == sim.url
    assert len(data["notes"]) == 1
    assert "trailing /v1" in data["notes"][0]
    assert err.strip() == f"tokview: note: {data['notes'][0]}"
    assert text.count("note: dropped the trailing /v1") == 1


def _parsed(url):
    try:
        return urls_module.parse_server_url(url)
    except BadServerURL as exc:
        return str(exc)


PLAIN_URLS = [
    "http://127.0.0.1:8000",
    "http://127.0.0.1:8000/",
    "http://127.0.0.1:8000/v1",
    "http://127.0.0.1:8000/v1/",
    "https://gpu-3.lab.example:30000/v1",
    "http://localhost",
    "http://h:80",
    "https://h:443",
    "http://h:443",
    "https://h:80",
    "http://h:65535",
    "http://h:65536",
    "http://h:0",
    "http://h:08000",
    "http://1.2.3",
    "http://1.2.3.4",
    "http://127.000.0.1:8000",
    "http://256.1.1.1:8000",
    "http://0.0.0.0:1",
    "http://xn--d1acufc.xn--p1ai:8000",
    "http://a-b.c-d:9",
    "http://-ab:9",
    "http://ab-:9",
    "http://h.:8000",
    "http://H:8000",
    "HTTP://h:8000",
    "http://h:8000//",
    "http://h:8000/v1//",
    "http://h:8000/v2",
    "http://h:8000?x=1",
    "http://u:p@h:8000",
    "http://[::1]:8000",
]


@pytest.mark.parametrize("url", PLAIN_URLS)
def test_the_plain_url_path_agrees_with_httpx(url, monkeypatch):
    """`_plain_url` skips importing httpx for the URLs people type; it must change nothing: every URL
    parses (or fails) exactly as it does through httpx alone."""
    got = _parsed(url)
    monkeypatch.setattr(urls_module, "_plain_url", lambda _url: None)
    assert got == _parsed(url)


def test_plain_urls_take_the_fast_path():
    """The common forms really skip httpx (otherwise the start-up saving is not there)."""
    for url in ("http://127.0.0.1:8000", "https://gpu-3.lab:30000/v1/", "http://localhost:30000/"):
        assert urls_module._plain_url(url) is not None
    for url in ("http://u:p@h:8000", "http://[::1]:8000", "http://h:80", "http://h:8000/v2", "http://127.000.0.1:1"):
        assert urls_module._plain_url(url) is None
