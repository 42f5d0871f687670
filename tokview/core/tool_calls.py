"""Tool calls read off the output ids, by the profile's tool-call layout, and the server's `tool_calls` field.

A server's tool parser (`--tool-call-parser kimi_k2`, `hermes`, `glm47`) cuts the decoded text at marker ids and
returns `tool_calls[]` (id, name, arguments); every marker is hidden from every text field. This module
reads the same calls from the ids alone (`parse_tool_calls`): where the section and each call sit, the
call id text, the name and the arguments text, and what is malformed about them. The findings
(`findings.py`), the segment kinds (`segments.py`) and the alignment of the `tool_calls` field to its ids
(`analysis.align_text_fields`) all read this one parse.

GLM (`glm47`): each call is `<tool_call>NAME` then `<arg_key>K</arg_key><arg_value>V</arg_value>` pairs, then
`</tool_call>`; the arguments are the JSON object vLLM's glm4_moe_tool_parser.py (`extract_tool_calls`, which the
glm47 parser extends with regexes that allow no newline after the name) builds: keys stripped, a value kept as
written when the request's `tools` type that parameter `string`, else `json.loads` of the stripped value, else
`ast.literal_eval`, else the stripped text; `json.dumps(..., ensure_ascii=False)`.

Qwen3-Coder / Qwen3.5 (`qwen3_coder`): hermes' markers around an XML body (`core.xml_tool_calls`).

Positions here are output-relative; spans are [start, end).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from tokview.core.harmony import calls_of, parse_harmony
from tokview.core.profiles import (
    GLM47,
    HARMONY,
    KIMI_K2,
    QWEN3_CODER,
    TAGGED_PARSERS,
    ModelProfile,
    ToolCallLayout,
)
from tokview.core.xml_tool_calls import tool_properties, xml_call

if TYPE_CHECKING:
    from tokview.core.tokenizer import TokenizerAdapter

Span = tuple[int, int]
KIMI_CALL_ID = re.compile(r"functions\.(?P<name>[\w.\-]+):(?P<index>\d+)")
"""Kimi's call id form (`functions.get_weather:0`): what its template renders and its chat format expects."""
KIMI_NAME = re.compile(r"^(?:functions\.)?(?P<name>[\w.\-]+):(?P<index>\d+)$")
"""How SGLang's kimik2 detector reads the name from a call id (vLLM takes the text between `.` and `:`)."""

# Problems the parse records (each becomes a finding of the same code).
SECTION_UNCLOSED = "tool_section_unclosed"
CALL_UNCLOSED = "tool_call_unclosed"
OUT_OF_ORDER = "tool_call_out_of_order"


@dataclass(frozen=True)
class Problem:
    """Something malformed in the layout: its finding code, what happened, and the output positions."""

    code: str
    detail: str
    positions: tuple[int, ...]


@dataclass(frozen=True)
class CallOnIds:
    """One call as the ids hold it."""

    span: Span
    """From its begin marker through its end marker (or the output's end, when unclosed)."""
    id_span: Span | None = None
    """Kimi: the call id text's ids, between call begin and argument begin."""
    arguments_span: Span | None = None
    """Kimi: the arguments' ids; hermes: the whole JSON body's ids (name and arguments together)."""
    closed: bool = True
    call_id: str | None = None
    """The call id text as the ids spell it (Kimi); None for hermes, which writes no id."""
    name: str | None = None
    arguments: str | None = None
    """The arguments' text: Kimi's as written; hermes' re-serialised as its parser does (json.dumps)."""
    arguments_error: str | None = None
    """Why the arguments are not a JSON object (None when they are, or without a tokenizer)."""
    name_span: Span | None = None
    """GLM: the name's ids, between `<tool_call>` and the first argument marker (or the call's end)."""
    argument_pairs: tuple[tuple[Span, Span], ...] = ()
    """GLM: each complete pair's (key ids, value ids), between their markers."""
    parameters: tuple[tuple[str, str], ...] | None = None
    """qwen3_coder: each argument's key and value as written (`xml_tool_calls.XmlCall.parameters`)."""


@dataclass(frozen=True)
class ToolCallsOnIds:
    """Every call the output ids hold, the sections around them, and the layout's problems."""

    layout: ToolCallLayout
    sections: tuple[Span, ...]
    """Kimi: begin marker through end marker (the output's end when unclosed). Hermes, GLM: first call to last."""
    calls: tuple[CallOnIds, ...]
    problems: tuple[Problem, ...]
    markers: tuple[int, ...]
    """Output positions of every marker id, in order."""

    @property
    def found(self) -> bool:
        return bool(self.markers)

    @property
    def first_marker(self) -> int | None:
        return self.markers[0] if self.markers else None

    @property
    def end(self) -> int:
        """One past the last position the calls occupy (their last marker, or the end of an unclosed one)."""
        ends = [s[1] for s in self.sections] + [c.span[1] for c in self.calls] + [m + 1 for m in self.markers]
        return max(ends, default=0)


NO_CALLS: tuple[CallOnIds, ...] = ()


def marker_positions(ids: list[int], layout: ToolCallLayout) -> list[tuple[int, int]]:
    """(output position, marker id) of every marker, in order: `list.index` scans (in C) per marker id, so an
    output without calls costs no Python step per id. (`segments.positions_of` does the same; segments
    imports this module, so it cannot be imported here.)"""
    found: list[tuple[int, int]] = []
    for token_id in layout.marker_ids:
        at = -1
        try:
            while True:
                at = ids.index(token_id, at + 1)
                found.append((at, token_id))
        except ValueError:
            pass
    return sorted(found)


def call_count(output_ids: Sequence[int], profile: ModelProfile) -> int:
    """How many tool calls the output ids hold: by the profile's call layout, or a Harmony output's function calls
    (gpt-oss has no call layout: its calls are messages to `functions.…` ended by `<|call|>`, `harmony.calls_of`)."""
    if profile.format == HARMONY:
        return len(calls_of(parse_harmony(output_ids)))
    if profile.tool_calls is None:
        return 0
    return len(parse_tool_calls(output_ids, profile.tool_calls).calls)


def parse_tool_calls(
    output_ids: Sequence[int],
    layout: ToolCallLayout,
    tokenizer: TokenizerAdapter | None = None,
    tools: object = None,
) -> ToolCallsOnIds:
    """The calls in `output_ids` by `layout`; texts (call id, name, arguments) only with a tokenizer.

    `tools` (the request's): GLM keeps the values of parameters they type `string` as written, as vLLM's parser
    does; without them every value is json-decoded where it parses (what that parser does without tools)."""
    ids = output_ids if isinstance(output_ids, list) else list(output_ids)
    markers = marker_positions(ids, layout)
    if not markers:
        return ToolCallsOnIds(layout, (), NO_CALLS, (), ())
    walk = _Walk(layout, len(ids))
    for pos, token_id in markers:
        walk.marker(pos, token_id)
    walk.finish()
    calls = tuple(_with_texts(call, ids, layout, tokenizer, tools) for call in walk.calls)
    sections = tuple(walk.sections)
    if layout.parser in TAGGED_PARSERS and calls:
        sections = ((calls[0].span[0], calls[-1].span[1]),)
    return ToolCallsOnIds(layout, sections, calls, tuple(walk.problems), tuple(p for p, _ in markers))


class _Walk:
    """The markers in order, through the states outside → section → call id → arguments (Kimi),
    outside → call (hermes), or outside → call name → (key → value)* (GLM), recording spans and every marker
    out of its place."""

    def __init__(self, layout: ToolCallLayout, n: int) -> None:
        self.layout, self.n = layout, n
        self.sections: list[Span] = []
        self.calls: list[CallOnIds] = []
        self.problems: list[Problem] = []
        self.section_start: int | None = None
        self.call_start: int | None = None
        self.argument_start: int | None = None
        self.arg_state = ""
        """GLM, inside a call: `name`, `key`, `keyed` (after `</arg_key>`), `value`, `valued`, `broken`."""
        self.arg_open = -1
        self.name_end: int | None = None
        self.key_span: Span = (0, 0)
        self.pairs: list[tuple[Span, Span]] = []

    def out_of_order(self, pos: int, what: str) -> None:
        self.problems.append(Problem(OUT_OF_ORDER, f"{what} at output[{pos}]", (pos,)))

    def marker(self, pos: int, token_id: int) -> None:
        lay = self.layout
        if lay.parser == GLM47 and token_id in self.glm_argument_ids:
            self.glm_argument(pos, token_id)
        elif token_id == lay.section_begin_id:
            if self.section_start is not None:
                self.out_of_order(
                    pos,
                    f"{lay.section_begin} opens a section inside the section opened at output[{self.section_start}]",
                )
                self.close_section(pos)
            self.section_start = pos
        elif token_id == lay.section_end_id:
            if self.call_start is not None:
                self.unclosed_call(pos)
            if self.section_start is None:
                self.out_of_order(pos, f"{lay.section_end} closes a section that was never opened")
            else:
                self.close_section(pos + 1)
        elif token_id == lay.call_begin_id:
            if self.call_start is not None:
                self.out_of_order(
                    pos, f"{lay.call_begin} begins a call inside the call begun at output[{self.call_start}]"
                )
                self.unclosed_call(pos)
            elif lay.section_begin_id is not None and self.section_start is None:
                self.out_of_order(pos, f"{lay.call_begin} begins a call outside any {lay.section_begin} section")
            self.call_start, self.argument_start = pos, None
            self.arg_state, self.name_end, self.pairs = "name", None, []
        elif token_id == lay.argument_begin_id:
            if self.call_start is None:
                self.out_of_order(pos, f"{lay.argument_begin} outside any call")
            elif self.argument_start is not None:
                self.out_of_order(pos, f"{lay.argument_begin} repeated in the call begun at output[{self.call_start}]")
            else:
                self.argument_start = pos
        elif token_id == lay.call_end_id:
            if self.call_start is None:
                self.out_of_order(pos, f"{lay.call_end} ends a call that never began")
                return
            if lay.argument_begin_id is not None and self.argument_start is None:
                self.out_of_order(pos, f"the call begun at output[{self.call_start}] has no {lay.argument_begin}")
            if self.arg_state in ("key", "keyed", "value"):
                self.out_of_order(
                    pos, f"{lay.call_end} ends the call begun at output[{self.call_start}] in an argument"
                )
            self.end_call(pos + 1, closed=True)

    @property
    def glm_argument_ids(self) -> tuple[int | None, ...]:
        lay = self.layout
        return (lay.arg_key_begin_id, lay.arg_key_end_id, lay.arg_value_begin_id, lay.arg_value_end_id)

    def glm_argument(self, pos: int, token_id: int) -> None:
        """One GLM argument marker: each is due in one state only (`<arg_key>` after the name or a value,
        `</arg_key>` inside a key, `<arg_value>` after a key, `</arg_value>` inside a value)."""
        lay = self.layout
        which = self.glm_argument_ids.index(token_id)
        text = (lay.arg_key_begin, lay.arg_key_end, lay.arg_value_begin, lay.arg_value_end)[which]
        due = (("name", "valued"), ("key",), ("keyed",), ("value",))[which]
        if self.call_start is None:
            self.out_of_order(pos, f"{text} outside any call")
            return
        if self.name_end is None:
            self.name_end = pos
        if self.arg_state not in due:
            self.out_of_order(pos, f"{text} out of place in the call begun at output[{self.call_start}]")
            self.arg_state = "broken"
            return
        if which == 1:
            self.key_span = (self.arg_open + 1, pos)
        elif which == 3:
            self.pairs.append((self.key_span, (self.arg_open + 1, pos)))
        self.arg_open = pos
        self.arg_state = ("key", "keyed", "value", "valued")[which]

    def close_section(self, end: int) -> None:
        assert self.section_start is not None
        self.sections.append((self.section_start, end))
        self.section_start = None

    def unclosed_call(self, end: int) -> None:
        self.problems.append(
            Problem(
                CALL_UNCLOSED,
                f"the call begun at output[{self.call_start}] never reaches {self.layout.call_end}",
                (self.call_start or 0,),
            )
        )
        self.end_call(end, closed=False)

    def end_call(self, end: int, closed: bool) -> None:
        start, arg = self.call_start, self.argument_start
        assert start is not None
        body_end = end - 1 if closed else end
        if self.layout.parser == KIMI_K2:
            id_span = (start + 1, arg if arg is not None else body_end)
            arguments_span = (arg + 1, body_end) if arg is not None else None
            call = CallOnIds((start, end), id_span, arguments_span, closed)
        elif self.layout.parser == GLM47:
            name_span = (start + 1, self.name_end if self.name_end is not None else body_end)
            pairs = tuple(self.pairs)
            call = CallOnIds(
                (start, end), None, (start + 1, body_end), closed, name_span=name_span, argument_pairs=pairs
            )
        else:
            call = CallOnIds((start, end), None, (start + 1, body_end), closed)
        self.calls.append(call)
        self.call_start = self.argument_start = None
        self.arg_state, self.name_end, self.pairs = "", None, []

    def finish(self) -> None:
        end = self.n
        if self.call_start is not None:
            self.unclosed_call(end)
        if self.section_start is not None:
            start = self.section_start
            self.problems.append(
                Problem(
                    SECTION_UNCLOSED,
                    f"the section opened at output[{start}] never reaches {self.layout.section_end}",
                    (start,),
                )
            )
            self.close_section(end)


def _with_texts(
    call: CallOnIds, ids: list[int], layout: ToolCallLayout, tokenizer: TokenizerAdapter | None, tools: object = None
) -> CallOnIds:
    """The call with its texts decoded (as the parser reads them: special ids dropped)."""
    if tokenizer is None:
        return call

    def text(span: Span | None) -> str | None:
        return None if span is None else tokenizer.decode(ids[span[0] : span[1]], skip_special_tokens=True)

    if layout.parser == KIMI_K2:
        call_id, arguments = text(call.id_span), text(call.arguments_span)
        match = KIMI_NAME.match((call_id or "").strip())
        name = match.group("name") if match else None
        return replace(call, call_id=call_id, name=name, arguments=arguments, arguments_error=_not_object(arguments))
    if layout.parser == GLM47:
        name = (text(call.name_span) or "").strip()
        values: dict[str, Any] = {}
        for key_span, value_span in call.argument_pairs:
            key, value = (text(key_span) or "").strip(), text(value_span) or ""
            values[key] = value if _is_string_parameter(tools, name, key) else glm_value(value.strip())
        return replace(call, name=name, arguments=json.dumps(values, ensure_ascii=False))
    body = text(call.arguments_span) or ""
    if layout.parser == QWEN3_CODER:
        xml = xml_call(body, tools)
        return replace(
            call, name=xml.name, arguments=xml.arguments, arguments_error=xml.error, parameters=xml.parameters
        )
    try:
        parsed = json.loads(body)
    except json.JSONDecodeError as exc:
        return replace(call, arguments_error=f"the call's JSON does not parse ({exc.msg} at char {exc.pos})")
    except RecursionError:  # a model's `[[[[…`: deeper than Python's json reads, and no call a parser takes
        return replace(call, arguments_error="the call's JSON is nested too deeply to parse")
    if not isinstance(parsed, dict) or "name" not in parsed:
        return replace(call, arguments_error='the call\'s JSON is not an object {"name": …, "arguments": …}')
    name = parsed.get("name") if isinstance(parsed.get("name"), str) else None
    args = parsed.get("arguments", parsed.get("parameters"))
    error = None if isinstance(args, dict) else f"arguments is {type(args).__name__}, not a JSON object"
    return replace(call, name=name, arguments=json.dumps(args, ensure_ascii=False), arguments_error=error)


def glm_value(text: str) -> Any:
    """A GLM argument value as vLLM's glm4_moe parser `_deserialize`s it: JSON, else a Python literal, else the
    text (`ast.literal_eval` errors other than the two it catches are taken as text here: vLLM's would fail the
    whole parse)."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


def _is_string_parameter(tools: object, name: str, key: str) -> bool:
    """vLLM's `_is_string_type`: the first declared tool of this name types the parameter `string`."""
    schema = tool_properties(tools, name).get(key)
    return isinstance(schema, dict) and schema.get("type") == "string"


def _not_object(text: str | None) -> str | None:
    if text is None:
        return "no arguments"
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"the arguments do not parse as JSON ({exc.msg} at char {exc.pos})"
    except RecursionError:
        return "the arguments are JSON nested too deeply to parse"
    return None if isinstance(parsed, dict) else f"the arguments are a JSON {type(parsed).__name__}, not an object"


# -- the server's `tool_calls` field ------------------------------------------------------------------


def server_tool_calls(calls: object) -> list[dict[str, Any]] | None:
    """A message's `tool_calls` (OpenAI shape) as plain records {id, name, arguments}; None when absent.

    Anything that is not a list of objects is None (nothing a server sends that way is a call)."""
    if not isinstance(calls, list):
        return None
    found = []
    for call in calls:
        if not isinstance(call, dict):
            continue
        function = call["function"] if isinstance(call.get("function"), dict) else {}
        found.append(
            {
                "id": _str_or_none(call.get("id")),
                "name": _str_or_none(function.get("name")),
                "arguments": _str_or_none(function.get("arguments")),
            }
        )
    return found


def fold_stream_tool_calls(chunks: Sequence[Any]) -> list[dict[str, Any]] | None:
    """A chat stream's `delta.tool_calls` folded per index: the first id and name, the arguments concatenated
    (both servers send id and name once, then argument pieces). None when no chunk carried a call."""
    calls: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        for choice in (chunk.get("choices") if isinstance(chunk, dict) else None) or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            for call in (delta.get("tool_calls") if isinstance(delta, dict) else None) or ():
                if not isinstance(call, dict):
                    continue
                index = call["index"] if isinstance(call.get("index"), int) else len(calls)
                merged = calls.setdefault(index, {"id": None, "name": None, "arguments": None})
                function: dict[str, Any] = call["function"] if isinstance(call.get("function"), dict) else {}
                if isinstance(call.get("id"), str) and call["id"]:
                    merged["id"] = merged["id"] or call["id"]
                if isinstance(function.get("name"), str) and function["name"]:
                    merged["name"] = merged["name"] or function["name"]
                if isinstance(function.get("arguments"), str):
                    merged["arguments"] = (merged["arguments"] or "") + function["arguments"]
    return [calls[i] for i in sorted(calls)] or None


def tool_calls_of_response(body: object) -> list[dict[str, Any]] | None:
    """The `tool_calls` of a stored chat answer: a plain body's first message, or a stored stream's chunks
    (`{"stream": true, "chunks": [...]}`, as the chat backends and the proxy keep them)."""
    if not isinstance(body, dict):
        return None
    if body.get("stream") and isinstance(body.get("chunks"), list):
        return fold_stream_tool_calls(body["chunks"])
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    message = choices[0].get("message")
    return server_tool_calls(message.get("tool_calls")) if isinstance(message, dict) else None


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


def declared_tools(settings: dict[str, Any]) -> set[str] | None:
    """The function names the request's `tools` declared; None when unknown.

    A request tokview made itself (its settings record the `mode`: `tokview proxy` records the request's
    `tools`, `tokview batch` sends none) without `tools` declared none. Any other capture (imported) without
    them may have lost them: unknown."""
    tools = settings.get("tools")
    if tools is None and "mode" in settings:
        return set()
    if not isinstance(tools, list):
        return None
    names = set()
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            names.add(function["name"])
        elif isinstance(tool, dict) and isinstance(tool.get("name"), str):
            names.add(tool["name"])
    return names


def field_name(index: int | None, parser: str | None = None) -> str:
    """The text field an alignment field index stands for: 0 reasoning, 1 content, then per server call
    its id (hermes, GLM, qwen3_coder, which write none: its name) and its arguments (`align_with_tool_calls` orders them so)."""
    if index is None:
        return ""
    if index == 0:
        return "reasoning"
    if index == 1:
        return "content"
    call, part = divmod(index - 2, 2)
    first = "function.name" if parser in TAGGED_PARSERS else "id"  # their calls write no id: the name comes first
    return f"tool_calls[{call}].{first if part == 0 else 'function.arguments'}"
