"""What each server's kimi_k2 tool parser makes of a turn, as recorded (tools README §3-§5).

vLLM: `tool_calls[].id` is the header the model wrote, `content` null (`""` with tool_choice
required or named), `finish_reason` `tool_calls` (`stop` when named); streamed with
`return_token_ids`, one chunk per id, the markers and the header as `delta: {}`, the arguments as
deltas whose last `}` waits for `<|tool_call_end|>`. SGLang: the id is rebuilt as
`functions.{name}:{calls in history + index}`, `content` is `""`, `matched_stop` null without
streaming; streamed, text deltas, one header chunk per call at its argument begin, then the argument
pieces, and the ids only in the final `sglext` chunk. tool_choice none: vLLM's parser swallows the
section (no `tool_calls`, `stop`); SGLang does not render the tools at all (handled by the caller).
A GLM model's turn (`glm_tools`) goes out in the same shapes, a call's arguments whole with its name.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from tokview.core.json_value import JsonObject
from tokview.core.server_versions import VLLM_MARKER_LOGPROBS, at_least
from tokview.sim import common, glm_tools, requests, tools
from tokview.sim.common import SimState, sse
from tokview.sim.model import Generation
from tokview.sim.tools import ToolTurn


def read_turn(state: SimState, body: dict[str, Any], gen: Generation, thinking: bool, history: int) -> ToolTurn:
    """Parse the output and decide the returned calls' ids and names per server (and the parser quirks)."""
    choice, _ = tools.tool_choice(body)
    profile = state.profile
    delims = tools.Delimiters(profile.think_open_id, profile.think_close_id, tuple(profile.stop_ids))
    parsed = tools.parse_output(state.tokenizer, gen.output_ids, thinking, delims)
    calls = list(parsed.calls)
    kind = state.cfg.kind
    if kind == "sglang":
        calls = [c for c in calls if tools.SGLANG_NAME.match(c.header)]
    if state.cfg.quirk("parser-drops-call"):
        calls = calls[:-1]
    if choice == "none":
        calls = []
    if kind == "sglang":
        names = [m.group("name") for c in calls if (m := tools.SGLANG_NAME.match(c.header))]
        ids = [f"functions.{name}:{history + k}" for k, name in enumerate(names)]
    else:
        names = [tools.function_name(c.header) for c in calls]
        ids = [c.header for c in calls]
    if state.cfg.quirk("uuid-call-ids"):
        ids = [f"chatcmpl-tool-{uuid.uuid4().hex}" for _ in calls]
    return ToolTurn(parsed, calls, ids, names, choice)


def region_ids(turn: ToolTurn, out: list[int], region: str) -> list[int]:
    return [t for t, r in zip(out, turn.parsed.regions) if r == region]


def finish_reason(turn: ToolTurn, gen: Generation, kind: str) -> str:
    if gen.finish_reason == "length":
        return "length"
    if turn.calls and (kind == "sglang" or turn.choice != "named"):
        return "tool_calls"
    return "stop"


# -- vLLM ----------------------------------------------------------------------------------------------
def vllm_message(state: SimState, turn: ToolTurn, out: list[int], field: str) -> dict[str, Any]:
    reasoning = state.decode(region_ids(turn, out, "reasoning"), True) or None
    content: str | None = state.decode(region_ids(turn, out, "content"), True) or None
    if content is None and turn.choice in ("required", "named"):
        content = ""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
    }
    if turn.calls:
        message["tool_calls"] = [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": call.arguments}}
            for cid, name, call in zip(turn.ids, turn.names, turn.calls)
        ]
    message[field] = reasoning
    return message


def vllm_deltas(state: SimState, turn: ToolTurn, out: list[int], field: str) -> list[dict[str, Any]]:
    """One delta per output id (README §4): text pieces, `{}` for what the parser hides, argument deltas."""
    deltas: list[dict[str, Any]] = []
    sent: dict[int, str] = {}
    texts = state.stream_pieces(out, True)
    for pos in range(len(out)):
        region = turn.parsed.regions[pos]
        k = turn.call_at(pos)
        if region == "reasoning":
            deltas.append({field: texts[pos]})
        elif region == "content":
            deltas.append({"content": texts[pos]})
        elif k is not None:
            deltas.append(_vllm_argument_delta(state, turn, out=out, k=k, pos=pos, sent=sent))
        else:
            deltas.append({})
    return deltas


def _vllm_argument_delta(
    state: SimState, turn: ToolTurn, *, out: list[int], k: int, pos: int, sent: dict[int, str]
) -> dict[str, Any]:
    """vLLM streams the arguments parsed so far and holds back a trailing `}` until `<|tool_call_end|>`."""
    call = turn.calls[k]
    if pos == call.end_at:
        target = call.arguments
    else:
        so_far = "".join(state.stream_pieces(out[call.arg_begin_at + 1 : pos + 1], False)).lstrip()
        target = so_far[:-1] if so_far.endswith("}") else so_far  # a character not whole yet is held back
    first = k not in sent
    text = target[len(sent.get(k, "")) :]
    sent[k] = sent.get(k, "") + text
    if first:
        function = {"name": turn.names[k], "arguments": text}
        return {"tool_calls": [{"id": turn.ids[k], "type": "function", "index": k, "function": function}]}
    return {"tool_calls": [{"index": k, "function": {"arguments": text}}]} if text else {}


def vllm_events(
    state: SimState,
    body: dict[str, Any],
    prompt: list[int],
    gen: Generation,
    *,
    turn: ToolTurn,
    field: str,
    ids: bool,
    usage: dict[str, Any],
    fingerprint: str,
    logprob: Callable[[int, int], dict[str, Any]] | None,
) -> list[str]:
    """The chat stream of a tool request: role chunk, one chunk per id (empty ones only with ids), usage."""
    out = gen.output_ids
    head: JsonObject = {
        "id": common.new_id("chatcmpl-"),
        "object": "chat.completion.chunk",
        "created": common.now(),
        "model": state.cfg.model_name,
    }
    first: JsonObject = {
        **head,
        "choices": [
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        ],
        "prompt_token_ids": list(prompt) if ids else None,
        "prompt_text": None,
    }
    keyless = bool(state.cfg.quirk("no-id-fields"))  # a build before return_token_ids: no id keys at all
    if keyless:
        first.pop("prompt_token_ids")
    events = [sse(first)]
    with_usage = requests.include_usage(body)
    misses = bool(state.cfg.quirk("stream-misses-ids"))
    # from 0.31 an empty delta's chunk is sent for its logprob, as on the path without tools (`vllm.chat_events`)
    marker_logprobs = logprob is not None and at_least(state.cfg.server_version, VLLM_MARKER_LOGPROBS)
    for pos, (tid, delta) in enumerate(zip(out, vllm_deltas(state, turn, out, field))):
        last = pos == len(out) - 1
        in_section = turn.parsed.section_at is not None and pos >= turn.parsed.section_at
        if not last and not delta and ((not ids and not marker_logprobs) or (misses and in_section)):
            continue
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
        if logprob is not None:
            choice["logprobs"] = {"content": [logprob(tid, len(prompt) + pos)]}
        chunk: dict[str, Any] = {**head, "choices": [choice]}
        if last:
            choice.update(finish_reason=finish_reason(turn, gen, "vllm"), stop_reason=None)
            if gen.finish_reason == "stop" and not gen.eos_stop:
                choice["stop_reason"] = gen.matched
            if not with_usage:
                chunk["system_fingerprint"] = fingerprint
        if not keyless:
            choice["token_ids"] = [tid] if ids else None
        events.append(sse(chunk))
    if with_usage:
        events.append(sse({**head, "choices": [], "usage": usage, "system_fingerprint": fingerprint}))
    events.append("data: [DONE]\n\n")
    return events


# -- SGLang --------------------------------------------------------------------------------------------
def sglang_message(state: SimState, turn: ToolTurn, out: list[int]) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": state.decode(region_ids(turn, out, "content"), True),
        "reasoning_content": state.decode(region_ids(turn, out, "reasoning"), True) or None,
    }
    if turn.calls:
        message["tool_calls"] = [
            {"id": cid, "index": k, "type": "function", "function": {"name": name, "arguments": call.arguments}}
            for k, (cid, name, call) in enumerate(zip(turn.ids, turn.names, turn.calls))
        ]
    return message


def sglang_deltas(state: SimState, turn: ToolTurn, out: list[int]) -> list[tuple[dict[str, Any], bool]]:
    """(delta, carries `usage: null`) per visible piece: reasoning, content, then per call its header
    at `<|tool_call_argument_begin|>` and its argument pieces (README §4)."""
    deltas: list[tuple[dict[str, Any], bool]] = []
    empty = {"role": None, "content": None, "reasoning_content": None}
    begins = {call.arg_begin_at: k for k, call in enumerate(turn.calls)}
    texts, arguments = state.stream_pieces(out, True), state.stream_pieces(out, False)
    for pos in range(len(out)):
        region = turn.parsed.regions[pos]
        if region == "reasoning":
            deltas.append(({"reasoning_content": texts[pos]}, False))
        elif region == "content":
            deltas.append(({"role": None, "content": texts[pos], "reasoning_content": None}, True))
        elif pos in begins:
            head = begins[pos]
            # a GLM call's arguments are read off its <arg_key>/<arg_value> pairs, no span of ids: sent whole with its
            # name, as the glm47 parser sends them once the call closes (recorded on vLLM; SGLang's chunking unrecorded)
            whole = turn.calls[head].arguments if glm_tools.is_tagged(state) else ""
            function: dict[str, Any] = {"name": turn.names[head], "arguments": whole}
            call = {"id": turn.ids[head], "index": head, "type": "function", "function": function}
            deltas.append(({**empty, "tool_calls": [call]}, True))
        elif (k := turn.call_at(pos)) is not None and pos != turn.calls[k].end_at:
            piece = {"name": None, "arguments": arguments[pos]}
            deltas.append(
                ({**empty, "tool_calls": [{"id": None, "index": k, "type": "function", "function": piece}]}, True)
            )
    return deltas


def sglext(body: dict[str, Any], prompt: list[int], out: list[int]) -> dict[str, Any] | None:
    """The `sglext` object the two flags ask for (`input_ids`, `output_ids` one list per choice), or None."""
    ext: dict[str, Any] = {}
    if body.get("return_input_ids_in_sglext"):
        ext["input_ids"] = list(prompt)
    if body.get("return_output_ids_in_sglext"):
        ext["output_ids"] = [list(out)]
    return ext or None


def sglang_events(
    state: SimState,
    body: dict[str, Any],
    prompt: list[int],
    gen: Generation,
    *,
    turn: ToolTurn,
    text_ids: list[int],
    usage: dict[str, Any],
) -> list[str]:
    """SGLang's chat stream of a tool request: role chunk, deltas, finish chunk, `sglext`, usage, [DONE]."""
    head: JsonObject = {
        "id": common.new_id(),
        "object": "chat.completion.chunk",
        "created": common.now(),
        "model": state.cfg.model_name,
    }

    def chunk(
        delta: dict[str, Any], with_usage: bool, finish: str | None = None, matched: int | str | None = None
    ) -> str:
        choice: JsonObject = {
            "index": 0,
            "delta": delta,
            "logprobs": None,
            "finish_reason": finish,
            "matched_stop": matched,
        }
        return sse({**head, "choices": [choice], **({"usage": None} if with_usage else {})})

    events = [chunk({"reasoning_content": None, "role": "assistant", "content": ""}, False)]
    events += [chunk(delta, with_usage) for delta, with_usage in sglang_deltas(state, turn, text_ids)]
    events.append(chunk({"reasoning_content": None}, False, finish_reason(turn, gen, "sglang"), gen.matched))
    out = gen.output_ids
    if state.cfg.quirk("stream-misses-ids"):  # the model's own call markers: Kimi's, or GLM's <tool_call> and kin
        layout = state.profile.tool_calls
        markers = layout.marker_ids if glm_tools.is_tagged(state) and layout is not None else tools.MARKERS
        out = [t for t in out if t not in markers]
    ext = sglext(body, prompt, out)
    if ext is not None:
        events.append(sse({**head, "choices": [], "usage": None, "sglext": ext}))
    if requests.include_usage(body):
        events.append(sse({**head, "choices": [], "usage": usage}))
    events.append(common.DONE)
    return events
