"""Spec-decode metrics: every server schema folds into one shape; steps are placed only when proven."""

from __future__ import annotations

import json

import pytest
from facts import KIMI_CHAIN_OUTPUT, KIMI_PROMPT_6X7, RECORDINGS

from tokview.core import spec_decode as sd
from tokview.core.profiles import get_profile


def test_vllm_detailed_recording_normalises_with_per_step_lists():
    body = json.loads((RECORDINGS / "vllm_chat_specdec_logprobs.json").read_text())
    spec = sd.from_vllm(body)
    assert spec is not None
    assert spec.schema == "vllm"
    assert (spec.steps, spec.drafted, spec.accepted) == (3, 9, 3)
    assert spec.histogram == [2, 0, 0, 1]
    assert sum(spec.histogram) == spec.steps
    assert spec.per_step_accepted == [0, 0, 3]
    assert spec.per_step_drafted == [3, 3, 3]
    assert spec.mean_acceptance_length == pytest.approx(
        body["metrics"]["speculative_decoding"]["mean_acceptance_length"]
    )
    assert spec.acceptance_rate == pytest.approx(1 / 3)
    assert sd.SpecDecode.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


def test_ngram_recording_cannot_be_placed_so_segments_are_unavailable():
    """ngram drafts only where text repeats: 3 steps for 18 tokens, 1 + Σ(a+1) = 7 ≠ 18."""
    body = json.loads((RECORDINGS / "vllm_chat_specdec_logprobs.json").read_text())
    spec = sd.from_vllm(body)
    assert sd.place_steps(spec, 18, "stop") is None
    out = sd.summary(spec.to_dict(), KIMI_PROMPT_6X7, KIMI_CHAIN_OUTPUT, "stop", get_profile("kimi-k2.5"))
    assert out["segments"] is None
    assert out["runs"] is None
    assert out["placed"] is False
    assert "1 + Σ(accepted+1) = 7, 18 output tokens" in out["segments_unavailable"]
    assert out["mean_acceptance_length"] == 2.0


def test_summary_mode_has_totals_only():
    body = json.loads((RECORDINGS / "vllm_completions_specdec_prompt_logprobs.json").read_text())
    spec = sd.from_vllm(body)
    assert spec.steps == 0
    assert spec.per_step_accepted is None
    assert spec.mean_acceptance_length == 1.0
    assert sd.place_steps(spec, 18, "stop") is None
    assert "no step drafted" in sd.summary(spec.to_dict(), [1], [2, 3], "stop", None)["segments_unavailable"]
    with_steps = sd.SpecDecode("vllm", 4, 12, 5)
    assert "totals only" in sd.summary(with_steps.to_dict(), [1], [2, 3], "stop", None)["segments_unavailable"]


def test_no_metrics_means_none():
    assert sd.from_vllm({"metrics": None}) is None
    assert sd.from_vllm({}) is None
    assert sd.from_sglang({"completion_tokens": 3}) is None
    assert sd.summary(None, [1], [2], "stop", None) is None


@pytest.mark.parametrize(
    "schema,meta",
    [
        (
            "sglang-0.5.10",
            {"spec_accept_token_num": 6, "spec_draft_token_num": 12, "spec_accept_histogram": [1, 1, 0, 2]},
        ),
        (
            "sglang-0.5.11",
            {"spec_accepted_drafts": 6, "spec_proposed_drafts": 12, "spec_accept_histogram": [1, 1, 0, 2]},
        ),
        (
            "sglang-0.5.12",
            {
                "spec_num_correct_drafts": 6,
                "spec_num_proposed_drafts": 12,
                "spec_correct_drafts_histogram": [1, 1, 0, 2],
                "spec_accepted_drafts": 6,
                "spec_proposed_drafts": 12,
                "spec_accept_histogram": [1, 1, 0, 2],
            },
        ),
    ],
)
def test_all_three_sglang_schemas_give_the_same_numbers(schema, meta):
    base = {"spec_verify_ct": 4, "spec_accept_rate": 0.5, "spec_accept_length": 2.5, "completion_tokens": 10}
    spec = sd.from_sglang({**base, **meta})
    assert spec.schema == schema
    assert (spec.steps, spec.accepted, spec.drafted) == (4, 6, 12)
    assert spec.mean_acceptance_length == 2.5
    assert spec.acceptance_rate == 0.5
    assert spec.histogram == [1, 1, 0, 2]
    assert spec.reported["spec_accept_length"] == 2.5
    assert sd.place_steps(spec, 10, "stop") is None  # SGLang gives no per-step lists


def test_sglang_0_5_10_without_a_histogram_says_none():
    """0.5.10.post1 omits spec_accept_histogram when the scheduler sent an empty one."""
    spec = sd.from_sglang({"spec_verify_ct": 4, "spec_accept_token_num": 6, "spec_draft_token_num": 12})
    assert spec.schema == "sglang-0.5.10"
    assert spec.histogram is None
    assert spec.accepted == 6


def test_old_sglang_with_only_verify_count_keeps_what_it_said():
    spec = sd.from_sglang({"spec_verify_ct": 5, "spec_accept_length": 2.0})
    assert spec.schema == "sglang"
    assert spec.accepted is None
    assert spec.mean_acceptance_length == 2.0


def test_malformed_values_are_dropped_not_guessed():
    spec = sd.from_vllm(
        {
            "metrics": {
                "speculative_decoding": {"num_spec_steps": "3", "per_step_accepted": [1, None], "num_draft_tokens": -2}
            }
        }
    )
    assert spec.steps is None
    assert spec.per_step_accepted is None
    assert spec.drafted is None


def _spec(accepted, drafted=None, steps=None):
    drafted = drafted if drafted is not None else [3] * len(accepted)
    return sd.SpecDecode(
        "vllm",
        steps if steps is not None else len(accepted),
        sum(drafted),
        sum(accepted),
        per_step_accepted=accepted,
        per_step_drafted=drafted,
    )


def test_steps_that_cover_the_output_are_placed_with_runs():
    spec = _spec([2, 0, 3])  # 1 + 3 + 1 + 4 = 9
    placed = sd.place_steps(spec, 9, "length")
    assert placed.step_of == [sd.PREFILL, 0, 0, 0, 1, 2, 2, 2, 2]
    assert placed.run == [0, 2, 2, 2, 0, 3, 3, 3, 3]
    assert placed.accepted == [False, True, True, False, False, True, True, True, False]


def test_last_step_clamped_only_at_a_stop_or_length():
    spec = _spec([2, 3])  # covers 1 + 3 + 4 = 8; output of 6 ends inside the last step
    assert sd.place_steps(spec, 6, "stop").step_of == [sd.PREFILL, 0, 0, 0, 1, 1]
    assert sd.place_steps(spec, 6, "abort") is None
    assert sd.place_steps(spec, 4, "stop") is None  # the last step would add nothing: not a clamp
    assert sd.place_steps(spec, 9, "stop") is None  # too few steps: some step did not draft


def test_a_step_without_a_draft_or_a_count_mismatch_is_not_placed():
    assert sd.place_steps(_spec([1, 0], drafted=[3, 0]), 4, "stop") is None
    assert sd.place_steps(_spec([1, 0], steps=3), 4, "stop") is None
    assert sd.place_steps(_spec([4], drafted=[3]), 6, "stop") is None


def test_acceptance_per_segment_counts_each_step_where_it_starts():
    profile = get_profile("kimi-k2.5")
    out = KIMI_CHAIN_OUTPUT  # 9 reasoning, closer at 9, 7 answer, stop at 17 (18 ids)
    spec = _spec([3, 3, 1, 0, 3, 2])  # 1 + 4+4+2+1+4+3 = 19 > 18: last step clamped at the stop
    result = sd.summary(spec.to_dict(), KIMI_PROMPT_6X7, out, "stop", profile)
    segs = result["segments"]
    # steps start at positions 1, 5, 9 (closer → reasoning), 11, 12, 16
    assert segs["reasoning"] == {
        "tokens": 10,
        "steps": 3,
        "accepted": 7,
        "drafted": 9,
        "mean_acceptance_length": pytest.approx(1 + 7 / 3),
        "acceptance_rate": pytest.approx(7 / 9),
    }
    assert segs["answer"]["steps"] == 3
    assert segs["answer"]["accepted"] == 5
    assert segs["answer"]["tokens"] == 8
    assert result["runs"][:6] == [0, 3, 3, 3, 3, 3]
    assert len(result["runs"]) == 18
