"""`tokview batch` through a misbehaving gateway (tests/hostile_proxy.py) in front of the simulator.

Whatever the gateway does to the generation requests, the run must end on its own (no hang), print no
traceback, and balance: every planned prompt is stored or recorded as a failure, once, and the exit code
is the one README "Exit codes" documents for the outcome (0 all ok, 3 finished with failures, 1 stopped
early). A fault served to every request shows what a run of failures does; a fault served to the first
two requests only shows the retries recover.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from flag_defaults import unless_given
from hostile_proxy import FAULTS, hostile_proxy, proxy_url

from tokview.sim import SimConfig, start_simulator
from tokview.store import Store

ROOT = Path(__file__).resolve().parents[1]
TOKVIEW = [sys.executable, "-c", "import sys; from tokview.cli import main; sys.exit(main())"]
PROMPTS = 4
RUN_LIMIT_S = 60
"""No case may take longer: a hang is a failure, not a stuck suite."""


@pytest.fixture(scope="module")
def sim():
    with start_simulator(SimConfig(kind="vllm")) as running:
        yield running


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    rows = [{"id": f"p{i}", "messages": [{"role": "user", "content": f"Question {i}?"}]} for i in range(PROMPTS)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run_batch(url: str, prompts: Path, db: Path, *extra: str, retries: int = 1, timeout: float = RUN_LIMIT_S):
    """One `tokview batch` through the proxy, small and quick: 1 worker, short answers, `retries` retries."""
    argv = [*TOKVIEW, "batch", str(prompts), "--server", url, "--db", str(db), "--workers", "1", "--timeout", "2"]
    argv += [*unless_given(["--concurrency", "2", "--max-new-tokens", "12"], extra), "--retries", str(retries)]
    argv += ["--summary-json"]
    env = {**os.environ, "TOKVIEW_DEBUG": ""}
    return subprocess.run([*argv, *extra], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


def documented_exit(summary: dict) -> int:
    """README "Exit codes": 1 stopped early, 3 finished with failures, 0 done."""
    if summary["stopped"]:
        return 1
    return 3 if summary["failed"] else 0


def assert_balanced(done: subprocess.CompletedProcess, db: Path) -> dict:
    """Every prompt ends stored or as one recorded failure; the exit code says which outcome it was."""
    assert "Traceback" not in done.stderr, done.stderr
    assert "internal error" not in done.stderr, done.stderr
    assert "\x1b" not in done.stderr, "a terminal escape from the server reached the terminal"
    summary = json.loads(done.stdout)
    assert summary["input"] == PROMPTS, summary
    assert summary["skipped"] == 0, summary
    assert summary["abandoned"] == 0, summary
    assert summary["ok"] + summary["failed"] == PROMPTS, summary
    assert summary["balanced"], summary
    assert done.returncode == summary["exit_code"] == documented_exit(summary), (done.returncode, summary)
    with Store(db) as store:
        stored = [r[0] for r in store.query("SELECT prompt_id FROM samples")]
        failed = [r[0] for r in store.query("SELECT prompt_id FROM failures")]
    assert len(stored) == len(set(stored)) == summary["ok"], (stored, summary)
    assert len(failed) == len(set(failed)) == summary["failed"], (failed, summary)
    assert sorted(stored + failed) == [f"p{i}" for i in range(PROMPTS)]
    reasons = json.dumps([summary["failures_by_reason"], summary["failure_examples"]])
    assert "unexpected error" not in reasons, reasons  # a server's bad answer is a failure with its reason, not a bug
    return summary


NEVER_A_SAMPLE = {
    "malformed-json",
    "empty-200",
    "json-null",
    "json-array",
    "cut-body",
    "cut-head",
    "not-http",
    "html-200",
    "html-502",
    "http-400",
    "http-401",
    "http-404",
    "http-413",
    "http-500",
    "http-503",
    "http-429",
    "redirect-loop",
    "surrogate-error-body",
    "control-chars-error-body",
    "output-id-negative",
    "output-id-string",
    "output-id-huge",
    "output-text-surrogate",
    "drip",
    "br-always",
}
"""Faults after which no sample can exist: served to every request, every prompt must fail."""
RETRYABLE = [
    "malformed-json",
    "cut-body",
    "cut-head",
    "html-502",
    "http-500",
    "http-503",
    "http-429",
    "surrogate-error-body",
    "drip",
]
"""Faults a retry gets past: served to the first two requests only, every prompt must end ok."""
AT_START_UP = ["malformed-json", "cut-body", "not-http", "html-200", "http-500", "surrogate-error-body"]
"""Faults also served to tokview's one-token start-up probes: the run must still plan and balance."""


def _case(fault: str, times: int | None, probes: bool = False):
    name = f"{fault}-{'always' if times is None else f'first{times}'}{'-probes-too' if probes else ''}"
    return pytest.param(fault, times, probes, id=name)


CASES = (
    [_case(f, None) for f in FAULTS]
    + [_case(f, 2) for f in RETRYABLE]
    + [_case(f, None, probes=True) for f in AT_START_UP]
)


@pytest.mark.parametrize("fault, times, probes", CASES)
def test_a_batch_through_a_hostile_gateway_balances_and_ends(sim, prompts, tmp_path, fault, times, probes):
    db = tmp_path / "s.duckdb"
    with hostile_proxy(sim.url, fault, times, probes=probes) as proxy:
        # a fault served for good needs no retry to show it (and each costs a backoff); a passing one does
        done = run_batch(proxy_url(proxy), prompts, db, retries=0 if times is None else 1)
    summary = assert_balanced(done, db)
    if times is None and fault in NEVER_A_SAMPLE:
        assert summary["failed"] == PROMPTS, summary
    if fault == "br-always":  # said by its name, not as the compressed bytes read as text
        assert any("compressed as 'br'" in reason for reason in summary["failures_by_reason"]), summary
    if times is not None or fault in ("pass", "echo-headers", "gzip-always", "deflate-always"):
        assert summary["ok"] == PROMPTS, summary
        assert done.returncode == 0, summary


def test_a_gateway_echoing_a_basic_credential_stores_no_secret(sim, prompts, tmp_path):
    """A gateway that reflects the request's headers into a 200 body hands back the credential tokview
    sent: the user:password of the server URL (as `authorization: Basic …`) and the API key."""
    db = tmp_path / "s.duckdb"
    password, key = "hunter2-basic-pw", "sk-live-proxy-key-123456"
    basic = base64.b64encode(f"alice:{password}".encode()).decode()
    with hostile_proxy(sim.url, "echo-headers") as proxy:
        env = {**os.environ, "TOKVIEW_API_KEY": key}
        argv = [*TOKVIEW, "batch", str(prompts), "--server", proxy_url(proxy, f"alice:{password}"), "--db", str(db)]
        argv += ["--workers", "1", "--max-new-tokens", "12", "--retries", "1", "--summary-json"]
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=RUN_LIMIT_S, env=env)
        seen = proxy.seen_headers
    assert any("authorization" in h for h in seen), "tokview sent no credential: the case proves nothing"
    assert_balanced(done, db)
    with Store(db) as store:
        stored = str(store.query("SELECT raw_request, raw_response, server_url FROM samples"))
        shown = subprocess.run(
            [*TOKVIEW, "show", store.query("SELECT sample_id FROM samples LIMIT 1")[0][0], "--db", str(db), "--json"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=RUN_LIMIT_S,
        )
    assert shown.returncode == 0, shown.stderr
    for secret in (password, basic, key):
        assert secret not in stored
        assert secret not in shown.stdout
        assert secret not in done.stderr + done.stdout


def test_hostile_text_in_error_bodies_reaches_no_terminal_and_every_reader_works(sim, prompts, tmp_path):
    """Error bodies with a lone surrogate (as a JSON escape), NUL, BEL and terminal escapes: the failures
    are recorded, and the batch summary, `stats` and `stats --json` print none of the raw control bytes."""
    for fault in ("surrogate-error-body", "control-chars-error-body"):
        db = tmp_path / f"{fault}.duckdb"
        with hostile_proxy(sim.url, fault) as proxy:
            done = run_batch(proxy_url(proxy), prompts, db)
        assert_balanced(done, db)
        assert not any(c in done.stderr + done.stdout for c in ("\x1b", "\x07", "\x00")), done.stderr
        for extra in ([], ["--json"]):
            stats = subprocess.run(
                [*TOKVIEW, "stats", "--db", str(db), *extra],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=RUN_LIMIT_S,
            )
            assert stats.returncode == 0, stats.stderr
            assert "Traceback" not in stats.stderr, stats.stderr
            assert not any(c in stats.stdout + stats.stderr for c in ("\x1b", "\x07", "\x00")), stats.stdout


def test_an_output_id_outside_the_vocabulary_is_flagged_and_never_exported(sim, prompts, tmp_path):
    """A gateway (or a broken server) changed the first output id of two answers to 999999 (the vocabulary
    has 163,840): those samples carry an error finding and the default export holds only the other two."""
    db = tmp_path / "s.duckdb"
    with hostile_proxy(sim.url, "output-id-out-of-vocab", times=2) as proxy:
        done = run_batch(proxy_url(proxy), prompts, db, "--max-new-tokens", "400")
    assert_balanced(done, db)
    with Store(db) as store:
        rows = store.query("SELECT list_max(output_ids) >= 163840, valid FROM samples")
    assert sorted(rows) == [(False, True), (False, True), (True, False), (True, False)]
    out = tmp_path / "out.jsonl"
    exported = subprocess.run(
        [*TOKVIEW, "export", "--db", str(db), "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=RUN_LIMIT_S,
    )
    assert exported.returncode == 0, exported.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 2
    assert all(max(r["input_ids"]) < 163840 for r in lines)


@pytest.mark.parametrize("fault", ["redirect-307", "redirect-loop"])
def test_a_redirect_is_followed_or_reported_as_a_redirect(sim, prompts, tmp_path, fault):
    db = tmp_path / "s.duckdb"
    with hostile_proxy(sim.url, fault) as proxy:
        done = run_batch(proxy_url(proxy), prompts, db, retries=0)
    summary = assert_balanced(done, db)  # followed (the body re-sent) or failed naming the redirect: either is fine
    for reason in summary["failure_examples"].values():
        assert "307" in reason or "redirect" in reason.lower(), reason
        assert "not JSON" not in reason, reason


@pytest.mark.parametrize("mode", ["raw", "dual"])
def test_a_gateway_that_changes_the_prompt_is_a_failure_not_a_sample_of_the_sent_ids(sim, prompts, tmp_path, mode):
    """The raw path sends its own prompt ids and stored them as the prompt whatever the server echoed: a gateway that
    changed one (here: dropped the first) made every output a continuation of another prompt, stored with no
    finding, exit 0."""
    db = tmp_path / "s.duckdb"
    with hostile_proxy(sim.url, "prompt-ids-shifted", None) as proxy:
        done = run_batch(proxy_url(proxy), prompts, db, "--mode", mode, retries=0)
    summary = assert_balanced(done, db)
    assert summary["failed"] == PROMPTS, summary
    assert any("echoed other prompt ids than were sent" in r for r in summary["failures_by_reason"]), summary
