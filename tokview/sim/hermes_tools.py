"""The simulated Qwen3's tool calls (the `hermes` layout: `core.profiles.QWEN3_TOOL_CALLS`).

Without it a Qwen3 sim never called a tool, so every agent chain or proxied harness against it stopped at its first
turn. The model: when the prompt declares tools (Qwen3's template writes them in the first system turn, one JSON
line per tool between `<tools>` and `</tools>`) and the current tool loop (the turns since the last user turn that
is not a `<tool_response>` turn: the template's own `last_query_index`) has had fewer tool-calling turns than
`tool-rounds`, it writes `<think>\\n` reasoning `\\n</think>\\n\\n`, then per call `<tool_call>\\n{"name": NAME,
"arguments": ARGS}\\n</tool_call>` (calls separated by `\\n`), then `<|im_end|>`: exactly what Qwen3's template
renders for that turn in the next prompt (reasoning kept inside the loop, arguments as `tojson`, i.e. `json.dumps`),
so the next prompt extends the output id for id. The arguments are `tools.example_value`'s, the calls chosen as for
Kimi (`tools.plan_from`). `unclosed-section` drops the last `</tool_call>`.

The parser side is `glm_tools.read_turn` on the profile's layout: vLLM's hermes parser (content the text before the
first `<tool_call>`, ids `chatcmpl-tool-<uuid>`; SGLang's qwen25 detector: `call_<24 hex>`), the arguments
`json.dumps` of the call's `arguments` object.

Qwen3-Coder / Qwen3.5 (the `qwen3_coder` layout): the same turns, each call's body XML as their templates render
it (`<function=NAME>`, per argument `<parameter=K>`, the value on its own lines, a mapping or list `tojson` and any
other value `| string`, `</parameter>`, then `</function>`), the tools read from the template's declaration (JSON
lines, or Qwen3-Coder's XML: `<function>` / `<name>` / `<parameter>` / `<type>` inside `<tools>`); parsed as the
qwen3_coder parsers do: vLLM's as `core.xml_tool_calls` reads them, SGLang's by its own conversion
(`sglang_arguments`), so the two servers' `tool_calls` differ in text as they do for real (`2.0` stays a float,
`anyOf` is not read, `null` is null for every type) and the by-value comparison is what agrees them.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tokview.core.profiles import HERMES, QWEN3_CODER
from tokview.core.xml_tool_calls import CONTAINER_TYPES, INTEGER_PREFIXES, STRING_TYPES, tool_properties
from tokview.sim import tools
from tokview.sim.tools import PlannedCall

if TYPE_CHECKING:
    from tokview.core.tokenizer import TokenizerAdapter
    from tokview.sim.model import ModelState


TOOLS_OPEN, TOOLS_CLOSE = "<tools>\n", "\n</tools>"


XML_FUNCTION = re.compile(r"<function>\s*<name>(.*?)</name>(.*?)</function>", re.S)
XML_PARAMETER = re.compile(r"<parameter>\s*<name>(.*?)</name>(.*?)</parameter>", re.S)
XML_FIELD = re.compile(r"<(type|enum)>(.*?)</\1>", re.S)


def is_hermes(state: ModelState) -> bool:
    """Whether the served profile writes Qwen's `<tool_call>` spans (hermes JSON, or Qwen3-Coder's XML)."""
    layout = state.profile.tool_calls
    return layout is not None and layout.parser in (HERMES, QWEN3_CODER)


def is_xml(state: ModelState) -> bool:
    """Whether its calls are Qwen3-Coder's XML (`qwen3_coder`), not hermes JSON."""
    layout = state.profile.tool_calls
    return layout is not None and layout.parser == QWEN3_CODER


def declared_tools(tokenizer: TokenizerAdapter, prompt_ids: Sequence[int]) -> list[dict[str, Any]] | None:
    """The tools of the prompt's first turn (None without a `<tools>` block, or when a line is not JSON)."""
    ids = list(prompt_ids)
    end = tokenizer.token_to_id("<|im_end|>")
    first = ids[: ids.index(end)] if end in ids else ids
    text = tokenizer.decode(first, skip_special_tokens=False)
    return tools.json_lines_tools(text, TOOLS_OPEN, TOOLS_CLOSE) or xml_declared_tools(text)


def xml_declared_tools(text: str) -> list[dict[str, Any]] | None:
    """The tools of a Qwen3-Coder-style `<tools>` block (`<function><name>…</name>` with `<parameter><name>…
    </name><type>…</type>` entries), as OpenAI tools; None without one."""
    start = text.find("<tools>\n<function>")  # the block itself, not a preamble that names the tags
    end = text.find("</tools>", start + 1)
    if start < 0 or end < 0:
        return None
    declared = []
    for function in XML_FUNCTION.finditer(text[start:end]):
        properties = {p.group(1): _xml_schema(p.group(2)) for p in XML_PARAMETER.finditer(function.group(2))}
        parameters = {"type": "object", "properties": properties}
        declared.append({"type": "function", "function": {"name": function.group(1), "parameters": parameters}})
    return declared or None


def loop_rounds(tokenizer: TokenizerAdapter, prompt_ids: Sequence[int]) -> int:
    """Tool-calling turns in the current loop: the `<tool_response>` user turns since the last user turn that is
    not one (Qwen3 renders a run of tool results as one user turn)."""
    ids = list(prompt_ids)
    im_start, response = tokenizer.token_to_id("<|im_start|>"), tokenizer.token_to_id("<tool_response>")
    user = tokenizer.encode("user\n")
    rounds = 0
    for pos in range(len(ids) - 1, -1, -1):
        if ids[pos] != im_start or ids[pos + 1 : pos + 1 + len(user)] != user:
            continue
        if ids[pos + 1 + len(user) : pos + 2 + len(user)] != [response]:
            break
        rounds += 1
    return rounds


def plan_calls(state: ModelState, prompt: list[int], seed: int, body: dict[str, Any]) -> list[PlannedCall]:
    """The calls the model writes for this prompt ([] = it answers in text)."""
    declared = declared_tools(state.tokenizer, prompt)
    return tools.plan_for(state, declared, loop_rounds(state.tokenizer, prompt), seed, body) if declared else []


def _xml_schema(fields: str) -> dict[str, Any]:
    """A parameter's `<type>` (string when absent) and `<enum>` (a JSON list) as a JSON schema."""
    schema: dict[str, Any] = {"type": "string"}
    for key, value in XML_FIELD.findall(fields):
        try:
            schema[key] = value if key == "type" else json.loads(value)
        except ValueError:
            continue
    return schema


def calls_ids(
    tokenizer: TokenizerAdapter, calls: Sequence[PlannedCall], closed: bool = True, xml: bool = False
) -> list[int]:
    """Qwen3's ids for these calls, as its template renders them (the last without `</tool_call>` when not
    `closed`); `xml`: Qwen3-Coder's / Qwen3.5's."""
    begin, end = tokenizer.token_to_id("<tool_call>"), tokenizer.token_to_id("</tool_call>")
    assert begin is not None and end is not None, "a hermes profile's tokenizer has <tool_call> and </tool_call>"
    ids: list[int] = []
    for k, call in enumerate(calls):
        body = xml_body(call) if xml else json_body(call)
        ids += ([*tokenizer.encode("\n")] if k else []) + [begin, *tokenizer.encode(body), end]
    return ids if closed or not ids else ids[:-1]


def json_body(call: PlannedCall) -> str:
    arguments = json.dumps(json.loads(call.arguments), ensure_ascii=False)
    return '\n{"name": "' + call.name + '", "arguments": ' + arguments + "}\n"


def xml_body(call: PlannedCall) -> str:
    """Qwen3-Coder's and Qwen3.5's templates' body for this call: a mapping or list `tojson`, any other value
    `| string` (Python's text: `True`, `None`, `2.0`)."""
    parts = [f"\n<function={call.name}>\n"]
    for key, value in json.loads(call.arguments).items():
        text = json.dumps(value, ensure_ascii=False) if isinstance(value, (dict, list)) else str(value)
        parts.append(f"<parameter={key}>\n{text}\n</parameter>\n")
    return "".join(parts) + "</function>\n"


def sglang_arguments(parameters: Sequence[tuple[str, str]], declared: object, name: str) -> str:
    """SGLang's qwen3_coder detector's arguments (`_convert_param_value`): `null` is null whatever the type; a
    parameter the tools do not name, or whose schema has no `type` (an `anyOf`), is text; a number with a `.` or an
    `e` stays a float."""
    schema = tool_properties(declared, name)
    values = {key: _sglang_value(text, schema.get(key), key in schema) for key, text in parameters}
    try:
        return json.dumps(values, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):  # a literal JSON cannot hold: the values as written
        return json.dumps(dict(parameters), ensure_ascii=False)


def _sglang_value(text: str, schema: object, named: bool) -> Any:
    if text.lower() == "null":
        return None
    if not named:
        return text
    kind = str(schema["type"]).strip().lower() if isinstance(schema, dict) and "type" in schema else "string"
    if kind in STRING_TYPES:
        return text
    try:
        if kind.startswith(INTEGER_PREFIXES):
            return int(text)
        if kind.startswith(("num", "float")):
            number = float(text)
            return int(number) if number.is_integer() and not ("." in text or "e" in text.lower()) else number
    except ValueError:
        return text
    if kind in ("boolean", "bool", "binary"):
        return text.lower() == "true"
    if kind in CONTAINER_TYPES or kind.startswith(("dict", "list")):
        try:
            return json.loads(text)
        except ValueError:
            pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text
