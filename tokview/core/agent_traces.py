"""Agent traces in a prompt row: the row's `tools`, assistant `tool_calls`, and the results that answer them.

Why checked here, before anything is sent: a trace the servers cannot render the way the file means it
(a result that answers no call, a call left unanswered while the conversation goes on, a call to a function
the row does not declare, arguments that are not a JSON object) would be generated from another prompt than
the file's, or refused by one server and rendered as `{}` by the other (tools README §6). Such a row is a bad
row with its line number.

Shapes read:
- OpenAI: row-level `tools` (a list, or a JSON string of one; a bare function object is wrapped as
  `{"type": "function", "function": …}`), assistant `tool_calls` (`{id, type, function: {name, arguments}}`,
  arguments a JSON-object string or an object), `role: tool` results with `tool_call_id` (and `name`).
  A result without `tool_call_id` answers the first call still unanswered.
- ShareGPT: `from: function_call` is an assistant turn whose `value` is the call (or a list of calls) as JSON
  `{name, arguments}`; a `gpt` turn holding Hermes `<tool_call>{json}</tool_call>` blocks is an assistant turn
  with those calls (its text outside the blocks is the content); `tool`, `function`, `observation`,
  `function_response` and `ipython` turns are results, matched to the unanswered calls in order.
Calls without an id get Kimi's `functions.NAME:IDX` (IDX counts the row's calls), the form the template renders.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from tokview.core.xml_tool_calls import FUNCTION_OPEN, xml_call
from tokview.errors import TokviewError

HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
HERMES_RESPONSE = re.compile(r"<tool_response>\s*(.*?)\s*</tool_response>", re.S)


class PromptError(TokviewError):
    """A prompt row is not in any shape tokview reads (`core.prompts` re-exports it), or its agent trace
    cannot be sent as the file means it."""

    title = "prompt row"


def row_tools(raw: object, where: str) -> list[dict[str, Any]] | None:
    """The row's `tools` as the servers take them (None: the row has none)."""
    if raw is None or raw == [] or raw == "":
        return None
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError:
            raise PromptError(f"{where}: `tools` is a string that is not a JSON list of tools") from None
        except RecursionError:
            raise PromptError(f"{where}: `tools` is a JSON string nested too deeply") from None
    if not isinstance(raw, list):
        raise PromptError(f"{where}: `tools` must be a list of tools, not {type(raw).__name__}")
    tools = []
    for k, tool in enumerate(raw, start=1):
        if isinstance(tool, dict) and "function" not in tool and isinstance(tool.get("name"), str):
            tool = {"type": "function", "function": tool}
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise PromptError(f"{where}: tool {k} has no function name (expected {{type, function: {{name, …}}}})")
        tools.append(tool)
    return tools


def tool_names(tools: list[dict[str, Any]] | None) -> set[str]:
    return {t["function"]["name"] for t in tools or []}


def _lone_surrogate(value: object) -> int | None:
    """The first lone surrogate in a JSON value's strings (keys too), as a code point; None when all are text."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return ord(text[exc.start])
    return None


def normal_call(raw: object, where: str, number: int) -> dict[str, Any]:
    """One call as the servers take it: {id, type, function: {name, arguments as a JSON-object string}}."""
    if not isinstance(raw, dict):
        raise PromptError(f"{where}: call {number} is not an object")
    function: dict[str, Any] = raw["function"] if isinstance(raw.get("function"), dict) else raw
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise PromptError(f"{where}: call {number} has no function name")
    arguments = function.get("arguments", function.get("parameters", {}))
    read: object = arguments  # the arguments as values: their strings must be text
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except json.JSONDecodeError:
            parsed = None
        except RecursionError:
            raise PromptError(f"{where}: call {number} ({name}) has arguments nested too deeply") from None
        if not isinstance(parsed, dict):
            raise PromptError(
                f"{where}: call {number} ({name}) has arguments that are not a JSON object: vLLM would render "
                "them as {}, SGLang refuses the request"
            )
        read = parsed
    elif isinstance(arguments, dict):
        try:
            arguments = json.dumps(arguments, ensure_ascii=False)  # what both servers' templates render
        except RecursionError:
            raise PromptError(f"{where}: call {number} ({name}) has arguments nested too deeply") from None
    else:
        raise PromptError(f"{where}: call {number} ({name}) has arguments that are not a JSON object")
    # an escaped `\\ud800` inside an arguments string passes the row's text checks, and the server's tokenizer
    # refused the request (HTTP 500, retried, then a failure): the JSON's values, read, must be text
    surrogate = _lone_surrogate(read)
    if surrogate is not None:
        raise PromptError(
            f"{where}: call {number} ({name}) has arguments holding a lone UTF-16 surrogate U+{surrogate:04X} (an "
            "unpaired \\u escape) that cannot be tokenized"
        )
    call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if raw.get("id") is not None:
        call["id"] = str(raw["id"])
    return call


def sharegpt_calls(value: str, where: str) -> list[Any]:
    """The calls of a ShareGPT `function_call` turn: a JSON call or a list of them."""
    try:
        parsed = json.loads(value)
    except (json.JSONDecodeError, RecursionError):  # RecursionError: nested deeper than Python's json reads
        raise PromptError(f"{where}: a `function_call` turn's value is not JSON {{name, arguments}}") from None
    return parsed if isinstance(parsed, list) else [parsed]


def hermes_calls(value: str, where: str) -> tuple[str, list[Any]]:
    """(content outside the blocks, calls) of a `gpt` turn with Hermes `<tool_call>` blocks, JSON or Qwen3-Coder's
    XML (`<function=NAME>` with `<parameter=K>` values, kept as the text they are: the template writes text back
    as it is)."""
    calls = []
    for block in HERMES_CALL.findall(value):
        if block.startswith(FUNCTION_OPEN):
            xml = xml_call(block)
            if xml.name is None:
                raise PromptError(f"{where}: a <tool_call> block's <function=NAME> has no closing '>'")
            calls.append({"name": xml.name, "arguments": dict(xml.parameters)})
            continue
        try:
            calls.append(json.loads(block))
        except (json.JSONDecodeError, RecursionError):  # RecursionError: nested deeper than Python's json reads
            raise PromptError(
                f"{where}: a <tool_call> block is neither JSON {{name, arguments}} nor <function=NAME> XML"
            ) from None
    return HERMES_CALL.sub("", value).strip(), calls


def hermes_results(value: str) -> list[dict[str, Any]] | None:
    """The results of a ShareGPT tool turn written as Hermes `<tool_response>` blocks (one per call, as Hermes
    datasets write parallel results), each as the text inside its block (what Qwen3's template wraps again), named
    by the block's JSON `name` when it has one; None when the turn is not only such blocks. Sent as they were, the
    prompt held each result wrapped twice, and parallel results in one turn were refused."""
    blocks = HERMES_RESPONSE.findall(value)
    if not blocks or HERMES_RESPONSE.sub("", value).strip():
        return None
    results = []
    for block in blocks:
        result: dict[str, Any] = {"role": "tool", "content": block}
        try:
            said = json.loads(block)
        except (json.JSONDecodeError, RecursionError):
            said = None
        if isinstance(said, dict) and isinstance(said.get("name"), str):
            result["name"] = said["name"]
        results.append(result)
    return results


def check_trace(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    where: str,
    numbers: Sequence[int] | None = None,
) -> None:
    """Give every call an id and every result its call's id; refuse a trace the servers would render otherwise.

    Edits `messages` in place (ids filled in). Raises PromptError naming the message as the file numbers it
    (`numbers`: a Hermes tool turn of several `<tool_response>` blocks is several messages here, one there)."""
    declared = tool_names(tools)
    pending: list[dict[str, Any]] = []  # calls not yet answered, in order
    made = 0
    for index, msg in enumerate(messages):
        number = numbers[index] if numbers is not None else index + 1
        role = msg["role"]
        if role == "tool":
            _answer(msg, pending, where, number)
            continue
        if pending:
            ids = ", ".join(c["id"] for c in pending)
            raise PromptError(
                f"{where}: message {number} ({role}) comes while call {ids} has no result: the template would "
                "render a call nobody answered"
            )
        for call in msg.get("tool_calls") or []:
            name = call["function"]["name"]
            if name not in declared:
                said = f"its `tools` declare {', '.join(sorted(declared))}" if declared else "it has no `tools`"
                raise PromptError(f"{where}: message {number} calls {name!r}, which the row does not declare ({said})")
            call.setdefault("id", f"functions.{name}:{made}")
            made += 1
            pending.append(call)
        call_ids = [c["id"] for c in msg.get("tool_calls") or []]
        if len(set(call_ids)) != len(call_ids):
            raise PromptError(f"{where}: message {number} gives two calls the same id {call_ids!r}")
    if pending and messages[-1]["role"] == "tool":  # the generation follows these results: all must be there
        ids = ", ".join(c["id"] for c in pending)
        raise PromptError(
            f"{where}: the row ends with results while call {ids} has none: the model would be asked for its next "
            "turn after a call nobody answered"
        )


def _answer(msg: dict[str, Any], pending: list[dict[str, Any]], where: str, number: int) -> None:
    """Match a result to the call it answers: by `tool_call_id`, else the first unanswered call of its `name` (Hermes
    results name their function, in any order), else the first unanswered call."""
    wanted = msg.get("tool_call_id")
    if wanted is None:
        named = [c for c in pending if c["function"]["name"] == msg.get("name")]
        call = named[0] if named else pending[0] if pending else None
    else:
        call = next((c for c in pending if c["id"] == str(wanted)), None)
    if call is None:
        said = f" for {wanted!r}" if wanted is not None else ""
        raise PromptError(f"{where}: message {number} is a tool result{said} that answers no call before it")
    name = msg.get("name")
    if name is not None and name != call["function"]["name"]:
        raise PromptError(
            f"{where}: message {number} is the result of {name!r}, but it answers call {call['id']} "
            f"of {call['function']['name']!r}"
        )
    pending.remove(call)
    msg["tool_call_id"] = call["id"]
