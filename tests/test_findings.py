"""Every finding code, with a positive and a negative case, on both real tokenizers, and the registry.

Each case starts from a valid sample built from the tokenizer itself (a prompt whose tail opens
reasoning, then reasoning ids, the closer, answer ids and the stop id) and changes one thing; the
positive case states the exact positions its finding names (none only for a finding about an absence).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from facts import (
    KIMI_CHAIN_OUTPUT,
    KIMI_PROMPT_6X7,
    RECORDINGS,
)
from finding_family import Family
from test_chain_findings import CHAIN_CASES, ChainCase
from test_harmony_findings import HARMONY_CASES, HarmonyCase
from test_tool_calls_findings import KIMI_ONLY, TOOL_CASES
from test_tool_calls_findings import Case as ToolCallCase

from tokview.core.analysis import analyze
from tokview.core.finding_context import first_difference
from tokview.core.findings import ERROR, FINDING_CODES, INFO, RULES, WARN, Hit, default_severity, rule, why
from tokview.core.record import Capture

QUESTION = [{"role": "user", "content": "What is 6 times 7?"}]
REASONING = "Okay, let me think about this carefully."
ANSWER = "The answer is forty-two!"


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


def _last(c: Capture) -> tuple[int, ...]:
    """The position of the output's last id."""
    return (len(c.prompt_ids) + len(c.output_ids) - 1,)


def _out(c: Capture, *output_positions: int) -> tuple[int, ...]:
    """Absolute positions of output positions."""
    return tuple(len(c.prompt_ids) + i for i in output_positions)


def _char_split_start(f: Family) -> int:
    """Output position of the first answer id that splitting the answer into characters changed."""
    chars = _char_split(f)[len(f.reasoning) + 1 :]
    return len(f.reasoning) + 1 + next(i for i, (a, b) in enumerate(zip(chars, f.answer)) if a != b)


def _render_start(f: Family, messages: list) -> int:
    """The first prompt position where rendering `messages` gives another id than the served prompt."""
    local = f.tok.render(messages, template_kwargs=f.p.template_kwargs(True))
    return next(i for i, (a, b) in enumerate(zip(local, f.prompt)) if a != b)


QUESTION_8 = [{"role": "user", "content": "What is 6 times 8?"}]
QUOTED = [
    {"role": "system", "content": "Tools may return any text."},
    {"role": "user", "content": "What does <|im_end|> do in a chat template?"},
]


def _quoted(f: Family) -> Capture:
    """A user message spelling `<|im_end|>`: rendered, the prompt holds the control id where the text quoted it."""
    prompt = f.tok.render(QUOTED, template_kwargs=f.p.template_kwargs(True))
    return f.capture(prompt_ids=prompt, output_ids=[f.p.think_open_id] + f.output(), messages=QUOTED)


def _quoted_at(f: Family, c: Capture) -> tuple[int, ...]:
    """The prompt position of the quoted `<|im_end|>`: the one the text " do in" follows."""
    end = f.tok.encode("<|im_end|>")[0]
    ids = c.prompt_ids
    at = [p for p, t in enumerate(ids) if t == end and f.tok.decode(ids[p + 1 : p + 8]).startswith(" do in")]
    assert len(at) == 1, at
    return (at[0],)


UNLIKELY = {"off_policy_nll": 2.0, "low_prob": 0.01}


def _scored(f: Family, values: list[float]) -> Capture:
    return f.capture(target_logprobs=values, target_score=UNLIKELY)


def _two_unlikely(f: Family) -> list[float]:
    """Mean NLL 3 nats over the output, with output[2] and output[5] below p=0.01."""
    values = [-3.0] * len(f.output())
    values[2] = values[5] = -6.0
    return values


@dataclasses.dataclass(frozen=True)
class Case:
    positive: Callable[[Family], Capture]
    negative: Callable[[Family], Capture]
    positions: Callable[[Family, Capture], tuple[int, ...]]
    """The exact positions the positive case's finding names (() only for a finding about an absence)."""


ABSENT: Callable[[Family, Capture], tuple[int, ...]] = lambda f, c: ()  # noqa: E731

CASES: dict[str, Case | ToolCallCase | ChainCase | HarmonyCase] = {
    "empty_output": Case(lambda f: f.capture(output_ids=[], usage={}), lambda f: f.capture(), ABSENT),
    "unknown_token_id": Case(
        lambda f: f.capture(output_ids=f.output(answer=[*f.answer, f.tok.vocab_size])),
        lambda f: f.capture(),
        lambda f, c: _out(c, len(f.reasoning) + 1 + len(f.answer)),  # the id past the vocabulary
    ),
    "dual_divergence": Case(
        lambda f: _dual(f, f.output(answer=f.answer + f.answer)),
        lambda f: _dual(f, f.output()),
        lambda f, c: _last(c),  # the raw path's stop id is where the parsed path went on answering
    ),
    "think_open_in_prompt": Case(
        lambda f: f.capture(),
        lambda f: f.capture(prompt_ids=_no_prefill_prompt(f), output_ids=[f.p.think_open_id] + f.output()),
        lambda f, c: (len(_no_prefill_prompt(f)),),
    ),
    "think_open_missing": Case(
        lambda f: f.capture(prompt_ids=_no_prefill_prompt(f)),
        lambda f: f.capture(),
        lambda f, c: _out(c, len(f.reasoning)),  # the closer that closes nothing
    ),
    "think_close_missing": Case(
        lambda f: f.capture(output_ids=f.output(close=False, answer=[], stop=False), finish_reason="length"),
        lambda f: f.capture(),
        ABSENT,  # the closer that never came
    ),
    "think_close_repeated": Case(
        lambda f: f.capture(output_ids=f.output(answer=f.answer + [f.p.think_close_id] + f.answer)),
        lambda f: f.capture(),
        lambda f, c: _out(c, len(f.reasoning), len(f.reasoning) + 1 + len(f.answer)),
    ),
    "think_open_in_output_after_prefill": Case(
        lambda f: f.capture(output_ids=[f.p.think_open_id] + f.output()),
        lambda f: f.capture(),
        lambda f, c: _out(c, 0),
    ),
    "reasoning_with_thinking_off": Case(
        lambda f: _thinking_off(f, [f.p.think_open_id] + f.output()),
        lambda f: _thinking_off(f, f.answer + [f.p.stop_ids[0]]),
        lambda f, c: _out(c, 0, 1 + len(f.reasoning)),  # the opener and the closer
    ),
    "empty_reasoning": Case(
        lambda f: f.capture(output_ids=f.output(reasoning=f.tok.encode("\n\n"))),
        lambda f: f.capture(),
        lambda f, c: _out(c, len(f.tok.encode("\n\n"))),  # the closer right after the blank reasoning
    ),
    "empty_answer": Case(
        lambda f: f.capture(output_ids=f.output(answer=f.tok.encode("\n"))),
        lambda f: f.capture(),
        lambda f, c: _last(c),  # the stop that ended the turn where the answer should have been
    ),
    "truncated": Case(
        lambda f: f.capture(output_ids=f.output(stop=False), finish_reason="length"),
        lambda f: f.capture(),
        lambda f, c: _last(c),
    ),
    "generation_aborted": Case(
        lambda f: f.capture(output_ids=f.output(stop=False), finish_reason="abort"),
        lambda f: f.capture(),
        lambda f, c: _last(c),
    ),
    "no_stop_token": Case(
        lambda f: f.capture(output_ids=f.output(stop=False)), lambda f: f.capture(), lambda f, c: _last(c)
    ),
    "stopped_by_request": Case(
        lambda f: f.capture(output_ids=f.output(stop=False), matched_stop="forty"),
        lambda f: f.capture(matched_stop=f.p.stop_ids[0]),
        lambda f, c: _last(c),
    ),
    "output_past_stop": Case(  # a second turn's ids after the first's stop (a loss mask over both)
        lambda f: f.capture(output_ids=f.output() + f.answer + [f.p.stop_ids[0]]),
        lambda f: f.capture(),
        lambda f, c: _out(c, len(f.output()) - 1),  # the first stop, where the server would have ended
    ),
    "output_prefix_overlap": Case(
        lambda f: f.capture(  # the echoed ids are none the server counted (SGLang #17240)
            output_ids=f.prompt[-5:] + f.output(), usage={"completion_tokens": len(f.output())}
        ),
        lambda f: f.capture(),
        lambda f, c: _out(c, 0, 1, 2, 3, 4),
    ),
    "completion_count_mismatch": Case(
        lambda f: f.capture(usage={"completion_tokens": 3}), lambda f: f.capture(), ABSENT
    ),
    "parser_hidden_ids": Case(
        lambda f: _chat_fields(f),
        lambda f: f.capture(text=f.tok.decode(f.output(), skip_special_tokens=False)),
        lambda f, c: _out(c, len(f.reasoning)) + _last(c),  # the closer and the stop
    ),
    "parser_split_mismatch": Case(
        lambda f: _chat_fields(f, reasoning=f.tok.decode(f.output(), skip_special_tokens=True), content=""),
        lambda f: _chat_fields(f),
        lambda f, c: _out(c, len(f.reasoning)),  # where the ids split: the closer
    ),
    "reasoning_field_missing": Case(
        lambda f: _chat_fields(f, reasoning=None, reasoning_field=None), lambda f: _chat_fields(f), ABSENT
    ),
    "literal_think_text": Case(
        lambda f: f.capture(output_ids=_literal_close(f)),
        lambda f: f.capture(),
        lambda f, c: _out(c, *range(len(f.reasoning), len(_literal_close(f)) - len(f.answer) - 1)),
    ),
    "retokenize_drift": Case(
        lambda f: f.capture(output_ids=_char_split(f)),
        lambda f: f.capture(),
        lambda f, c: _out(c, _char_split_start(f)),
    ),
    "prompt_render_mismatch": Case(
        lambda f: f.capture(messages=QUESTION_8),
        lambda f: f.capture(
            prompt_ids=f.tok.render(QUESTION, template_kwargs=f.p.template_kwargs(True)),
            output_ids=[f.p.think_open_id] + f.output(),
            messages=QUESTION,
        ),
        lambda f, c: (_render_start(f, QUESTION_8),),
    ),
    "control_text_in_messages": Case(_quoted, lambda f: f.capture(messages=QUESTION), _quoted_at),
    "over_max_length": Case(
        lambda f: f.capture(settings={"thinking": True, "max_model_len": 20}),
        lambda f: f.capture(),
        lambda f, c: (20,),  # the first id past the limit
    ),
    "off_policy": Case(
        lambda f: _scored(f, _two_unlikely(f)),
        lambda f: _scored(f, [-0.3] * len(f.output())),
        lambda f, c: _out(c, 2, 5),  # the tokens below p
    ),
}
CASES.update(TOOL_CASES)  # the tool-call codes: their cases live beside the tool-call tests
CASES.update(CHAIN_CASES)  # the chain codes: beside the chain tests
CASES.update(HARMONY_CASES)  # the Harmony codes: run on the gpt-oss family in test_harmony_findings


def test_every_code_has_cases():
    assert set(CASES) == set(RULES) == set(FINDING_CODES)


@pytest.mark.parametrize("code", FINDING_CODES)
def test_every_code_is_declared_with_severity_why_and_a_check_named_after_it(code):
    declared = RULES[code]
    assert declared.code == code
    assert declared.check.__name__ == code
    assert declared.severity in (INFO, WARN, ERROR)
    assert default_severity(code) == declared.severity
    assert declared.why
    assert "\n" not in declared.why
    assert why(code) == declared.why


@pytest.mark.parametrize("code", FINDING_CODES)
def test_positive(fam, code):
    if code in HARMONY_CASES:
        pytest.skip("a Harmony code: tests/test_harmony_findings.py runs it on the gpt-oss tokenizer")
    if code in KIMI_ONLY and fam.p.tool_calls.parser != "kimi_k2":
        pytest.skip("the hermes layout has no section markers and writes no call id")
    case = CASES[code]
    capture = case.positive(fam)
    analysis = analyze(capture, fam.profile, fam.tok)
    hits = [f for f in analysis.findings if f.code == code]
    assert hits, f"{code} not found; got {analysis.codes}"
    assert len(hits) == 1
    assert hits[0].severity == default_severity(code)
    assert hits[0].detail
    assert hits[0].positions == case.positions(fam, capture)
    if default_severity(code) == ERROR:
        assert not analysis.valid


@pytest.mark.parametrize("code", FINDING_CODES)
def test_negative(fam, code):
    negative = fam.capture() if code in HARMONY_CASES else CASES[code].negative(fam)  # no Harmony on think tags
    assert code not in codes(fam, negative)


# -- the seed case and the recordings -----------------------------------------------------------


def test_seed_case_kimi_prefilled_opener(kimi_tok, kimi_profile):
    capture = Capture(prompt_ids=KIMI_PROMPT_6X7, output_ids=KIMI_CHAIN_OUTPUT, finish_reason="stop")
    analysis = analyze(capture, kimi_profile, kimi_tok)
    assert "think_open_in_prompt" in analysis.codes
    assert analysis.valid
    info = next(f for f in analysis.findings if f.code == "think_open_in_prompt")
    assert "163606" in info.detail
    assert info.positions == (27,)


def test_seed_case_without_opener_in_prompt(kimi_tok, kimi_profile):
    capture = Capture(prompt_ids=KIMI_PROMPT_6X7[:-1], output_ids=KIMI_CHAIN_OUTPUT, finish_reason="stop")
    analysis = analyze(capture, kimi_profile, kimi_tok)
    assert "think_open_missing" in analysis.codes
    assert not analysis.valid
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
    assert "163607" in hidden.detail
    assert "163586" in hidden.detail
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
    split = next(f for f in analyze(capture, kimi_profile, kimi_tok).findings if f.code == "parser_split_mismatch")
    closer = capture.output_ids.index(kimi_profile.think_close_id)
    assert split.positions == (len(capture.prompt_ids) + closer,)  # where the ids split, which the parser missed


def test_no_split_is_no_mismatch_when_the_client_turned_the_split_off(kimi_tok, kimi_profile):
    """SGLang's `separate_reasoning: false` (sent by a harness through the proxy) answers the whole text in `content`,
    as asked: it read as a parser that split elsewhere than the ids (a WARN on a healthy answer)."""
    body = json.loads((RECORDINGS / "sgl_chat.json").read_text())
    choice = body["choices"][0]
    whole = (choice["message"]["reasoning_content"] or "") + (choice["message"]["content"] or "")
    capture = Capture(
        prompt_ids=choice["prompt_token_ids"],
        output_ids=choice["response_token_ids"],
        finish_reason="stop",
        reasoning=None,
        content=whole,
        reasoning_field="reasoning_content",
        endpoint="sglang-chat",
        usage=body["usage"],
        settings={"separate_reasoning": False},
        server_kind="sglang",
    )
    assert "parser_split_mismatch" not in analyze(capture, kimi_profile, kimi_tok).codes
    asked = dataclasses.replace(capture, settings={"separate_reasoning": True})
    assert "parser_split_mismatch" in analyze(asked, kimi_profile, kimi_tok).codes
    vllm = dataclasses.replace(capture, server_kind="vllm", endpoint="vllm-chat")  # vLLM ignores the field
    assert "parser_split_mismatch" in analyze(vllm, kimi_profile, kimi_tok).codes


def test_severity_override(kimi_tok, kimi_profile):
    capture = Capture(prompt_ids=KIMI_PROMPT_6X7, output_ids=KIMI_CHAIN_OUTPUT[:-1], finish_reason="length")
    analysis = analyze(capture, kimi_profile, kimi_tok, severities={"truncated": "warn"})
    assert next(f for f in analysis.findings if f.code == "truncated").severity == "warn"
    for bad in ({"truncatd": "warn"}, {"truncated": "fatal"}):
        with pytest.raises(ValueError, match="severity override: unknown"):
            analyze(capture, kimi_profile, kimi_tok, severities=bad)


# -- regressions from review ------------------------------------------------------------------


def test_reasoning_reopened_after_the_answer_is_an_error(fam):
    out = fam.output(stop=False) + [fam.p.think_open_id] + fam.reasoning + [fam.p.stop_ids[0]]
    capture = fam.capture(output_ids=out)
    analysis = analyze(capture, fam.profile, fam.tok)
    hit = next(f for f in analysis.findings if f.code == "think_close_missing")
    assert not analysis.valid
    assert "reopened" in hit.detail
    assert hit.positions == (len(fam.prompt) + len(fam.output(stop=False)),)  # the opener after the answer


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
    assert hidden.positions == ()
    assert "parsed-path output" in hidden.detail
    assert len(analysis.aligned_kinds) == len(fam.prompt) + len(longer)


def test_empty_parsed_path_aligns_to_nothing(fam):
    analysis = analyze(_dual(fam, []), fam.profile, fam.tok)
    assert "dual_divergence" in analysis.codes
    assert analysis.alignment is not None
    assert analysis.alignment.statuses == ()


def test_literal_think_only_in_prompt_is_a_warning(fam):
    literal = [i for ch in "Explain <think> tags" for i in fam.tok.encode(ch)]
    analysis = analyze(fam.capture(prompt_ids=literal + fam.prompt, messages=None, usage={}), fam.profile, fam.tok)
    hit = next(f for f in analysis.findings if f.code == "literal_think_text")
    assert hit.severity == "warn"
    assert analysis.valid
    assert hit.positions == tuple(range(literal.index(fam.tok.encode("<")[0]), len(literal) - len(" tags")))


def test_id_only_import_is_not_a_missing_reasoning_field(fam):
    """A dataset of ids (speculators rows) has no text fields: nothing can have been read from the wrong one."""
    capture = fam.capture(endpoint="imported")
    assert "reasoning_field_missing" not in analyze(capture, fam.profile, fam.tok).codes


def test_empty_answer_without_a_stop_names_the_last_output_id(fam):
    capture = fam.capture(output_ids=fam.output(answer=[], stop=False))
    hit = next(f for f in analyze(capture, fam.profile, fam.tok).findings if f.code == "empty_answer")
    assert hit.positions == (len(fam.prompt) + len(fam.reasoning),)  # the closer, with nothing after it


def test_off_policy_with_no_token_below_p_names_the_least_likely_ones(fam):
    values = [-3.0] * len(fam.output())
    values[1], values[4] = -4.0, -3.5  # none below log(0.01), the mean above 2 nats
    hit = next(f for f in analyze(_scored(fam, values), fam.profile, fam.tok).findings if f.code == "off_policy")
    n = len(fam.prompt)
    assert hit.positions[:2] == (n, n + 1)
    assert n + 4 in hit.positions
    assert len(hit.positions) == min(100, len(values))


def test_whitespace_that_is_not_ascii_still_reads_as_blank(fam):
    """The blank test looks for a visible ASCII byte first; ideographic spaces have none, so it decodes."""
    blank = fam.tok.encode("\u3000\u3000")
    assert "empty_reasoning" in codes(fam, fam.capture(output_ids=fam.output(reasoning=blank)))
    cjk = fam.tok.encode("你好")
    assert "empty_reasoning" not in codes(fam, fam.capture(output_ids=fam.output(reasoning=cjk)))


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], (1, 5, 3)) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2
    assert first_difference([1, 2, 3], [1]) == 1
    assert first_difference([], []) is None
    assert first_difference([], [7]) == 0
    # equal lists are told by `==`; a tuple against a list takes the walk and still finds them equal
    assert first_difference([5] * 3000, [5] * 3000) is None
    assert first_difference((5, 6), [5, 6]) is None
    assert first_difference([5] * 3000, [5] * 2999 + [6]) == 2999


# -- the registry: one declaration per code ------------------------------------------------------


def test_a_new_finding_is_one_declaration(fam):
    """A code added to the registry is run by analyze and explained and ranked by what reads the registry."""

    def first_id_is_answer(ctx):
        return Hit.at("the first output id", [ctx.n_prompt])

    rule("first_id_is_answer", ERROR, "A made-up finding.")(first_id_is_answer)
    try:
        analysis = analyze(fam.capture(), fam.profile, fam.tok)
        hit = next(f for f in analysis.findings if f.code == "first_id_is_answer")
        assert hit.positions == (len(fam.prompt),)
        assert hit.severity == ERROR
        assert not analysis.valid
        assert why("first_id_is_answer") == "A made-up finding."
        assert default_severity("first_id_is_answer") == ERROR
    finally:
        RULES.pop("first_id_is_answer", None)


def test_a_code_is_declared_once_by_a_check_named_after_it():
    with pytest.raises(ValueError, match="declared twice"):
        rule("truncated", ERROR, "again")(RULES["truncated"].check)
    with pytest.raises(ValueError, match="name it after its code"):
        rule("some_new_code", WARN, "why")(RULES["truncated"].check)
    with pytest.raises(ValueError, match="unknown severity"):
        rule("some_new_code", "fatal", "why")
    assert "some_new_code" not in RULES


def test_a_hit_names_positions_unless_it_is_about_an_absence():
    with pytest.raises(ValueError, match="names positions"):
        Hit("something", ())
    with pytest.raises(ValueError, match="names positions"):
        Hit("something", (3,), absent=True)
    assert Hit.missing("no field").positions == ()
    assert Hit.at("here", [4]).positions == (4,)


def test_unknown_codes_from_a_newer_store_read_as_info_without_help():
    assert default_severity("a_code_from_the_future") == INFO
    assert why("a_code_from_the_future") == ""


def test_the_readme_table_lists_every_code_with_its_severity():
    """The README's findings table is the users' copy of the registry: it must not drift from it."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `([a-z_]+)` \| (info|warn|error)\b", readme, flags=re.MULTILINE))
    assert rows == {code: declared.severity for code, declared in RULES.items()}


@pytest.mark.parametrize("family", ["kimi", "qwen"])  # Qwen3's delimiters are added ids, not special ones
def test_literal_think_text_sees_a_spelled_marker_wherever_the_reference_buffer_does(family, request, make_capture):
    """`literal_think_text` finds markers run by run between the ids that spell no text; the reference is
    one buffer of every piece with those ids as b"\\0". Random mixes of marker fragments, specials and
    delimiters, across the prompt/output boundary too, must be judged the same way."""
    import random
    from dataclasses import replace

    from tokview.core.findings import RULES

    tok, p = request.getfixturevalue(f"{family}_tok"), request.getfixturevalue(f"{family}_profile")
    spelled = [[i for ch in text for i in tok.encode(ch)] for text in ("<think>", "</think>", "<thi", "nk>")]
    fragments = [tok.encode(t) for t in ("<", "think", ">", "</", "th", "ink", "hello", "a b c")] + spelled
    specials = [p.think_open_id, p.think_close_id, p.stop_ids[0]]
    rng = random.Random(11)

    def ids(k: int) -> list[int]:
        out: list[int] = []
        for _ in range(k):
            out += [rng.choice(specials)] if rng.random() < 0.2 else rng.choice(fragments)
        return out

    seen = {True: 0, False: 0}
    for _ in range(300):
        prompt, output = ids(rng.randrange(0, 6)), ids(rng.randrange(1, 8))
        hidden = p.delimiter_ids
        buf = b"".join(b"\x00" if t in hidden or tok.is_special(t) else tok.piece_bytes(t) for t in [*prompt, *output])
        expected = any(m.encode() in buf for m in (p.think_open, p.think_close))
        capture = replace(make_capture(), prompt_ids=prompt, output_ids=output, messages=None, usage={})
        found = any(f.code == "literal_think_text" for f in analyze(capture, p, tok).findings)
        assert found == expected, (prompt, output)
        seen[expected] += 1
    assert seen[True] > 10
    assert seen[False] > 10  # both outcomes were exercised
    assert "literal_think_text" in RULES


def test_a_reencode_made_ahead_is_what_the_drift_check_compares(kimi_tok, kimi_profile, make_capture):
    """`analyze(..., reencoded=...)` (the batch writer computes it on another thread) stands in for
    encode(decode(output)): the same ids find no drift, other ids find it where they differ."""
    from tokview.core.finding_context import reencode_output

    capture = make_capture()
    again = reencode_output(kimi_tok, capture.output_ids)
    assert again == kimi_tok.encode(kimi_tok.decode(capture.output_ids))

    def drift(**kw: Any) -> list[str]:
        found = analyze(capture, kimi_profile, kimi_tok, **kw).findings
        return [f.detail for f in found if f.code == "retokenize_drift"]

    assert drift() == drift(reencoded=again) == []
    other = [*again[:3], again[3] + 1, *again[4:]]
    (detail,) = drift(reencoded=other)
    assert "from output[3]" in detail


@pytest.mark.parametrize("reason", ["abort", "error", "content_filter"])
def test_a_generation_the_server_ended_is_an_error_and_not_also_a_missing_stop(fam, reason):
    """vLLM answers an engine abort with HTTP 200 and `finish_reason: "abort"`: it was a valid sample, trained on."""
    profile = fam.profile
    result = analyze(fam.capture(output_ids=fam.output(stop=False), finish_reason=reason), profile, fam.tok)
    assert "generation_aborted" in result.codes and "no_stop_token" not in result.codes
    assert not result.valid
    for whole in ("stop", "tool_calls"):
        assert "generation_aborted" not in analyze(fam.capture(finish_reason=whole), profile, fam.tok).codes


def test_no_finish_reason_and_no_stop_id_is_a_lost_end_not_a_whole_turn(fam):
    """A stream whose last events a gateway dropped (the chunk with `finish_reason`), then `[DONE]`: only
    `no_stop_token`'s warning said so, and the cut answer was exported as valid. An import names no reason."""
    profile = fam.profile
    cut = analyze(fam.capture(output_ids=fam.output(stop=False), finish_reason=None), profile, fam.tok)
    assert "generation_aborted" in cut.codes and "no_stop_token" not in cut.codes and not cut.valid
    assert "no finish_reason" in next(f.detail for f in cut.findings if f.code == "generation_aborted")
    ended = analyze(fam.capture(finish_reason=None), profile, fam.tok)  # the model's own end id: whole
    assert "generation_aborted" not in ended.codes and "no_stop_token" not in ended.codes
    imported = fam.capture(output_ids=fam.output(stop=False), finish_reason=None, endpoint="imported")
    assert "generation_aborted" not in analyze(imported, profile, fam.tok).codes


def _stop_string_cut(fam: Family, stop: str, *, include: bool = False) -> Capture:
    """What vLLM and SGLang answer when a request's stop string ends the answer: the ids run through the token
    that completes it, the text is cut where it begins (`include_stop_str_in_output` keeps it)."""
    answer = fam.tok.decode(fam.answer)
    cut = answer.index(stop) + (len(stop) if include else 0)
    ids = fam.answer[: next(k for k in range(1, len(fam.answer) + 1) if stop in fam.tok.decode(fam.answer[:k]))]
    return _chat_fields(fam, output_ids=fam.output(answer=ids, stop=False), content=answer[:cut], matched_stop=stop)


@pytest.mark.parametrize("stop", ["forty", "is fo", " answer"])
def test_a_requests_stop_string_makes_an_invalid_sample_and_is_not_blamed_on_the_parser(fam, stop):
    """A harness's stop string cut the answer (a few-shot separator, an observation marker): the server says
    finish_reason "stop" all the same, and the row was exported as a whole turn, its findings blaming the parser."""
    analysis = analyze(_stop_string_cut(fam, stop), fam.profile, fam.tok)
    assert not analysis.valid
    assert "stopped_by_request" in analysis.codes
    assert {"no_stop_token", "parser_split_mismatch"}.isdisjoint(analysis.codes)
    hit = next(f for f in analysis.findings if f.code == "stopped_by_request")
    assert repr(stop) in hit.detail
    kept = analyze(_stop_string_cut(fam, stop, include=True), fam.profile, fam.tok)
    assert "stopped_by_request" in kept.codes and "parser_split_mismatch" not in kept.codes


def test_a_stop_id_is_the_requests_only_when_the_request_listed_it_and_it_is_none_of_the_models(fam):
    asked = {"thinking": True, "stop_token_ids": [fam.answer[0], fam.p.stop_ids[0]]}
    out = fam.output(stop=False) + [fam.answer[0]]
    assert "stopped_by_request" in codes(fam, fam.capture(output_ids=out, matched_stop=fam.answer[0], settings=asked))
    for own in fam.p.stop_ids:  # SGLang's matched_stop and vLLM's stop_reason name the model's own end too
        assert "stopped_by_request" not in codes(fam, fam.capture(matched_stop=own, settings=asked))
    # an end id of the generation config the profile does not list (a folder without generation_config.json): the
    # servers name it all the same, and no request asked for it (a whole batch run was made invalid)
    unlisted = fam.capture(output_ids=out, matched_stop=fam.answer[0])
    assert "stopped_by_request" not in codes(fam, unlisted)


def test_a_split_cut_in_the_middle_of_a_character_is_not_a_parser_mismatch(qwen_tok, qwen_profile):
    """A cut-off output whose last ids are half a character: the server holds those bytes back from the text, the
    ids' decode ends in U+FFFD, and the split was reported as the parser's mismatch."""
    prompt = qwen_tok.render(QUESTION, template_kwargs={"enable_thinking": True}) + [qwen_profile.think_open_id]
    emoji = qwen_tok.encode(" 🎉")
    assert qwen_tok.decode(emoji[:-1]).endswith("\ufffd")
    answer = qwen_tok.encode("\n\nans") + emoji[:-1]
    capture = Capture(
        prompt_ids=prompt,
        output_ids=qwen_tok.encode("\nhm\n") + [qwen_profile.think_close_id] + answer,
        finish_reason="length",
        endpoint="vllm-chat",
        reasoning="hm",
        content="\n\nans",
        reasoning_field="reasoning",
        settings={"thinking": True},
    )
    codes_ = analyze(capture, qwen_profile, qwen_tok).codes
    assert "truncated" in codes_ and "parser_split_mismatch" not in codes_
    other = dataclasses.replace(capture, content="\n\nanswer")
    assert "parser_split_mismatch" in analyze(other, qwen_profile, qwen_tok).codes


def test_a_newline_after_the_stop_is_template_glue_not_ids_past_the_stop(fam):
    """SpecForge's ChatML end of turn is `<|im_end|>\\n`, supervised whole: every row of such a dataset was invalid.
    Only whitespace after the stop is glue (`no_stop_token` warns of it); a second turn after it is not."""
    newline = fam.tok.encode("\n")
    glued = analyze(fam.capture(output_ids=fam.output() + newline), fam.profile, fam.tok)
    assert "output_past_stop" not in glued.codes and "no_stop_token" in glued.codes
    more = analyze(fam.capture(output_ids=fam.output() + newline + fam.answer), fam.profile, fam.tok)
    assert "output_past_stop" in more.codes


def test_an_echoed_prompt_tail_holding_its_stop_is_said_once_as_the_echo(fam):
    """SGLang #17240 echoes the prompt's tail into the output: a tail holding the prompt's `<|im_end|>` was also
    called ids past a stop, with the wrong cause."""
    end = max(k for k, t in enumerate(fam.prompt) if t in fam.p.stop_ids)  # the user turn's end
    tail = fam.prompt[end - 2 :]
    analysis = analyze(
        fam.capture(output_ids=tail + fam.output(), usage={"completion_tokens": len(fam.output())}),
        fam.profile,
        fam.tok,
    )
    assert "output_prefix_overlap" in analysis.codes and "output_past_stop" not in analysis.codes
    # a stop past the echoed tail is still the output's own: said
    tail = fam.prompt[-3:]
    out = tail + fam.output() + fam.answer + [fam.p.stop_ids[0]]
    both = analyze(fam.capture(output_ids=out, usage={"completion_tokens": len(out) - 3}), fam.profile, fam.tok)
    assert {"output_prefix_overlap", "output_past_stop"} <= set(both.codes)
