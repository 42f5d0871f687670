"""A reasoning model run with thinking off (`tokview batch --no-thinking`) over real sockets against the
simulator: it keeps its own profile, the kwarg reaches the template, and the output is checked to hold
no reasoning (`reasoning_with_thinking_off` stays silent on a server that obeys)."""

from __future__ import annotations

from pathlib import Path

import pytest
from builders import kimi, profile

from tokview.batch import BatchConfig, run_batch
from tokview.core import segments as seg
from tokview.core.analysis import analyze
from tokview.sim import SimConfig, start_simulator
from tokview.store import Store

SAMPLES = Path(__file__).resolve().parents[1] / "sample_data"


@pytest.mark.parametrize("mode", ["raw", "chat"])
async def test_no_thinking_keeps_the_profile_and_the_output_holds_no_reasoning(tmp_path, mode):
    with start_simulator(SimConfig(kind="vllm")) as sim, Store(tmp_path / "off.duckdb") as store:
        config = BatchConfig(
            servers=[sim.url],
            prompts_path=SAMPLES / "openai_messages.jsonl",
            tokenizer=kimi(),
            profile=None,
            mode=mode,
            thinking=False,
            limit=3,
            max_new_tokens=200,
            timeout=10.0,
        )
        summary = await run_batch(config, store)
        assert summary.balanced
        assert summary.failed == 0
        assert summary.ok == 3
        rows = store.samples_page(limit=10)
        for row in rows:
            sample = store.load_sample(row.sample_id)
            cap = sample.capture
            assert sample.profile == "kimi-k2.5"
            assert cap.thinking is False
            assert cap.settings["chat_template_kwargs"] == {"thinking": False}
            assert cap.prompt_ids[-2:] == [profile().think_open_id, profile().think_close_id]  # closed in the prompt
            kinds = set(analyze(cap, profile(), kimi()).kinds[len(cap.prompt_ids) :])
            assert kinds <= {seg.ANSWER, seg.STOP}
            assert sample.valid
            assert "reasoning_with_thinking_off" not in row.codes
        # the same ids, said to come from a thinking-off run although they reason, are an error
        reasoning = [profile().think_open_id] + kimi().encode("Hmm.") + [profile().think_close_id]
        cap.output_ids = reasoning + cap.output_ids
        assert "reasoning_with_thinking_off" in analyze(cap, profile(), kimi()).codes
