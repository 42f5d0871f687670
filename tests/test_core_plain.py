"""The plain profile: chat models without think tokens (SmolLM, Llama, Qwen2.5, a reasoning model run
with thinking off) load with no --profile, segment as prompt → answer → stop, and get every finding
except the think ones. Built on a real plain tokenizer folder made offline (plain_tokenizer.py).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from plain_tokenizer import ENDOFTEXT, IM_END, build_plain_tokenizer_dir
from test_chain_findings import CHAIN_CASES
from test_harmony_findings import HARMONY_CASES
from test_tool_calls import TOOL_CODES

from tokview.core import segments as seg
from tokview.core.analysis import analyze
from tokview.core.findings import FINDING_CODES, default_severity
from tokview.core.profiles import (
    BUILTIN_PROFILES,
    ModelProfile,
    ProfileError,
    detect_profile,
    get_profile,
    load_profile_toml,
    tokenizer_stop_ids,
    with_tokenizer_stops,
)
from tokview.core.record import Capture
from tokview.core.resolve import load_tokenizer_and_profile, resolve_for_stored
from tokview.core.tokenizer import TokenizerAdapter, load_tokenizer

QUESTION = [{"role": "user", "content": "What is 6 times 7?"}]
QUOTED = [{"role": "user", "content": "Why does my template end with <|im_end|> here?"}]
ANSWER = "The answer is forty-two."
THINK_CODES = {
    "think_open_in_prompt",
    "think_open_missing",
    "think_close_missing",
    "think_close_repeated",
    "think_open_in_output_after_prefill",
    "empty_reasoning",
    "reasoning_with_thinking_off",
    "reasoning_field_missing",
    "literal_think_text",
}


@pytest.fixture(scope="module")
def plain_dir(tmp_path_factory) -> Path:
    return build_plain_tokenizer_dir(tmp_path_factory.mktemp("plain-tok"))


@pytest.fixture(scope="module")
def plain_tok(plain_dir):
    return load_tokenizer(plain_dir)


@pytest.fixture(scope="module")
def plain(plain_tok):
    return detect_profile(plain_tok)


# -- loading ---------------------------------------------------------------------------------------


def test_a_tokenizer_without_think_tokens_gets_the_plain_profile(plain_tok, plain):
    assert plain.name == "plain"
    assert not plain.has_reasoning
    assert plain.think_open_id is None
    assert plain.think_close_id is None
    assert plain.delimiter_ids == frozenset()
    # eos first, then what generation_config.json adds (servers stop on both)
    assert plain.stop_ids == (IM_END, ENDOFTEXT)
    assert plain.template_kwargs(True) == {}
    assert plain.template_kwargs(False) == {}
    assert plain.max_length == 2048


def test_stop_ids_come_from_eos_and_generation_config(plain_dir, plain_tok, tmp_path):
    assert tokenizer_stop_ids(plain_tok) == (IM_END, ENDOFTEXT)
    copy = tmp_path / "tok"
    copy.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (copy / name).write_bytes((plain_dir / name).read_bytes())
    assert tokenizer_stop_ids(load_tokenizer(copy)) == (IM_END,)  # no generation_config.json: eos only
    (copy / "generation_config.json").write_text("{not json")
    assert tokenizer_stop_ids(load_tokenizer(copy)) == (IM_END,)  # unreadable: eos only, no crash
    (copy / "generation_config.json").write_text(json.dumps({"eos_token_id": 0}))
    assert tokenizer_stop_ids(load_tokenizer(copy)) == (IM_END, ENDOFTEXT)


def test_plain_by_name_takes_the_tokenizers_stops_wherever_it_is_resolved(plain_dir, plain_tok):
    assert BUILTIN_PROFILES["plain"].stop_ids == ()
    _, named = load_tokenizer_and_profile(plain_dir, "plain")
    assert named.stop_ids == (IM_END, ENDOFTEXT)
    _, detected = load_tokenizer_and_profile(plain_dir)
    assert detected.name == "plain"
    assert detected.stop_ids == (IM_END, ENDOFTEXT)
    # a stored run recorded "plain": re-analysed with the tokenizer's stops
    _, stored = resolve_for_stored(None, None, recorded_tokenizer_dir=str(plain_dir), recorded_profile="plain")
    assert stored.stop_ids == (IM_END, ENDOFTEXT)
    # a reasoning profile keeps its own (even empty) stops
    assert with_tokenizer_stops(get_profile("qwen3").with_overrides(stop_ids=()), plain_tok).stop_ids == ()


def test_reasoning_false_in_a_profile_file(tmp_path, plain_tok):
    only_name = tmp_path / "smol.toml"
    only_name.write_text('name = "smollm2"\nreasoning = false\n')
    p = load_profile_toml(only_name)
    assert (p.name, p.has_reasoning, p.stop_ids, p.thinking_kwarg) == ("smollm2", False, (), None)
    assert with_tokenizer_stops(p, plain_tok).stop_ids == (IM_END, ENDOFTEXT)

    with_stops = tmp_path / "llama.toml"
    with_stops.write_text('[profile]\nname = "llama3"\nreasoning = false\nstop_ids = [128009, 128001]\n')
    assert get_profile(str(with_stops)).stop_ids == (128009, 128001)

    # a reasoning family's tokenizer, served as a plain model: its delimiters are dropped, its stops kept
    off = tmp_path / "qwen-plain.toml"
    off.write_text('base = "qwen3"\nname = "qwen3-plain"\nreasoning = false\n')
    q = load_profile_toml(off)
    assert not q.has_reasoning
    assert q.stop_ids == (151645, 151643)
    assert q.reasoning_parser is None


@pytest.mark.parametrize(
    "text, message",
    [
        ('name = "x"\nreasoning = "no"\n', "reasoning must be true or false"),
        ('name = "x"\nreasoning = false\nthink_open_id = 5\n', "names think delimiters"),
        ("reasoning = false\n", "missing keys ['name']"),
        ('base = "plain"\nreasoning = true\n', "reasoning = true needs think_open_id"),
        ('name = "x"\nstop_ids = [1]\n', "reasoning = false for a model without think delimiters"),
        ('profile = "qwen3"\n', "[profile] must be a table of keys, not str"),
    ],
)
def test_profile_file_mistakes_are_one_line_errors(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ProfileError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_profile_toml(path)


def test_plain_aliases():
    assert get_profile("plain") is get_profile("none") is BUILTIN_PROFILES["plain"]


# -- segments and findings ---------------------------------------------------------------------------


@dataclasses.dataclass
class Plain:
    tok: TokenizerAdapter
    profile: ModelProfile

    @property
    def prompt(self) -> list[int]:
        return self.tok.render(QUESTION)

    @property
    def answer(self) -> list[int]:
        return self.tok.encode(ANSWER)

    def output(self, answer=None, stop=True) -> list[int]:
        return list(self.answer if answer is None else answer) + ([IM_END] if stop else [])

    def capture(self, **changes) -> Capture:
        out = changes.pop("output_ids") if "output_ids" in changes else self.output()
        base: dict[str, Any] = dict(
            prompt_ids=self.prompt,
            output_ids=out,
            finish_reason="stop",
            endpoint="vllm-completions",
            settings={"max_new_tokens": 256},
            messages=QUESTION,
            usage={"prompt_tokens": len(self.prompt), "completion_tokens": len(out)},
        )
        base.update(changes)
        return Capture(**base)

    def chat(self, **changes) -> Capture:
        return self.capture(
            **{"endpoint": "vllm-chat", "content": ANSWER, "reasoning": None, "reasoning_field": None, **changes}
        )


@pytest.fixture(scope="module")
def fam(plain_tok, plain) -> Plain:
    return Plain(plain_tok, plain)


def _chars(fam: Plain) -> list[int]:
    return fam.output(answer=[i for ch in ANSWER for i in fam.tok.encode(ch)])


CASES = {
    "empty_output": (lambda f: f.capture(output_ids=[], usage={}), lambda f: f.capture()),
    "unknown_token_id": (lambda f: f.capture(output_ids=f.output(answer=[f.tok.vocab_size])), lambda f: f.capture()),
    "dual_divergence": (
        lambda f: f.chat(endpoint="dual", parsed_output_ids=f.output(answer=f.answer * 2)),
        lambda f: f.chat(endpoint="dual", parsed_output_ids=f.output()),
    ),
    "empty_answer": (lambda f: f.capture(output_ids=f.output(answer=f.tok.encode(" \n"))), lambda f: f.capture()),
    "truncated": (lambda f: f.capture(output_ids=f.output(stop=False), finish_reason="length"), lambda f: f.capture()),
    "generation_aborted": (
        lambda f: f.capture(output_ids=f.output(stop=False), finish_reason="abort"),
        lambda f: f.capture(),
    ),
    "no_stop_token": (lambda f: f.capture(output_ids=f.output(stop=False)), lambda f: f.capture()),
    "stopped_by_request": (
        lambda f: f.capture(output_ids=f.output(stop=False), matched_stop="answer"),
        lambda f: f.capture(output_ids=f.output(stop=False) + [ENDOFTEXT], matched_stop=ENDOFTEXT),
    ),
    "output_past_stop": (lambda f: f.capture(output_ids=f.output() + f.output()), lambda f: f.capture()),
    "output_prefix_overlap": (
        lambda f: f.capture(output_ids=f.prompt[-5:] + f.output(), usage={"completion_tokens": len(f.output())}),
        lambda f: f.capture(),
    ),
    "completion_count_mismatch": (lambda f: f.capture(usage={"completion_tokens": 3}), lambda f: f.capture()),
    "parser_hidden_ids": (lambda f: f.chat(), lambda f: f.capture(text=f.tok.decode(f.output()))),
    "parser_split_mismatch": (
        lambda f: f.chat(reasoning="I think it is 42.", reasoning_field="reasoning"),
        lambda f: f.chat(),
    ),
    "retokenize_drift": (lambda f: f.capture(output_ids=_chars(f)), lambda f: f.capture()),
    "prompt_render_mismatch": (
        lambda f: f.capture(messages=[{"role": "user", "content": "What is 6 times 8?"}]),
        lambda f: f.capture(),
    ),
    "over_max_length": (lambda f: f.capture(settings={"max_model_len": 20}), lambda f: f.capture()),
    "control_text_in_messages": (
        lambda f: f.capture(prompt_ids=f.tok.render(QUOTED), messages=QUOTED),
        lambda f: f.capture(),
    ),
    "off_policy": (
        lambda f: f.capture(target_logprobs=[-3.0] * len(f.output()), target_score={"off_policy_nll": 2.0}),
        lambda f: f.capture(target_logprobs=[-0.3] * len(f.output()), target_score={"off_policy_nll": 2.0}),
    ),
}


def test_cases_cover_every_code_but_the_think_ones():
    assert set(CASES) == set(FINDING_CODES) - THINK_CODES - TOOL_CODES - set(HARMONY_CASES) - set(CHAIN_CASES)


def test_a_plain_sample_is_prompt_answer_stop_and_valid(fam):
    cap = fam.capture()
    analysis = analyze(cap, fam.profile, fam.tok)
    n = len(cap.prompt_ids)
    assert [(s.kind, s.start, s.end) for s in analysis.segments] == [
        (seg.PROMPT, 0, n),
        (seg.ANSWER, n, n + len(fam.answer)),
        (seg.STOP, n + len(fam.answer), n + len(fam.answer) + 1),
    ]
    assert analysis.codes == []
    assert analysis.valid
    assert analysis.loss_mask == (0,) * n + (1,) * (len(fam.answer) + 1)


def test_the_generation_configs_extra_stop_is_a_stop(fam):
    out = fam.output(stop=False) + [ENDOFTEXT]
    analysis = analyze(fam.capture(output_ids=out), fam.profile, fam.tok)
    assert analysis.kinds[-1] == seg.STOP
    assert analysis.valid
    assert analysis.codes == []


@pytest.mark.parametrize("code", sorted(CASES))
def test_positive(fam, code):
    analysis = analyze(CASES[code][0](fam), fam.profile, fam.tok)
    hits = [f for f in analysis.findings if f.code == code]
    assert hits, f"{code} not found; got {analysis.codes}"
    assert hits[0].severity == default_severity(code)


@pytest.mark.parametrize("code", sorted(CASES))
def test_negative(fam, code):
    assert code not in analyze(CASES[code][1](fam), fam.profile, fam.tok).codes


def test_think_findings_never_fire_on_a_plain_model(fam):
    """Every positive case above, plus outputs that spell <think>/</think> as text and a thinking-off run."""
    literal = fam.tok.encode("<think>I wonder</think>") + fam.output()
    captures = [make(fam) for make, _ in CASES.values()] + [
        fam.capture(output_ids=literal),
        fam.capture(settings={"thinking": False}),
        fam.capture(settings={"thinking": True}),
        fam.chat(reasoning="", reasoning_field="reasoning"),
    ]
    for cap in captures:
        for thinking in (None, True, False):
            cap.settings["thinking"] = thinking
            fired = set(analyze(cap, fam.profile, fam.tok).codes) & THINK_CODES
            assert not fired, (fired, cap.output_ids)
    assert analyze(fam.capture(output_ids=literal), fam.profile, fam.tok).valid


def test_plain_output_segments_without_a_tokenizer(plain):
    prompt, out = [1, 50, 60, 2, 1, 70], [80, 81, 82, IM_END]
    assert seg.token_kinds(prompt, out, plain) == [seg.PROMPT] * 6 + [seg.ANSWER] * 3 + [seg.STOP]
    assert not seg.prompt_opens_reasoning(prompt, plain)
    assert seg.prefilled_opener_position(prompt, plain) is None


# -- a reasoning model run with thinking off keeps its profile ------------------------------------------


def test_thinking_off_keeps_the_reasoning_profile_and_checks_for_no_reasoning(qwen_tok, qwen_profile):
    prompt = qwen_tok.render(QUESTION, template_kwargs=qwen_profile.template_kwargs(False))
    assert seg.prompt_opens_reasoning(prompt, qwen_profile) is False  # the template closed reasoning
    answer = qwen_tok.encode(ANSWER) + [qwen_profile.stop_ids[0]]
    settings = {"thinking": False, "chat_template_kwargs": {"enable_thinking": False}}
    clean = analyze(
        Capture(prompt_ids=prompt, output_ids=answer, finish_reason="stop", messages=QUESTION, settings=settings),
        qwen_profile,
        qwen_tok,
    )
    assert clean.valid
    assert clean.codes == []
    assert {s.kind for s in clean.segments} == {seg.PROMPT, seg.ANSWER, seg.STOP}

    reasoned = [qwen_profile.think_open_id] + qwen_tok.encode("Hmm.") + [qwen_profile.think_close_id] + answer
    bad = analyze(
        Capture(prompt_ids=prompt, output_ids=reasoned, finish_reason="stop", messages=QUESTION, settings=settings),
        qwen_profile,
        qwen_tok,
    )
    hit = next(f for f in bad.findings if f.code == "reasoning_with_thinking_off")
    assert not bad.valid
    assert hit.positions == (len(prompt), len(prompt) + 3)
    assert "151667" in hit.detail
    # the same ids with thinking on are a normal sample
    on = analyze(
        Capture(prompt_ids=prompt, output_ids=reasoned, finish_reason="stop", settings={"thinking": True}),
        qwen_profile,
        qwen_tok,
    )
    assert "reasoning_with_thinking_off" not in on.codes
