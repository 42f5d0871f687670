"""Text, ids and numbers from a server are untrusted: whatever a misbehaving server sends, every command
finishes, records what failed with a reason a person can read, stores nothing it cannot store and prints
nothing that drives the terminal.

Driven the way the tester drove it: a proxy of our own on 127.0.0.1 between tokview and the simulator
rewrites the simulator's answers (an error body with a JSON `\\ud800` escape, NULs and escape
sequences; output ids of 2**41; a lone surrogate in the output text; a NaN logprob; an echoed
Authorization header), and the real `tokview` command runs against it in a subprocess with a timeout,
so a frozen writer thread fails the test instead of hanging it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import unicodedata
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from loopback import serve_asgi

from tokview.store import Store
from tokview.ui.display import visible

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ROOT / "sample_data" / "plain_prompts.jsonl"
TOKVIEW = [sys.executable, "-c", "import sys; from tokview.cli import main; sys.exit(main())"]
GENERATE_PATHS = ("/v1/completions", "/v1/chat/completions", "/generate")
HOSTILE = "boom \\ud800 nul \\u0000 title \\u001b]0;pwned\\u0007 clear \\u001b[2J c1 \\u009b31m end"
"""JSON escapes a hostile error body carries: a lone surrogate, a NUL, an OSC title, a screen clear, a CSI."""

Mutate = Callable[[str, int, bytes, dict[str, str]], tuple[int, bytes]]


@contextmanager
def proxy(target: str, mutate: Mutate) -> Iterator[str]:
    """A proxy on 127.0.0.1 that forwards every request to `target` and lets `mutate(path, status, body,
    request headers)` rewrite the answer (status, body bytes)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    clients: list[httpx.AsyncClient] = []  # one, made on the server's own loop at the first request

    async def endpoint(request: Request) -> Response:
        body = await request.body()
        headers = {k: v for k, v in request.headers.items() if k not in ("host", "content-length")}
        if not clients:
            clients.append(httpx.AsyncClient(base_url=target, timeout=30))
        answer = await clients[0].request(request.method, request.url.path, content=body, headers=headers)
        status, data = mutate(request.url.path, answer.status_code, answer.content, dict(request.headers))
        return Response(data, status_code=status, media_type="application/json")

    app = Starlette(routes=[Route("/{path:path}", endpoint, methods=["GET", "POST"])])
    with serve_asgi(app) as url:
        yield url


def tokview(*args: str, timeout: float = 90, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The real command in a subprocess, stdout and stderr as bytes (escape sequences are looked for raw)."""
    return subprocess.run(
        [*TOKVIEW, *args], capture_output=True, timeout=timeout, cwd=ROOT, env={**os.environ, **(env or {})}
    )


def batch(url: str, db: Path, *extra: str, limit: int = 4) -> subprocess.CompletedProcess:
    args = ["batch", str(PROMPTS), "--server", url, "--db", str(db), "--limit", str(limit)]
    return tokview(*args, "--retries", "0", "--max-new-tokens", "20", *extra)


def hostile_500(path: str, status: int, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    if path in GENERATE_PATHS:
        return 500, b'{"error": {"message": "' + HOSTILE.encode() + b'"}}'
    return status, body


def assert_no_traceback(output: bytes) -> None:
    text = output.decode("utf-8", "backslashreplace")
    assert "Traceback" not in text, text
    assert "internal error" not in text, text
    assert "Exception in thread" not in text, text


def assert_terminal_safe(output: bytes) -> None:
    """No escape sequence, NUL, BEL or C1 control reaches the terminal, and no traceback does."""
    assert_no_traceback(output)
    text = output.decode("utf-8", "backslashreplace")
    assert "\x1b" not in text, text
    assert "\x00" not in text, text
    assert "\x07" not in text, text
    assert "\x9b" not in text, text


def failure_reasons(db: Path) -> list[str]:
    with Store(db) as store:
        return [row[0] for row in store.query("SELECT reason FROM failures ORDER BY sample_id")]


# -- a lone surrogate in a server's error body ---------------------------------------------------------
@pytest.mark.parametrize("workers", [[], ["--workers", "2"]], ids=["one-process", "workers-2"])
def test_every_request_failing_with_a_lone_surrogate_is_recorded_and_exits_3(vllm_sim, tmp_path, workers):
    db = tmp_path / "s.duckdb"
    with proxy(vllm_sim.url, hostile_500) as url:
        done = batch(url, db, *workers)
    assert done.returncode == 3, done.stderr
    assert_no_traceback(done.stderr + done.stdout)
    assert b"ok 0 + failed 4 + skipped 0 = 4 of input 4 (balanced)" in done.stderr
    reasons = failure_reasons(db)
    assert len(reasons) == 4
    for reason in reasons:  # stored whole, the unstorable surrogate written as its escape
        assert "boom \\ud800 nul" in reason
        assert "clear" in reason
        assert "end" in reason


def test_a_run_where_some_error_bodies_hold_lone_surrogates_never_freezes(vllm_sim, tmp_path):
    """With more requests than the writer lets pile up, a dead writer froze the run (the tester's 10.5 min)."""
    calls = {"n": 0}

    def every_other(path: str, status: int, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        if path in GENERATE_PATHS:
            calls["n"] += 1
            if calls["n"] % 2:
                return hostile_500(path, status, body, headers)
        return status, body

    db = tmp_path / "s.duckdb"
    prompts = tmp_path / "many.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i:03d}", "prompt": f"Count to {i}."}) + "\n" for i in range(80)))
    with proxy(vllm_sim.url, every_other) as url:
        args = ["batch", str(prompts), "--server", url, "--db", str(db), "--retries", "0"]
        done = tokview(*args, "--max-new-tokens", "8", "--concurrency", "4", timeout=60)
    assert done.returncode == 3, done.stderr
    assert_no_traceback(done.stderr)
    with Store(db) as store:
        ok = store.query("SELECT count(*) FROM samples")[0][0]
        failed = store.query("SELECT count(*) FROM failures")[0][0]
    assert ok + failed == 80
    assert ok >= 20
    assert failed >= 20
    assert f"ok {ok} + failed {failed} + skipped 0 = 80 of input 80 (balanced)".encode() in done.stderr


def test_a_writer_whose_part_cannot_be_written_stops_the_run_instead_of_dying(tmp_path):
    """Defence in depth: any error writing a part (a bug) becomes the writer's `error`, which stops the
    run; the thread keeps draining its queue, so nothing waits on `pending` forever."""
    from builders import kimi, make_capture, profile

    from tokview.batch.worklist import WorkItem
    from tokview.batch.writer_thread import GroupWriter
    from tokview.store.part_sink import PartSink, StoreError

    class BrokenSink(PartSink):
        def write_part(self, samples: Any, failures: Any = ()) -> None:
            raise TypeError("str is not valid UTF-8: surrogates not allowed")

    writer = GroupWriter(BrokenSink(tmp_path / "s.duckdb"), profile=profile(), tokenizer=kimi(), run_id="r")
    for n in range(5):
        writer.add_sample(WorkItem(f"s{n}", f"p{n}", None, 0, []), make_capture(f"q{n}"))
    closing = threading.Thread(target=writer.close)
    closing.start()
    closing.join(30)
    assert not closing.is_alive()
    assert writer.pending == 0
    assert isinstance(writer.error, StoreError)
    assert "TypeError: str is not valid UTF-8" in str(writer.error)


HOSTILE_MODEL = "evil\\u001b]0;pwned\\u0007\\u001b[2J\\ud800"


def hostile_everywhere(path: str, status: int, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    """Every generation answers the hostile 500; the model list names a model made of escape sequences."""
    if path == "/v1/models":
        return 200, b'{"object": "list", "data": [{"id": "' + HOSTILE_MODEL.encode() + b'", "object": "model"}]}'
    return hostile_500(path, status, body, headers)


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_doctor_on_a_server_sending_lone_surrogates_and_escapes_reports_them_safely(vllm_sim, as_json):
    with proxy(vllm_sim.url, hostile_everywhere) as url:
        done = tokview("doctor", "--server", url, "--timeout", "10", *(["--json"] if as_json else []))
    assert done.returncode == 3, done.stderr  # a failed check, not an internal error
    assert_terminal_safe(done.stdout + done.stderr)
    text = done.stdout.decode()
    if as_json:
        report = json.loads(text)
        details = " ".join(check["detail"] for check in report["checks"])
        assert not report["ok"]
        assert "boom \\ud800 nul \x00 title \x1b]0;pwned\x07 clear" in details
    else:
        assert "boom \\ud800 nul \\x00 title \\x1b]0;pwned\\x07 clear \\x1b[2J c1 \\x9b31m end" in text


# -- escape sequences from a server never reach the terminal --------------------------------------------
def test_escape_sequences_in_error_bodies_reach_neither_the_batch_summary_nor_stats(vllm_sim, tmp_path):
    db = tmp_path / "s.duckdb"
    with proxy(vllm_sim.url, hostile_500) as url:
        done = batch(url, db)
    assert done.returncode == 3
    assert_terminal_safe(done.stderr + done.stdout)
    assert b"boom \\ud800 nul \\x00 title \\x1b]0;pwned\\x07 clear \\x1b[2J c1 \\x9b31m end" in done.stderr
    stats = tokview("stats", "--db", str(db), "--samples")
    assert stats.returncode == 0, stats.stderr
    assert_terminal_safe(stats.stdout + stats.stderr)
    assert b"failures  4" in stats.stdout
    assert b"title \\x1b]0;pwned\\x07 clear" in stats.stdout


# -- ids no tokenizer has, lone surrogates in the output text ------------------------------------------
def rewrite_answers(change: Callable[[dict[str, Any]], None]) -> Mutate:
    """A proxy hook applying `change` to every choice of every generation answer (JSON, not streamed)."""

    def mutate(path: str, status: int, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        if path not in GENERATE_PATHS or status != 200:
            return status, body
        answer = json.loads(body)
        for choice in answer.get("choices") or [answer]:
            change(choice)
        return status, json.dumps(answer).encode()  # ensure_ascii: a lone surrogate goes out as "\ud800"

    return mutate


def huge_id(choice: dict[str, Any]) -> None:
    for key in ("token_ids", "output_ids"):
        if choice.get(key):
            choice[key][0] = 2**41


def lone_surrogate_text(choice: dict[str, Any]) -> None:
    if isinstance(choice.get("text"), str):
        choice["text"] = "\ud800" + choice["text"]
    message = choice.get("message")
    if isinstance(message, dict) and isinstance(message.get("content"), str):
        message["content"] = "\ud800" + message["content"]


def lone_surrogate_finish(choice: dict[str, Any]) -> None:
    choice["finish_reason"] = "stop\udfff"


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (huge_id, "malformed response from POST /v1/"),
        (lone_surrogate_text, "malformed response from POST /v1/"),
        (lone_surrogate_finish, "malformed response from POST /v1/"),
    ],
    ids=["id-2**41", "lone-surrogate", "lone-surrogate-finish-reason"],
)
def test_an_impossible_id_or_text_is_a_malformed_response_with_its_reason(vllm_sim, tmp_path, change, said):
    db = tmp_path / "s.duckdb"
    with proxy(vllm_sim.url, rewrite_answers(change)) as url:
        done = batch(url, db, limit=2)
    assert done.returncode == 3, done.stderr
    assert_no_traceback(done.stderr)
    reasons = failure_reasons(db)
    assert len(reasons) == 2, done.stderr
    for reason in reasons:
        assert reason.startswith(said), reason
        assert "unexpected error" not in reason, reason
    with Store(db) as store:
        assert store.count_samples() == 0


# -- a NaN logprob from the scoring target --------------------------------------------------------------
def nan_logprob(path: str, status: int, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    """The target's prompt_logprobs with one logprob NaN (Python's json writes it; real servers have)."""
    if path != "/v1/completions" or status != 200:
        return status, body
    answer = json.loads(body)
    positions = answer["choices"][0]["prompt_logprobs"]
    entry = positions[-1]
    for value in entry.values():
        value["logprob"] = float("nan")
    return status, json.dumps(answer).encode()


def test_a_nan_logprob_from_the_target_is_a_malformed_response_and_is_scored_again(vllm_sim, tmp_path):
    db = tmp_path / "s.duckdb"
    made = batch(vllm_sim.url, db, limit=2)
    assert made.returncode == 0, made.stderr
    with proxy(vllm_sim.url, nan_logprob) as url:
        scored = tokview("score", "--db", str(db), "--server", url, "--retries", "0")
    assert scored.returncode == 3, scored.stderr
    assert_no_traceback(scored.stderr)
    assert b"scored 0 + failed 2" in scored.stderr
    assert b"9999" not in scored.stderr
    assert b"malformed response from " in scored.stderr
    assert b"NaN" in scored.stderr
    again = tokview("score", "--db", str(db), "--server", vllm_sim.url, "--retries", "0")
    assert again.returncode == 0, again.stderr
    assert b"scored 2 + failed 0 + already scored 0" in again.stderr, again.stderr


# -- a gateway echoing the request's Basic credential in a 200 body -------------------------------------
def echo_authorization(path: str, status: int, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    """Every 200 generation answer gains the request's Authorization header, as an echoing gateway adds it."""
    if path not in GENERATE_PATHS or status != 200:
        return status, body
    answer = json.loads(body)
    auth = headers.get("authorization", "")
    answer["gateway"] = {"seen": f"authorization={auth}", "token": auth.split(" ", 1)[-1]}
    return status, json.dumps(answer).encode()


def test_an_echoed_basic_credential_is_neither_stored_nor_shown(vllm_sim, tmp_path):
    import base64

    db = tmp_path / "s.duckdb"
    token = base64.b64encode(b"alice:pw-s3cret-4567").decode()
    with proxy(vllm_sim.url, echo_authorization) as url:
        done = batch(url.replace("http://", "http://alice:pw-s3cret-4567@"), db, limit=2)
    assert done.returncode == 0, done.stderr
    with Store(db) as store:
        raw = [row[0] for row in store.query("SELECT raw_response FROM samples")]
        sample_id = store.query("SELECT sample_id FROM samples LIMIT 1")[0][0]
    assert len(raw) == 2
    assert all("gateway" in r for r in raw)  # the echo came back and was stored …
    shown = tokview("show", sample_id, "--db", str(db), "--json")
    assert shown.returncode == 0, shown.stderr
    for text in (*raw, shown.stdout.decode()):
        assert token not in text
        assert token.rstrip("=") not in text
        assert "pw-s3cret" not in text  # … masked


def escapes_in_text_and_model(choice: dict[str, Any]) -> None:
    if isinstance(choice.get("text"), str):
        choice["text"] = "\x1b]0;pwned\x07\x1b[2J" + choice["text"]


def test_escape_sequences_in_a_stored_answer_are_shown_not_run(vllm_sim, tmp_path):
    def mutate(path: str, status: int, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        status, body = rewrite_answers(escapes_in_text_and_model)(path, status, body, headers)
        if path in GENERATE_PATHS and status == 200:
            answer = json.loads(body)
            answer["model"] = "evil\x1b]0;pwned\x07\x9b2J"
            body = json.dumps(answer, ensure_ascii=False).encode()
        return status, body

    db = tmp_path / "s.duckdb"
    with proxy(vllm_sim.url, mutate) as url:
        done = batch(url, db, limit=1)
    assert done.returncode == 0, done.stderr
    assert_terminal_safe(done.stderr)
    with Store(db) as store:
        sample_id, text = store.query("SELECT sample_id, text FROM samples")[0]
    assert text.startswith("\x1b]0;pwned\x07")  # stored as the server sent it: a model may emit such bytes
    shown = tokview("show", sample_id, "--db", str(db))
    assert shown.returncode == 0, shown.stderr
    assert_terminal_safe(shown.stdout + shown.stderr)
    stats = tokview("stats", "--db", str(db), "--samples")
    assert_terminal_safe(stats.stdout + stats.stderr)


def test_the_app_s_token_pieces_show_c1_controls_and_lone_surrogates_as_escapes():
    """A byte-level token decodes to U+009B (CSI on a terminal that reads C1); an older store may hold a
    lone surrogate: the app's panes show both as text, never send them to the terminal."""
    from tokview.ui.display import visible

    assert visible("a\x9b2Jb\ud800c") == "a\\x9b2Jb\\ud800c"
    assert visible("\x00\x1b\x7f é") == "␀␛␡·é"  # as before: C0 and DEL as their glyphs, letters kept


def test_printable_escapes_what_acts_on_a_terminal_and_keeps_everything_else():
    from tokview.untrusted_text import printable, printable_line, storable

    hostile = "ok é ✓\n\tnul\x00 esc\x1b[2J bel\x07 del\x7f csi\x9b1m sur\ud800"
    assert printable(hostile) == "ok é ✓\n\tnul\\x00 esc\\x1b[2J bel\\x07 del\\x7f csi\\x9b1m sur\\ud800"
    assert printable_line("a\nb\tc") == "a\\nb\\tc"
    assert storable(hostile) == hostile.replace("\ud800", "\\ud800")
    assert storable(hostile).encode("utf-8")  # a part, a column and a terminal all take it


def test_a_lone_surrogate_elsewhere_in_an_answer_is_stored_exactly_and_shown(vllm_sim, tmp_path):
    """Not in the output text (that is a malformed answer): in a field tokview does not read. The body is
    stored as JSON whose escape reads back as the same string, and `show --json` prints it."""

    def mutate(path: str, status: int, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        if path in GENERATE_PATHS and status == 200:
            answer = json.loads(body)
            answer["system_fingerprint"] = "fp-\ud800-\x1b[2J"
            body = json.dumps(answer).encode()
        return status, body

    db = tmp_path / "s.duckdb"
    with proxy(vllm_sim.url, mutate) as url:
        done = batch(url, db, limit=2)
    assert done.returncode == 0, done.stderr
    with Store(db) as store:
        sample_id = store.query("SELECT sample_id FROM samples ORDER BY sample_id LIMIT 1")[0][0]
        assert store.count_samples() == 2
        assert store.load_sample(sample_id).capture.raw_response["system_fingerprint"] == "fp-\ud800-\x1b[2J"
    shown = tokview("show", sample_id, "--db", str(db), "--json")
    assert shown.returncode == 0, shown.stderr
    assert_terminal_safe(shown.stdout + shown.stderr)
    assert json.loads(shown.stdout)["capture"]["raw_response"]["system_fingerprint"] == "fp-\ud800-\x1b[2J"


def huge_top_id(choice: dict[str, Any]) -> None:
    """An alternative named `token_id:2**41` in the completions answer's top_logprobs."""
    tops = (choice.get("logprobs") or {}).get("top_logprobs")
    if tops:
        tops[0] = {f"token_id:{2**41}": -0.5, **tops[0]}


def test_an_impossible_id_among_the_logprob_alternatives_is_a_malformed_response(vllm_sim, tmp_path):
    db = tmp_path / "s.duckdb"
    with proxy(vllm_sim.url, rewrite_answers(huge_top_id)) as url:
        done = batch(url, db, "--logprobs", "2", limit=2)
    assert done.returncode == 3, done.stderr
    assert_no_traceback(done.stderr)
    reasons = failure_reasons(db)
    assert len(reasons) == 2, reasons
    assert all(r.startswith("malformed response from POST /v1/") for r in reasons), reasons
    assert all(str(2**41) in r for r in reasons)
    assert tokview("stats", "--db", str(db)).returncode == 0  # nothing unlandable was left behind


def test_a_model_name_with_a_lone_surrogate_and_escapes_ends_in_recorded_failures(vllm_sim, tmp_path):
    """The name a server lists is stored with the run and each sample's id: its lone surrogate once made
    the run record unwritable ('cannot write to …: surrogate'); the requests that name it are refused by
    the server, and those failures are recorded and printed safely."""
    db = tmp_path / "s.duckdb"
    with proxy(vllm_sim.url, hostile_everywhere) as url:
        done = batch(url, db, limit=2)
    assert done.returncode == 3, done.stderr
    assert_terminal_safe(done.stderr + done.stdout)
    assert len(failure_reasons(db)) == 2
    with Store(db) as store:
        (server_info,) = store.query("SELECT server_info FROM runs")[0]
    assert json.loads(server_info)[0]["model"] == "evil\x1b]0;pwned\x07\x1b[2J\\ud800"  # kept, as text


def test_a_line_keeps_the_line_and_paragraph_separators_escaped_and_reads_back():
    """`stats --samples` promises a record a line; an id holding U+2028 split in two for a reader that splits lines
    as Python's `splitlines` does."""
    from tokview.untrusted_text import from_printed, printable_line

    text = "ls\u2028sep\u2029x"
    line = printable_line(text)
    assert line == "ls\\u2028sep\\u2029x" and len(line.splitlines()) == 1
    assert from_printed(line) == text


@pytest.mark.parametrize("piece", ["\u200d", "\u200b", "\ufeff", "\u2028", "\u2029", "\u0301", "\ufe0f", "\U0001f3fd"])
def test_a_token_of_zero_width_characters_alone_takes_a_cell_in_the_token_view(piece):
    """Byte-level tokens of their own (a ZWJ, a line separator, a combining accent, a skin tone): drawn in 0 cells,
    such a token and the cursor on it were invisible, and a combining mark was drawn onto the token before."""
    from rich.cells import cell_len

    shown = visible(piece)
    assert cell_len(shown) >= 1
    assert "\u2028" not in shown and "\u2029" not in shown  # a terminal may break the line there
    assert not unicodedata.combining(shown[0])


def test_zero_width_characters_are_named_at_a_tokens_edges_and_kept_inside_it():
    assert visible("a\u200db") == "a\u200db"  # a joiner between letters draws as the text it joins
    assert visible("a\u2028b") == "a‹U+2028›b"  # a line separator is named wherever it is
    assert visible("e\u0301") == "e\u0301"  # a whole character: as it is
    assert visible("\u0301x") == "◌\u0301x"
    assert visible("\u200dx") == "‹U+200D›x"  # a leading joiner made the layout count the whole token 0 cells
    assert visible("\u200d👩") == "‹U+200D›👩"
    assert visible(" \u200b") == "·‹U+200B›"  # not the same as a plain space token
    assert visible("👨\u200d👩") == "👨\u200d👩"  # inside: the sequence it joins


def test_a_long_reason_is_clipped_before_a_word_never_through_one() -> None:
    """The batch summary cut a reason at 200 characters: `/v1/completions` read `/v1/completion`, brackets left open."""
    from tokview.untrusted_text import clipped

    reason = "the chat endpoint returned no token ids: " + "use the raw path " * 12 + "(vLLM /v1/completions)"
    cut = clipped(reason, 200)
    assert len(cut) <= 200 and cut.endswith(" …")
    assert reason.startswith(cut[: -len(" …")]) and reason[len(cut) - 2] == " "
    assert clipped("short", 200) == "short"
    assert clipped("x" * 300, 200) == "x" * 198 + " …"  # no space to cut at: cut where it must
    body = 'HTTP 500: {"detail":"' + "x" * 250 + '"}'  # one space, early: it kept only "HTTP 500: …"
    assert clipped(body, 200) == body[:198] + " …"
