"""What a proxied turn's prefix-break finding puts the break down to: the harness's changes to the answer it sent
back, or (sent back as served) the server's chat template. The finding blamed the harness for every break; most
came from a faithful harness and Kimi's template dropping a finished turn's reasoning."""

from __future__ import annotations

from typing import Any

import pytest

from tokview.core.profiles import get_profile
from tokview.proxy.break_causes import harness_changes, served_of
from tokview.proxy.recorder import prefix_break_finding
from tokview.proxy.sessions import SessionBook, assistant_message, restore

SYSTEM = list(range(100, 120))
QUESTION = {"role": "user", "content": "Weather in Paris?"}
CALL = {"id": "functions.get_weather:0", "name": "get_weather", "arguments": '{"city":"Paris"}'}
SERVED = assistant_message("\n\nLooking.", [CALL], "I should call the tool.")


def _sent(**changes: Any) -> dict[str, Any]:
    """The served answer as a faithful harness sends it back, with `changes` (None drops a key)."""
    message = {
        "role": "assistant",
        "content": "\n\nLooking.",
        "reasoning_content": "I should call the tool.",
        "tool_calls": [
            {"id": CALL["id"], "type": "function", "function": {"name": "get_weather", "arguments": CALL["arguments"]}}
        ],
    }
    message.update(changes)
    return {k: v for k, v in message.items() if v is not None}


def _changes(sent: dict[str, Any], kind: str = "vllm") -> list[str] | None:
    served = served_of(SERVED, [QUESTION], 10)
    assert served is not None
    return harness_changes(served, [QUESTION, sent, {"role": "tool", "content": "sunny"}], kind)


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_an_answer_sent_back_as_served_changed_nothing(kind: str) -> None:
    assert _changes(_sent(), kind) == []
    parts = _sent(content=[{"type": "text", "text": "\n\nLooking."}])  # the same text as parts
    assert _changes(parts, kind) == []


def test_each_change_a_harness_makes_is_named() -> None:
    assert _changes(_sent(reasoning_content=None)) == ["dropped its reasoning"]
    assert _changes(_sent(reasoning_content="")) == ["dropped its reasoning"]
    assert _changes(_sent(reasoning_content="I should call it.")) == ["re-wrote its reasoning"]
    assert _changes(_sent(content="Looking.")) == ["changed its content (the whitespace around it)"]
    renumbered = _sent(
        tool_calls=[{"id": "call_0", "function": {"name": "get_weather", "arguments": CALL["arguments"]}}]
    )
    assert _changes(renumbered) == ["renumbered its call ids ('call_0' for the served 'functions.get_weather:0')"]
    spaced = _sent(
        tool_calls=[{"id": CALL["id"], "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]
    )
    assert _changes(spaced) == ["re-serialised its arguments"]
    everything = _sent(reasoning_content=None, content="Looking.", tool_calls=renumbered["tool_calls"])
    assert len(_changes(everything) or []) == 3


def test_reasoning_under_vllms_name_is_dropped_by_sglang_only() -> None:
    """vLLM reads `reasoning` and `reasoning_content`; SGLang only `reasoning_content` (the recordings: a history
    with `reasoning` rendered `<think></think>` on SGLang)."""
    renamed = _sent(reasoning_content=None, reasoning="I should call the tool.")
    assert _changes(renamed, "vllm") == []
    assert _changes(renamed, "sglang") == [
        "sent its reasoning as `reasoning`, a field SGLang does not read (it reads `reasoning_content`)"
    ]


def test_no_assistant_message_where_the_answer_goes_compares_nothing() -> None:
    served = served_of(SERVED, [QUESTION], 10)
    assert served is not None
    assert harness_changes(served, [QUESTION], "vllm") is None
    assert harness_changes(served, [QUESTION, {"role": "user", "content": "hm"}], "vllm") is None
    assert served_of(SERVED, None, 10) is None and served_of(None, [QUESTION], 10) is None


def _place(book: SessionBook, prompt: list[int], output: list[int], messages: list[Any], answer: dict[str, Any]):
    turn = book.place(prompt, messages)
    book.add(turn, f"t{turn.turn}", prompt_ids=prompt, output_ids=output, messages=messages, answer=answer)
    return turn


def _detail(turn, prompt: list[int], messages: list[Any], kind: str = "vllm") -> str:
    kimi = get_profile("kimi-k2.5")
    return prefix_break_finding(turn, prompt, None, messages=messages, profile=kimi, server_kind=kind)["detail"]


def test_the_finding_names_the_harness_or_the_template_and_where() -> None:
    book = SessionBook("r")
    first = [*SYSTEM, 1]
    _place(book, first, [2, 3, 4], [QUESTION], SERVED)
    tool = {"role": "tool", "tool_call_id": CALL["id"], "content": "sunny"}
    # the template re-rendered the answer (its reasoning dropped): ids break inside the answer
    faithful = [QUESTION, _sent(), tool]
    turn = book.place([*first, 2, 9, 4, 5], faithful)
    assert (turn.joined_by, turn.break_at) == ("messages", len(first) + 1)
    said = _detail(turn, [*first, 2, 9, 4, 5], faithful)
    assert "The harness sent turn 0's answer back as served" in said and "changed" not in said
    # the same break with the reasoning dropped by the harness
    dropped = [QUESTION, _sent(reasoning_content=None), tool]
    said = _detail(book.place([*first, 2, 9, 4, 5], dropped), [*first, 2, 9, 4, 5], dropped)
    assert "The harness changed turn 0's answer before sending it back: it dropped its reasoning" in said
    # a break before the answer, in the history turn 0's prompt already held
    early = [*SYSTEM[:5], 7, *SYSTEM[6:], 1, 2, 3, 4, 5]
    turn = book.place(early, faithful)
    assert turn.break_at == 5
    said = _detail(turn, early, faithful)
    assert "The break is in the history before turn 0's answer" in said and "also changed" not in said
    # there, a change to the answer is said beside, never as the cause
    said = _detail(book.place(early, dropped), early, dropped)
    assert "The break is in the history before turn 0's answer" in said
    assert "it also changed turn 0's answer before sending it back: it dropped its reasoning" in said


def test_twin_rollouts_each_compare_with_their_own_answer() -> None:
    """Two rollouts of one task share their messages (call ids and reasoning are left out of the key): the next
    turn of the first went after the newest, its twin's, and read its own call id as "renumbered"."""
    book = SessionBook("r")
    first = [*SYSTEM, 1]
    twins = []
    for k, call_id in enumerate(("call-AAA", "call-BBB")):
        answer = assistant_message("", [{**CALL, "id": call_id}], "I should call the tool.")
        twins.append(_place(book, first, [2, 30 + k, 4], [QUESTION], answer))
    assert twins[0].session_id != twins[1].session_id
    sent = _sent(
        content="", tool_calls=[{"id": "call-AAA", "function": {"name": "get_weather", "arguments": CALL["arguments"]}}]
    )
    messages = [QUESTION, sent, {"role": "tool", "tool_call_id": "call-AAA", "content": "sunny"}]
    prompt = [*first, 2, 30, 9]  # rollout A's ids, broken inside its answer
    turn = book.place(prompt, messages)
    assert (turn.session_id, turn.break_at) == (twins[0].session_id, len(first) + 2)
    said = _detail(turn, prompt, messages)
    assert "The harness sent turn 0's answer back as served" in said and "The harness changed" not in said


def test_odd_client_shapes_compare_without_failing() -> None:
    """A `tool_calls` that is not a list (which `_message_text` leaves out, so the turn still joins by messages)
    raised in the finding, and the request went unrecorded."""
    for odd in (5, True, 1.5, "x", {"id": "a"}):
        assert _changes(_sent(tool_calls=odd)) == []
    assert _changes(_sent(content={"text": "x"})) == ["changed its content (the whitespace around it)"]


def test_sglang_reads_reasoning_content_only_even_beside_reasoning() -> None:
    both = _sent(reasoning_content="I should call it.", reasoning="I should call the tool.")
    assert _changes(both, "sglang") == ["re-wrote its reasoning"]
    assert _changes(both, "vllm") == []


def test_a_restarted_proxy_compares_with_the_answer_it_restored() -> None:
    """A turn put back from the store keeps its served answer, its reasoning read back too: a harness that dropped
    it is named after a restart as before one."""
    book = SessionBook("r")
    request = f'{{"body": {{"messages": [{{"role": "user", "content": "{QUESTION["content"]}"}}]}}}}'
    response = (
        '{"choices": [{"message": {"tool_calls": [{"id": "functions.get_weather:0", "type": "function", '
        '"function": {"name": "get_weather", "arguments": "{\\"city\\":\\"Paris\\"}"}}]}}]}'
    )
    row = ("proxy:r:s1", 0, "t0", [*SYSTEM, 1], [2, 3, 4], request, "\n\nLooking.", response)
    restore(book, [(*row, None, None, len(SYSTEM) + 1, 0, None, "I should call the tool.")], None)  # type: ignore[arg-type]
    faithful = [QUESTION, _sent(), {"role": "tool", "tool_call_id": CALL["id"], "content": "sunny"}]
    turn = book.place([*SYSTEM, 1, 2, 9], faithful)
    assert turn.joined_by == "messages"
    assert "back as served" in _detail(turn, [*SYSTEM, 1, 2, 9], faithful)
    dropped = [QUESTION, _sent(reasoning_content=None), faithful[2]]
    turn = book.place([*SYSTEM, 1, 2, 9], dropped)
    assert "it dropped its reasoning" in _detail(turn, [*SYSTEM, 1, 2, 9], dropped)


def test_a_break_before_the_part_a_harness_changed_is_the_templates() -> None:
    """Qwen3 on vLLM: the template re-spaces `</think>` in the history, so every next turn breaks there. A harness
    that also renumbered its call ids (which come after it, and which Qwen3's template never renders) was blamed for
    the break; one that re-serialised its arguments too. Only a change to a part at or before the break is a cause."""
    qwen = get_profile("qwen3")
    layout = qwen.tool_calls
    assert layout is not None and qwen.think_close_id is not None
    close, call = qwen.think_close_id, layout.call_begin_id
    book = SessionBook("r", profile=qwen)
    first = [*SYSTEM, 1]
    output = [2, 3, close, 5, 5, call, 7, 8, layout.call_end_id, 151645]  # reasoning, </think>, "\n\n", the call
    _place(book, first, output, [QUESTION], SERVED)
    tool = {"role": "tool", "tool_call_id": CALL["id"], "content": "sunny"}
    at_space = len(first) + 3  # the whitespace after </think>: 6 where 5 was served
    renumbered = [QUESTION, _sent(tool_calls=[{**_sent()["tool_calls"][0], "id": "call_0"}]), tool]
    prompt = [*first, 2, 3, close, 6, 5, call, 7, 8, layout.call_end_id, 151645, 9]
    turn = book.place(prompt, renumbered)
    assert turn.break_at == at_space
    said = prefix_break_finding(turn, prompt, None, messages=renumbered, profile=qwen, server_kind="vllm")["detail"]
    assert "only after the break (it renumbered its call ids ('call_0'" in said, said
    assert "The harness changed turn 0's answer before sending it back" not in said, said
    assert "The template re-rendered the history" in said, said
    # the same renumbering with the break inside the call: the harness's
    in_call = [*first, 2, 3, close, 5, 5, call, 9, 8, layout.call_end_id, 151645, 9]
    turn = book.place(in_call, renumbered)
    said = prefix_break_finding(turn, in_call, None, messages=renumbered, profile=qwen, server_kind="vllm")["detail"]
    assert "The harness changed turn 0's answer before sending it back: it renumbered its call ids" in said, said
    # a dropped reasoning reaches any break in the answer
    dropped = [QUESTION, _sent(reasoning_content=None), tool]
    turn = book.place(prompt, dropped)
    said = prefix_break_finding(turn, prompt, None, messages=dropped, profile=qwen, server_kind="vllm")["detail"]
    assert "The harness changed turn 0's answer before sending it back: it dropped its reasoning" in said, said


def test_without_a_reasoning_parser_a_harness_that_strips_the_think_block_is_the_cause() -> None:
    """No reasoning parser: the think block is the content's, and a harness that strips it from the content changes
    the ids from the answer's start. The `</think>` was taken for where the content begins, and the template blamed."""
    qwen = get_profile("qwen3")
    assert qwen.think_close_id is not None and qwen.think_open_id is not None
    output = [qwen.think_open_id, 2, qwen.think_close_id, 5, 6, 151645]
    served = served_of(assistant_message("<think>x</think>done", [], None), [QUESTION], 10, output, qwen)
    assert served is not None and served.answer_at == 0
    stripped = [QUESTION, {"role": "assistant", "content": "done"}, {"role": "user", "content": "more"}]
    assert harness_changes(served, stripped, "vllm", reaching=0) == ["changed its content (the whitespace around it)"]


def test_only_the_changes_that_reach_the_break_are_its_cause_the_rest_said_after_it() -> None:
    qwen = get_profile("qwen3")
    layout = qwen.tool_calls
    assert layout is not None and qwen.think_close_id is not None
    book = SessionBook("r", profile=qwen)
    first = [*SYSTEM, 1]
    _place(book, first, [2, 3, qwen.think_close_id, 5, layout.call_begin_id, 7, layout.call_end_id], [QUESTION], SERVED)
    tool = {"role": "tool", "tool_call_id": CALL["id"], "content": "sunny"}
    both = [QUESTION, _sent(reasoning_content=None, tool_calls=[{**_sent()["tool_calls"][0], "id": "call_9"}]), tool]
    prompt = [*first, qwen.think_close_id, 5, 9]
    turn = book.place(prompt, both)
    said = prefix_break_finding(turn, prompt, None, messages=both, profile=qwen, server_kind="vllm")["detail"]
    assert "it dropped its reasoning; it also renumbered its call ids ('call_9'" in said, said
    assert "after the break" in said, said
