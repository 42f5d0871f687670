"""Logprobs with ids, from every shape the recordings show, and the off-policy numbers."""

from __future__ import annotations

import json
import math

import pytest
from facts import IM_ASSISTANT, IM_END, IM_MIDDLE, IM_USER, KIMI_CHAIN_OUTPUT, RECORDINGS, THINK_OPEN

from tokview.core import logprobs as lp

SCORE_PROMPT = [IM_USER, 375, IM_MIDDLE, 79, IM_END, IM_ASSISTANT, THINK_OPEN]


def rec(name):
    return json.loads((RECORDINGS / name).read_text())


def test_sglang_output_triples_with_top_k():
    meta = rec("sgl_generate_logprobs.json")["meta_info"]
    got = lp.from_sglang_output(meta, KIMI_CHAIN_OUTPUT)
    assert len(got.logprobs) == 18
    assert got.logprobs[0] == 0.0
    assert got.top_ids[0] == [256, 264]
    assert got.top_logprobs[0] == [0.0, -30.5]
    assert all(len(t) == 2 for t in got.top_ids)


def test_sglang_output_ids_must_match():
    meta = rec("sgl_generate_logprobs.json")["meta_info"]
    with pytest.raises(lp.LogprobShapeError, match="other ids"):
        lp.from_sglang_output(meta, KIMI_CHAIN_OUTPUT[:-1] + [5])
    assert lp.from_sglang_output({"completion_tokens": 3}, [1, 2, 3]) is None


def test_sglang_and_vllm_scoring_agree_on_the_same_stored_sample():
    ids = SCORE_PROMPT + KIMI_CHAIN_OUTPUT
    sgl = lp.from_sglang_input(rec("sgl_generate_score_stored_sample.json")["meta_info"], ids, len(SCORE_PROMPT))
    choice = rec("vllm_completions_score_stored_sample.json")["choices"][0]
    vll = lp.from_vllm_prompt(choice["prompt_logprobs"], ids, len(SCORE_PROMPT), 2)
    assert len(sgl.logprobs) == len(vll.logprobs) == 18
    assert sgl.logprobs == pytest.approx(vll.logprobs, abs=1e-3)
    assert len(vll.top_ids[0]) == 2
    assert vll.top_logprobs[0][0] >= vll.top_logprobs[0][1]
    # the whole prompt side: the first position has no logprob on either server
    whole = lp.from_vllm_prompt(choice["prompt_logprobs"], ids, 0, 0)
    assert whole.logprobs[0] is None
    assert whole.logprobs[1] == pytest.approx(-11.918, abs=1e-3)
    assert whole.top_ids is None


def test_scoring_refuses_a_response_for_other_ids():
    ids = SCORE_PROMPT + KIMI_CHAIN_OUTPUT
    meta = rec("sgl_generate_score_stored_sample.json")["meta_info"]
    with pytest.raises(lp.LogprobShapeError):
        lp.from_sglang_input(meta, ids[:-1], 7)
    with pytest.raises(lp.LogprobShapeError, match="other ids"):
        lp.from_sglang_input(meta, ids[:-1] + [1], 7)
    prompt_lps = rec("vllm_completions_score_stored_sample.json")["choices"][0]["prompt_logprobs"]
    with pytest.raises(lp.LogprobShapeError, match="does not name"):
        lp.from_vllm_prompt(prompt_lps, ids[:-1] + [1], 7, 2)


def test_vllm_chat_logprobs_need_token_ids_not_strings():
    body = rec("vllm_chat_specdec_logprobs.json")
    choice = body["choices"][0]
    with pytest.raises(lp.LogprobShapeError, match="return_tokens_as_token_ids"):
        lp.from_vllm_chat(choice["logprobs"], choice["token_ids"])
    as_ids = {
        "content": [
            {
                "token": f"token_id:{t}",
                "logprob": e["logprob"],
                "top_logprobs": [
                    {"token": f"token_id:{t}", "logprob": e["logprob"]},
                    {"token": "token_id:264", "logprob": -30.0},
                ],
            }
            for t, e in zip(choice["token_ids"], choice["logprobs"]["content"])
        ]
    }
    got = lp.from_vllm_chat(as_ids, choice["token_ids"])
    assert got.logprobs == [0.0] * 18
    assert got.top_ids[3] == [choice["token_ids"][3], 264]
    with pytest.raises(lp.LogprobShapeError):
        lp.from_vllm_chat(as_ids, choice["token_ids"][:-1])


def test_vllm_completion_logprobs_sorted_by_value():
    got = lp.from_vllm_completion(
        {"token_logprobs": [-0.1, None], "top_logprobs": [{"token_id:5": -2.0, "token_id:7": -0.1}, None]}, [7, 9]
    )
    assert got.logprobs == [-0.1, None]
    assert got.top_ids == [[7, 5], []]
    assert got.top_logprobs == [[-0.1, -2.0], []]


def test_infinite_logprobs_are_floored_for_json():
    got = lp.from_sglang_output({"output_token_logprobs": [[-math.inf, 3, None]]}, [3])
    assert got.logprobs == [lp.FLOOR]
    assert json.dumps(got.logprobs)


def test_mean_nll_low_share_and_off_policy():
    assert lp.mean_nll([-1.0, -3.0, None]) == 2.0
    assert lp.mean_nll([None]) is None
    assert lp.low_share([-0.1, -5.0, -4.0], 0.01) == pytest.approx(1 / 3)  # log(0.01) = -4.605
    on = lp.score_summary([-0.2, -0.5, -1.0])
    off = lp.score_summary([-3.0, -6.0, -0.5])
    assert not on["off_policy"]
    assert off["off_policy"]
    assert off["mean_nll"] == pytest.approx(3.1667, abs=1e-3)
    assert lp.score_summary([-3.0], off_policy_nll=5.0)["off_policy"] is False
    assert on["off_policy_nll"] == lp.DEFAULT_OFF_POLICY_NLL
    assert on["tokens"] == 3


def test_a_sure_alternative_keeps_its_zero_logprob():
    """vLLM names the sampled token with logprob 0.0 when the model is certain (every output position of
    the real spec-decode recordings): `x or FLOOR` stored it as -9999, "impossible"."""
    chat = {
        "content": [
            {
                "token": "token_id:5",
                "logprob": 0.0,
                "top_logprobs": [
                    {"token": "token_id:5", "logprob": -0.0},
                    {"token": "token_id:9", "logprob": -30.8203125},
                ],
            }
        ]
    }
    got = lp.from_vllm_chat(chat, [5])
    assert got is not None
    assert got.top_logprobs == [[0.0, -30.8203125]]
    assert got.logprobs == [0.0]
    completion = {"token_logprobs": [0.0], "top_logprobs": [{"token_id:5": 0.0, "token_id:9": None}]}
    got = lp.from_vllm_completion(completion, [5])
    assert got is not None
    assert got.top_logprobs == [[0.0, lp.FLOOR]]
    assert got.top_ids == [[5, 9]]
    assert math.copysign(1.0, lp.mean_nll([0.0, -0.0])) == 1.0  # 0.0, not -0.0


def test_vllm_completions_alternatives_are_cut_to_the_k_asked_for():
    """Completions name the sampled token beside the top K: `--logprobs 0` stored it as a lone
    alternative there and nothing on the other endpoints."""
    body = {"token_logprobs": [-0.5], "top_logprobs": [{"token_id:7": -0.5, "token_id:3": -0.2, "token_id:9": -2.0}]}
    two = lp.from_vllm_completion(body, [7], 2)
    assert two is not None
    assert two.top_ids == [[3, 7]]
    assert two.top_logprobs == [[-0.2, -0.5]]
    none = lp.from_vllm_completion({"token_logprobs": [-0.5], "top_logprobs": [{"token_id:7": -0.5}]}, [7], 0)
    assert none is not None
    assert none.top_ids is None
    assert none.top_logprobs is None
    assert none.logprobs == [-0.5]


def test_a_logprob_above_zero_is_refused_and_one_too_small_to_store_is_floored():
    """A server answering 5.0 gave a mean NLL of -5 (exit 0); one answering -1e39, a value the store's FLOAT cannot
    hold, aborted the whole `score` run at its write, every score of it lost."""
    assert lp._lp(5.0) == 5.0  # kept as served (a capture's side data): `score` refuses it
    assert lp.above_zero([-1.0, None, 5.0]) == 5.0
    assert lp.above_zero([-1.0, 3e-6, 0.0]) is None  # a sure token's float32 rounding
    assert lp._lp(-1e39) == lp.FLOOR
    assert lp._lp(-0.25) == -0.25


@pytest.mark.parametrize(
    ("parse", "why"),
    [
        # a chat alternative that is no object, a completions entry that is a list or names a logprob as text
        (lambda: lp.from_vllm_chat({"content": [{"logprob": -0.1, "top_logprobs": [[1, 2]]}]}, [5]), "list of objects"),
        (lambda: lp.from_vllm_completion({"token_logprobs": [-0.1], "top_logprobs": [["x"]]}, [5], 1), "not an object"),
        (
            lambda: lp.from_vllm_completion({"token_logprobs": [-0.1], "top_logprobs": [{"token_id:5": "-1"}]}, [5], 1),
            "not a number",
        ),
        # one alternatives entry short: no alternatives were stored at all, and nothing said so
        (
            lambda: lp.from_vllm_completion(
                {"token_logprobs": [-0.1, -0.2], "top_logprobs": [{"token_id:5": -0.1}]}, [5, 6], 1
            ),
            "has 1 entries for 2",
        ),
        (
            lambda: lp.from_sglang_output({"output_token_logprobs": [[-0.1, 5, None]], "output_top_logprobs": []}, [5]),
            "has 0 entries for 1",
        ),
        # scoring: a key that is no id, a rank that is no integer
        (
            lambda: lp.from_vllm_prompt(
                [None, {"6": {"logprob": -0.1, "rank": 1}, "x": {"logprob": -1, "rank": 2}}], [5, 6], 1, 2
            ),
            "not an id",
        ),
        (
            lambda: lp.from_vllm_prompt([None, {"6": {"logprob": -0.1, "rank": "1"}}], [5, 6], 1, 2),
            "rank is not an integer",
        ),
    ],
)
def test_malformed_alternatives_are_a_malformed_answer_not_a_python_error(parse, why):
    """They failed as "unexpected error: AttributeError / TypeError / ValueError", read as tokview's own bug."""
    with pytest.raises(lp.LogprobShapeError, match=why):
        parse()


def test_an_echoed_prompt_tail_before_the_generated_ids_gets_no_logprob():
    """SGLang #17240 puts the prompt's tail in output_ids, not in the logprobs; any other extra head is malformed."""
    meta = {"output_token_logprobs": [[-0.5, 7, None], [-0.25, 8, None]]}
    got = lp.from_sglang_output(meta, [3, 4, 7, 8], prompt_ids=[1, 2, 3, 4])
    assert got.logprobs == [None, None, -0.5, -0.25]
    with pytest.raises(lp.LogprobShapeError, match="other ids"):
        lp.from_sglang_output(meta, [9, 4, 7, 8], prompt_ids=[1, 2, 3, 4])  # not the prompt's tail
    with pytest.raises(lp.LogprobShapeError, match="other ids"):
        lp.from_sglang_output(meta, [3, 4, 7, 8])  # no prompt to compare with


def test_a_scoring_answer_without_a_logprob_for_a_token_is_malformed():
    """A target that answers null for a scored token's own logprob: stored, it was a whole score of fewer tokens,
    counted scored and never asked again. Only position 0 (nothing predicts it) may go without."""
    with pytest.raises(lp.LogprobShapeError, match=r"prompt_logprobs\[2\] gives the token no logprob"):
        lp.from_vllm_prompt(
            [None, {"6": {"logprob": -0.1, "rank": 1}}, {"7": {"logprob": None, "rank": 1}}], [5, 6, 7], 1, 0
        )
    assert lp.from_vllm_prompt([None, {"6": {"logprob": -0.1, "rank": 1}}], [5, 6], 0, 0).logprobs == [None, -0.1]
    meta = {"input_token_logprobs": [[None, 5, None], [-0.5, 6, None], [None, 7, None]]}
    with pytest.raises(lp.LogprobShapeError, match=r"input_token_logprobs\[2\] gives the token no logprob"):
        lp.from_sglang_input(meta, [5, 6, 7], 1)
    meta["input_token_logprobs"][2][0] = -0.25
    assert lp.from_sglang_input(meta, [5, 6, 7], 0).logprobs == [None, -0.5, -0.25]
