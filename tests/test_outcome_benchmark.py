"""The outcome benchmark's pure parts (benchmarks/outcome): the text-path row builder, the statistics, the prompt set.

Hermetic and fast: a character-level tokenizer with ChatML-like rendering stands in for the model folder, so
no model, venv or server is needed.
"""

from __future__ import annotations

import math

import pytest

from benchmarks.outcome import prompts, stats
from benchmarks.outcome.textpath import drift_count, text_row

SPECIAL = {"<|im_start|>": 1000, "<|im_end|>": 1001}


def render(messages, add_generation_prompt):
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def encode(text):
    """Characters as ids, the two markers as one special id each; 'ab' merges into one id (a non-trivial merge)."""
    ids, i = [], 0
    while i < len(text):
        marker = next((m for m in SPECIAL if text.startswith(m, i)), None)
        if marker:
            ids.append(SPECIAL[marker])
            i += len(marker)
        elif text.startswith("ab", i):
            ids.append(999)
            i += 2
        else:
            ids.append(ord(text[i]))
            i += 1
    return ids


def test_text_row_supervises_the_answer_and_the_end_of_turn_only():
    row = text_row("q1_gen0", "hi", "ok", render=render, encode=encode, end_marker="<|im_end|>")
    head = encode(render([{"role": "user", "content": "hi"}], True))
    assert row["id"] == "q1_gen0"
    assert row["input_ids"] == head + [ord("o"), ord("k"), 1001]  # the template's trailing newline is cut
    assert row["loss_mask"] == [0] * len(head) + [1, 1, 1]


def test_text_row_re_tokenizes_what_the_server_split_differently():
    """The served answer 'a','b' (two ids) comes back as the merged 'ab' id: the drift condition B keeps."""
    served_ids = [ord("a"), ord("b"), 1001]
    row = text_row("q", "x", "ab", render=render, encode=encode, end_marker="<|im_end|>")
    head_len = row["loss_mask"].index(1)
    assert row["input_ids"][head_len:] == [999, 1001] != served_ids
    exact = {"id": "q", "input_ids": row["input_ids"][:head_len] + served_ids, "loss_mask": []}
    assert drift_count([exact], [row]) == {"rows": 1, "ids_differ": 1, "mask_differs": 0}


def test_text_row_refuses_a_template_whose_generation_prompt_is_not_a_prefix():
    def odd(messages, add_generation_prompt):
        return ("G" if add_generation_prompt else "") + render(messages, False)

    with pytest.raises(ValueError, match="prefix"):
        text_row("q", "x", "y", render=odd, encode=encode, end_marker="<|im_end|>")


def _s(pid, steps, accepted, hist):
    return stats.SampleSpec(pid, steps, accepted, tuple(hist))


def test_acceptance_length_is_pooled_over_steps_and_per_position_counts_at_least_k():
    a = _s("p1", 4, 8, [1, 0, 1, 2])  # steps accepting 0, 2, 3, 3 drafts
    b = _s("p2", 1, 0, [1, 0, 0, 0])
    assert stats.acceptance_length([a, b]) == pytest.approx(1 + 8 / 5)  # not the mean of per-sample ratios (2.5)
    assert stats.per_position([a, b], 3) == pytest.approx([3 / 5, 3 / 5, 2 / 5])


def test_sample_spec_reads_the_stored_dict_and_builds_a_histogram_from_per_step_lists():
    stored = {"steps": 3, "accepted": 4, "per_step_accepted": [3, 0, 1], "num_spec_tokens": 3, "histogram": None}
    assert stats.sample_spec("p", stored) == _s("p", 3, 4, [1, 1, 0, 1])
    assert stats.sample_spec("p", {"steps": 0, "accepted": 0}) is None


def test_bootstrap_interval_contains_the_value_and_a_paired_difference_of_equal_groups_is_zero():
    samples = [_s(f"p{i}", 10, i % 4 * 5, [1, 1, 1, 7]) for i in range(40)]
    iv = stats.bootstrap([samples], lambda g: stats.acceptance_length(g[0]), draws=300)
    assert iv.low <= iv.value <= iv.high and iv.low < iv.high
    same = stats.bootstrap(
        [samples, samples], lambda g: stats.acceptance_length(g[0]) - stats.acceptance_length(g[1]), draws=200
    )
    assert (same.value, same.low, same.high) == (0.0, 0.0, 0.0)
    assert math.isnan(stats.acceptance_length([]))


def test_paired_keeps_only_common_prompts_in_one_order():
    got = stats.paired({"A": [_s("b", 1, 0, [1]), _s("a", 1, 0, [1])], "B": [_s("a", 2, 0, [2])]})
    assert [s.prompt_id for s in got["A"]] == ["a"] and [s.steps for s in got["B"]] == [2]


def test_prompt_set_is_deterministic_distinct_and_split_without_overlap():
    rows = prompts.make_prompts(600)
    assert rows == prompts.make_prompts(600)
    assert len({r.prompt for r in rows}) == 600
    train, held = prompts.split(rows, 400, 40)
    assert not {r.id for r in train} & {r.id for r in held}
    assert train[:10] == prompts.split(prompts.make_prompts(900), 400, 40)[0][:10]  # growing the set moves no id
