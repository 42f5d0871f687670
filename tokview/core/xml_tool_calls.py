"""Qwen3-Coder's and Qwen3.5's XML tool calls (the `qwen3_coder` layout): the body between `<tool_call>` and
`</tool_call>` read as vLLM's and SGLang's `qwen3_coder` parsers read it.

The body is plain text: `<function=NAME>`, then per argument `<parameter=KEY>` + newline + value + newline +
`</parameter>`, then `</function>`. The parsers take the name up to the first `>`, end a value (SGLang's and
older vLLM's at the first `</parameter>`, next `<parameter=` or `</function>`; vLLM's current one structurally, as
`_parameters` does), drop one newline at each end of it, and convert it by the type the request's `tools` give that
parameter (a string kept as written, an integer `int`, an object `json.loads`, ...; a parameter the schema does not
name stays text); the arguments are `json.dumps` of the result.

The two servers convert differently at the edges (SGLang reads `null` as null for every type, vLLM keeps it as text
for a string; `1.0` is 1 in one and 1.0 in the other; SGLang's stream builds the JSON in fragments): so the server's
`tool_calls` are compared with the ids by value (`arguments_agree`), not by text. And what a history renders back
is the value as written (`CallOnIds.parameters`): the templates write a string argument as it is and `| string` any
other scalar, so `true` read as True would render back as `True`, ids the model never wrote.
"""

from __future__ import annotations

import ast
import json
import math
import re
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

FUNCTION_OPEN, FUNCTION_CLOSE = "<function=", "</function>"
PARAMETER_OPEN, PARAMETER_CLOSE = "<parameter=", "</parameter>"
STRING_TYPES = ("string", "str", "text", "varchar", "char", "enum")
INTEGER_PREFIXES = ("int", "uint", "long", "short", "unsigned")
CONTAINER_TYPES = ("object", "array", "arr")


@dataclass(frozen=True)
class XmlCall:
    """One `<tool_call>` body as the parsers read it."""

    name: str | None
    """None when the body holds no `<function=NAME>` (no parser returns a call for it)."""
    parameters: tuple[tuple[str, str], ...]
    """Each argument's key and value as written (one newline dropped at each end), in order."""
    arguments: str | None
    """`json.dumps` of the values converted by the request's `tools` (vLLM's non-streamed `arguments`)."""
    error: str | None


def xml_call(body: str, tools: object = None) -> XmlCall:
    """The first function of a call's body (a second in the same `<tool_call>` becomes a call of its own in the
    parsers' answer, which the call count then says)."""
    start = body.find(FUNCTION_OPEN)
    if start < 0:
        return XmlCall(None, (), None, "the call holds no <function=NAME>: neither server's parser returns it")
    rest = body[start + len(FUNCTION_OPEN) :]
    name_end = rest.find(">")
    if name_end < 0:
        return XmlCall(None, (), None, "the function's name is never closed with '>': no parser returns the call")
    name = rest[:name_end]
    parameters = _parameters(rest[name_end + 1 :])
    schema = tool_properties(tools, name)
    try:
        arguments = json.dumps({k: convert_value(v, schema.get(k)) for k, v in parameters}, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):  # a literal JSON cannot hold (`...`, a set), or nested too deep
        return XmlCall(name, parameters, None, "a value reads as a Python literal JSON cannot hold: the parsers fail")
    return XmlCall(name, parameters, arguments, None)


TAGS = re.compile(r"</parameter>|<parameter=|</function>")


def _parameters(text: str) -> tuple[tuple[str, str], ...]:
    """Each `<parameter=K>` up to the function's `</function>`, structurally (as vLLM's current parser reads it): a
    value ends at the `</parameter>` the next parameter or the function's end follows, not counting the ones that
    close a parameter block the value itself writes on lines of its own, so a value that writes `</parameter>`,
    `</function>` or a whole example call (code that emits XML) stays whole and a history renders it back as
    written. A value with no such end ends as the parsers' patterns end it (the first `</parameter>`, `<parameter=`
    or `</function>`: a `</parameter>` the model left out). Linear: the tags are found once, and the walks that look
    for an end share one budget (a runaway output that repeats a parameter for 200 KB took a minute)."""
    tags = [(m.start(), m.group()) for m in TAGS.finditer(text)]
    at_of = [pos for pos, _ in tags]
    budget = 4 * len(tags) + 64
    found: list[tuple[str, str]] = []
    at, n = 0, len(text)
    while True:
        at = _past_space(text, at)
        if at >= n or text.startswith(FUNCTION_CLOSE, at):
            break
        if not text.startswith(PARAMETER_OPEN, at):
            i = bisect_left(at_of, at)
            while i < len(tags) and tags[i][1] != PARAMETER_OPEN:
                i += 1
            if i == len(tags):
                break
            at = tags[i][0]
        name_end = text.find(">", at + len(PARAMETER_OPEN))
        if name_end < 0:
            break
        key, value_at = text[at + len(PARAMETER_OPEN) : name_end], name_end + 1
        first = bisect_left(at_of, value_at)
        end, at, budget = _structural_end(text, tags, first, budget)
        if end < 0:  # the parsers' own end: the first tag after the value's start
            end = tags[first][0] if first < len(tags) else n
            at = end + (len(PARAMETER_CLOSE) if first < len(tags) and tags[first][1] == PARAMETER_CLOSE else 0)
        value = text[value_at:end]
        value = value[1:] if value.startswith("\n") else value
        found.append((key, value[:-1] if value.endswith("\n") else value))
    return tuple(found)


def _structural_end(text: str, tags: list[tuple[int, str]], i: int, budget: int) -> tuple[int, int, int]:
    """(the value's end, where reading goes on, the budget left) from tag `i` on; -1 for none found."""
    depth = 0
    while i < len(tags) and budget > 0:
        budget -= 1
        pos, tag = tags[i]
        if tag == PARAMETER_OPEN and pos > 0 and text[pos - 1] == "\n":
            depth += 1  # a parameter block the value writes on lines of its own
        elif tag == PARAMETER_CLOSE:
            if depth:
                depth -= 1
            else:
                after = _past_space(text, pos + len(PARAMETER_CLOSE))
                if after >= len(text) or text.startswith((PARAMETER_OPEN, FUNCTION_CLOSE), after):
                    return pos, pos + len(PARAMETER_CLOSE), budget
        i += 1
    return -1, -1, budget


def _past_space(text: str, at: int) -> int:
    while at < len(text) and text[at] in " \t\r\n":
        at += 1
    return at


def tool_properties(tools: object, name: str) -> dict[str, Any]:
    """The `properties` of the request's first declared tool of this name ({} when none declares it): the schema
    the servers' parsers type a call's values by."""
    for tool in tools if isinstance(tools, list) else ():
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or function.get("name") != name:
            continue
        parameters = function.get("parameters")
        properties = parameters.get("properties") if isinstance(parameters, dict) else None
        return properties if isinstance(properties, dict) else {}
    return {}


def convert_value(value: str, schema: object) -> Any:
    """vLLM's `_convert_param_value`: by the parameter's schema's type (`anyOf`: its first type that is not null);
    a parameter the tools do not name (`schema` None) stays text."""
    if not isinstance(schema, dict):
        return value
    kind, nullable = _schema_type(schema)
    if nullable and value.lower() in ("null", "none"):
        return None
    if kind in STRING_TYPES:
        return value
    if value.lower() in ("null", "none"):
        return None
    if kind.startswith(INTEGER_PREFIXES):
        try:
            return int(value)
        except ValueError:
            return value
    if kind.startswith(("num", "float")):
        try:
            number = float(value)
            return int(number) if number.is_integer() else number
        except (ValueError, OverflowError):
            return value
    if kind in ("boolean", "bool", "binary"):
        return value.lower() == "true"
    container = kind in CONTAINER_TYPES or kind.startswith(("dict", "list"))
    if container:
        try:
            parsed = json.loads(value)
            return _literal(parsed) if isinstance(parsed, str) else parsed  # `"{'k': 1}"`: decoded twice (vLLM)
        except (ValueError, RecursionError):
            pass
    parsed = _literal(value)
    return _literal(parsed) if container and isinstance(parsed, str) else parsed


def _literal(text: str) -> Any:
    """`ast.literal_eval`, else the text."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


def _schema_type(schema: dict[str, Any]) -> tuple[str, bool]:
    if "type" in schema:
        kind = str(schema["type"]).strip().lower()
        return kind, kind == "null"
    if isinstance(schema.get("anyOf"), list):
        kinds = [str(o["type"]).strip().lower() for o in schema["anyOf"] if isinstance(o, dict) and "type" in o]
        others = [k for k in kinds if k != "null"]
        return (others[0] if others else "string"), "null" in kinds
    return "string", False


def history_arguments(parameters: Sequence[tuple[str, str]], tools: object, name: str) -> str:
    """The arguments a history should send back so the template renders the values as written: each converted by
    the request's `tools` where it renders back the same under either rule Qwen's templates write a scalar by
    (`| string`; some variants `tojson`) and a mapping or list by (`tojson`), else the text itself (`true` stays
    `"true"`: True renders `True`; `2.50` stays text: 2.5 renders `2.5`)."""
    schema = tool_properties(tools, name)
    values: dict[str, Any] = {}
    for key, text in parameters:
        readings = [convert_value(text, schema.get(key)), _number(text)]  # `5.0`: 5 renders `5`, 5.0 `5.0`
        values[key] = next((value for value in readings if _renders_as(value, text)), text)
    return json.dumps(values, ensure_ascii=False)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _renders_as(value: object, text: str) -> bool:
    if isinstance(value, str):
        return value == text
    if isinstance(value, (dict, list)):
        try:
            return json.dumps(value, ensure_ascii=False) == text
        except (TypeError, ValueError, RecursionError):  # a set inside, or nested too deep
            return False
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value) == text == json.dumps(value)
    return False


def arguments_agree(parameters: Sequence[tuple[str, str]], server_arguments: str | None) -> bool:
    """Whether the server's arguments hold the same keys as the ids and, key for key, a value some server's reading
    of the text as written gives (`_value_agrees`)."""
    if server_arguments is None:
        return False
    try:
        theirs = json.loads(server_arguments)
    except (ValueError, RecursionError):
        return False
    mine = dict(parameters)
    if not isinstance(theirs, dict) or set(theirs) != set(mine):
        return False
    return all(_value_agrees(mine[key], value) for key, value in theirs.items())


READ_FAILS = (ValueError, SyntaxError, TypeError, MemoryError, RecursionError, OverflowError)


def _value_agrees(text: str, value: object) -> bool:
    """The servers read a value by the schema they were given (SGLang and older vLLM ignore `anyOf`, SGLang reads
    `null` as null for every type, a non-`true` boolean is false, a whole float may be an int, a container is
    decoded as JSON, then as a Python literal, twice when that gives text): any of those readings agrees."""
    bare = text.strip()
    try:
        if isinstance(value, str):  # as written (no server strips a value), or decoded from JSON once or twice
            return value == text or _json_equal(_json_once(bare), value) or _json_equal(_decoded(bare), value)
        if value is None:
            return bare.lower() in ("null", "none")
        if isinstance(value, bool):
            return value == (text.lower() == "true") or _literal(bare) is value
        if isinstance(value, int):
            return (bare.lstrip("+-").isdigit() and int(bare) == value) or float(bare) == value
        if isinstance(value, float):
            number = float(bare)
            return number == value or (math.isnan(value) and math.isnan(number))
        return _json_equal(_decoded(bare), value)
    except READ_FAILS:
        return False


def _json_once(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return UNREAD


def _json_equal(mine: object, theirs: object) -> bool:
    """Equal as JSON (`[true]` is not `[1]`, as Python's == would have it), keys in any order."""
    if mine is UNREAD:
        return False
    try:
        return json.dumps(mine, sort_keys=True) == json.dumps(theirs, sort_keys=True)
    except (TypeError, ValueError, RecursionError):
        return False


UNREAD = object()
"""What `_decoded` gives for text that is neither JSON nor a Python literal."""


def _decoded(text: str) -> Any:
    """A container's reading: JSON, else a Python literal (else UNREAD); a result that is text decoded once more."""
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):
        try:
            parsed = ast.literal_eval(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return UNREAD
    return _literal(parsed) if isinstance(parsed, str) else parsed
