"""Harmony (gpt-oss) on ids: messages, channels and headers, segment kinds, and each Harmony finding on
its case and on nothing clean, on the real o200k_harmony tokenizer (tests/test_harmony_tokenizer.py builds
it offline; skipped with the reason when js-tiktoken's ranks are not on this machine).

`HARMONY_CASES` has the shape of test_findings.CASES (positive, negative, exact positions), given a
`HarmonyFamily` instead of a think-tag family."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from tokview.core import gpt_oss_tokenizer as g
from tokview.core import segments as seg
from tokview.core.analysis import analyze
from tokview.core.findings import ERROR, RULES, default_severity
from tokview.core.harmony import CALL, END, RETURN, parse_harmony
from tokview.core.profiles import HARMONY, get_profile
from tokview.core.record import Capture

QUESTION = [{"role": "user", "content": "What is 6 times 7?"}]
CLEAN = "<|channel|>analysis<|message|>Six sevens.<|end|><|start|>assistant<|channel|>final<|message|>42.<|return|>"
CALLING = (
    "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
    'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>'
)


CALLING_IN_ROLE = (  # the recipient in the role
    "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant to=functions.get_weather"
    '<|channel|>commentary <|constrain|>json<|message|>{"city": "Paris"}<|call|>'
)
CALLING_AS_TEMPLATED = (  # as gpt-oss's own chat template renders a call in history: the content type, no constrain
    "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant to=functions.get_weather"
    '<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>'
)


@pytest.fixture(scope="module")
def oss_tok():
    from tokview.core.tokenizer import load_tokenizer

    try:
        return load_tokenizer(g.gpt_oss_tokenizer_dir())
    except g.GptOssDataError as exc:
        pytest.skip(f"no o200k ranks on this machine (npm pack js-tiktoken into ~/.cache/tokview): {exc}")


@dataclasses.dataclass
class HarmonyFamily:
    tok: Any
    profile: Any
    prompt: list[int]

    def ids(self, text: str) -> list[int]:
        return self.tok.encode(text)

    def capture(self, text: str = CLEAN, **changes: Any) -> Capture:
        out = self.ids(text)
        base: dict[str, Any] = dict(
            prompt_ids=list(self.prompt),
            output_ids=out,
            finish_reason="stop",
            endpoint="sglang-generate",
            settings={"max_new_tokens": 256, "chat_template_kwargs": {"current_date": "2026-01-01"}},
            messages=QUESTION,
            usage={"prompt_tokens": len(self.prompt), "completion_tokens": len(out)},
        )
        base.update(changes)
        return Capture(**base)

    def at(self, c: Capture, token_id: int, nth: int = 0) -> int:
        """The absolute position of the nth occurrence of an id in the output."""
        found = [i for i, t in enumerate(c.output_ids) if t == token_id]
        return len(c.prompt_ids) + found[nth]


@pytest.fixture(scope="module")
def hfam(oss_tok) -> HarmonyFamily:
    prompt = oss_tok.render(QUESTION, template_kwargs={"current_date": "2026-01-01"})
    return HarmonyFamily(oss_tok, get_profile("gpt-oss"), prompt)


@dataclasses.dataclass
class HarmonyCase:
    positive: Callable[[HarmonyFamily], Capture]
    negative: Callable[[HarmonyFamily], Capture]
    positions: Callable[[HarmonyFamily, Capture], tuple[int, ...]]


CHANNEL = 200005
CONSTRAIN = 200003
MESSAGE = 200008
NO_CHANNEL = "<|channel|>analysis<|message|>Six sevens.<|end|><|start|>assistant<|message|>42.<|return|>"
CONSTRAIN_FOR_START = "<|channel|>analysis<|message|>Six sevens.<|end|><|constrain|>json<|message|>42.<|return|>"
AFTER_FINAL = (
    "<|channel|>final<|message|>42.<|end|><|start|>assistant<|channel|>analysis<|message|>Hmm.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>42.<|return|>"
)
RECIPIENT_ON_ANALYSIS = '<|channel|>analysis to=functions.get_weather<|message|>{"city": "Paris"}<|call|>'
BAD_JSON = CALLING.replace('{"city": "Paris"}', '{"city": Paris}')
FINAL_ENDS_END = CLEAN.replace("<|return|>", "<|end|>")


def _served_on(f: HarmonyFamily, day: str) -> list[int]:
    """The prompt a server that stamps its own date (not the recorded 2026-01-01) serves."""
    return f.tok.render(QUESTION, template_kwargs={"current_date": day})


def _first_change(a: list[int], b: list[int]) -> int:
    return next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)


def _chat(f: HarmonyFamily, text: str = CLEAN, reasoning: str = "Six sevens.", content: str = "42.") -> Capture:
    return f.capture(text, endpoint="vllm-chat", reasoning=reasoning, content=content, reasoning_field="reasoning")


HARMONY_CASES = {
    "harmony_malformed_header": HarmonyCase(
        lambda f: f.capture(NO_CHANNEL),
        lambda f: f.capture(CALLING),
        lambda f, c: (f.at(c, MESSAGE, 1),),  # the <|message|> the second header reached without a channel
    ),
    "harmony_no_final": HarmonyCase(
        lambda f: f.capture("<|channel|>analysis<|message|>Six sevens.<|end|>"),
        lambda f: f.capture(CALLING),  # a turn that calls a tool answers later
        lambda f, c: (),
    ),
    "harmony_analysis_after_final": HarmonyCase(
        lambda f: f.capture(AFTER_FINAL),
        lambda f: f.capture(),
        lambda f, c: (f.at(c, CHANNEL, 1),),
    ),
    "harmony_recipient_on_analysis": HarmonyCase(
        lambda f: f.capture(RECIPIENT_ON_ANALYSIS),
        lambda f: f.capture(CALLING),
        lambda f, c: (len(c.prompt_ids),),
    ),
    "harmony_tool_json_invalid": HarmonyCase(
        lambda f: f.capture(BAD_JSON),
        lambda f: f.capture(CALLING),
        lambda f, c: (f.at(c, MESSAGE, 1) + 1,),  # the arguments' first id
    ),
    "harmony_wrong_end_token": HarmonyCase(
        lambda f: f.capture(FINAL_ENDS_END),
        lambda f: f.capture(CALLING),
        lambda f, c: (f.at(c, END, 1),),
    ),
    "prompt_date_mismatch": HarmonyCase(  # any date-stamping template; gpt-oss's is the one that matters
        lambda f: f.capture(prompt_ids=_served_on(f, "2026-01-02")),
        lambda f: f.capture(),
        lambda f, c: (_first_change(f.prompt, c.prompt_ids),),
    ),
    "harmony_split_mismatch": HarmonyCase(
        lambda f: _chat(f, reasoning="", content="Six sevens.42."),
        lambda f: _chat(f),
        lambda f, c: (f.at(c, CHANNEL, 1),),
    ),
}


def test_every_harmony_code_is_registered_and_has_a_case():
    assert {code for code in RULES if code.startswith("harmony_")} | {"prompt_date_mismatch"} == set(HARMONY_CASES)


@pytest.mark.parametrize("code", sorted(HARMONY_CASES))
def test_harmony_positive(hfam, code):
    case = HARMONY_CASES[code]
    capture = case.positive(hfam)
    analysis = analyze(capture, hfam.profile, hfam.tok)
    hits = [f for f in analysis.findings if f.code == code]
    assert len(hits) == 1, f"{code} not found once; got {analysis.codes}"
    assert hits[0].severity == default_severity(code)
    assert hits[0].detail
    assert hits[0].positions == case.positions(hfam, capture)
    if default_severity(code) == ERROR:
        assert not analysis.valid


@pytest.mark.parametrize("code", sorted(HARMONY_CASES))
def test_harmony_negative(hfam, code):
    assert code not in analyze(HARMONY_CASES[code].negative(hfam), hfam.profile, hfam.tok).codes


@pytest.mark.parametrize("text", [CLEAN, CALLING, CALLING_IN_ROLE, CALLING_AS_TEMPLATED])
def test_a_clean_harmony_turn_has_no_findings(hfam, text):
    assert analyze(hfam.capture(text), hfam.profile, hfam.tok).codes == []
    chat = analyze(_chat(hfam, text) if text == CLEAN else hfam.capture(text), hfam.profile, hfam.tok).codes
    assert [c for c in chat if c != "parser_hidden_ids"] == []  # the headers and end ids are hidden: info only


def test_harmony_codes_never_fire_on_think_tag_samples(kimi_tok, kimi_profile, make_capture):
    codes = analyze(make_capture(), kimi_profile, kimi_tok).codes
    assert not [c for c in codes if c.startswith("harmony_")]


def test_messages_channels_recipient_constraint_and_end_tokens(hfam):
    out = hfam.ids(CALLING)
    first, call = parse_harmony(out, hfam.tok)
    assert (first.channel, first.end_id, first.recipient, first.problems) == ("analysis", END, None, [])
    assert (call.channel, call.recipient, call.constraint, call.end_id) == (
        "commentary",
        "functions.get_weather",
        "json",
        CALL,
    )
    assert hfam.tok.decode(out[call.body[0] : call.body[1]]) == '{"city": "Paris"}'
    (a, f) = parse_harmony(hfam.ids(CLEAN))
    assert (a.channel, f.channel, f.end_id) == ("analysis", "final", RETURN)


def test_segment_kinds_follow_the_channels(hfam):
    c = hfam.capture()
    analysis = analyze(c, hfam.profile, hfam.tok)
    kinds = [s.kind for s in analysis.segments]
    assert kinds == [
        seg.PROMPT,
        seg.HARMONY_HEADER,
        seg.ANALYSIS,
        seg.MESSAGE_END,
        seg.HARMONY_HEADER,
        seg.FINAL,
        seg.STOP,
    ]
    final = next(s for s in analysis.segments if s.kind == seg.FINAL)
    ids = [*c.prompt_ids, *c.output_ids]
    assert hfam.tok.decode(ids[final.start : final.end]) == "42."
    assert set(seg.HARMONY_KINDS) <= set(seg.SEGMENT_KINDS)


def test_gpt_oss_profile_is_detected_from_the_tokenizer(oss_tok):
    from tokview.core.profiles import detect_profile

    p = detect_profile(oss_tok)
    assert (p.name, p.format, p.has_reasoning, p.effort_kwarg) == ("gpt-oss", HARMONY, False, "reasoning_effort")
    assert set(p.stop_ids) >= {RETURN, CALL}


@pytest.mark.parametrize(
    ("text", "problem", "at"),
    [
        (CONSTRAIN_FOR_START, "<|constrain|> where <|start|> is expected", (CONSTRAIN, 0)),
        (CLEAN.replace("<|start|>", "<|call|>", 1), "<|call|> where <|start|> is expected", (CALL, 0)),
        ("<|channel|>final 42.<|return|>", "no <|message|>", (RETURN, 0)),
        ("<|channel|>thoughts<|message|>42.<|return|>", "a channel name Harmony does not have", (CHANNEL, 0)),
        (
            "<|constrain|>json<|channel|>final<|message|>42.<|return|>",
            "<|constrain|> before the channel",
            (CONSTRAIN, 0),
        ),
        (
            "<|channel|>analysis<|message|>Six sevens.<|start|>assistant<|channel|>final<|message|>42.<|return|>",
            "no end token before <|start|>",
            (200006, 0),
        ),
    ],
)
def test_each_malformed_header_is_named_where_it_is(hfam, text, problem, at):
    c = hfam.capture(text)
    hits = [f for f in analyze(c, hfam.profile, hfam.tok).findings if f.code == "harmony_malformed_header"]
    assert len(hits) == 1, hits
    assert problem in hits[0].detail, hits
    assert hfam.at(c, *at) in hits[0].positions


def test_any_id_sequence_parses_and_its_kinds_partition_the_ids(hfam):
    """Random mixes of Harmony specials and text: the reader never loops or raises, every id gets one kind,
    and the runs read at `run_starts` are those `groupby` finds."""
    import random

    from tokview.core.harmony import CHANNEL_IDS

    rng = random.Random(28)
    pool = [[200002], [200003], [200005], [200006], [200007], [200008], [200012], [316, 28], [13], [4108]]
    pool += [list(v) for v in CHANNEL_IDS.values()]
    for _ in range(400):
        out = [i for _ in range(rng.randrange(0, 14)) for i in rng.choice(pool)]
        prompt = hfam.prompt[-3:]
        kinds = seg.token_kinds(prompt, out, hfam.profile)
        assert len(kinds) == len(prompt) + len(out)
        starts = seg.run_starts(prompt, len(out), hfam.profile, seg.delimiter_positions(out, hfam.profile))
        assert seg.segments_from_kinds(kinds, len(prompt), starts) == seg.segments_from_kinds(kinds, len(prompt))
        analyze(hfam.capture(hfam.tok.decode(out)), hfam.profile, hfam.tok)


def test_a_call_whose_arguments_nest_past_pythons_json_is_not_judged_and_fails_nothing(hfam):
    """A call's arguments nested deeper than Python's json reads raised RecursionError out of the analysis (a batch
    exited 70 on such a sample). They are now not judged: no `harmony_tool_json_invalid`, and the rest of the
    analysis stands."""
    deep = "[" * 100_000 + "]" * 100_000
    text = CALLING.replace('{"city": "Paris"}', deep)
    analysis = analyze(hfam.capture(text), hfam.profile, hfam.tok)
    assert "harmony_tool_json_invalid" not in analysis.codes
    assert analysis.segments  # analysed to the end


def test_a_recipient_in_the_role_is_read_as_the_call_it_is(hfam):
    """`<|start|>assistant to=functions.f<|channel|>commentary …<|call|>` (the template's history form) is a call:
    read as text, it was a commentary message that ended with the wrong token and whose JSON went unchecked."""
    out = hfam.ids(CALLING_IN_ROLE)
    _, call = parse_harmony(out, hfam.tok)
    assert (call.channel, call.recipient, call.constraint, call.end_id) == (
        "commentary",
        "functions.get_weather",
        "json",
        CALL,
    )
    broken = analyze(hfam.capture(CALLING_IN_ROLE.replace('"Paris"}', '"Par')), hfam.profile, hfam.tok)
    assert "harmony_tool_json_invalid" in broken.codes
    assert "harmony_wrong_end_token" not in broken.codes


def test_a_builtin_tools_call_names_the_tool_not_its_content_type_and_is_no_function_call(hfam):
    """`analysis to=python code`: the recipient is python (` code` is the content type); vLLM's tool parser takes
    only `functions.…` recipients, so it is no function call (it was exported as a call named "python code")."""
    from tokview.core.harmony import calls_of

    text = "<|channel|>analysis to=python code<|message|>print(6*7)<|call|>"
    [call] = parse_harmony(hfam.ids(text), hfam.tok)
    assert (call.channel, call.recipient, call.end_id) == ("analysis", "python", CALL)
    assert calls_of([call]) == []
    builtin = analyze(
        hfam.capture(text + "<|start|>assistant<|channel|>final<|message|>42.<|return|>"), hfam.profile, hfam.tok
    )
    assert "harmony_recipient_on_analysis" not in builtin.codes  # built-in tools are called on the analysis channel
    assert calls_of(parse_harmony(hfam.ids(CALLING_AS_TEMPLATED), hfam.tok))[0].recipient == "functions.get_weather"


def _codes(fam: HarmonyFamily, c: Capture) -> dict[str, Any]:
    return {f.code: f for f in analyze(c, fam.profile, fam.tok).findings}


@pytest.mark.parametrize("body", ["", "   "])
def test_an_empty_final_message_is_no_answer(hfam, body):
    """A final header and nothing after it passed as valid: a drafter would learn to stop right after it."""
    text = (
        f"<|channel|>analysis<|message|>Six sevens.<|end|><|start|>assistant<|channel|>final<|message|>{body}<|return|>"
    )
    c = hfam.capture(text)
    found = _codes(hfam, c)["harmony_no_final"]
    assert found.severity == ERROR and "is empty" in found.detail
    assert found.positions == (hfam.at(c, RETURN),)
    assert "harmony_no_final" not in _codes(hfam, hfam.capture())


def test_a_python_tool_call_is_code_not_json(hfam):
    """gpt-oss's built-in python tool takes code: every code-interpreter sample was invalid (harmony_tool_json_invalid)."""
    code = "<|channel|>analysis<|message|>Run it.<|end|><|start|>assistant<|channel|>analysis to=python code<|message|>print(6*7)<|call|>"
    assert "harmony_tool_json_invalid" not in _codes(hfam, hfam.capture(code))
    browser = code.replace("to=python code", "to=browser.search code")
    assert "harmony_tool_json_invalid" in _codes(hfam, hfam.capture(browser))  # a browser call's arguments are JSON


def test_a_whole_turn_that_says_length_at_its_last_id_is_judged_whole(hfam):
    """SGLang checks the length before the stop id: a final ending <|return|> as the last allowed id says length."""
    c = hfam.capture(finish_reason="length")
    assert c.output_ids[-1] == RETURN
    assert _codes(hfam, c) == {}


PREAMBLE = (
    "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary<|message|>"
    "Let me look that up.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Paris"}<|call|>'
)
"""A commentary preamble before a call: vLLM's Harmony parser returns it as content."""


def test_a_commentary_preamble_is_content_as_vllm_reads_it_in_findings_and_text_exports(hfam) -> None:
    """The preamble was read as nothing: a text export's assistant turn dropped it, and a server's content holding it
    read as a parser that split the channels wrong. An analysis message to a function is a call, not reasoning."""
    from tokview.export.formats import texts_from_ids

    served = _chat(hfam, PREAMBLE, reasoning="Need the weather.", content="Let me look that up.")
    assert "harmony_split_mismatch" not in analyze(served, hfam.profile, hfam.tok).codes
    texts = texts_from_ids(served, hfam.profile, hfam.tok)
    assert (texts.reasoning, texts.content) == ("Need the weather.", "Let me look that up.")
    twice = AFTER_FINAL.replace("<|channel|>final<|message|>42.<|end|>", "<|channel|>final<|message|>41.<|end|>")
    for glue in ("\n", ""):  # vLLM joins a side's messages by a newline, SGLang and the simulator by nothing
        joined = _chat(hfam, twice, reasoning="Hmm.", content=glue.join(["41.", "42."]))
        assert "harmony_split_mismatch" not in analyze(joined, hfam.profile, hfam.tok).codes, glue
    to_function = _chat(hfam, RECIPIENT_ON_ANALYSIS, reasoning="", content="")
    assert "harmony_split_mismatch" not in analyze(to_function, hfam.profile, hfam.tok).codes


def test_call_arguments_the_server_read_whole_or_that_are_no_object_are_said_so(hfam) -> None:
    """A stream that lost ids left a call's arguments broken on the ids while the server returned it whole: the
    finding blamed the server's tool parser. Arguments that are JSON but no object (`[1, 2]`) were said nothing of."""
    returned = [{"id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'}]
    served = hfam.capture(
        BAD_JSON, endpoint="vllm-chat", reasoning="Need the weather.", content="", tool_calls=returned
    )
    lost = analyze(served, hfam.profile, hfam.tok)
    hit = next(f for f in lost.findings if f.code == "harmony_tool_json_invalid")
    assert "Yet the server returned this call" in hit.detail and "drops or rejects" not in hit.detail
    array = analyze(hfam.capture(CALLING.replace('{"city": "Paris"}', "[1, 2]")), hfam.profile, hfam.tok)
    hit = next(f for f in array.findings if f.code == "harmony_tool_json_invalid")
    assert hit.severity == "warn" and "not an object (list" in hit.detail


def test_a_later_broken_call_is_an_error_whatever_came_before_and_calls_match_by_place(hfam) -> None:
    """A call taking `[1, 2]` returned its warning at once, and a broken call after it went unsaid (the sample
    stayed valid); a broken call matched a later whole call of the same name and blamed the stream."""
    two = CALLING.replace('{"city": "Paris"}', "[1, 2]") + BAD_JSON.split("<|end|>", 1)[1].replace(
        "<|channel|>commentary", "<|start|>assistant<|channel|>commentary", 1
    )
    found = analyze(hfam.capture(two), hfam.profile, hfam.tok)
    hit = next(f for f in found.findings if f.code == "harmony_tool_json_invalid")
    assert hit.severity == "error" and "not JSON" in hit.detail
    rome = CALLING.split("<|end|>", 1)[1].replace('"Paris"', '"Rome"')
    both = BAD_JSON + "<|start|>assistant" + rome.replace("<|start|>assistant", "", 1)
    returned = [
        {"id": "a", "name": "get_weather", "arguments": '{"city": Paris}'},
        {"id": "b", "name": "get_weather", "arguments": '{"city": "Rome"}'},
    ]
    served = hfam.capture(both, endpoint="vllm-chat", reasoning="Need the weather.", content="", tool_calls=returned)
    hit = next(f for f in analyze(served, hfam.profile, hfam.tok).findings if f.code == "harmony_tool_json_invalid")
    assert "Yet the server returned" not in hit.detail and "returns them as this text" in hit.detail


def test_empty_messages_add_no_lines_as_vllm_joins_them(hfam) -> None:
    """vLLM joins only non-empty texts: an empty final between two gave a blank line in the export, and a healthy
    server's content read as a mismatch."""
    from tokview.export.formats import texts_from_ids

    gaps = (
        "<|channel|>final<|message|>41.<|end|><|start|>assistant<|channel|>final<|message|><|end|>"
        "<|start|>assistant<|channel|>final<|message|>42.<|return|>"
    )
    served = _chat(hfam, gaps, reasoning="", content="41.\n42.")
    assert "harmony_split_mismatch" not in analyze(served, hfam.profile, hfam.tok).codes
    assert texts_from_ids(served, hfam.profile, hfam.tok).content == "41.\n42."


def test_a_recipient_is_a_call_unless_it_is_a_builtin_tools_or_the_assistant() -> None:
    """vLLM's chat path takes any recipient but a built-in tool's, `assistant` or a special token for a function
    (its heuristic fallback): such a message is a call, never reasoning or content."""
    from tokview.core.harmony import HarmonyMessage, to_function

    def message(recipient: str) -> HarmonyMessage:
        return HarmonyMessage(0, 0, (1, 2), 2, channel="analysis", recipient_ids=(1,), recipient=recipient)

    assert [to_function(message(r)) for r in ("get_weather", "browser.search", "python", "assistant", "<|x|>")] == [
        True,
        False,
        False,
        False,
        False,
    ]


@pytest.mark.parametrize("in_role", [False, True])
def test_a_bare_recipient_whose_equals_sign_is_glued_to_its_name_is_a_call(hfam, in_role: bool) -> None:
    """o200k encodes `to=get_weather` as ` to`, `=get`, `_weather` (no ` to` `=` pair on the ids), and gpt-oss
    writes a header as its tokenizer does: vLLM still reads the message as a call to `get_weather`. Read as a
    preamble, the call's JSON was exported as the answer's content and a server that kept it out read as a parser
    mistake."""
    from tokview.core.harmony import text_bodies, to_function
    from tokview.export.formats import texts_from_ids

    header = (
        "<|start|>assistant to=get_weather<|channel|>commentary json"
        if in_role
        else "<|start|>assistant<|channel|>commentary to=get_weather <|constrain|>json"
    )
    text = f'<|channel|>analysis<|message|>Need the weather.<|end|>{header}<|message|>{{"city": "Paris"}}<|call|>'
    ids = hfam.ids(text)
    assert 28 not in ids  # no lone "=": the recipient's first id holds it
    messages = parse_harmony(ids, hfam.tok)
    assert [(m.recipient, to_function(m)) for m in messages] == [(None, False), ("get_weather", True)]
    assert text_bodies(messages)[1] == []
    served = _chat(hfam, text, reasoning="Need the weather.", content="")
    assert texts_from_ids(served, hfam.profile, hfam.tok).content == ""
    assert "harmony_split_mismatch" not in analyze(served, hfam.profile, hfam.tok).codes
    # the same words in an answer's body name no recipient
    plain = parse_harmony(hfam.ids("<|channel|>final<|message|>I want to=get it<|return|>"), hfam.tok)
    assert [m.recipient for m in plain] == [None]
