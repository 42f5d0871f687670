"""Tool calls and Harmony messages in their own colours: a call's markers, its id and its
arguments each have a style class in both panes; the right pane says which `tool_calls` field kept an id;
Harmony's analysis / final / commentary / header / end kinds map to reasoning / answer / commentary / header /
delimiter. Contrast of every class: test_contrast.py::test_token_panes_reach_aa walks STYLE_CLASSES."""

from __future__ import annotations

from facts import IM_END, THINK_CLOSE
from ui.helpers import InspectApp

from tokview.core import segments as seg
from tokview.core.analysis import analyze
from tokview.core.record import Capture
from tokview.ui.display import (
    ANSWER,
    CLASS_INDEX,
    COMMENTARY_CLS,
    DELIMITER,
    HEADER,
    REASONING,
    TOOL_ARGS,
    TOOL_ID,
    TOOL_MARKER_CLS,
    _class_for,
    detail_lines,
    kept_seq,
    served_seq,
)
from tokview.ui.screens.inspect import InspectData

SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARG_BEGIN, CALL_END = 163595, 163596, 163597, 163598, 163599
CALL_ID, ARGUMENTS = "functions.get_weather:0", '{"city": "Paris"}'


def tool_capture(tokenizer) -> Capture:
    """A Kimi turn that reasons, then calls get_weather once; the server's tool_calls as a parser returns them."""
    prompt = tokenizer.render([{"role": "user", "content": "weather in Paris?"}], template_kwargs={"thinking": True})
    output = (
        tokenizer.encode("I should look it up")
        + [THINK_CLOSE, SECTION_BEGIN, CALL_BEGIN]
        + tokenizer.encode(CALL_ID)
        + [ARG_BEGIN]
        + tokenizer.encode(ARGUMENTS)
        + [CALL_END, SECTION_END, IM_END]
    )
    return Capture(
        prompt_ids=prompt,
        output_ids=output,
        finish_reason="tool_calls",
        reasoning="I should look it up",
        content=None,
        reasoning_field="reasoning",
        tool_calls=[{"id": CALL_ID, "name": "get_weather", "arguments": ARGUMENTS}],
        settings={"tools": [{"type": "function", "function": {"name": "get_weather"}}], "thinking": True},
        endpoint="vllm-chat",
        server_kind="vllm",
    )


def _positions(analysis, kind: str) -> list[int]:
    return [i for i, k in enumerate(analysis.kinds) if k == kind]


def test_a_calls_markers_id_and_arguments_have_their_own_classes_in_both_panes(tokenizer, profile):
    capture = tool_capture(tokenizer)
    analysis = analyze(capture, profile, tokenizer)
    served, kept = served_seq(capture, analysis, tokenizer), kept_seq(capture, analysis, tokenizer)
    ids, args, markers = (_positions(analysis, k) for k in (seg.TOOL_CALL_ID, seg.TOOL_ARGUMENTS, seg.TOOL_MARKER))
    assert ids
    assert args
    assert len(markers) == 5
    assert {served.classes[i] for i in ids} == {CLASS_INDEX[TOOL_ID]}
    assert {served.classes[i] for i in args} == {CLASS_INDEX[TOOL_ARGS]}
    assert {served.classes[i] for i in markers} == {CLASS_INDEX[TOOL_MARKER_CLS]}
    # the right pane: the id and the arguments were kept, in the tool_calls field (not hidden, not answer)
    assert {kept.classes[i] for i in ids} == {CLASS_INDEX[TOOL_ID]}
    assert {kept.classes[i] for i in args} == {CLASS_INDEX[TOOL_ARGS]}
    assert {kept.fields[i] for i in ids} == {"tool_calls[0].id"}
    assert {kept.fields[i] for i in args} == {"tool_calls[0].function.arguments"}
    rows = dict(
        detail_lines(kept, ids[0], tokenizer, kinds=analysis.kinds, loss_mask=analysis.loss_mask, logprobs=None)
    )
    assert rows["text field"] == "kept in tool_calls[0].id"
    reasoning_at = _positions(analysis, seg.REASONING)[0]
    rows = dict(
        detail_lines(kept, reasoning_at, tokenizer, kinds=analysis.kinds, loss_mask=analysis.loss_mask, logprobs=None)
    )
    assert rows["text field"] == "kept in reasoning"


def test_harmony_kinds_map_to_reasoning_answer_commentary_header_and_delimiter():
    assert _class_for(seg.ANALYSIS, False) == CLASS_INDEX[REASONING]
    assert _class_for(seg.FINAL, False) == CLASS_INDEX[ANSWER]
    assert _class_for(seg.COMMENTARY, False) == CLASS_INDEX[COMMENTARY_CLS]
    assert _class_for(seg.HARMONY_HEADER, True) == _class_for(seg.HARMONY_HEADER, False) == CLASS_INDEX[HEADER]
    assert _class_for(seg.MESSAGE_END, True) == CLASS_INDEX[DELIMITER]


async def test_inspect_paints_a_call_id_in_its_own_colour(tokenizer, profile):
    capture = tool_capture(tokenizer)
    analysis = analyze(capture, profile, tokenizer)
    app = InspectApp(InspectData("tool@run", capture, analysis), tokenizer, profile)
    async with app.run_test(size=(120, 40)) as pilot:
        for theme in ("textual-dark", "textual-light"):
            app.theme = theme
            await pilot.pause()
            for view in (app.screen.served, app.screen.kept):
                view.notify_style_update()
                colours = {
                    name: view.cell_style(CLASS_INDEX[name]).color
                    for name in (TOOL_ID, TOOL_ARGS, TOOL_MARKER_CLS, ANSWER, REASONING, DELIMITER)
                }
                tools = [colours[name] for name in (TOOL_ID, TOOL_ARGS, TOOL_MARKER_CLS)]
                others = {colours[name] for name in (ANSWER, REASONING, DELIMITER)}
                assert len(set(tools)) == 3, (theme, colours)
                assert not others & set(tools), (theme, colours)
