"""`over_max_length` compares a sample with the context length the server reported (`max_model_len`,
recorded in the capture's settings), the tokenizer's `model_max_length` only when the server reported
none, and its detail says which limit it used. A trainer's shorter limit is the export's business
(its max_length counts), not a finding.

Found by a curator: a 6,028-id sample from a server whose max_model_len is 32,768 was flagged "over the
4096-id limit", the built-in Kimi-layout tokenizer's model_max_length."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tokview.core.analysis import analyze
from tokview.core.record import Capture
from tokview.sim import SimConfig, start_simulator
from tokview.store import Store

ROOT = Path(__file__).resolve().parents[1]
TOKVIEW = [sys.executable, "-c", "import sys; from tokview.cli import main; sys.exit(main())"]


def _long_capture(tok, profile, total: int, **settings) -> Capture:
    """A Kimi-layout sample of exactly `total` ids: a long user turn, reasoning, the closer, an answer, the stop."""
    answer = tok.encode("Okay") + [profile.think_close_id] + tok.encode("The answer.") + [profile.stop_ids[0]]
    words = " ".join(f"w{i}" for i in range(total))
    prompt = tok.render([{"role": "user", "content": words}], template_kwargs=profile.template_kwargs(True))
    prompt = prompt[: total - len(answer) - 8] + prompt[-8:]  # cut in the middle of the user's words
    capture = Capture(
        prompt_ids=prompt, output_ids=answer, finish_reason="stop", settings={"thinking": True, **settings}
    )
    assert len(capture.input_ids) == total
    return capture


def _over(capture, tok, profile):
    return [f for f in analyze(capture, profile, tok).findings if f.code == "over_max_length"]


def test_a_sample_under_the_servers_context_is_not_over_the_tokenizers_4096(kimi_tok, kimi_profile):
    assert kimi_tok.model_max_length == 4096
    assert _over(_long_capture(kimi_tok, kimi_profile, 6028, max_model_len=32768), kimi_tok, kimi_profile) == []


def test_over_the_servers_context_says_the_server_reported_it(kimi_tok, kimi_profile):
    (found,) = _over(_long_capture(kimi_tok, kimi_profile, 6028, max_model_len=6000), kimi_tok, kimi_profile)
    assert found.positions == (6000,)
    assert "6028 ids" in found.detail
    assert "over the 6000-id limit (the server's max_model_len)" in found.detail


def test_without_a_server_limit_the_tokenizers_is_used_and_named(kimi_tok, kimi_profile):
    (found,) = _over(_long_capture(kimi_tok, kimi_profile, 6028), kimi_tok, kimi_profile)
    assert found.positions == (4096,)
    assert "over the 4096-id limit (the tokenizer's model_max_length; the server reported no" in found.detail
    assert _over(_long_capture(kimi_tok, kimi_profile, 4000), kimi_tok, kimi_profile) == []


def test_a_batch_sample_longer_than_4096_from_a_32768_server_is_not_over_max_length(tmp_path):
    """Driven as the curator saw it: `tokview batch` against a server reporting max_model_len 32,768."""
    prompts = tmp_path / "long.jsonl"
    words = " ".join(f"w{i}" for i in range(1100))  # ~6,000 ids with the Kimi-layout tokenizer
    prompts.write_text(json.dumps({"id": "long", "prompt": words}) + "\n")
    db = tmp_path / "s.duckdb"
    with start_simulator(SimConfig(kind="vllm", max_model_len=32768)) as sim:
        done = subprocess.run(
            [*TOKVIEW, "batch", str(prompts), "--server", sim.url, "--db", str(db), "--workers", "1"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 0, done.stderr
    with Store(db) as store:
        ((n,),) = store.query("SELECT len(prompt_ids) + len(output_ids) FROM samples")
        codes = [c for (c,) in store.query("SELECT code FROM findings")]
    assert n > 4096
    assert "over_max_length" not in codes
