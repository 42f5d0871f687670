"""The vLLM surface (0.32.0 shapes, real-servers.md §4.4-§4.5, protocols.md §2).

Chat completions with `return_token_ids` (top-level `prompt_token_ids`, per-choice `token_ids`),
an id-based kimi_k2 reasoning split into `message.reasoning` (`reasoning_content` before 0.16),
completions with a token-id prompt, streaming exactly as recorded, and tokenize/detokenize.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tokview.core.json_value import JsonObject, as_pydantic_bool
from tokview.core.profiles import HARMONY
from tokview.core.server_versions import VLLM_MARKER_LOGPROBS, at_least
from tokview.sim import common, faults, glm_tools, harmony, requests, spec, tool_shapes, tools
from tokview.sim.common import SimState, sse
from tokview.sim.model import Generation, Sampling
from tokview.sim.reasoning import vllm_id_regions


def routes(state: SimState) -> list[Route]:
    cfg = state.cfg

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def version(request: Request) -> Response:
        return JSONResponse({"version": cfg.server_version})

    async def models(request: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": cfg.model_name,
                        "object": "model",
                        "created": common.now(),
                        "owned_by": "tokview-sim",
                        "root": str(state.tokenizer.source or cfg.model_name),
                        "parent": None,
                        "max_model_len": cfg.max_model_len,
                        "permission": [],
                        "simulator": True,
                    }
                ],
            }
        )

    async def chat(request: Request) -> Response:
        body = await common.read_json(request, "vllm")
        return body if isinstance(body, Response) else await _chat(state, request, body)

    async def completions(request: Request) -> Response:
        body = await common.read_json(request, "vllm")
        return body if isinstance(body, Response) else await _completions(state, request, body)

    async def tokenize(request: Request) -> Response:
        body = await common.read_json(request, "vllm")
        if isinstance(body, Response):
            return body
        try:
            if body.get("messages") is not None:
                messages, render_kwargs = tools.request_render(
                    body["messages"], body, body.get("chat_template_kwargs") or {}, "vllm", endpoint="tokenize"
                )
                tokens = state.render(messages, render_kwargs, *_generation_prompt(body))
            else:
                tokens = requests.tokenize_text(state.tokenizer, body)
        except ValueError as exc:
            return faults.error_response("vllm", 400, str(exc), "BadRequestError")
        strs = state.pieces(tokens, False) if body.get("return_token_strs") else None
        return JSONResponse(
            {"count": len(tokens), "max_model_len": cfg.max_model_len, "tokens": tokens, "token_strs": strs}
        )

    async def detokenize(request: Request) -> Response:
        body = await common.read_json(request, "vllm")
        if isinstance(body, Response):
            return body
        return JSONResponse({"prompt": state.decode(body.get("tokens") or [], False)})

    return [
        Route("/health", health),
        Route("/version", version),
        Route("/v1/models", models),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
    ]


def _fingerprint(state: SimState) -> str:
    return f"vllm-{state.cfg.server_version}-tokview-sim"


def _sampling(state: SimState, body: dict[str, Any], prompt: list[int], default_max: int | None) -> Sampling:
    max_tokens = requests.chat_max_tokens(body, default_max)
    limit = state.cfg.max_model_len
    room = limit - len(prompt)
    if room <= 0:
        raise ValueError(
            f"This model's maximum context length is {limit} tokens. However, "
            f"your request has {len(prompt)} input tokens."
        )
    if max_tokens is not None and max_tokens > room:
        raise ValueError(
            f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's maximum "
            f"context length is {limit} tokens and your request has {len(prompt)} input tokens "
            f"({max_tokens} > {limit} - {len(prompt)})."
        )
    sampling: Sampling = {
        "max_tokens": max_tokens if max_tokens is not None else room,
        "stop_token_ids": body.get("stop_token_ids") or (),
        "ignore_eos": bool(body.get("ignore_eos")),
    }
    stop = requests.stop_strings(body.get("stop"))
    if tools.has_tools(body) or state.profile.format == HARMONY:  # text the sim does not cut (see README)
        return sampling
    return common.with_stop(sampling, stop, body)


def _unknown_model(state: SimState, body: dict[str, Any]) -> Response | None:
    """Real vLLM answers 404 NotFoundError for a `model` it does not serve (an absent one is fine)."""
    model = body.get("model")
    if model is None or model == state.cfg.model_name:
        return None
    return faults.error_response("vllm", 404, f"The model `{model}` does not exist.", "NotFoundError")


def _stop_reason(gen: Generation) -> int | str | None:
    return None if gen.eos_stop or gen.finish_reason == "length" else gen.matched


def _text_ids(gen: Generation, body: dict[str, Any]) -> list[int]:
    if isinstance(gen.matched, int) and not body.get("include_stop_str_in_output"):
        return gen.output_ids[:-1]
    return gen.output_ids


def _token_name(state: SimState, body: dict[str, Any], tid: int) -> str:
    return f"token_id:{tid}" if body.get("return_tokens_as_token_ids") else state.piece(tid, False)


def _chat_logprob(state: SimState, body: dict[str, Any], tid: int, pos: int) -> dict[str, Any]:
    """One `logprobs.content` entry; `pos` is absolute (prompt + output), as scoring sees it."""

    def entry(t: int, lp: float) -> dict[str, Any]:
        return {"token": _token_name(state, body, t), "logprob": lp, "bytes": list(state.piece(t, False).encode())}

    k = int(body.get("top_logprobs") or 0)
    return {
        **entry(tid, state.dist.logprob(pos, tid)),
        "top_logprobs": [entry(t, lp) for t, lp in state.dist.top(pos, tid, k)],
    }


def _completion_logprobs(state: SimState, body: dict[str, Any], prompt: list[int], out: list[int]) -> Any:
    """Completions `logprobs: K`: token_logprobs, tokens, top_logprobs (the token plus the top K)."""
    if body.get("logprobs") is None:
        return None
    k, n, dist = int(body["logprobs"]), len(prompt), state.dist
    tops = []
    for p, t in enumerate(out):
        top = {_token_name(state, body, a): lp for a, lp in dist.top(n + p, t, k)}
        top[_token_name(state, body, t)] = dist.logprob(n + p, t)
        tops.append(top)
    offsets = [0]
    for t in out[:-1]:
        offsets.append(offsets[-1] + len(state.piece(t, False)))
    return {
        "text_offset": offsets,
        "token_logprobs": [dist.logprob(n + p, t) for p, t in enumerate(out)],
        "tokens": [_token_name(state, body, t) for t in out],
        "top_logprobs": tops,
    }


def _prompt_logprobs(state: SimState, body: dict[str, Any], prompt: list[int]) -> Any:
    """`prompt_logprobs: K`: per prompt position the token itself (with its rank) plus the top K; first null."""
    if body.get("prompt_logprobs") is None:
        return None
    k, dist = int(body["prompt_logprobs"]), state.dist
    out: list[Any] = [None]
    for i, t in enumerate(prompt[1:], start=1):
        entry = {
            str(a): {"logprob": lp, "rank": r, "decoded_token": state.piece(a, False)}
            for r, (a, lp) in enumerate(dist.top(i, t, k), start=1)
        }
        entry[str(t)] = {
            "logprob": dist.logprob(i, t),
            "rank": dist.rank(i, t, k),
            "decoded_token": state.piece(t, False),
        }
        out.append(entry)
    return out


def _metrics(state: SimState, out: list[int]) -> dict[str, Any] | None:
    spec_metrics = spec.vllm_metrics(state.spec_decode, out)
    if spec_metrics is None:
        return None
    return {
        "time_to_first_token_ms": None,
        "generation_time_ms": None,
        "queue_time_ms": None,
        "mean_itl_ms": None,
        "tokens_per_second": None,
        "speculative_decoding": spec_metrics,
    }


def _generation_prompt(body: dict[str, Any]) -> tuple[bool, bool]:
    """(add_generation_prompt, continue_final_message) as vLLM reads them: both true is a 400 (ValueError here); the
    second renders the last message open, the assistant's start the answer goes on from (a prefill)."""
    header = as_pydantic_bool(body.get("add_generation_prompt", True)) is not False  # "false" is false, as pydantic
    continued = as_pydantic_bool(body.get("continue_final_message")) is True
    if header and continued:
        raise ValueError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    return header, continued


NO_AUTO_TOOL_CHOICE = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
"""vLLM's answer to tools with tool_choice auto when it was started without a tool parser (the live tier's chain
server says it word for word)."""


async def _chat(state: SimState, request: Request, body: dict[str, Any]) -> Response:
    cfg = state.cfg
    if (missing := _unknown_model(state, body)) is not None:
        return missing
    kwargs = requests.vllm_template_kwargs(body)
    effort = body.get("reasoning_effort")
    harmony_model = state.profile.format == HARMONY
    if cfg.quirk("no-tool-parser") and tools.has_tools(body) and body.get("tool_choice") in (None, "auto"):
        return faults.error_response("vllm", 400, NO_AUTO_TOOL_CHOICE, "BadRequestError")
    try:
        requests.declared_tools(body, "vllm")
        render = harmony.server_kwargs(state, body, kwargs) if harmony_model else kwargs
        messages, render_kwargs = tools.request_render(requests.chat_messages(body), body, render, "vllm")
        prompt = state.render(messages, render_kwargs, *_generation_prompt(body))
        sampling = _sampling(state, body, prompt, None)
        requests.include_usage(body)  # a malformed stream_options is the request's fault
        requests.one_choice(body)
    except ValueError as exc:
        return faults.error_response("vllm", 400, str(exc), "BadRequestError")
    stream = as_pydantic_bool(body.get("stream"))  # pydantic's bool: "false" is false, " true" refused
    if stream is None:
        return faults.error_response("vllm", 400, faults.STREAM_NOT_A_BOOL, "BadRequestError")
    fault, early = await common.admit(state, request, stream)
    if early is not None:
        return early
    gen = state.generate(prompt, body, **sampling)
    out = gen.output_ids
    ids = bool(body.get("return_token_ids")) and not cfg.quirk("no-id-fields")
    field = "reasoning_content" if cfg.quirk("vllm-pre-0.16") else "reasoning"
    thinking = state.thinking(kwargs) and effort != "none"
    if tools.has_tools(body) or harmony_model:
        return _tool_chat(state, body, prompt, gen, thinking=thinking, field=field, ids=ids, stream=stream, fault=fault)
    regions = vllm_id_regions(
        out,
        state.profile.think_open_id,
        state.profile.think_close_id,
        thinking and not cfg.quirk("no-reasoning-parser"),
        bool(cfg.quirk("parser-all-reasoning")),
    )
    text_len = len(_text_ids(gen, body))
    skip = bool(body.get("skip_special_tokens", True))
    r_tokens = regions.count("reasoning")
    usage = {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + len(out), "completion_tokens": len(out)}
    if stream:
        events = _chat_events(
            state,
            body,
            prompt,
            gen,
            regions=regions,
            text_len=text_len,
            skip=skip,
            field=field,
            ids=ids,
            usage=usage,
            r_tokens=r_tokens,
        )
        return common.deliver_stream(
            events,
            fault,
            {
                "error": {
                    "message": "simulated failure mid-stream (fault stream-error)",
                    "type": "InternalServerError",
                    "code": 500,
                }
            },
        )
    reasoning_ids = [t for t, r in zip(out[:text_len], regions) if r == "reasoning"]
    content_ids = [t for t, r in zip(out[:text_len], regions) if r == "content"]
    hide = body.get("include_reasoning") is False  # vLLM then nulls the reasoning and token_ids (tools §8, bug 2)
    drop = common.stop_drop(gen, bool(body.get("include_stop_str_in_output")))
    reasoning_text, content_text = common.cut_texts(
        [state.decode(reasoning_ids, skip), state.decode(content_ids, skip)], drop
    )
    reasoning = None if hide else reasoning_text or None
    content = content_text or None
    message = {
        "role": "assistant",
        "content": content,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        field: reasoning,
    }
    logprobs = None
    if body.get("logprobs") and not hide:  # `suppress_metadata` nulls them too
        logprobs = {"content": [_chat_logprob(state, body, t, len(prompt) + p) for p, t in enumerate(out)]}
    choice = {
        "index": 0,
        "message": message,
        "logprobs": logprobs,
        "finish_reason": gen.finish_reason,
        "stop_reason": _stop_reason(gen),
        "token_ids": list(out) if ids and not hide else None,
        "routed_experts": None,
    }
    full_usage: dict[str, Any] = {
        **usage,
        "prompt_tokens_details": None,
        "completion_tokens_details": {"reasoning_tokens": r_tokens},
    }
    return _deliver_chat(state, choice=choice, usage=full_usage, prompt=prompt, out=out, ids=ids, fault=fault)


def _chat_events(
    state: SimState,
    body: dict[str, Any],
    prompt: list[int],
    gen: Generation,
    *,
    regions: list[str],
    text_len: int,
    skip: bool,
    field: str,
    ids: bool,
    usage: dict[str, Any],
    r_tokens: int,
) -> list[str]:
    """As recorded (vllm_chat_stream.txt): role chunk with prompt ids, one chunk per id, usage, [DONE].

    Without `return_token_ids`, as vLLM 0.32 sends it (tools recordings, vllm_t1_stream_noids.txt): the id keys are
    there as null, and an id that adds no text (a think or tool-call marker) sends no chunk at all. Before the
    fields existed (the `no-id-fields` quirk) the keys are absent."""
    rid, created, model = common.new_id("chatcmpl-"), common.now(), state.cfg.model_name
    null_ids = not ids and not state.cfg.quirk("no-id-fields")
    head: JsonObject = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}
    first: dict[str, Any] = {
        **head,
        "choices": [
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        ],
    }
    if ids:
        first.update(prompt_token_ids=list(prompt), prompt_text=None)
    elif null_ids:
        first.update(prompt_token_ids=None, prompt_text=None)
    events = [sse(first)]
    out = gen.output_ids
    drop = common.stop_drop(gen, bool(body.get("include_stop_str_in_output")))
    texts = common.cut_texts(state.stream_pieces(out[:text_len], skip), drop)
    hide = body.get("include_reasoning") is False  # vLLM then hides reasoning deltas, ids and logprobs (bug 2)
    marker_logprobs = at_least(state.cfg.server_version, VLLM_MARKER_LOGPROBS)  # a marker id's chunk for its logprob
    for pos, (tid, region) in enumerate(zip(out, regions)):
        last = pos == len(out) - 1
        piece = texts[pos] if pos < text_len else ""
        if region == "delim" or (hide and region == "reasoning"):
            delta: dict[str, Any] = {}
        elif region == "reasoning":
            delta = {field: piece}
        else:
            delta = {"content": piece}
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
        if body.get("logprobs") and not hide:
            choice["logprobs"] = {"content": [_chat_logprob(state, body, tid, len(prompt) + pos)]}
        if last:
            choice["finish_reason"] = gen.finish_reason
            choice["stop_reason"] = _stop_reason(gen)
        if ids and not hide:
            choice["token_ids"] = [tid]
        elif null_ids or ids:
            if not delta and not last and (choice["logprobs"] is None or not marker_logprobs):
                continue  # nothing to say for this id: serving_chat's `continue` (not with logprobs asked for)
            choice["token_ids"] = None
        events.append(sse({**head, "choices": [choice]}))
    if requests.include_usage(body):
        final: JsonObject = {
            **head,
            "choices": [],
            "usage": {**usage, "completion_tokens_details": {"reasoning_tokens": r_tokens}},
            "system_fingerprint": _fingerprint(state),
        }
        metrics = _metrics(state, out)
        if metrics is not None:  # as recorded: only the spec-decode part rides the usage chunk
            final["metrics"] = {"speculative_decoding": metrics["speculative_decoding"]}
        events.append(sse(final))
    events.append(common.DONE)
    return events


async def _completions(state: SimState, request: Request, body: dict[str, Any]) -> Response:
    cfg = state.cfg
    if (missing := _unknown_model(state, body)) is not None:
        return missing
    try:
        prompt = requests.completion_prompt(state.tokenizer, body.get("prompt"))
        sampling = _sampling(state, body, prompt, 16)  # vLLM's completions default max_tokens is 16
        requests.include_usage(body)
        requests.one_choice(body)
    except ValueError as exc:
        return faults.error_response("vllm", 400, str(exc), "BadRequestError")
    stream = as_pydantic_bool(body.get("stream"))  # pydantic's bool: "false" is false, " true" refused
    if stream is None:
        return faults.error_response("vllm", 400, faults.STREAM_NOT_A_BOOL, "BadRequestError")
    fault, early = await common.admit(state, request, stream)
    if early is not None:
        return early
    gen = state.generate(prompt, body, **sampling)
    out = gen.output_ids
    ids = bool(body.get("return_token_ids")) and not cfg.quirk("no-id-fields")
    skip = bool(body.get("skip_special_tokens", True))
    text_ids = _text_ids(gen, body)
    drop = common.stop_drop(gen, bool(body.get("include_stop_str_in_output")))
    # vLLM's serving_completion: `echo` puts the prompt's text before the answer's, and `return_token_ids` empties it
    # (`if request.return_token_ids: prompt_text = ""`), so a proxy that adds the flag changes what the client reads.
    echoed = ""
    if as_pydantic_bool(body.get("echo")) and not body.get("return_token_ids"):
        given = body.get("prompt")
        echoed = given if isinstance(given, str) else state.decode(prompt, skip)
    rid, created = common.new_id("cmpl-"), common.now()
    usage: JsonObject = {
        "prompt_tokens": len(prompt),
        "total_tokens": len(prompt) + len(out),
        "completion_tokens": len(out),
    }
    if stream:
        events = []
        texts = common.cut_texts(state.stream_pieces(text_ids, skip), drop)
        for pos, tid in enumerate(out):
            last = pos == len(out) - 1
            choice: dict[str, Any] = {
                "index": 0,
                "text": (echoed if pos == 0 else "") + (texts[pos] if pos < len(text_ids) else ""),
                "logprobs": None,
                "finish_reason": gen.finish_reason if last else None,
                "stop_reason": _stop_reason(gen) if last else None,
            }
            if not cfg.quirk("no-id-fields"):  # vLLM sets both on every chunk: null when not asked for (and the
                # prompt's on the first chunk only), written in its model's field order
                choice["prompt_token_ids"] = list(prompt) if ids and pos == 0 else None
                choice["token_ids"] = [tid] if ids else None
            events.append(
                sse(
                    {
                        "id": rid,
                        "object": "text_completion",
                        "created": created,
                        "model": cfg.model_name,
                        "choices": [choice],
                    }
                )
            )
        if requests.include_usage(body):
            events.append(
                sse(
                    {
                        "id": rid,
                        "object": "text_completion",
                        "created": created,
                        "model": cfg.model_name,
                        "choices": [],
                        "usage": usage,
                    }
                )
            )
        events.append(common.DONE)
        return common.deliver_stream(
            events, fault, {"error": {"message": "simulated failure mid-stream (fault stream-error)", "code": 500}}
        )
    choice = {
        "index": 0,
        "text": echoed + common.cut_texts([state.decode(text_ids, skip)], drop)[0],
        "logprobs": _completion_logprobs(state, body, prompt, out),
        "finish_reason": gen.finish_reason,
        "stop_reason": _stop_reason(gen),
        "token_ids": list(out) if ids else None,
        "prompt_logprobs": _prompt_logprobs(state, body, prompt),
        "prompt_token_ids": list(prompt) if ids else None,
        "routed_experts": None,
    }
    if cfg.quirk("no-id-fields"):
        choice.pop("token_ids")
        choice.pop("prompt_token_ids")
    payload: JsonObject = {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": cfg.model_name,
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": _fingerprint(state),
        "usage": {**usage, "prompt_tokens_details": None, "completion_tokens_details": None},
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": _metrics(state, out),
    }
    return common.deliver_json(payload, fault)


def _tool_chat(
    state: SimState,
    body: dict[str, Any],
    prompt: list[int],
    gen: Generation,
    *,
    thinking: bool,
    field: str,
    ids: bool,
    stream: bool,
    fault: str | None,
) -> Response:
    """A chat request with `tools`: the kimi_k2 tool parser's answer (tools README §3-§5); every chat request of a
    Harmony model (gpt-oss): the openai_gptoss parse of its channels and calls, in the same shapes."""
    out = gen.output_ids
    if state.profile.format == HARMONY:  # vLLM's openai_gptoss parser: channels, not think tags
        turn = harmony.read_turn(state, body, gen)
    elif glm_tools.is_tagged(state):  # vLLM's glm47 tool parser: <tool_call> name and <arg_key>/<arg_value> pairs
        turn = glm_tools.read_turn(state, body, gen, thinking)
    else:
        turn = tool_shapes.read_turn(state, body, gen, thinking, 0)
    r_tokens = turn.parsed.regions.count("reasoning")
    usage: dict[str, Any] = {
        "prompt_tokens": len(prompt),
        "total_tokens": len(prompt) + len(out),
        "completion_tokens": len(out),
        "completion_tokens_details": {"reasoning_tokens": r_tokens},
    }
    details = {"prompt_tokens_details": None, "completion_tokens_details": usage["completion_tokens_details"]}
    logprob = None
    if body.get("logprobs"):
        logprob = lambda tid, pos: _chat_logprob(state, body, tid, pos)  # noqa: E731
    if stream:
        events = tool_shapes.vllm_events(
            state,
            body,
            prompt,
            gen,
            turn=turn,
            field=field,
            ids=ids,
            usage=usage,
            fingerprint=_fingerprint(state),
            logprob=logprob,
        )
        error: JsonObject = {"error": {"message": "simulated failure mid-stream (fault stream-error)", "code": 500}}
        return common.deliver_stream(events, fault, error)
    message = tool_shapes.vllm_message(state, turn, out, field)
    hide = body.get("include_reasoning") is False  # vLLM then nulls the reasoning and token_ids (bug 2, §8)
    if hide:
        message[field] = None
    choice = {
        "index": 0,
        "message": message,
        "logprobs": {"content": [logprob(t, len(prompt) + p) for p, t in enumerate(out)]} if logprob else None,
        "finish_reason": tool_shapes.finish_reason(turn, gen, "vllm"),
        "stop_reason": _stop_reason(gen),
        "token_ids": list(out) if ids and not hide else None,
        "routed_experts": None,
    }
    return _deliver_chat(state, choice=choice, usage={**usage, **details}, prompt=prompt, out=out, ids=ids, fault=fault)


def _deliver_chat(
    state: SimState,
    *,
    choice: dict[str, Any],
    usage: dict[str, Any],
    prompt: list[int],
    out: list[int],
    ids: bool,
    fault: str | None,
) -> Response:
    """A non-streamed chat answer around its one choice, as vLLM 0.32 sends it (text and tool-call paths alike)."""
    cfg = state.cfg
    payload: dict[str, Any] = {
        "id": common.new_id("chatcmpl-"),
        "object": "chat.completion",
        "created": common.now(),
        "model": cfg.model_name,
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": _fingerprint(state),
        "usage": usage,
        "prompt_logprobs": None,
        "prompt_token_ids": list(prompt) if ids else None,
        "prompt_text": None,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": _metrics(state, out),
    }
    if cfg.quirk("no-id-fields"):
        choice.pop("token_ids")
        payload.pop("prompt_token_ids")
    return common.deliver_json(payload, fault)
