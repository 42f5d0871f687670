"""The simulated GLM-4.7's tool calls and vLLM's glm47 tool parser (issue 28 item 5: GLM as a profile of the think-tag
model; the layout is `core.profiles.GLM_TOOL_CALLS`).

The model: when the prompt declares tools (GLM-4.7's `# Tools` system block, one JSON line per tool between
`<tools>` and `</tools>`) and the current tool loop (since the last `<|user|>`) has had fewer tool-calling turns than
`tool-rounds`, it writes its reasoning, `</think>`, then per call `<tool_call>NAME<arg_key>K</arg_key><arg_value>V
</arg_value>…</tool_call>` with no newlines (GLM-4.7's template layout: a string value as it is, any other
`json.dumps`), and stops with `<|observation|>`, the id GLM ends a tool-calling turn with (its generation_config's
eos list), so the next prompt, which renders `<|observation|>` before the results, extends the output id for id.
The arguments are `tools.example_value`'s, the calls chosen as for Kimi (`tools.plan_from`). `unclosed-section`
drops the last `</tool_call>` (GLM has no section marker: its calls are the section).

The parser (`read_turn`) is vLLM's glm45 reasoning parser and glm47 tool parser, non-streamed
(glm4_moe_tool_parser.py `extract_tool_calls`): reasoning up to `</think>`, content the text before the first
`<tool_call>`, every closed call returned with id `chatcmpl-tool-<uuid>` (SGLang's glm47 parser: `call_<24 hex>`;
the simulated SGLang serves a GLM model with it), its arguments `json.dumps` of the pairs
(a value of a parameter the request's tools type `string` as written, any other json-decoded). Streamed, each call's
id, name and whole arguments come in one delta at its `</tool_call>` (vLLM streams the arguments in pieces; the
folded call is the same).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tokview.core.glm_layout import GLM_ID
from tokview.core.profiles import GLM_TOOL_CALLS, HERMES, QWEN3_CODER, TAGGED_PARSERS
from tokview.core.tool_calls import parse_tool_calls
from tokview.sim import hermes_tools, tools
from tokview.sim.tools import ParsedCall, ParsedOutput, PlannedCall, ToolTurn

if TYPE_CHECKING:
    from tokview.core.tokenizer import TokenizerAdapter
    from tokview.sim.model import Generation, ModelState


CALL_BEGIN, CALL_END = GLM_ID["<tool_call>"], GLM_ID["</tool_call>"]
KEY_BEGIN, KEY_END = GLM_ID["<arg_key>"], GLM_ID["</arg_key>"]
VALUE_BEGIN, VALUE_END = GLM_ID["<arg_value>"], GLM_ID["</arg_value>"]
USER, OBSERVATION, SYSTEM = GLM_ID["<|user|>"], GLM_ID["<|observation|>"], GLM_ID["<|system|>"]
TOOLS_OPEN, TOOLS_CLOSE = "\n<tools>\n", "</tools>"


def is_glm(state: ModelState) -> bool:
    """Whether the served profile writes GLM's tool calls."""
    layout = state.profile.tool_calls
    return layout is not None and layout.parser == GLM_TOOL_CALLS.parser


def is_tagged(state: ModelState) -> bool:
    """Whether the served profile's calls are `<tool_call>` spans with no section (GLM's, hermes' for Qwen3): read by
    `read_turn`, each call's arguments sent whole when streamed."""
    layout = state.profile.tool_calls
    return layout is not None and layout.parser in TAGGED_PARSERS


def declared_tools(tokenizer: TokenizerAdapter, prompt_ids: Sequence[int]) -> list[dict[str, Any]] | None:
    """The tools of the prompt's `# Tools` system block (None without one, or when a line is not JSON)."""
    ids = list(prompt_ids)
    if SYSTEM not in ids:
        return None
    text = tokenizer.decode(ids[ids.index(SYSTEM) + 1 :], skip_special_tokens=False)
    return tools.json_lines_tools(text, TOOLS_OPEN, TOOLS_CLOSE)


def loop_rounds(prompt_ids: Sequence[int]) -> int:
    """Tool-calling turns in the current loop: the runs of results (`<|observation|>`) since the last user turn."""
    ids = list(prompt_ids)
    start = len(ids) - ids[::-1].index(USER) if USER in ids else 0
    return ids[start:].count(OBSERVATION)


def plan_calls(state: ModelState, prompt: list[int], seed: int, body: dict[str, Any]) -> list[PlannedCall]:
    """The calls the model writes for this prompt ([] = it answers in text)."""
    declared = declared_tools(state.tokenizer, prompt)
    return tools.plan_for(state, declared, loop_rounds(prompt), seed, body) if declared else []


def calls_ids(tokenizer: TokenizerAdapter, calls: Sequence[PlannedCall], closed: bool = True) -> list[int]:
    """GLM-4.7's ids for these calls (the last without `</tool_call>` when not `closed`)."""
    ids: list[int] = []
    for call in calls:
        ids += [CALL_BEGIN, *tokenizer.encode(call.name)]
        for key, value in json.loads(call.arguments).items():
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            ids += [KEY_BEGIN, *tokenizer.encode(key), KEY_END, VALUE_BEGIN, *tokenizer.encode(text), VALUE_END]
        ids.append(CALL_END)
    return ids if closed or not ids else ids[:-1]


def read_turn(state: ModelState, body: dict[str, Any], gen: Generation, thinking: bool) -> ToolTurn:
    """The glm45 reasoning + glm47 tool parse of the output (vLLM's and SGLang's): per id a region, and the closed
    calls; on a Qwen3 profile the qwen3 reasoning + hermes tool parse (the same regions: content up to the first
    `<tool_call>`)."""
    out = gen.output_ids
    close = state.profile.think_close_id
    stops = set(state.profile.stop_ids)
    answer_at = out.index(close) + 1 if thinking and close in out else (len(out) if thinking else 0)
    regions = ["reasoning" if p < answer_at else "content" for p in range(len(out))]
    if answer_at:
        regions[answer_at - 1] = "hidden" if close in out else regions[answer_at - 1]
        if out[0] == state.profile.think_open_id:  # Qwen3 writes its own <think>: the reasoning parser drops it
            regions[0] = "hidden"
    layout = state.profile.tool_calls or GLM_TOOL_CALLS
    on_ids = parse_tool_calls(out[answer_at:], layout, state.tokenizer, body.get("tools"))
    first = on_ids.first_marker
    calls: list[ParsedCall] = []
    names: list[str] = []
    if first is not None:
        for p in range(answer_at + first, len(out)):
            regions[p] = "hidden"
        if state.cfg.kind == "sglang":  # SGLang's detectors return the text before the first call stripped
            _strip_content(state, out, regions, answer_at, answer_at + first)
        # vLLM's hermes parser also returns a call whose `</tool_call>` never came (`<tool_call>(.*)`) once its JSON
        # parses; SGLang's qwen25 and the glm47 parsers need the end
        whole_unclosed = state.cfg.kind == "vllm" and layout.parser in (HERMES, QWEN3_CODER)
        for call in on_ids.calls:
            if (call.closed or (whole_unclosed and call.arguments_error is None)) and call.name:
                end_at = answer_at + call.span[1] - 1
                arguments = call.arguments or "{}"
                if state.cfg.kind == "sglang" and call.parameters is not None:  # its own qwen3_coder conversion
                    arguments = hermes_tools.sglang_arguments(call.parameters, body.get("tools"), call.name)
                calls.append(ParsedCall(call.name, arguments, end_at - 1, end_at))
                names.append(call.name)
    for p, tid in enumerate(out):
        if tid in stops:
            regions[p] = "hidden"
    choice = tools.tool_choice(body)[0]
    if choice == "none" or state.cfg.quirk("parser-drops-call"):
        calls, names = ([], []) if choice == "none" else (calls[:-1], names[:-1])
    # vLLM names a call chatcmpl-tool-<uuid>; SGLang call_<24 hex> (every tool parser but kimi_k2's)
    ids = [
        f"chatcmpl-tool-{uuid.uuid4().hex}" if state.cfg.kind == "vllm" else f"call_{uuid.uuid4().hex[:24]}"
        for _ in calls
    ]
    parsed = ParsedOutput(regions, calls, answer_at + first if first is not None else None)
    return ToolTurn(parsed, calls, ids, names, choice)


def _strip_content(state: ModelState, out: list[int], regions: list[str], start: int, end: int) -> None:
    """Hide the whitespace-only ids at both ends of the content in `out[start:end]` (`normal_text.strip()`)."""
    blank = [not state.tokenizer.decode([out[p]], skip_special_tokens=False).strip() for p in range(start, end)]
    k = 0
    while k < len(blank) and blank[k]:
        regions[start + k] = "hidden"
        k += 1
    k = len(blank) - 1
    while k >= 0 and blank[k]:
        regions[start + k] = "hidden"
        k -= 1
