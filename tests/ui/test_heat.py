"""The heat view's levels and detail rows, from captures (pure functions, no app)."""

from __future__ import annotations

import math
from typing import Any

from tokview.core import spec_decode as sd
from tokview.core.record import Capture
from tokview.ui.heat import HEAT_MODES, heat_detail, heat_levels, prob_level, unavailable


def _capture(**kw) -> Capture:
    base: dict[str, Any] = dict(prompt_ids=[1, 2, 3], output_ids=[10, 11, 12, 13, 14, 15], finish_reason="stop")
    base.update(kw)
    return Capture(**base)


def _spec(accepted, steps=None):
    return sd.SpecDecode(
        "vllm",
        len(accepted) if steps is None else steps,
        3 * len(accepted),
        sum(accepted),
        per_step_accepted=accepted,
        per_step_drafted=[3] * len(accepted),
        num_spec_tokens=3,
    ).to_dict()


def test_prob_levels():
    assert [prob_level(math.log(p)) for p in (0.95, 0.6, 0.2, 0.05, 0.001)] == [0, 1, 2, 3, 4]
    assert prob_level(None) is None
    assert prob_level(800.0) == 0  # a logit a server sent as a logprob: math.exp raised OverflowError, the app ended
    big = _capture(target_logprobs=[800.0] * 6)
    assert dict(heat_detail(big, 5))["target logprob"] == "800.0000 (p 1.000)"


def test_acceptance_levels_follow_runs_and_prompt_is_uncoloured():
    cap = _capture(spec_decode=_spec([3, 0]))  # 1 + 4 + 1 = 6
    levels = heat_levels(cap, "acceptance")
    assert levels[:3] == [None, None, None]
    assert levels[3:] == [None, 0, 0, 0, 0, 4]  # prefill (no step), a full run of 3, then a rejected step
    rows = dict(heat_detail(cap, 4))
    assert rows["acceptance run"] == "step 0: 3 of 3 drafts accepted; this is the accepted draft"
    assert "target token" in dict(heat_detail(cap, 7))["acceptance run"]
    assert heat_detail(cap, 0) == []


def test_unplaceable_steps_say_unavailable_never_guess():
    cap = _capture(spec_decode=_spec([0, 0, 3]))  # 1+1+1+4 = 7 > 6: the last step clamped at the stop
    assert heat_levels(cap, "acceptance") is not None
    ngram = _capture(spec_decode=_spec([1]))  # covers 3 of 6
    assert heat_levels(ngram, "acceptance") is None
    assert "not every decode step drafted" in unavailable(ngram, "acceptance")
    assert dict(heat_detail(ngram, 3))["acceptance run"] == "unavailable (steps not placed)"
    assert unavailable(_capture(), "acceptance") == "no spec-decode metrics captured"


def test_logprob_modes_and_details():
    cap = _capture(
        output_logprobs=[-0.01, -3.0, -0.2, -0.05, -6.0, 0.0],
        output_top_ids=[[10, 99]] * 6,
        output_top_logprobs=[[-0.01, -5.0]] * 6,
    )
    assert heat_levels(cap, "sampled")[3:] == [0, 3, 1, 0, 4, 0]
    assert heat_levels(cap, "target") is None
    assert "tokview score" in unavailable(cap, "target")
    rows = dict(heat_detail(cap, 3, piece=lambda t: f"t{t}"))
    assert "sampled logprob" not in rows
    assert rows["sampled top-K"] == "10 't10' -0.010, 99 't99' -5.000"
    scored = _capture(target_logprobs=[-4.0] * 6)
    assert heat_levels(scored, "target")[3:] == [3] * 6
    assert "target logprob" in dict(heat_detail(scored, 5))
    assert heat_levels(cap, "segments") is None
    assert unavailable(cap, "segments") is None
    assert HEAT_MODES[0] == "segments"


def test_stats_bars():
    from tokview.ui.heat import acceptance_bars, nll_bars

    assert acceptance_bars(None)[1] == {}
    assert "not scored" in nll_bars({"target_logprobs": None})[0]
    side = {
        "spec_decode": {
            "mean_acceptance_length": 2.0,
            "samples": 3,
            "placed_samples": 2,
            "segments": {"reasoning": {"mean_acceptance_length": 2.5}, "answer": {"mean_acceptance_length": None}},
        },
        "target_logprobs": {
            "samples": 3,
            "off_policy": 1,
            "nll_histogram": {"upper_edges": [0.5, 2.0], "counts": [1, 1, 1]},
        },
    }
    title, bars = acceptance_bars(side)
    assert bars == {"all": 2.0, "reasoning": 2.5}
    assert "2 of 3 samples placed" in title
    side["spec_decode"]["segments"] = None
    assert "unavailable" in acceptance_bars(side)[0]
    assert nll_bars(side)[1] == {"≤0.5": 1, "≤2": 1, ">2": 1}
