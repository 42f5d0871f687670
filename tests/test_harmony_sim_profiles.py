"""The simulator's think-tag model served as another family's profile (issue 28 item 5): Kimi-K2.6 is K2.5's layout
with `preserve_thinking`, so the Kimi-layout tokenizer serves it; a profile whose ids are not the tokenizer's is
refused in one line."""

from __future__ import annotations

import httpx
import pytest

from tokview.sim import SimConfig, start_simulator
from tokview.sim.config import SimConfigError


def test_the_think_tag_model_serves_kimi_k2_6():
    with start_simulator(SimConfig(kind="vllm", profile="kimi-k2.6")) as sim:
        assert sim.profile.name == "kimi-k2.6"
        assert sim.profile.history_kwarg == "preserve_thinking"
        body = {"messages": [{"role": "user", "content": "hi"}], "return_token_ids": True}
        choice = httpx.post(sim.url + "/v1/chat/completions", json=body, timeout=30).json()["choices"][0]
    assert choice["message"]["reasoning"]
    assert choice["message"]["content"]
    assert choice["token_ids"][-1] == sim.profile.stop_ids[0]


def test_a_profile_of_another_vocabulary_is_refused_in_one_line():
    with pytest.raises(SimConfigError) as err:
        with start_simulator(SimConfig(kind="vllm", profile="glm-4.7")):
            pass
    assert "\n" not in str(err.value)
    assert "glm-4.7" in str(err.value)
    assert "151350" in str(err.value)


def test_a_profile_without_think_ids_is_checked_by_its_stop_ids():
    """gpt-oss names no think ids, so nothing was compared: on the Kimi layout the simulator served Harmony markers
    spelled as text, with `content` and `reasoning` null."""
    with pytest.raises(SimConfigError) as err:
        with start_simulator(SimConfig(kind="vllm", profile="gpt-oss")):
            pass
    assert (
        "\n" not in str(err.value)
        and "gpt-oss" in str(err.value)
        and "is not an id of this tokenizer" in str(err.value)
    )
