"""The GLM-layout tokenizer (tokview.core.glm_layout): GLM-4.5/4.7's special ids, a template that treats history
reasoning as GLM-4.7's does, and the profile tokview detects from it."""

from __future__ import annotations

import pytest

from tokview.core.glm_layout import GLM_ID, VOCAB_SIZE
from tokview.core.profiles import BUILTIN_PROFILES, detect_profile
from tokview.core.tokenizer import load_tokenizer

HISTORY = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": " Fine. ", "reasoning_content": " first thought "},
    {"role": "user", "content": "again"},
    {"role": "assistant", "content": "Done.", "reasoning_content": "second thought"},
]


@pytest.fixture(scope="module")
def glm_tok(glm_tok_dir):
    return load_tokenizer(glm_tok_dir)


@pytest.mark.parametrize(
    "text", ["<|endoftext|>", "<|user|>", "<|assistant|>", "<|observation|>", "<think>", "</think>"]
)
def test_the_profiles_ids_are_the_tokenizers(glm_tok, text):
    profile = BUILTIN_PROFILES["glm-4.7"]
    named = {profile.think_open: profile.think_open_id, profile.think_close: profile.think_close_id}
    named.update(zip(("<|user|>", "<|observation|>", "<|endoftext|>"), profile.stop_ids, strict=True))
    named.update({"<|assistant|>": GLM_ID["<|assistant|>"]})
    assert glm_tok.token_to_id(text) == named[text]


def test_the_vocabulary_has_the_models_rows(glm_tok):
    assert glm_tok.has_id(VOCAB_SIZE - 1)


def test_the_profile_detected_is_glm_4_7(glm_tok):
    profile = detect_profile(glm_tok)
    assert (profile.name, profile.thinking_kwarg, profile.history_kwarg) == (
        "glm-4.7",
        "enable_thinking",
        "clear_thinking",
    )
    # the family's stop order, `<|user|>` first: detected as `<|endoftext|>` first, an audited answer ended with it
    assert profile.stop_ids == (151336, 151338, 151329)


def test_reasoning_before_the_last_user_turn_renders_as_a_closer_alone(glm_tok):
    text = glm_tok.render_text(HISTORY, add_generation_prompt=True)
    assert "<|assistant|></think>Fine.<|user|>" in text


def test_reasoning_after_the_last_user_turn_is_kept_trimmed(glm_tok):
    text = glm_tok.render_text(HISTORY, add_generation_prompt=True)
    assert text.endswith("<|assistant|><think>second thought</think>Done.<|assistant|><think>")


def test_clear_thinking_false_keeps_every_turns_reasoning(glm_tok):
    text = glm_tok.render_text(HISTORY, add_generation_prompt=False, template_kwargs={"clear_thinking": False})
    assert "<|assistant|><think>first thought</think>Fine.<|user|>" in text


def test_thinking_off_prefills_a_closer(glm_tok):
    ids = glm_tok.render(HISTORY[:1], template_kwargs={"enable_thinking": False})
    assert ids[-2:] == [GLM_ID["<|assistant|>"], GLM_ID["</think>"]]


def test_text_round_trips_through_the_ids(glm_tok):
    text = "Okay, let me think about this carefully. The answer is forty-two!"
    assert glm_tok.decode(glm_tok.encode(text)) == text
