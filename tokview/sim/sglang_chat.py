"""SGLang's OpenAI chat endpoint (0.5.23 shapes, real-servers.md §6.6, protocols.md §1.7-§1.10).

Ids come inside the choice (`prompt_token_ids` + `response_token_ids`, or `token_ids` on other
builds), only without streaming (asking for them while streaming is the recorded HTTP 400), and the
kimi_k2 parser splits *decoded text*, so a special `</think>` leaves everything in reasoning.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from tokview.core.json_value import JsonObject, as_pydantic_bool
from tokview.core.profiles import HARMONY
from tokview.core.served_messages import messages_as_served
from tokview.core.sglang_prefill import last_assistant
from tokview.sim import common, faults, glm_tools, harmony, requests, tool_shapes, tools
from tokview.sim import sglang_shapes as shapes
from tokview.sim.common import SimState, sse
from tokview.sim.model import Generation, Sampling
from tokview.sim.reasoning import sglang_stream_regions, sglang_text_split

STREAM_IDS_ERROR = "{field} is not supported with streaming{where}. Please set stream=false when using {field}=true."
"""SGLang's refusal of an id flag on a chat stream; only `return_token_ids`'s names the endpoint (`where`)."""


TOOLS_IN_KWARGS = "apply_chat_template() got multiple values for keyword argument 'tools'"
"""SGLang renders with `apply_chat_template(..., tools=tools, **chat_template_kwargs)`: a `tools` kwarg is refused."""


async def chat(state: SimState, request: Request, body: dict[str, Any]) -> Response:
    cfg = state.cfg
    no_ids = bool(cfg.quirk("no-id-fields"))
    stream = as_pydantic_bool(body.get("stream"))  # pydantic's bool: "false" is false, " true" refused
    if stream is None:
        return faults.error_response("sglang", 400, faults.STREAM_NOT_A_BOOL, "BadRequest")
    if stream and not no_ids:
        for flag in ("return_token_ids", "return_prompt_token_ids", "return_meta_info"):
            if body.get(flag):
                where = " on /v1/chat/completions" if flag == "return_token_ids" else ""
                said = STREAM_IDS_ERROR.format(field=flag, where=where)
                return faults.error_response("sglang", 400, said, "BadRequest")
    kwargs = requests.sglang_template_kwargs(body)
    tool_parser = tools.has_tools(body) and body.get("tool_choice") != "none"
    try:
        requests.declared_tools(body, "sglang")
        if body.get("input_ids") is not None:
            prompt = requests.valid_ids(state.tokenizer, body["input_ids"])
        else:
            if "tools" in kwargs:  # its template call passes `tools=` itself: a TypeError, answered as a 400
                raise ValueError(TOOLS_IN_KWARGS)
            continued = as_pydantic_bool(body.get("continue_final_message")) is True  # "false" is false
            # SGLang fills a null content and joins text parts before it reads a last assistant message
            served = messages_as_served(requests.chat_messages(body), "sglang", state.tokenizer.chat_template)
            messages, prefix = last_assistant(served, continued)
            render = harmony.server_kwargs(state, body, kwargs) if state.profile.format == HARMONY else kwargs
            messages, render_kwargs = tools.request_render(messages, body, render, "sglang")
            prompt = state.render(messages, render_kwargs)
            if prefix is not None:  # SGLang's prefill: the generation prompt, then the prefix's ids
                prompt = prompt + state.tokenizer.encode(prefix)
        max_tokens = requests.chat_max_tokens(body)
        requests.include_usage(body)  # a malformed stream_options is the request's fault
        requests.one_choice(body)
        stop = requests.stop_strings(body.get("stop")) if not tool_parser and state.profile.format != HARMONY else ()
    except ValueError as exc:
        return faults.error_response("sglang", 400, str(exc), "BadRequest")
    cut = common.context_room(state, prompt, max_tokens)  # a request past the limit is a 400
    if isinstance(cut, Response):
        return cut
    fault, early = await common.admit(state, request, stream)
    if early is not None:
        return early
    started = time.monotonic()
    sampling: Sampling = {
        "max_tokens": cut,
        "stop_token_ids": body.get("stop_token_ids") or (),
        "ignore_eos": bool(body.get("ignore_eos")),
    }
    gen = state.generate(prompt, body, **common.with_stop(sampling, stop, body))
    # with tools (and tool_choice not none) SGLang decodes with the special tokens for its tool parser
    skip = bool(body.get("skip_special_tokens", True)) and not tool_parser
    thinking = state.thinking(kwargs)
    separate = bool(body.get("separate_reasoning", True)) and not cfg.quirk("no-reasoning-parser")
    out = gen.output_ids
    r_tokens = 0
    if thinking and separate:
        r_tokens = out.index(state.profile.think_close_id) + 1 if state.profile.think_close_id in out else len(out)
    if tool_parser or state.profile.format == HARMONY:  # gpt-oss: SGLang's GptOssDetector reads every answer
        return _tool_chat(
            state, body, prompt, gen, thinking=thinking and separate, r_tokens=r_tokens, stream=stream, fault=fault
        )
    if stream:
        events = chat_events(state, body, prompt, gen, skip=skip, split=thinking and separate, r_tokens=r_tokens)
        return common.deliver_stream(
            events, fault, {"error": {"message": "simulated failure mid-stream (fault stream-error)"}}
        )
    keep = bool(body.get("no_stop_trim"))
    text = common.cut_texts([state.decode(shapes.text_ids(gen, keep), skip)], common.stop_drop(gen, keep))[0]
    if cfg.quirk("parser-all-reasoning"):
        reasoning, content = text.replace("<think>", "").replace("</think>", "").strip() or None, ""
    elif separate:
        reasoning, content = sglang_text_split(text, thinking)
    else:
        reasoning, content = None, text
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": content or "", "reasoning_content": reasoning},
        "logprobs": None,
        "finish_reason": gen.finish_reason,
        "matched_stop": gen.matched,
    }
    if not no_ids:
        if body.get("return_token_ids") or body.get("return_prompt_token_ids"):
            choice["prompt_token_ids"] = list(prompt)
        if body.get("return_token_ids"):
            choice[cfg.quirk("sglang-chat-ids") or "response_token_ids"] = list(out)
        if body.get("return_meta_info"):
            choice["meta_info"] = shapes.meta(
                prompt,
                len(out),
                finish_reason=shapes.finish(gen),
                rid=common.new_id(),
                started=started,
                reasoning_tokens=r_tokens,
            )
    payload: JsonObject = {
        "id": common.new_id(),
        "object": "chat.completion",
        "created": common.now(),
        "model": cfg.model_name,
        "choices": [choice],
        "usage": {
            "prompt_tokens": len(prompt),
            "total_tokens": len(prompt) + len(out),
            "completion_tokens": len(out),
            "prompt_tokens_details": None,
            "reasoning_tokens": r_tokens,
            "completion_tokens_details": {"reasoning_tokens": r_tokens},
        },
        "metadata": {
            "weight_version": "default",
            "weight_versions": [{"version": "default", "start": 0, "end": len(out)}],
        },
    }
    ext = tool_shapes.sglext(body, prompt, out)
    if ext is not None and not no_ids:
        payload["sglext"] = ext
    return common.deliver_json(payload, fault)


def _ids_fields(
    state: SimState, body: dict[str, Any], prompt: list[int], gen: Generation, *, started: float, r_tokens: int
) -> dict[str, Any]:
    """The id fields a non-streamed chat choice carries for the request's flags (none with no-id-fields)."""
    cfg, out = state.cfg, gen.output_ids
    fields: dict[str, Any] = {}
    if cfg.quirk("no-id-fields"):
        return fields
    if body.get("return_token_ids") or body.get("return_prompt_token_ids"):
        fields["prompt_token_ids"] = list(prompt)
    if body.get("return_token_ids"):
        fields[cfg.quirk("sglang-chat-ids") or "response_token_ids"] = list(out)
    if body.get("return_meta_info"):
        fields["meta_info"] = shapes.meta(
            prompt,
            len(out),
            finish_reason=shapes.finish(gen),
            rid=common.new_id(),
            started=started,
            reasoning_tokens=r_tokens,
        )
    return fields


def _tool_chat(
    state: SimState,
    body: dict[str, Any],
    prompt: list[int],
    gen: Generation,
    *,
    thinking: bool,
    r_tokens: int,
    stream: bool,
    fault: str | None,
) -> Response:
    """A chat request with tools: SGLang's kimi_k2 tool parser's answer (tools README §3-§5); a GLM model's, its
    glm47 parser's (as `--tool-call-parser glm47` answers); a gpt-oss model's, with or without tools (SGLang's
    GptOssDetector splits the Harmony channels, decoding with the special tokens: protocols.md)."""
    started = time.monotonic()
    out = gen.output_ids
    history = tools.history_tool_calls(body.get("messages") or [])
    if state.profile.format == HARMONY:  # the channels, as vLLM's parser reads them; SGLang's own call ids
        turn = harmony.read_turn(state, body, gen)
        turn.ids[:] = [f"call_{uuid.uuid4().hex[:24]}" for _ in turn.calls]
        r_tokens = turn.parsed.regions.count("reasoning")
    elif glm_tools.is_tagged(state):
        turn = glm_tools.read_turn(state, body, gen, thinking)
    else:
        turn = tool_shapes.read_turn(state, body, gen, thinking, history)
    usage = {
        "prompt_tokens": len(prompt),
        "total_tokens": len(prompt) + len(out),
        "completion_tokens": len(out),
        "prompt_tokens_details": None,
        "reasoning_tokens": r_tokens,
        "completion_tokens_details": {"reasoning_tokens": r_tokens} if r_tokens else None,
    }
    text_ids = shapes.text_ids(gen, bool(body.get("no_stop_trim")))
    if stream:
        events = tool_shapes.sglang_events(state, body, prompt, gen, turn=turn, text_ids=text_ids, usage=usage)
        error: JsonObject = {"error": {"message": "simulated failure mid-stream (fault stream-error)"}}
        return common.deliver_stream(events, fault, error)
    finish = tool_shapes.finish_reason(turn, gen, "sglang")
    choice: dict[str, Any] = {
        "index": 0,
        "message": tool_shapes.sglang_message(state, turn, out),
        "logprobs": None,
        "finish_reason": finish,
        "matched_stop": None if finish == "tool_calls" else gen.matched,
        **_ids_fields(state, body, prompt, gen, started=started, r_tokens=r_tokens),
    }
    payload: dict[str, Any] = {
        "id": common.new_id(),
        "object": "chat.completion",
        "created": common.now(),
        "model": state.cfg.model_name,
        "choices": [choice],
        "usage": usage,
        "metadata": {
            "weight_version": "default",
            "weight_versions": [{"version": "default", "start": 0, "end": len(out)}],
        },
    }
    ext = tool_shapes.sglext(body, prompt, out)
    if ext is not None and not state.cfg.quirk("no-id-fields"):
        payload["sglext"] = ext
    return common.deliver_json(payload, fault)


def chat_events(
    state: SimState, body: dict[str, Any], prompt: list[int], gen: Generation, *, skip: bool, split: bool, r_tokens: int
) -> list[str]:
    """SGLang chat stream: role chunk, one delta per visible piece, finish chunk, usage, [DONE]."""
    rid, created, model = common.new_id(), common.now(), state.cfg.model_name
    out = gen.output_ids
    keep = bool(body.get("no_stop_trim"))
    pieces = common.cut_texts(state.stream_pieces(shapes.text_ids(gen, keep), skip), common.stop_drop(gen, keep))
    if state.cfg.quirk("parser-all-reasoning"):
        regions = ["hidden" if p in ("<think>", "</think>") else "reasoning" for p in pieces]
    elif split:
        regions = sglang_stream_regions(pieces, True)
    else:
        regions = ["content"] * len(pieces)

    def chunk(delta: dict[str, Any], finish: str | None = None, matched: int | str | None = None) -> str:
        return sse(
            {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, "matched_stop": matched}
                ],
                "usage": None,
            }
        )

    events = [chunk({"role": "assistant", "content": ""})]
    for piece, region in zip(pieces, regions):
        if region == "hidden" or not piece:
            continue
        events.append(chunk({"reasoning_content": piece} if region == "reasoning" else {"content": piece}))
    events.append(chunk({}, gen.finish_reason, gen.matched))
    ext = tool_shapes.sglext(body, prompt, out)
    if ext is not None and not state.cfg.quirk("no-id-fields"):
        events.append(
            sse(
                {
                    "id": rid,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "choices": [],
                    "usage": None,
                    "sglext": ext,
                }
            )
        )
    if requests.include_usage(body):
        events.append(
            sse(
                {
                    "id": rid,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "choices": [],
                    "usage": {
                        "prompt_tokens": len(prompt),
                        "total_tokens": len(prompt) + len(out),
                        "completion_tokens": len(out),
                        "reasoning_tokens": r_tokens,
                    },
                }
            )
        )
    events.append(common.DONE)
    return events
