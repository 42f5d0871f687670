"""The simulated gpt-oss: Harmony channel messages on o200k_harmony ids, and vLLM's openai_gptoss parse of them.

The model answers `<|channel|>analysis<|message|>…<|end|><|start|>assistant<|channel|>final<|message|>…<|return|>`
(the generation prompt ended `<|start|>assistant`), or, when the prompt's developer message declares tools and the
prompt does not end with a tool result, calls the first one:
`…<|end|><|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}<|call|>`.
The output is written as text and encoded with the real tokenizer, so decoding and encoding it again gives the
same ids. Each `harmony-*` quirk (`config.HARMONY_QUIRKS`) reproduces one known failure, on every request.

The parser side (`read_turn`) is vLLM's: analysis bodies are `reasoning`, final bodies `content`, a message with a
`functions.*` recipient a tool call (id `chatcmpl-tool-…`); headers and end tokens give no text. It returns the
`ToolTurn` the kimi_k2 shapes use, so the chat answer and its stream are built by `tool_shapes` as for Kimi.
"""

from __future__ import annotations

import json
import random
import re
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tokview.core.harmony import CALL, MESSAGE, parse_harmony
from tokview.sim.model import ANSWER_SENTENCES, REASONING_SENTENCES, TOOL_REASONING, Generation, request_seed
from tokview.sim.tools import WORDS, ParsedCall, ParsedOutput, ToolTurn, tool_choice

if TYPE_CHECKING:
    from tokview.sim.model import ModelState

ANALYSIS = "<|channel|>analysis<|message|>"
FINAL = "<|start|>assistant<|channel|>final<|message|>"
_TOOLS = re.compile(r"namespace functions \{(.*?)\} // namespace functions", re.S)
_TYPE = re.compile(r"^type (\w[\w.\-]*) = ", re.M)
_PARAM = re.compile(r"^(\w+)(\?)?: (\w+)", re.M)


def declared_tools(prompt_text: str) -> list[tuple[str, dict[str, Any]]]:
    """(name, example arguments) of each tool the developer message declares, in order."""
    found = _TOOLS.search(prompt_text)
    if not found:
        return []
    block = found.group(1)
    starts = [(m.start(), m.group(1)) for m in _TYPE.finditer(block)]
    declared = []
    for k, (at, name) in enumerate(starts):
        body = block[at : starts[k + 1][0] if k + 1 < len(starts) else len(block)]
        args = {p.group(1): _example(p.group(3), p.group(1)) for p in _PARAM.finditer(body) if not p.group(2)}
        declared.append((name, args))
    return declared


def _example(ts_type: str, name: str) -> Any:
    if ts_type == "number":
        return 3
    if ts_type == "boolean":
        return True
    return WORDS[sum(map(ord, name)) % len(WORDS)]


def ends_with_tool_result(prompt_text: str) -> bool:
    """Whether the last message before the generation prompt is a tool's result (`<|start|>functions.NAME …`)."""
    head = prompt_text.removesuffix("<|start|>assistant")
    last = head.rfind("<|start|>")
    return last >= 0 and head.startswith("<|start|>functions.", last)


def output_text(rng: random.Random, quirk: Callable[[str], object], call: tuple[str, dict[str, Any]] | None) -> str:
    """The Harmony text the model writes, with the failures of the quirks `quirk` (name → its value) finds on."""
    if call is not None:
        name, args = call
        arguments = json.dumps(args)
        if quirk("harmony-json-garbage"):
            arguments = "Sure, here you go: " + arguments
        thought = TOOL_REASONING[rng.randrange(len(TOOL_REASONING))]
        if quirk("harmony-recipient-on-analysis"):
            return f"<|channel|>analysis to=functions.{name}<|message|>{arguments}<|call|>"
        return (
            f"{ANALYSIS}{thought}<|end|><|start|>assistant<|channel|>commentary to=functions.{name} "
            f"<|constrain|>json<|message|>{arguments}<|call|>"
        )
    reasoning = " ".join(REASONING_SENTENCES[rng.randrange(len(REASONING_SENTENCES))] for _ in range(rng.randint(2, 4)))
    answer = " ".join(ANSWER_SENTENCES[rng.randrange(len(ANSWER_SENTENCES))] for _ in range(rng.randint(1, 2)))
    if quirk("harmony-no-final"):
        return f"{ANALYSIS}{reasoning}<|return|>"
    final = FINAL
    if quirk("harmony-no-channel"):
        final = "<|start|>assistant<|message|>"
    if quirk("harmony-constrain-for-start"):
        final = "<|constrain|>json<|message|>"
    end = "<|call|>" if quirk("harmony-final-ends-call") else "<|return|>"
    if quirk("harmony-analysis-after-final"):
        return f"{ANALYSIS}{reasoning}<|end|>{FINAL}{answer}<|end|><|start|>assistant{ANALYSIS}Hmm.<|end|>{FINAL}{answer}{end}"
    return f"{ANALYSIS}{reasoning}<|end|>{final}{answer}{end}"


def generate(
    state: ModelState,
    prompt: list[int],
    body: dict[str, Any],
    *,
    max_tokens: int | None = None,
    stop_token_ids: Sequence[int] = (),
    ignore_eos: bool = False,
    stop: Sequence[str] = (),
    skip_special: bool = True,
) -> Generation:
    """A Harmony turn for `prompt`, cut as a server cuts it: at the first of the model's stop ids
    (`<|return|>`, `<|call|>`, `<|endoftext|>`) or the request's, or at `max_tokens`. (Stop strings are not looked
    for in Harmony messages: the servers' own readers never pass them here.)"""
    seed = body.get("seed")
    rng = random.Random(request_seed(prompt, seed, state.cfg.seed))
    text = state.decode(prompt, False)
    choice, named = tool_choice(body)
    call = None
    if choice != "none" and not ends_with_tool_result(text):
        declared = declared_tools(text)
        picked = [t for t in declared if t[0] == named] if named else declared
        call = picked[0] if picked else None
    out = list(state.model._encode(output_text(rng, state.cfg.quirk, call)))
    if ignore_eos and max_tokens:
        while len(out) < max_tokens:  # past its end, as a model ignoring its stop ids goes on (SimModel.generate)
            out += state.model._encode(output_text(rng, state.cfg.quirk, None))
    model_stops = set(state.profile.stop_ids)
    stops = set(int(i) for i in stop_token_ids or ()) | (set() if ignore_eos else model_stops)
    for pos, tid in enumerate(out):
        if tid in stops and (max_tokens is None or pos < max_tokens):
            return Generation(out[: pos + 1], "stop", tid, eos_stop=tid in model_stops)
    if max_tokens is not None and len(out) > max_tokens:
        return Generation(out[:max_tokens], "length", None, eos_stop=False)
    return Generation(out, "length" if ignore_eos else "stop", None, eos_stop=False)


def server_kwargs(state: ModelState, body: dict[str, Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The kwargs vLLM renders a gpt-oss chat prompt with: the request's top-level `reasoning_effort` wins, and
    with `server-date` the server's own date replaces the one the request named."""
    out = dict(kwargs)
    if isinstance(body.get("reasoning_effort"), str) and state.profile.effort_kwarg:
        out[state.profile.effort_kwarg] = body["reasoning_effort"]
    day = state.cfg.quirk("server-date")
    if day and state.profile.date_kwarg:
        out[state.profile.date_kwarg] = str(day)
    return out


def read_turn(state: ModelState, body: dict[str, Any], gen: Generation) -> ToolTurn:
    """vLLM's openai_gptoss parse of the output: per id a region, and the calls (`functions.*` recipients)."""
    out = gen.output_ids
    all_reasoning = bool(state.cfg.quirk("parser-all-reasoning"))
    regions = ["hidden"] * len(out)
    calls: list[ParsedCall] = []
    names: list[str] = []
    for m in parse_harmony(out, state.tokenizer):
        start, stop = m.body
        if m.recipient and m.recipient.startswith("functions.") and m.end_id == CALL:
            args = state.decode(out[start:stop], False)
            calls.append(ParsedCall(m.recipient, args, start - 1, stop))
            names.append(m.recipient.removeprefix("functions."))
            for p in range(start, stop):
                regions[p] = "args"
            continue
        region = {"analysis": "reasoning", "final": "content"}.get(m.channel or "")
        if region is None or out[start - 1 : start] != [MESSAGE]:
            continue  # a commentary preamble or a header the parser cannot read: no text
        for p in range(start, stop):
            regions[p] = "reasoning" if all_reasoning else region
    if tool_choice(body)[0] == "none":
        calls, names = [], []
    ids = [f"chatcmpl-tool-{uuid.uuid4().hex}" for _ in calls]
    parsed = ParsedOutput(regions, calls, next((c.arg_begin_at for c in calls), None))
    return ToolTurn(parsed, calls, ids, names, tool_choice(body)[0])
