"""Live tier: `run_batch` against a real vLLM (started by .ci/live.sh, URL in TOKVIEW_LIVE_VLLM_URL).

Exported speculators `input_ids` must equal the ids the real server reported it saw and produced.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from builders import kimi, profile

from tokview.batch import BatchConfig, run_batch
from tokview.export import export
from tokview.store import Store

pytestmark = pytest.mark.live
SAMPLES = Path(__file__).resolve().parents[2] / "sample_data"


@pytest.mark.parametrize("mode", ["raw", "chat"])
async def test_live_batch_exports_served_ids(vllm_surface_url, tmp_path, mode):
    config = BatchConfig(
        servers=[vllm_surface_url],
        prompts_path=SAMPLES / "multiturn.jsonl",
        tokenizer=kimi(),
        model_profile=profile(),
        mode=mode,
        limit=2,
        max_new_tokens=32,
        temperature=0.0,
        concurrency=2,
        timeout=120,
    )
    with Store(tmp_path / "live.duckdb") as store:
        summary = await run_batch(config, store)
        assert summary.balanced
        assert summary.failed == 0
        assert summary.ok == summary.input > 1
        out = tmp_path / "live.jsonl"
        export(store, "speculators", out, select="all", tokenizer=kimi(), profile=profile())
        for line in out.read_text().splitlines():
            row = json.loads(line)
            body = store.load_sample(row["metadata"]["tokview_sample_id"]).capture.raw_response
            choice = body["choices"][0]
            served_prompt = choice.get("prompt_token_ids") or body.get("prompt_token_ids")
            assert row["input_ids"] == served_prompt + choice["token_ids"]
