"""The simulated model's tool calls and the servers' kimi_k2 tool parser (tools README §2-§6, issue 23 item 7).

The model decides from the prompt ids alone, as a real one does, so every endpoint (chat, vLLM
completions, SGLang `/generate`) gets the same output for the same prompt: when the prompt declares
tools (a `tool_declare` turn) and the current tool loop (the turns since the last user turn) has had
fewer tool-calling turns than `tool-rounds` (default 1; `each`: until every declared tool was
called), it calls `tool-calls` (default 1; `each`: every declared tool once) declared tools in one
section, in declaration order (cycling); otherwise (the loop is done: the prompt ends with its
results) it answers in text. Call ids are Kimi's `functions.NAME:IDX`, IDX counting the calls
already in the prompt; the arguments are JSON (`json.dumps`, the separators both servers
re-serialise history with) built deterministically from each tool's parameters schema.

The output layout (§2): reasoning, `</think>`, the section
`<|tool_calls_section_begin|>` (`<|tool_call_begin|>` id `<|tool_call_argument_begin|>` args
`<|tool_call_end|>`)… `<|tool_calls_section_end|>`, then `<|im_end|>`. The quirks
`section-in-reasoning` (no `</think>`: Kimi opening the section inside its reasoning) and
`unclosed-section` (no section end) change it.

The parser side works on ids (both servers' regexes match exactly the spans between these special
ids): `parse_output` splits an output into reasoning, content, hidden ids and the calls.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tokview.core.kimi_layout import KIMI_ID
from tokview.core.served_tools import tools_as_served

if TYPE_CHECKING:
    from tokview.core.tokenizer import TokenizerAdapter
    from tokview.sim.model import ModelState

IM_END = KIMI_ID["<|im_end|>"]
IM_USER = KIMI_ID["<|im_user|>"]
IM_SYSTEM = KIMI_ID["<|im_system|>"]
IM_MIDDLE = KIMI_ID["<|im_middle|>"]
THINK_CLOSE = KIMI_ID["</think>"]
SECTION_BEGIN = KIMI_ID["<|tool_calls_section_begin|>"]
SECTION_END = KIMI_ID["<|tool_calls_section_end|>"]
CALL_BEGIN = KIMI_ID["<|tool_call_begin|>"]
ARG_BEGIN = KIMI_ID["<|tool_call_argument_begin|>"]
CALL_END = KIMI_ID["<|tool_call_end|>"]
MARKERS = frozenset({SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARG_BEGIN, CALL_END})

WORDS = ("Paris", "Oslo", "Rome", "Lima", "Kyoto", "Cairo", "Quito", "Dakar")
SGLANG_NAME = re.compile(r"^(?:functions\.)?(?P<name>[\w.\-]+):(?P<index>\d+)$")
SGLANG_BAD_ARGS = "Assistant tool call function.arguments must be valid JSON."


@dataclass(frozen=True)
class PlannedCall:
    """One call the model will write: its header id text and its arguments' JSON text."""

    call_id: str
    name: str
    arguments: str


@dataclass
class ParsedCall:
    """One call as the parser finds it in the output ids: its arguments are the ids strictly between the
    output positions `arg_begin_at` (`<|tool_call_argument_begin|>`) and `end_at` (`<|tool_call_end|>`)."""

    header: str
    arguments: str
    arg_begin_at: int
    end_at: int


@dataclass
class ParsedOutput:
    """Per output position a region (`reasoning`, `content`, `hidden`, `header`, `args`), and the calls."""

    regions: list[str]
    calls: list[ParsedCall]
    section_at: int | None


def has_kimi_ids(tokenizer: TokenizerAdapter) -> bool:
    """Whether the tokenizer has the Kimi ids this module finds the declared tools at and writes calls with (the
    Kimi-layout one, Kimi-K2's own): on any other the model never calls a tool here."""
    return all(tokenizer.token_to_id(text) == i for text, i in _KIMI_TOOL_IDS.items())


_KIMI_TOOL_IDS = {
    text: KIMI_ID[text]
    for text in (
        "<|im_system|>",
        "<|im_middle|>",
        "<|im_end|>",
        "<|tool_calls_section_begin|>",
        "<|tool_calls_section_end|>",
        "<|tool_call_begin|>",
        "<|tool_call_argument_begin|>",
        "<|tool_call_end|>",
    )
}


# -- the model -------------------------------------------------------------------------------------
def declared_tools(tokenizer: TokenizerAdapter, prompt_ids: Sequence[int]) -> list[dict[str, Any]] | None:
    """The tools of the prompt's `tool_declare` turn (None without one, or when its JSON does not parse)."""
    ids = prompt_ids if isinstance(prompt_ids, list) else list(prompt_ids)
    pos = -1
    while True:  # list.index scans in C, without copies: cheap on long prompts without tools
        try:
            pos = ids.index(IM_SYSTEM, pos + 1)
            middle = ids.index(IM_MIDDLE, pos + 1)
            end = ids.index(IM_END, middle + 1)
        except ValueError:
            return None
        if tokenizer.decode(ids[pos + 1 : middle], skip_special_tokens=False) != "tool_declare":
            continue
        try:
            tools = json.loads(tokenizer.decode(ids[middle + 1 : end], skip_special_tokens=False))
        except ValueError:
            return None
        return [t for t in tools if isinstance(t, dict)] if isinstance(tools, list) else None


def _as_dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _tool_name(tool: dict[str, Any]) -> str:
    function = _as_dict(tool.get("function")) or tool
    return str(function.get("name") or "tool")


def _tool_schema(tool: dict[str, Any]) -> dict[str, Any]:
    function = _as_dict(tool.get("function")) or tool
    schema = function.get("parameters")
    return schema if isinstance(schema, dict) else {}


def example_value(schema: object, rng: random.Random, depth: int = 0) -> Any:
    """A value of this JSON schema (enum first, then its type), the same for the same rng state."""
    if not isinstance(schema, dict):
        return rng.choice(WORDS)
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][rng.randrange(len(schema["enum"]))]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if kind == "integer":
        return rng.randint(1, 9)
    if kind == "number":
        return rng.randint(1, 40) / 2
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "array":
        return [example_value(schema.get("items"), rng, depth + 1)] if depth < 4 else []
    if kind == "object" or "properties" in schema:
        props = _as_dict(schema.get("properties"))
        return {name: example_value(sub, rng, depth + 1) for name, sub in props.items()} if depth < 4 else {}
    return rng.choice(WORDS)


def loop_rounds(prompt_ids: Sequence[int]) -> int:
    """Tool-calling turns in the current loop: sections after the last user turn."""
    ids = list(prompt_ids)
    start = len(ids) - ids[::-1].index(IM_USER) if IM_USER in ids else 0
    return ids[start:].count(SECTION_BEGIN)


def plan_calls(
    tokenizer: TokenizerAdapter,
    prompt_ids: Sequence[int],
    seed: int,
    *,
    calls: int = 1,
    rounds: int = 1,
    forced: bool = False,
    named: str | None = None,
    restart_ids: bool = False,
) -> list[PlannedCall]:
    """The calls the model writes for this prompt ([] = it answers in text).

    `calls` 0 calls every declared tool once; `rounds` 0 goes on until every declared tool was called; `restart_ids` numbers the calls from 0 (not from the calls
    already in the prompt); `forced` (tool_choice required or named: the servers'
    grammar makes a call) ignores `rounds`. Round r's call k is to declared tool (r * calls + k) mod n."""
    tools = declared_tools(tokenizer, prompt_ids)
    if not tools:
        return []
    first_index = 0 if restart_ids else list(prompt_ids).count(CALL_BEGIN)
    planned = plan_from(
        tools, loop_rounds(prompt_ids), first_index, seed, calls=calls, rounds=rounds, forced=forced, named=named
    )
    return [PlannedCall(f"functions.{c.name}:{first_index + k}", c.name, c.arguments) for k, c in enumerate(planned)]


def json_lines_tools(text: str, opener: str, closer: str) -> list[dict[str, Any]] | None:
    """The tools a template wrote one JSON line each between `opener` and `closer` (Qwen3's and GLM's `<tools>`
    block): None without the block, or when a line is not JSON."""
    start = text.find(opener)
    end = text.find(closer, start + 1)
    if start < 0 or end < 0:
        return None
    try:
        declared = [json.loads(line) for line in text[start + len(opener) : end].splitlines() if line.strip()]
    except ValueError:
        return None
    return [t for t in declared if isinstance(t, dict)]


def plan_for(
    state: ModelState, declared: list[dict[str, Any]], done: int, seed: int, body: dict[str, Any]
) -> list[PlannedCall]:
    """`plan_from` with the simulator's tool quirks and the request's tool_choice (a layout without call ids)."""
    choice, named = tool_choice(body)
    return plan_from(
        declared,
        done,
        0,
        seed,
        calls=state.count_quirk("tool-calls"),
        rounds=state.count_quirk("tool-rounds"),
        forced=choice in ("required", "named"),
        named=named,
    )


def plan_from(
    tools: list[dict[str, Any]],
    done: int,
    first_index: int,
    seed: int,
    *,
    calls: int = 1,
    rounds: int = 1,
    forced: bool = False,
    named: str | None = None,
) -> list[PlannedCall]:
    """The calls to these declared tools after `done` tool-calling turns of the loop ([] = answer in text), for
    any layout (Kimi's call ids `functions.NAME:IDX` from `first_index`; other layouts ignore them)."""
    per_turn = calls if calls > 0 else len(tools)  # 0: one call to each declared tool
    rounds = rounds if rounds > 0 else -(-len(tools) // per_turn)  # 0: until every tool was called
    if done >= rounds and not forced:
        return []
    rng = random.Random(seed)
    planned = []
    for k in range(per_turn):
        tool = tools[(done * per_turn + k) % len(tools)]
        name = named or _tool_name(tool)
        if named is not None:
            tool = next((t for t in tools if _tool_name(t) == named), tool)
        args = example_value(_tool_schema(tool) or {"type": "object"}, rng)
        args = args if isinstance(args, dict) else {"value": args}
        planned.append(PlannedCall(f"functions.{name}:{first_index + k}", name, json.dumps(args, ensure_ascii=False)))
    return planned


def section_ids(tokenizer: TokenizerAdapter, calls: Sequence[PlannedCall], closed: bool = True) -> list[int]:
    """Kimi's tool-call section for these calls (without its end marker when not `closed`)."""
    ids = [SECTION_BEGIN]
    for call in calls:
        ids += [CALL_BEGIN, *tokenizer.encode(call.call_id), ARG_BEGIN, *tokenizer.encode(call.arguments), CALL_END]
    return ids + [SECTION_END] if closed else ids


# -- the parser --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Delimiters:
    """The profile's reasoning delimiters and stop ids (Kimi's by default)."""

    open_id: int | None = KIMI_ID["<think>"]
    close_id: int | None = THINK_CLOSE
    stop_ids: tuple[int, ...] = (IM_END,)


def parse_output(
    tokenizer: TokenizerAdapter, out: Sequence[int], thinking: bool, delims: Delimiters = Delimiters()
) -> ParsedOutput:
    """Split output ids as the kimi_k2 reasoning + tool parsers do (both servers agree, README §3).

    Reasoning runs to `</think>` or, when the model opened the section inside its reasoning, to the
    section's start; a call is parsed only when it is complete (begin, id, argument begin, args, end)."""
    n = len(out)
    section_at = out.index(SECTION_BEGIN) if SECTION_BEGIN in out else None
    regions = ["reasoning" if thinking else "content"] * n
    state = regions[0] if n else "content"
    for pos, tid in enumerate(out):
        in_section = section_at is not None and pos >= section_at
        if in_section or tid in delims.stop_ids or (pos == 0 and thinking and tid == delims.open_id):
            regions[pos] = "hidden"
        elif tid == delims.close_id and state == "reasoning":
            regions[pos], state = "hidden", "content"
        else:
            regions[pos] = state
    calls: list[ParsedCall] = []
    if section_at is not None:
        calls = _parse_calls(tokenizer, out, section_at, regions)
    return ParsedOutput(regions, calls, section_at)


def _parse_calls(tokenizer: TokenizerAdapter, out: Sequence[int], start: int, regions: list[str]) -> list[ParsedCall]:
    calls: list[ParsedCall] = []
    pos = start
    while CALL_BEGIN in out[pos:]:
        begin = out.index(CALL_BEGIN, pos)
        try:
            arg_begin = out.index(ARG_BEGIN, begin + 1)
            end = out.index(CALL_END, arg_begin + 1)
        except ValueError:
            break
        if any(t in MARKERS or t == IM_END for t in out[begin + 1 : arg_begin]):
            pos = begin + 1
            continue
        header = tokenizer.decode(list(out[begin + 1 : arg_begin]), skip_special_tokens=False).strip()
        args = tokenizer.decode(list(out[arg_begin + 1 : end]), skip_special_tokens=False).strip()
        for p in range(begin + 1, arg_begin):
            regions[p] = "header"
        for p in range(arg_begin + 1, end):
            regions[p] = "args"
        if header and not re.search(r"[\s<|]", header) and args.startswith("{") and args.endswith("}"):
            calls.append(ParsedCall(header, args, arg_begin, end))
        pos = end + 1
    return calls


def function_name(header: str) -> str:
    """vLLM kimi_k2: `functions.get_weather:0` → `get_weather` (the part before `:`, after the last `.`)."""
    return header.split(":")[0].split(".")[-1]


# -- the request side ---------------------------------------------------------------------------------
def history_tool_calls(messages: Sequence[Any]) -> int:
    """Calls in the request's history (SGLang numbers returned ids from this count)."""
    total = 0
    for message in messages:
        if isinstance(message, dict) and isinstance(message.get("tool_calls"), list):
            total += len(message["tool_calls"])
    return total


def _parsed_arguments(call: object, kind: str) -> object:
    """Both servers `json.loads` a string; invalid JSON: vLLM renders `{}`, SGLang answers 400 (§6)."""
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        return call
    arguments = call["function"].get("arguments")
    if not isinstance(arguments, str):
        return call
    try:
        parsed = json.loads(arguments)
    except ValueError:
        if kind == "sglang":
            raise ValueError(SGLANG_BAD_ARGS) from None
        parsed = {}
    return {**call, "function": {**call["function"], "arguments": parsed}}


def prepare_messages(messages: list[Any], kind: str, endpoint: str = "chat") -> list[Any]:
    """The messages as each server hands them to the template.

    vLLM chat reads history reasoning from `reasoning` or `reasoning_content`; vLLM `/tokenize` only
    from `reasoning` (bug 1 of §8: it drops `reasoning_content`); SGLang only `reasoning_content`
    (it ignores `reasoning`, bug 3). Tool-call arguments are parsed to objects (the template's
    `tojson` re-serialises them)."""
    prepared = []
    for message in messages:
        if not isinstance(message, dict) or message.get("role") != "assistant":
            prepared.append(message)
            continue
        message = dict(message)
        if kind == "vllm":
            reasoning = message.pop("reasoning", None)
            kept = message.pop("reasoning_content", None)
            value = reasoning if endpoint == "tokenize" else (reasoning if reasoning is not None else kept)
            if value is not None:
                message["reasoning_content"] = value
        else:
            message.pop("reasoning", None)
        if isinstance(message.get("tool_calls"), list):
            message["tool_calls"] = [_parsed_arguments(c, kind) for c in message["tool_calls"]]
        prepared.append(message)
    return prepared


def rendered_tools(body: dict[str, Any], kind: str) -> list[Any] | None:
    """The `tools` the server renders: none for SGLang with tool_choice none (bug 5), and SGLang's
    `"defer_loading": null` in every tool (its Tool model's dump, bug 4)."""
    return tools_as_served(body.get("tools"), kind, body.get("tool_choice"))


def tool_choice(body: dict[str, Any]) -> tuple[str, str | None]:
    """(`auto`, `none`, `required` or `named`; the named function)."""
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        function = _as_dict(choice.get("function"))
        return "named", str(function.get("name") or "") or None
    if choice in ("none", "required"):
        return str(choice), None
    return "auto", None


def has_tools(body: dict[str, Any]) -> bool:
    """Whether the request declares tools (the tool parser then reads the output)."""
    return isinstance(body.get("tools"), list) and bool(body["tools"])


def uses_tools(messages: Sequence[Any], body: dict[str, Any]) -> bool:
    """A request with tools, history calls or tool results: the servers' tool handling applies."""
    return has_tools(body) or any(
        isinstance(m, dict) and (m.get("tool_calls") or m.get("role") == "tool") for m in messages
    )


def request_render(
    messages: list[Any], body: dict[str, Any], kwargs: dict[str, Any], kind: str, endpoint: str = "chat"
) -> tuple[list[Any], dict[str, Any]]:
    """(messages, template kwargs) as the server renders the request; requests without tools unchanged."""
    if not uses_tools(messages, body):
        return messages, kwargs
    declared = rendered_tools(body, kind)
    return prepare_messages(messages, kind, endpoint), ({**kwargs, "tools": declared} if declared else kwargs)


@dataclass
class ToolTurn:
    """A generation as the tool parser reads it: the parse, the calls it returns, and their ids."""

    parsed: ParsedOutput
    calls: list[ParsedCall]
    ids: list[str]
    names: list[str]
    choice: str

    def call_at(self, pos: int) -> int | None:
        """The index of the returned call whose arguments hold output position `pos`."""
        for k, call in enumerate(self.calls):
            if call.arg_begin_at < pos <= call.end_at:
                return k
        return None
