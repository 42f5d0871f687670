"""Every finding code, with a positive and a negative case, on both real tokenizers.

Each case starts from a valid sample built from the tokenizer itself (a prompt whose tail opens
reasoning, then reasoning ids, the closer, answer ids and the stop id) and changes one thing.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from facts import (
    KIMI_CHAIN_OUTPUT,
    KIMI_PROMPT_6X7,
    RECORDINGS,
)

from tokview.core.analysis import analyze
from tokview.core.findings import ERROR, FINDING_CODES, default_severity
from tokview.core.record import Capture

QUESTION = [{"role": "user", "content": "What is 6 times 7?"}]
REASONING = "Okay, let me think about this carefully."
ANSWER = "The answer is forty-two!"


@dataclasses.dataclass
class Family:
    """A tokenizer + profile and the ids of one valid sample built from them."""

    tok: object
    profile: object
    prompt: list[int]
    reasoning: list[int]
    answer: list[int]
    messages: list | None = None
    """The conversation the prompt renders from (None when the prompt was edited after rendering)."""

    @property
    def p(self):
        return self.profile

    def output(self, reasoning=None, answer=None, close=True, stop=True) -> list[int]:
        ids = list(self.reasoning if reasoning is None else reasoning)
        if close:
            ids.append(self.p.think_close_id)
        ids += self.answer if answer is None else answer
        if stop:
            ids.append(self.p.stop_ids[0])
        return ids

    def capture(self, **changes) -> Capture:
        out = changes.pop("output_ids") if "output_ids" in changes else self.output()
        base = dict(
            prompt_ids=list(self.prompt),
            output_ids=out,
            finish_reason="stop",
            endpoint="sglang-generate",
            settings={"thinking": True, "max_new_tokens": 256},
            messages=self.messages,
            usage={"prompt_tokens": len(self.prompt), "completion_tokens": len(out)},
        )
        base.update(changes)
        return Capture(**base)


@pytest.fixture(params=["kimi", "qwen"])
def fam(request, kimi_tok, qwen_tok, kimi_profile, qwen_profile) -> Family:
    if request.param == "kimi":
        prompt = kimi_tok.render(QUESTION, template_kwargs={"thinking": True})
        return Family(kimi_tok, kimi_profile, prompt, kimi_tok.encode(REASONING), kimi_tok.encode(ANSWER), QUESTION)
    # A Qwen3-Thinking-2507-style template pre-fills "<think>\n"; modelled by appending it.
    prompt = qwen_tok.render(QUESTION, template_kwargs={"enable_thinking": True})
    prompt += [qwen_profile.think_open_id] + qwen_tok.encode("\n")
    return Family(qwen_tok, qwen_profile, prompt, qwen_tok.encode(REASONING + "\n"), qwen_tok.encode("\n\n" + ANSWER))


def codes(fam: Family, capture: Capture) -> set[str]:
    return set(analyze(capture, fam.profile, fam.tok).codes)


def test_baseline_has_no_problem_findings(fam):
    found = codes(fam, fam.capture())
    assert found == {"think_open_in_prompt"}


def _no_prefill_prompt(fam: Family) -> list[int]:
    cut = max(i for i, t in enumerate(fam.prompt) if t == fam.p.think_open_id)
    return fam.prompt[:cut]


def _chat_fields(fam: Family, **changes) -> Capture:
    base = dict(
        endpoint="vllm-chat",
        reasoning=fam.tok.decode(fam.reasoning),
        content=fam.tok.decode(fam.answer),
        reasoning_field="reasoning",
    )
    base.update(changes)
    return fam.capture(**base)


def _literal_close(fam: Family) -> list[int]:
    literal = [i for ch in fam.p.think_close for i in fam.tok.encode(ch)]
    assert fam.p.think_close_id not in literal
    return fam.reasoning + literal + fam.answer + [fam.p.stop_ids[0]]


def _char_split(fam: Family) -> list[int]:
    text = fam.tok.decode(fam.answer)
    return fam.output(answer=[i for ch in text for i in fam.tok.encode(ch)])


def _dual(fam: Family, parsed: list[int]) -> Capture:
    return _chat_fields(fam, endpoint="dual", parsed_output_ids=parsed)


def _thinking_off(fam: Family, output: list[int]) -> Capture:
    """A reasoning model run with thinking off: the template closes reasoning in the prompt."""
    prompt = fam.tok.render(QUESTION, template_kwargs=fam.p.template_kwargs(False))
    return fam.capture(
        prompt_ids=prompt, output_ids=output, messages=QUESTION, settings={"thinking": False, "max_new_tokens": 256}
    )


CASES = {
    "empty_output": (lambda f: f.capture(output_ids=[], usage={}), lambda f: f.capture()),
    "dual_divergence": (lambda f: _dual(f, f.output(answer=f.answer + f.answer)), lambda f: _dual(f, f.output())),
    "think_open_in_prompt": (
        lambda f: f.capture(),
        lambda f: f.capture(prompt_ids=_no_prefill_prompt(f), output_ids=[f.p.think_open_id] + f.output()),
    ),
    "think_open_missing": (lambda f: f.capture(prompt_ids=_no_prefill_prompt(f)), lambda f: f.capture()),
    "think_close_missing": (
        lambda f: f.capture(output_ids=f.output(close=False, answer=[], stop=False), finish_reason="length"),
        lambda f: f.capture(),
    ),
    "think_close_repeated": (
        lambda f: f.capture(output_ids=f.output(answer=f.answer + [f.p.think_close_id] + f.answer)),
        lambda f: f.capture(),
    ),
    "think_open_in_output_after_prefill": (
        lambda f: f.capture(output_ids=[f.p.think_open_id] + f.output()),
        lambda f: f.capture(),
    ),
    "reasoning_with_thinking_off": (
        lambda f: _thinking_off(f, [f.p.think_open_id] + f.output()),
        lambda f: _thinking_off(f, f.answer + [f.p.stop_ids[0]]),
    ),
    "empty_reasoning": (
        lambda f: f.capture(output_ids=f.output(reasoning=f.tok.encode("\n\n"))),
        lambda f: f.capture(),
    ),
    "empty_answer": (lambda f: f.capture(output_ids=f.output(answer=f.tok.encode("\n"))), lambda f: f.capture()),
    "truncated": (lambda f: f.capture(output_ids=f.output(stop=False), finish_reason="length"), lambda f: f.capture()),
    "no_stop_token": (lambda f: f.capture(output_ids=f.output(stop=False)), lambda f: f.capture()),
    "output_prefix_overlap": (lambda f: f.capture(output_ids=f.prompt[-5:] + f.output()), lambda f: f.capture()),
    "completion_count_mismatch": (lambda f: f.capture(usage={"completion_tokens": 3}), lambda f: f.capture()),
    "parser_hidden_ids": (
        lambda f: _chat_fields(f),
        lambda f: f.capture(text=f.tok.decode(f.output(), skip_special_tokens=False)),
    ),
    "parser_split_mismatch": (
        lambda f: _chat_fields(f, reasoning=f.tok.decode(f.output(), skip_special_tokens=True), content=""),
        lambda f: _chat_fields(f),
    ),
    "reasoning_field_missing": (
        lambda f: _chat_fields(f, reasoning=None, reasoning_field=None),
        lambda f: _chat_fields(f),
    ),
    "literal_think_text": (lambda f: f.capture(output_ids=_literal_close(f)), lambda f: f.capture()),
    "retokenize_drift": (lambda f: f.capture(output_ids=_char_split(f)), lambda f: f.capture()),
    "prompt_render_mismatch": (
        lambda f: f.capture(messages=[{"role": "user", "content": "What is 6 times 8?"}]),
        lambda f: f.capture(
            prompt_ids=f.tok.render(QUESTION, template_kwargs=f.p.template_kwargs(True)),
            output_ids=[f.p.think_open_id] + f.output(),
            messages=QUESTION,
        ),
    ),
    "over_max_length": (lambda f: f.capture(settings={"thinking": True, "max_length": 20}), lambda f: f.capture()),
    "off_policy": (
        lambda f: f.capture(
            target_logprobs=[-3.0] * len(f.output()), target_score={"off_policy_nll": 2.0, "low_prob": 0.01}
        ),
        lambda f: f.capture(
            target_logprobs=[-0.3] * len(f.output()), target_score={"off_policy_nll": 2.0, "low_prob": 0.01}
        ),
    ),
}


def test_every_code_has_cases():
    assert set(CASES) == set(FINDING_CODES)


@pytest.mark.parametrize("code", FINDING_CODES)
def test_positive(fam, code):
    positive, _ = CASES[code]
    analysis = analyze(positive(fam), fam.profile, fam.tok)
    hits = [f for f in analysis.findings if f.code == code]
    assert hits, f"{code} not found; got {analysis.codes}"
    assert hits[0].severity == default_severity(code)
    assert hits[0].detail
    if default_severity(code) == ERROR:
        assert not analysis.valid


@pytest.mark.parametrize("code", FINDING_CODES)
def test_negative(fam, code):
    _, negative = CASES[code]
    assert code not in codes(fam, negative(fam))


# -- the seed case and the recordings -----------------------------------------------------------


def test_seed_case_kimi_prefilled_opener(kimi_tok, kimi_profile):
    capture = Capture(prompt_ids=KIMI_PROMPT_6X7, output_ids=KIMI_CHAIN_OUTPUT, finish_reason="stop")
    analysis = analyze(capture, kimi_profile, kimi_tok)
    assert "think_open_in_prompt" in analysis.codes
    assert analysis.valid
    info = next(f for f in analysis.findings if f.code == "think_open_in_prompt")
    assert "163606" in info.detail and info.positions == (27,)


def test_seed_case_without_opener_in_prompt(kimi_tok, kimi_profile):
    capture = Capture(prompt_ids=KIMI_PROMPT_6X7[:-1], output_ids=KIMI_CHAIN_OUTPUT, finish_reason="stop")
    analysis = analyze(capture, kimi_profile, kimi_tok)
    assert "think_open_missing" in analysis.codes and not analysis.valid
    missing = next(f for f in analysis.findings if f.code == "think_open_missing")
    assert missing.positions == (27 + 9,)  # the closer, output[9], after 27 prompt ids


def test_seed_case_without_tokenizer(kimi_profile):
    capture = Capture(prompt_ids=KIMI_PROMPT_6X7, output_ids=KIMI_CHAIN_OUTPUT, finish_reason="stop")
    analysis = analyze(capture, kimi_profile)
    assert analysis.codes == ["think_open_in_prompt"]
    assert [s.kind for s in analysis.segments] == [
        "prompt",
        "prefilled_opener",
        "reasoning",
        "closer",
        "answer",
        "stop",
    ]


def test_recorded_vllm_response_hides_closer_and_stop(kimi_tok, kimi_profile):
    body = json.loads((RECORDINGS / "vllm_chat_kimi_k2.json").read_text())
    choice = body["choices"][0]
    capture = Capture(
        prompt_ids=body["prompt_token_ids"],
        output_ids=choice["token_ids"],
        finish_reason="stop",
        reasoning=choice["message"]["reasoning"],
        content=choice["message"]["content"],
        reasoning_field="reasoning",
        endpoint="vllm-chat",
        usage=body["usage"],
    )
    analysis = analyze(capture, kimi_profile, kimi_tok)
    hidden = next(f for f in analysis.findings if f.code == "parser_hidden_ids")
    assert hidden.positions == (28 + 9, 28 + 17)
    assert "163607" in hidden.detail and "163586" in hidden.detail
    assert "parser_split_mismatch" not in analysis.codes
    assert analysis.valid


def test_recorded_sglang_special_closer_breaks_text_parser(kimi_tok, kimi_profile):
    body = json.loads((RECORDINGS / "sgl_chat.json").read_text())
    choice = body["choices"][0]
    capture = Capture(
        prompt_ids=choice["prompt_token_ids"],
        output_ids=choice["response_token_ids"],
        finish_reason="stop",
        reasoning=choice["message"]["reasoning_content"],
        content=choice["message"]["content"],
        reasoning_field="reasoning_content",
        endpoint="sglang-chat",
        usage=body["usage"],
    )
    assert "parser_split_mismatch" in analyze(capture, kimi_profile, kimi_tok).codes


def test_severity_override(kimi_tok, kimi_profile):
    capture = Capture(prompt_ids=KIMI_PROMPT_6X7, output_ids=KIMI_CHAIN_OUTPUT[:-1], finish_reason="length")
    analysis = analyze(capture, kimi_profile, kimi_tok, severities={"truncated": "warn"})
    assert next(f for f in analysis.findings if f.code == "truncated").severity == "warn"


# -- regressions from review ------------------------------------------------------------------


def test_reasoning_reopened_after_the_answer_is_an_error(fam):
    out = fam.output(stop=False) + [fam.p.think_open_id] + fam.reasoning + [fam.p.stop_ids[0]]
    analysis = analyze(fam.capture(output_ids=out), fam.profile, fam.tok)
    assert "think_close_missing" in analysis.codes and not analysis.valid


def test_empty_output_is_one_clear_error(fam):
    analysis = analyze(fam.capture(output_ids=[], usage={}), fam.profile, fam.tok)
    errors = [f.code for f in analysis.findings if f.severity == ERROR]
    assert errors == ["empty_output"]


def test_no_stop_token_is_silent_without_stop_ids(fam):
    profile = fam.profile.with_overrides(stop_ids=())
    assert "no_stop_token" not in analyze(fam.capture(output_ids=fam.output(stop=False)), profile, fam.tok).codes


def test_divergent_dual_capture_names_no_trained_positions(fam):
    longer = fam.output(answer=fam.answer + fam.answer)
    analysis = analyze(_dual(fam, longer), fam.profile, fam.tok)
    hidden = next(f for f in analysis.findings if f.code == "parser_hidden_ids")
    assert hidden.positions == () and "parsed-path output" in hidden.detail
    assert len(analysis.aligned_kinds) == len(fam.prompt) + len(longer)


def test_empty_parsed_path_aligns_to_nothing(fam):
    analysis = analyze(_dual(fam, []), fam.profile, fam.tok)
    assert "dual_divergence" in analysis.codes
    assert analysis.alignment is not None and analysis.alignment.statuses == ()


def test_literal_think_only_in_prompt_is_a_warning(fam):
    literal = [i for ch in "Explain <think> tags" for i in fam.tok.encode(ch)]
    analysis = analyze(fam.capture(prompt_ids=literal + fam.prompt, messages=None, usage={}), fam.profile, fam.tok)
    hit = next(f for f in analysis.findings if f.code == "literal_think_text")
    assert hit.severity == "warn" and analysis.valid


def test_id_only_import_is_not_a_missing_reasoning_field(fam):
    """A dataset of ids (speculators rows) has no text fields: nothing can have been read from the wrong one."""
    capture = fam.capture(endpoint="imported")
    assert "reasoning_field_missing" not in analyze(capture, fam.profile, fam.tok).codes
