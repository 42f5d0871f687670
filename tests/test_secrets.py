"""Credentials and API keys never reach the database, an export, a log line or doctor's output.

Covers: URL `user:password@` and TOKVIEW_API_KEY scrubbed before anything is stored or printed (store,
batch, export, servers, doctor), secrets a server echoes back (a Basic-auth header in base64, a short
password), ordinary prose that merely looks like a credential kept word for word, and the note that
tells the user which of two credentials is sent.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from tokview.cli import main
from tokview.core.profiles import get_profile
from tokview.export import export
from tokview.secrets import Secrets, scrub
from tokview.servers import CaptureFailed, CaptureRequest, ServerPool
from tokview.servers.doctor import run_doctor
from tokview.servers.urls import parse_server_url, server_url_notes
from tokview.sim import SimConfig, start_simulator
from tokview.store import Store

KIMI = get_profile("kimi-k2.5")
QUESTION = [{"role": "user", "content": "What is 6 times 7?"}]
API_KEY = "sk-review-KEY-0123456789"
PASSWORD = "pw-s3cret-4567"
VLLM_INFO = {"/version": {"version": "0.32.0"}, "/v1/models": {"data": [{"id": "m"}]}}
PROMPTS = Path(__file__).resolve().parents[1] / "sample_data" / "plain_prompts.jsonl"


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _dump(store: Store) -> str:
    """Every value of every sample, run and failure row, as one string to search for secrets."""
    return " ".join(
        str(v)
        for table in ("samples", "runs", "failures")
        for row in store.query(f"SELECT * FROM {table}")
        for v in row
    )


def echo_credentials(path: str, headers: dict[str, str]) -> tuple[int, Any]:
    """A 401 whose message quotes whatever credentials came in, as some gateways do."""
    auth = headers.get("authorization", "")
    decoded = base64.b64decode(auth[6:]).decode() if auth.startswith("Basic ") else ""
    return 401, {"error": {"message": f"rejected {auth} ({decoded}); key {API_KEY} is not valid here"}}


def echo_header(path: str, headers: dict[str, str]) -> tuple[int, Any]:
    """A gateway 401 quoting the raw header and its decoded form, as the tester's proxy did."""
    auth = headers.get("authorization", "")
    decoded = base64.b64decode(auth[6:]).decode() if auth.startswith("Basic ") else ""
    return 401, {"error": {"message": f"denied header={auth!r} decoded={decoded!r}"}}


ROUTES = {**VLLM_INFO, "/v1/chat/completions": echo_header, "/v1/completions": echo_header, "/tokenize": echo_header}


# -- the store -----------------------------------------------------------------------------------------
def test_scrub_strips_url_userinfo_and_masks_the_env_key(monkeypatch):
    monkeypatch.setenv("TOKVIEW_API_KEY", "sk-envkey")
    assert scrub("http://user:tok3n@10.0.0.1:8000/v1") == "http://10.0.0.1:8000/v1"
    assert scrub("POST https://tok3n@h/generate failed") == "POST https://h/generate failed"
    assert scrub({"reason": "401: bad key sk-envkey"}) == {"reason": "401: bad key [redacted]"}
    assert scrub("Authorization: Bearer abc.def") == "Authorization: Bearer [redacted]"
    assert scrub("http://127.0.0.1:8000/generate") == "http://127.0.0.1:8000/generate"  # nothing to hide


def test_credentials_never_reach_the_database_file(store, monkeypatch, make_capture, put):
    monkeypatch.setenv("TOKVIEW_API_KEY", "sk-envkey")
    cap = make_capture()
    cap.server_url = "http://alice:tok3n@127.0.0.1:8000"
    cap.raw_request["url"] = "http://alice:tok3n@127.0.0.1:8000/v1/chat/completions"
    put(store, "p1", cap)
    store.put_run("run1", server_info=[{"url": "http://alice:tok3n@127.0.0.1:8000", "kind": "vllm"}])
    store.put_failure(
        "p2", "p2@x_gen0", "run1", "HTTP 401: invalid api key sk-envkey", server="http://alice:tok3n@127.0.0.1:8000"
    )
    dump = _dump(store)
    assert "tok3n" not in dump
    assert "sk-envkey" not in dump
    assert "alice" not in dump
    assert "127.0.0.1:8000" in dump


PROSE = "Explain the basic idea of a bearer token; my page is https://alice@example.com/x"


def test_ordinary_prose_is_stored_unchanged_while_secrets_are_masked(tmp_path, monkeypatch, make_capture, put):
    """Payloads keep every word a person wrote; only secret-named keys and known secret values go."""
    monkeypatch.setenv("TOKVIEW_API_KEY", "sk-envkey")
    cap = make_capture(question=PROSE + " (key sk-envkey)")
    cap.raw_request = {
        "url": "http://bob:pw-s3cret@127.0.0.1:8000/v1/chat/completions",
        "headers": {"Authorization": "Bearer abc.def"},
        "body": {"messages": cap.messages},
    }
    cap.raw_response = {"choices": [{"message": {"content": "a basic idea: " + PROSE}}]}
    with Store(tmp_path / "p.duckdb", server_urls=["http://carol:c4rol-pw@127.0.0.1:8000"]) as store:
        sid = put(store, "p1", cap)
        cap2 = make_capture(question="carol's password is c4rol-pw")
        put(store, "p2", cap2)
        got = store.load_sample(sid).capture
        assert got.messages[-1]["content"] == PROSE + " (key [redacted])"
        assert got.raw_request["body"]["messages"][-1]["content"] == PROSE + " (key [redacted])"
        assert got.raw_response["choices"][0]["message"]["content"] == "a basic idea: " + PROSE
        assert got.raw_request["headers"]["Authorization"] == "[redacted]"
        assert got.raw_request["url"] == "http://127.0.0.1:8000/v1/chat/completions"
        assert "pw-s3cret" not in str(got.raw_request)
        other = store.load_sample(put(store, "p2", cap2)).capture
        assert other.messages[-1]["content"] == "[redacted]'s password is [redacted]"  # the configured URL's


# -- batch ---------------------------------------------------------------------------------------------
def test_credentials_in_the_server_url_reach_neither_stderr_nor_the_store(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TOKVIEW_API_KEY", "sk-envkey-123")
    db = tmp_path / "c.duckdb"
    with start_simulator(SimConfig(kind="vllm", quirks={"http-500": True})) as sim:
        url = sim.url.replace("http://", "http://alice:tok3n@")
        args = ["batch", str(PROMPTS), "--server", url, "--db", str(db), "--limit", "2", "--retries", "0"]
        code = main([*args, "--max-new-tokens", "20", "--summary-json"])
    out = capsys.readouterr()
    assert code == 3
    with Store(db) as store:
        dump = _dump(store)
        assert store.stats()["failures"]["total"] == 2  # the failures were stored, scrubbed
    for text in (out.out, out.err, dump):
        assert "tok3n" not in text
        assert "sk-envkey-123" not in text
        assert "alice" not in text


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
    assert code == 2
    assert "tokview: note: http://127.0.0.1:9: user:password in the URL and TOKVIEW_API_KEY" in err
    assert "hunter2pw" not in err
    assert "sk-both" not in err


# -- export --------------------------------------------------------------------------------------------
def test_credentials_an_older_store_kept_never_reach_an_export(sample_store, tmp_path, monkeypatch, kimi_tok):
    monkeypatch.setenv("TOKVIEW_API_KEY", "sk-envkey-9")
    secret_url = "http://alice:tok3n@127.0.0.1:8000"
    sample_store.execute("UPDATE samples SET server_url = ?", [secret_url])  # as a tokview before the fix wrote it
    sample_store.execute("UPDATE runs SET server_info = ?", [json.dumps([{"url": secret_url, "kind": "vllm"}])])
    sample_store.execute(
        "INSERT INTO failures VALUES ('p3', 'p3@x_gen0', 'run1', ?, now(), ?)",
        ["HTTP 401: invalid key sk-envkey-9", secret_url],
    )
    out = tmp_path / "s.jsonl"
    result = export(sample_store, "speculators", out, select="all", tokenizer=kimi_tok, profile=KIMI)
    texts = [out.read_text(), result.manifest_path.read_text(), (tmp_path / "s.errors.jsonl").read_text()]
    for text in texts:
        assert "tok3n" not in text
        assert "alice" not in text
        assert "sk-envkey-9" not in text
    assert _jsonl(out)[0]["metadata"]["endpoint"] == "http://127.0.0.1:8000/v1/chat/completions"
    assert "127.0.0.1:8000" in texts[1]
    assert "HTTP 401: invalid key [redacted]" in texts[2]


def test_prose_survives_a_store_export_round_trip_while_secrets_do_not(
    tmp_path, monkeypatch, kimi_tok, make_capture, put
):
    monkeypatch.setenv("TOKVIEW_API_KEY", "sk-envkey-7")
    prose = "Explain the basic idea of a bearer token, then fetch https://alice@example.com/x"
    cap = make_capture(question=prose + " with key sk-envkey-7")
    cap.raw_request = {
        "url": "http://127.0.0.1:8000/v1/chat/completions",
        "headers": {"Authorization": "Basic YWxpY2U6cHc="},
        "body": {"messages": cap.messages},
    }
    with Store(tmp_path / "r.duckdb") as s:
        put(s, "p1", cap)
        export(s, "sharegpt", tmp_path / "g.jsonl", select="all", tokenizer=kimi_tok, profile=KIMI)
        stored = s.load_sample(s.samples_page()[0].sample_id).capture
    human = _jsonl(tmp_path / "g.jsonl")[0]["conversations"][-2]
    assert human == {"from": "human", "value": prose + " with key [redacted]"}
    assert stored.raw_request["headers"]["Authorization"] == "[redacted]"
    assert "sk-envkey-7" not in (tmp_path / "r.duckdb").read_bytes().decode("latin-1")


# -- servers and doctor --------------------------------------------------------------------------------
async def test_url_credentials_sent_as_auth_and_never_stored(kimi_tok, monkeypatch, json_server):
    monkeypatch.setenv("TOKVIEW_API_KEY", API_KEY)

    def completions(path: str, headers: dict[str, str]) -> tuple[int, Any]:
        if headers.get("authorization") != "Basic " + base64.b64encode(f"tok:{PASSWORD}".encode()).decode():
            return echo_credentials(path, headers)
        return 200, {"choices": [{"token_ids": [5, 6, 163586], "text": "ok", "finish_reason": "stop"}]}

    url, _ = json_server({**VLLM_INFO, "/v1/completions": completions, "/v1/chat/completions": echo_credentials})
    authed = url.replace("http://", f"http://tok:{PASSWORD}@")
    async with ServerPool(authed, backend="vllm", tokenizer=kimi_tok, profile=KIMI, retries=0, timeout=5.0) as pool:
        cap = await pool.capture(CaptureRequest(messages=QUESTION, settings={"max_new_tokens": 3}))
        with pytest.raises(CaptureFailed) as failed:
            await pool.capture(CaptureRequest(messages=QUESTION, mode="chat", settings={"max_new_tokens": 3}))
        info = pool.server_info()
    assert cap.output_ids == [5, 6, 163586]  # Basic auth reached the server
    stored = json.dumps([cap.to_dict(), info, failed.value.reason, str(failed.value)], default=str)
    assert cap.server_url == url
    assert cap.raw_request["url"] == url + "/v1/completions"
    assert "HTTP 401" in failed.value.reason
    assert "rejected" in failed.value.reason
    assert PASSWORD not in stored
    assert API_KEY not in stored
    assert "tok:" not in stored


async def test_doctor_sends_the_api_key_and_never_prints_it(monkeypatch, json_server):
    monkeypatch.setenv("TOKVIEW_API_KEY", API_KEY)
    routes = {
        **VLLM_INFO,
        "/v1/chat/completions": echo_credentials,
        "/v1/completions": echo_credentials,
        "/tokenize": echo_credentials,
    }
    url, seen = json_server(routes)
    report = await run_doctor(url, profile=KIMI, timeout=5.0, retries=0, default_tokenizer=False)
    assert seen
    assert all(h.get("authorization") == f"Bearer {API_KEY}" for h in seen)
    out = report.render_text() + json.dumps(report.to_dict())
    assert "rejected" in out
    assert "HTTP 401" in out  # the server's message is shown…
    assert API_KEY not in out  # …with the key masked


@pytest.mark.parametrize("user, password", [("alice", "hunter2pw"), ("alice", "p4"), ("bo", "x")])
async def test_doctor_never_prints_an_echoed_basic_header_or_a_short_password(monkeypatch, user, password, json_server):
    monkeypatch.delenv("TOKVIEW_API_KEY", raising=False)
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    url, seen = json_server(ROUTES)
    authed = url.replace("http://", f"http://{user}:{password}@")
    report = await run_doctor(authed, profile=KIMI, timeout=5.0, retries=0, default_tokenizer=False)
    assert any(h.get("authorization") == f"Basic {token}" for h in seen)  # it was sent…
    out = report.render_text() + json.dumps(report.to_dict())
    assert "denied header=" in out  # …the server's message is shown…
    assert token not in out
    assert token.rstrip("=") not in out
    assert "Basic [redacted]" in out  # …never the header
    assert f"{user}:{password}" not in out
    assert f":{password}'" not in out
    assert f"'{password}'" not in out


def test_scrub_masks_header_values_but_keeps_words():
    secrets = Secrets.for_server(parse_server_url("http://al:p4@h:1"), None)
    assert secrets.scrub("Basic authentication required") == "Basic authentication required"
    assert secrets.scrub("got 'Bearer sk-abc123XYZ'") == "got 'Bearer [redacted]'"
    assert secrets.scrub("decoded='al:p4' pw=p4 and p4p4 stays") == "decoded='[redacted]' pw=[redacted] and p4p4 stays"


async def test_url_credentials_and_api_key_say_which_is_sent(monkeypatch, json_server):
    monkeypatch.setenv("TOKVIEW_API_KEY", "sk-both-0123456789")
    url, seen = json_server(ROUTES)
    authed = url.replace("http://", "http://alice:hunter2pw@")
    notes = server_url_notes(authed)
    report = await run_doctor(authed, profile=KIMI, timeout=5.0, retries=0, default_tokenizer=False, notes=notes)
    assert seen
    assert all(h.get("authorization", "").startswith("Basic ") for h in seen)
    (note,) = [n for n in report.notes if "TOKVIEW_API_KEY" in n]
    assert "sends the URL's user:password (Basic auth) and NOT the TOKVIEW_API_KEY bearer token" in note
    assert "hunter2pw" not in note
    assert "sk-both" not in note
    assert report.render_text().count("TOKVIEW_API_KEY are both set") == 1
    monkeypatch.delenv("TOKVIEW_API_KEY")
    assert not [n for n in server_url_notes(authed) if "TOKVIEW_API_KEY" in n]


def _walked(value: Any, secrets: list[str]) -> str:
    """The reference: every payload walked by `scrub_payload`, then dumped (the stdlib when orjson cannot)."""
    import orjson

    from tokview.secrets import scrub_payload

    clean = scrub_payload(value, secrets)
    try:
        return orjson.dumps(clean, default=str, option=orjson.OPT_NON_STR_KEYS).decode()
    except (TypeError, orjson.JSONEncodeError):
        return json.dumps(clean, ensure_ascii=False, default=str)


class _Point(NamedTuple):
    x: int
    y: int


class _Str(str):
    pass


@pytest.mark.parametrize(
    "payload",
    [
        {"choices": [{"token_ids": list(range(2000)), "text": "plain words"}], "usage": {"completion_tokens": 2000}},
        {"request": {"Authorization": "Bearer sk-live-1234", "body": [1, 2, 3]}},
        {"meta": {"API_\u212aEY": "x"}},  # the Kelvin sign lowers to "k": still a secret-named key
        {"server_url": "http://user:pass@host:8000/v1", "ids": [5, 6]},
        {"text": "mail me at a@b.c"},
        {"text": "the key sk-live-1234 leaked into the answer"},
        {"text": 'quoted "sk-live-1234" in prose', "n": 1},
        {"ids": [1234567, 7], "text": "digits only"},
        {"nested": [{"k": ("tuple", 1)}, {2: "int key"}]},
        {"text": "a\nb\tc", "ids": []},
        {"point": _Point(1, 2), "text": "a named tuple, written as orjson's default writes it"},
        {"api_key": "x", "point": _Point(2**70, 1)},  # to mask, and only the stdlib can write it
        {"role": _Str("user"), "ids": [1, 2]},  # a str subclass
        {"ids": [2**70, 1]},  # beyond 64 bits: only the stdlib can write it
    ],
)
@pytest.mark.parametrize("secrets", [[], ["sk-live-1234"], ["1234567"], ['we"ird'], ["ctl\x01secret"]])
def test_to_json_equals_the_walk_whether_or_not_it_skips_it(payload, secrets):
    """`to_json` skips the walk when the dumped JSON shows nothing to mask: its text must equal the walk's."""
    from tokview.store.sample_rows import to_json

    assert to_json(payload, secrets) == _walked(payload, secrets)


def test_to_json_skips_the_walk_only_when_nothing_could_be_masked(monkeypatch):
    """The shortcut is taken for a plain body and never for one with a secret, a secret key or userinfo."""
    from tokview.store import sample_rows

    walked: list[Any] = []
    real = sample_rows.scrub_payload
    monkeypatch.setattr(sample_rows, "scrub_payload", lambda v, s, key=None: walked.append(v) or real(v, s, key))
    plain = {"choices": [{"token_ids": [1, 2, 3], "text": "hello"}]}
    assert sample_rows.to_json(plain, ["sk-live-1234"]) == '{"choices":[{"token_ids":[1,2,3],"text":"hello"}]}'
    assert walked == []
    for risky in ({"x": "sk-live-1234"}, {"Api-Key": "v"}, {"url": "http://u:p@h/"}):
        walked.clear()
        assert "sk-live-1234" not in sample_rows.to_json(risky, ["sk-live-1234"])
        assert walked, risky
    assert sample_rows.to_json({"Api-Key": "v"}, []) == '{"Api-Key":"[redacted]"}'


def test_every_secret_key_name_holds_a_hint_the_shortcut_looks_for():
    from tokview.secrets import SECRET_KEY_HINTS, SECRET_KEYS

    assert all(any(hint in key for hint in SECRET_KEY_HINTS) for key in SECRET_KEYS)
