"""The SGLang surface (0.5.23 shapes, real-servers.md §6.5-§6.6, protocols.md §1).

Native `/generate` (raw ids, no reasoning parser, text trimmed by skip_special_tokens and the stop
trim), `/v1/chat/completions` (text-based kimi_k2 parser, ids inside the choice, refused with
streaming), and the small info endpoints.
"""

from __future__ import annotations

import time
from itertools import accumulate
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tokview.sim import common, faults
from tokview.sim.common import SimState, sse
from tokview.sim.model import Generation
from tokview.sim.reasoning import sglang_stream_regions, sglang_text_split

STREAM_IDS_ERROR = ("{field} is not supported with streaming on /v1/chat/completions. "
                    "Please set stream=false when using {field}=true.")


def routes(state: SimState) -> list[Route]:
    cfg = state.cfg

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def model_info(request: Request) -> Response:
        return JSONResponse({
            "model_path": cfg.model_name, "tokenizer_path": str(state.tokenizer.source or ""),
            "is_generation": True, "preferred_sampling_params": None, "weight_version": "default",
            "has_image_understanding": False, "has_audio_understanding": False,
            "served_model_name": cfg.model_name, "simulator": True,
            "simulator_note": "tokview sim: a loopback simulator, not a real model",
        })

    async def server_info(request: Request) -> Response:
        return JSONResponse({
            "version": cfg.server_version, "model_path": cfg.model_name, "served_model_name": cfg.model_name,
            "tokenizer_path": str(state.tokenizer.source or ""), "reasoning_parser": state.profile.reasoning_parser,
            "context_length": cfg.max_model_len, "skip_tokenizer_init": False,
            "incremental_streaming_output": bool(cfg.quirk("incremental-streaming")),
            "simulator": True,
        })

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{
            "id": cfg.model_name, "object": "model", "created": common.now(), "owned_by": "tokview-sim",
            "root": cfg.model_name, "max_model_len": cfg.max_model_len, "simulator": True}]})

    async def generate(request: Request) -> Response:
        body = await common.read_json(request, "sglang")
        if isinstance(body, Response):
            return body
        if "json" not in request.headers.get("content-type", ""):
            return faults.error_response("sglang", 400, "1 validation error for GenerateReqInput: the body "
                                         "must be sent with content-type: application/json", "BadRequest")
        try:
            prompts, batch = _generate_prompts(state, body)
            sp = body.get("sampling_params") or {}
            max_new = common.positive_int(sp.get("max_new_tokens", 128), "max_new_tokens")
        except ValueError as exc:
            return faults.error_response("sglang", 400, str(exc), "BadRequest")
        stream = bool(body.get("stream"))
        if stream and batch:
            return faults.error_response("sglang", 400, "the simulator streams one prompt at a time", "BadRequest")
        fault, early = await common.admit(state, request, stream)
        if early is not None:
            return early
        started = time.monotonic()
        seed = sp.get("sampling_seed", body.get("seed"))
        results = []
        for prompt in prompts:
            gen = state.model.generate(prompt, seed=seed, max_tokens=max_new,
                                       stop_token_ids=sp.get("stop_token_ids") or (),
                                       ignore_eos=bool(sp.get("ignore_eos")))
            results.append((prompt, gen))
        if stream:
            prompt, gen = results[0]
            events = _generate_events(state, body, prompt, gen, started)
            return common.deliver_stream(events, fault, {"error": {"message": "simulated failure mid-stream "
                                                                   "(fault stream-error)"}})
        payload = [_generate_result(state, body, p, g, started) for p, g in results]
        return common.deliver_json(payload if batch else payload[0], fault)

    async def chat(request: Request) -> Response:
        body = await common.read_json(request, "sglang")
        if isinstance(body, Response):
            return body
        return await _chat(state, request, body)

    async def tokenize(request: Request) -> Response:
        body = await common.read_json(request, "sglang")
        if isinstance(body, Response):
            return body
        try:
            tokens = _tokenize(state, body)
        except ValueError as exc:
            return faults.error_response("sglang", 400, str(exc), "BadRequest")
        return JSONResponse({"tokens": tokens, "count": len(tokens), "max_model_len": cfg.max_model_len})

    async def detokenize(request: Request) -> Response:
        body = await common.read_json(request, "sglang")
        if isinstance(body, Response):
            return body
        text = state.decode(body.get("tokens") or [], bool(body.get("skip_special_tokens", True)))
        return JSONResponse({"text": text})

    return [
        Route("/health", health), Route("/health_generate", health),
        Route("/get_model_info", model_info), Route("/get_server_info", server_info),
        Route("/v1/models", models),
        Route("/generate", generate, methods=["POST"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/tokenize", tokenize, methods=["POST"]), Route("/detokenize", detokenize, methods=["POST"]),
    ]


def _valid_ids(state: SimState, ids: Any) -> list[int]:
    vocab = state.tokenizer.vocab_size
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and 0 <= i < vocab for i in ids):
        raise ValueError(f"input_ids must be a non-empty list of token ids in [0, {vocab})")
    return ids


def _generate_prompts(state: SimState, body: dict[str, Any]) -> tuple[list[list[int]], bool]:
    if body.get("input_ids") is not None and body.get("text") is not None:
        raise ValueError("Either text or input_ids should be provided, not both")
    ids = body.get("input_ids")
    if ids is not None:
        if isinstance(ids, list) and ids and isinstance(ids[0], list):
            return [_valid_ids(state, p) for p in ids], True
        return [_valid_ids(state, ids)], False
    text = body.get("text")
    if isinstance(text, str):
        return [state.tokenizer.encode(text)], False
    if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
        return [state.tokenizer.encode(t) for t in text], True
    raise ValueError("Either text or input_ids should be provided")


def _finish(gen: Generation) -> dict[str, Any]:
    if gen.finish_reason == "length":
        return {"type": "length", "length": len(gen.output_ids)}
    return {"type": "stop", "matched": gen.matched}


def _text_ids(gen: Generation, no_stop_trim: bool) -> list[int]:
    """The ids the detokenizer turns into `text`: without the matched stop unless no_stop_trim."""
    if gen.matched is not None and not no_stop_trim:
        return gen.output_ids[:-1]
    return gen.output_ids


def _meta(state: SimState, prompt: list[int], n_out: int, finish: Any, rid: str, started: float | None,
          reasoning_tokens: int = 0) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": rid, "finish_reason": finish, "prompt_tokens": len(prompt), "weight_version": "default",
        "num_retractions": 0, "reasoning_tokens": reasoning_tokens, "completion_tokens": n_out,
        "cached_tokens": 0, "weight_versions": [{"version": "default", "start": 0, "end": n_out}],
        "cached_tokens_details": None, "dp_rank": None,
    }
    if started is not None:
        meta["e2e_latency"] = round(time.monotonic() - started, 6)
        meta["response_sent_to_client_ts"] = time.time()
    return meta


def _output_ids_field(state: SimState, prompt: list[int], out: list[int]) -> list[int]:
    bug = state.cfg.quirk("prompt-prefix-bug")
    if not bug:
        return list(out)
    n = 5 if bug is True else int(bug)
    return list(prompt[-n:]) + list(out)


def _logprob_fields(state: SimState, body: dict[str, Any], out: list[int]) -> dict[str, Any]:
    if not body.get("return_logprob"):
        return {}
    with_text = bool(body.get("return_text_in_logprobs"))
    k = int(body.get("top_logprobs_num") or 0)

    def triple(tid: int, lp: float) -> list[Any]:
        return [lp, tid, state.piece(tid, False) if with_text else None]

    fields: dict[str, Any] = {
        "input_token_logprobs": [], "output_token_logprobs": [triple(t, common.fake_logprob(t, p))
                                                              for p, t in enumerate(out)]}
    if k > 0:
        fields["input_top_logprobs"] = []
        fields["output_top_logprobs"] = [[triple(a, lp) for a, lp in common.top_alternatives(t, p, k)]
                                         for p, t in enumerate(out)]
    return fields


def _generate_result(state: SimState, body: dict[str, Any], prompt: list[int], gen: Generation,
                     started: float) -> dict[str, Any]:
    sp = body.get("sampling_params") or {}
    text = state.decode(_text_ids(gen, bool(sp.get("no_stop_trim"))), bool(sp.get("skip_special_tokens", True)))
    meta = _meta(state, prompt, len(gen.output_ids), _finish(gen), common.new_id(), started)
    meta.update(_logprob_fields(state, body, gen.output_ids))
    result: dict[str, Any] = {"text": text, "output_ids": _output_ids_field(state, prompt, gen.output_ids),
                              "meta_info": meta}
    if body.get("return_prompt_token_ids"):
        result["prompt_token_ids"] = list(prompt)
    if state.cfg.quirk("no-id-fields"):
        result.pop("output_ids")
        result.pop("prompt_token_ids", None)
    return result


def _generate_events(state: SimState, body: dict[str, Any], prompt: list[int], gen: Generation,
                     started: float) -> list[str]:
    """One SSE chunk per token: cumulative text/ids by default, deltas with incremental-streaming."""
    sp = body.get("sampling_params") or {}
    skip = bool(sp.get("skip_special_tokens", True))
    out = gen.output_ids
    n = len(out)
    texts = list(accumulate(state.pieces(out, skip), initial=""))
    texts[n] = state.decode(_text_ids(gen, bool(sp.get("no_stop_trim"))), skip)
    ids_field = _output_ids_field(state, prompt, out)
    offset = len(ids_field) - n  # the prompt-prefix bug's extra ids
    incremental = bool(state.cfg.quirk("incremental-streaming"))
    rid = common.new_id()
    events = []
    for k in range(1, n + 1):
        last = k == n
        if incremental:
            text = texts[k][len(texts[k - 1]):] if texts[k].startswith(texts[k - 1]) else ""
            ids = ids_field[: offset + 1] if k == 1 else [out[k - 1]]
        else:
            text, ids = texts[k], ids_field[: offset + k]
        chunk: dict[str, Any] = {"text": text, "output_ids": ids,
                                 "meta_info": _meta(state, prompt, k, _finish(gen) if last else None, rid,
                                                    started if last else None)}
        if state.cfg.quirk("no-id-fields"):
            chunk.pop("output_ids")
        events.append(sse(chunk))
    events.append(common.DONE)
    return events


def _tokenize(state: SimState, body: dict[str, Any]) -> list[int]:
    if body.get("messages") is not None:
        return state.render(body["messages"], body.get("chat_template_kwargs"),
                            bool(body.get("add_generation_prompt", True)))
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise ValueError("give prompt (a string) or messages")
    return list(state.tokenizer.tok.encode(prompt, add_special_tokens=bool(body.get("add_special_tokens", True))))


async def _chat(state: SimState, request: Request, body: dict[str, Any]) -> Response:
    cfg = state.cfg
    no_ids = bool(cfg.quirk("no-id-fields"))
    stream = bool(body.get("stream"))
    if stream and not no_ids:
        for flag in ("return_token_ids", "return_prompt_token_ids", "return_meta_info"):
            if body.get(flag):
                return faults.error_response("sglang", 400, STREAM_IDS_ERROR.format(field=flag), "BadRequest")
    kwargs = dict(body.get("chat_template_kwargs") or {})
    effort = body.get("reasoning_effort")
    if effort is not None:  # normalize_reasoning_inputs: sets both toggles unless given
        kwargs.setdefault("thinking", effort != "none")
        kwargs.setdefault("enable_thinking", effort != "none")
    try:
        if body.get("input_ids") is not None:
            prompt = _valid_ids(state, body["input_ids"])
        else:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise ValueError("messages must be a non-empty list")
            prompt = state.render(messages, kwargs)
        max_tokens = common.positive_int(body.get("max_completion_tokens", body.get("max_tokens")), "max_tokens")
    except ValueError as exc:
        return faults.error_response("sglang", 400, str(exc), "BadRequest")
    fault, early = await common.admit(state, request, stream)
    if early is not None:
        return early
    started = time.monotonic()
    gen = state.model.generate(prompt, seed=body.get("seed"), max_tokens=max_tokens,
                               stop_token_ids=body.get("stop_token_ids") or (),
                               ignore_eos=bool(body.get("ignore_eos")))
    skip = bool(body.get("skip_special_tokens", True))
    thinking = state.thinking(kwargs)
    separate = bool(body.get("separate_reasoning", True))
    out = gen.output_ids
    r_tokens = 0
    if thinking and separate:
        r_tokens = out.index(state.profile.think_close_id) + 1 if state.profile.think_close_id in out else len(out)
    if stream:
        events = _chat_events(state, body, prompt, gen, skip, thinking and separate, r_tokens)
        return common.deliver_stream(events, fault, {"error": {"message": "simulated failure mid-stream "
                                                               "(fault stream-error)"}})
    text = state.decode(_text_ids(gen, bool(body.get("no_stop_trim"))), skip)
    if cfg.quirk("parser-all-reasoning"):
        reasoning, content = text.replace("<think>", "").replace("</think>", "").strip() or None, ""
    elif separate:
        reasoning, content = sglang_text_split(text, thinking)
    else:
        reasoning, content = None, text
    choice: dict[str, Any] = {
        "index": 0, "message": {"role": "assistant", "content": content or "", "reasoning_content": reasoning},
        "logprobs": None, "finish_reason": gen.finish_reason, "matched_stop": gen.matched}
    if not no_ids:
        if body.get("return_token_ids") or body.get("return_prompt_token_ids"):
            choice["prompt_token_ids"] = list(prompt)
        if body.get("return_token_ids"):
            choice[cfg.quirk("sglang-chat-ids") or "response_token_ids"] = list(out)
        if body.get("return_meta_info"):
            choice["meta_info"] = _meta(state, prompt, len(out), _finish(gen), common.new_id(), started, r_tokens)
    payload = {
        "id": common.new_id(), "object": "chat.completion", "created": common.now(), "model": cfg.model_name,
        "choices": [choice],
        "usage": {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + len(out),
                  "completion_tokens": len(out), "prompt_tokens_details": None, "reasoning_tokens": r_tokens,
                  "completion_tokens_details": {"reasoning_tokens": r_tokens}},
        "metadata": {"weight_version": "default",
                     "weight_versions": [{"version": "default", "start": 0, "end": len(out)}]},
    }
    return common.deliver_json(payload, fault)


def _chat_events(state: SimState, body: dict[str, Any], prompt: list[int], gen: Generation, skip: bool,
                 split: bool, r_tokens: int) -> list[str]:
    """SGLang chat stream: role chunk, one delta per visible piece, finish chunk, usage, [DONE]."""
    rid, created, model = common.new_id(), common.now(), state.cfg.model_name
    out = gen.output_ids
    pieces = state.pieces(_text_ids(gen, bool(body.get("no_stop_trim"))), skip)
    if state.cfg.quirk("parser-all-reasoning"):
        regions = ["hidden" if p in ("<think>", "</think>") else "reasoning" for p in pieces]
    elif split:
        regions = sglang_stream_regions(pieces, True)
    else:
        regions = ["content"] * len(pieces)

    def chunk(delta: dict[str, Any], finish: str | None = None, matched: Any = None) -> str:
        return sse({"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish,
                                 "matched_stop": matched}], "usage": None})

    events = [chunk({"role": "assistant", "content": ""})]
    for piece, region in zip(pieces, regions):
        if region == "hidden" or not piece:
            continue
        events.append(chunk({"reasoning_content": piece} if region == "reasoning" else {"content": piece}))
    events.append(chunk({}, gen.finish_reason, gen.matched))
    if (body.get("stream_options") or {}).get("include_usage"):
        events.append(sse({"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                           "choices": [], "usage": {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + len(out),
                                                    "completion_tokens": len(out), "reasoning_tokens": r_tokens}}))
    events.append(common.DONE)
    return events
