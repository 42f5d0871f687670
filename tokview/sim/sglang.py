"""The SGLang surface (0.5.23 shapes, real-servers.md §6.5, protocols.md §1.1-§1.6).

Native `/generate` (raw ids, no reasoning parser, text trimmed by skip_special_tokens and the stop
trim; cumulative or incremental streaming), the small info endpoints, and the routing of
`/v1/chat/completions` to `sglang_chat` and of `/v1/completions` to `sglang_completions`.
"""

from __future__ import annotations

import time
from itertools import accumulate
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tokview.core.json_value import JsonValue
from tokview.core.profiles import HARMONY
from tokview.sim import common, faults, requests, sglang_chat, sglang_completions, spec, tools
from tokview.sim import sglang_shapes as shapes
from tokview.sim.common import SimState, sse
from tokview.sim.model import Generation, Sampling


def routes(state: SimState) -> list[Route]:
    cfg = state.cfg

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def model_info(request: Request) -> Response:
        return JSONResponse(
            {
                "model_path": cfg.model_name,
                "tokenizer_path": str(state.tokenizer.source or ""),
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "served_model_name": cfg.model_name,
                "simulator": True,
                "simulator_note": "tokview sim: a loopback simulator, not a real model",
            }
        )

    async def server_info(request: Request) -> Response:
        return JSONResponse(
            {
                "version": cfg.server_version,
                "model_path": cfg.model_name,
                "served_model_name": cfg.model_name,
                "tokenizer_path": str(state.tokenizer.source or ""),
                "reasoning_parser": state.profile.reasoning_parser,
                "context_length": cfg.max_model_len,
                "skip_tokenizer_init": False,
                "incremental_streaming_output": bool(cfg.quirk("incremental-streaming")),
                "simulator": True,
            }
        )

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
                        "root": cfg.model_name,
                        "max_model_len": cfg.max_model_len,
                        "simulator": True,
                    }
                ],
            }
        )

    async def generate(request: Request) -> Response:
        body = await common.read_json(request, "sglang")
        if isinstance(body, Response):
            return body
        if "json" not in request.headers.get("content-type", ""):
            return faults.error_response(
                "sglang",
                400,
                "1 validation error for GenerateReqInput: the body must be sent with content-type: application/json",
                "BadRequest",
            )
        try:
            prompts, batch = requests.generate_prompts(state.tokenizer, body)
            sp = body.get("sampling_params") or {}
            requests.top_p_in_range(sp if isinstance(sp, dict) else {})
            max_new = requests.positive_int(sp.get("max_new_tokens", 128), "max_new_tokens")
            stop = requests.stop_strings(sp.get("stop")) if state.profile.format != HARMONY else ()
        except ValueError as exc:
            return faults.error_response("sglang", 400, str(exc), "BadRequest")
        stream = bool(body.get("stream"))
        if stream and batch:
            return faults.error_response("sglang", 400, "the simulator streams one prompt at a time", "BadRequest")
        fault, early = await common.admit(state, request, stream)
        if early is not None:
            return early
        started = time.monotonic()
        results = []
        for prompt in prompts:
            asked = max_new if "max_new_tokens" in sp else None  # SGLang checks only a limit the request gave
            max_tokens = common.context_room(state, prompt, asked)
            if isinstance(max_tokens, Response):
                return max_tokens
            if max_new is not None:  # its default, 128, cut at the context
                max_tokens = min(max_tokens, max_new)
            sampling: Sampling = {
                "max_tokens": max_tokens,
                "stop_token_ids": sp.get("stop_token_ids") or (),
                "ignore_eos": bool(sp.get("ignore_eos")),
            }
            gen = state.generate(prompt, body, **common.with_stop(sampling, stop, sp))
            results.append((prompt, gen))
        if stream:
            prompt, gen = results[0]
            events = _generate_events(state, body, prompt, gen, started)
            return common.deliver_stream(
                events, fault, {"error": {"message": "simulated failure mid-stream (fault stream-error)"}}
            )
        payload: list[JsonValue] = [_generate_result(state, body, p, g, started) for p, g in results]
        return common.deliver_json(payload if batch else payload[0], fault)

    async def chat(request: Request) -> Response:
        body = await common.read_json(request, "sglang")
        if isinstance(body, Response):
            return body
        return await sglang_chat.chat(state, request, body)

    async def completions(request: Request) -> Response:
        body = await common.read_json(request, "sglang")
        if isinstance(body, Response):
            return body
        return await sglang_completions.completions(state, request, body)

    async def tokenize(request: Request) -> Response:
        body = await common.read_json(request, "sglang")
        if isinstance(body, Response):
            return body
        try:
            tokens = tokenize_body(state, body)
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
        Route("/health", health),
        Route("/health_generate", health),
        Route("/get_model_info", model_info),
        Route("/get_server_info", server_info),
        Route("/v1/models", models),
        Route("/generate", generate, methods=["POST"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
    ]


def _output_ids_field(state: SimState, prompt: list[int], out: list[int]) -> list[int]:
    bug = state.cfg.quirk("prompt-prefix-bug")
    if not bug:
        return list(out)
    n = 5 if bug is True else int(bug)
    return list(prompt[-n:]) + list(out)


def _logprob_fields(
    state: SimState, body: dict[str, Any], prompt: list[int], out: list[int], first: int = 0
) -> dict[str, Any]:
    """The logprob keys of meta_info for output positions [first, len(out)) (a stream chunk's slice).

    Positions are absolute (prompt + output), so scoring the stored sample gives the same values.
    `logprob_start_len` >= 0 adds the input side from that position (the first has no logprob)."""
    if not body.get("return_logprob"):
        return {}
    with_text = bool(body.get("return_text_in_logprobs"))
    k = int(body.get("top_logprobs_num") or 0)
    dist, n = state.dist, len(prompt)

    def triple(tid: int, lp: float | None) -> list[Any]:
        return [lp, tid, state.piece(tid, False) if with_text else None]

    def top(pos: int, tid: int | None) -> list[list[Any]]:
        return [triple(a, lp) for a, lp in dist.top(pos, tid, k)]

    fields: dict[str, Any] = {
        "output_token_logprobs": [triple(t, dist.logprob(n + p, t)) for p, t in enumerate(out) if p >= first],
        "output_token_logprobs_length": len(out) - first,
    }
    if k > 0:
        fields["output_top_logprobs"] = [top(n + p, t) for p, t in enumerate(out) if p >= first]
        if not out:  # nothing generated: the distribution of the next position (as SGLang 0.5.23 sends)
            fields["output_top_logprobs"] = [top(n, None)]
    start = body.get("logprob_start_len", -1)
    if isinstance(start, int) and start >= 0 and first == 0:
        fields["input_token_logprobs"] = [
            triple(t, None if i == 0 else dist.logprob(i, t)) for i, t in enumerate(prompt) if i >= start
        ]
        if k > 0:
            fields["input_top_logprobs"] = [None if i == 0 else top(i, t) for i, t in enumerate(prompt) if i >= start]
    return fields


def _generate_result(
    state: SimState, body: dict[str, Any], prompt: list[int], gen: Generation, started: float
) -> dict[str, Any]:
    sp = body.get("sampling_params") or {}
    keep = bool(sp.get("no_stop_trim"))
    text = state.decode(shapes.text_ids(gen, keep), bool(sp.get("skip_special_tokens", True)))
    text = common.cut_texts([text], common.stop_drop(gen, keep))[0]
    meta = shapes.meta(
        prompt, len(gen.output_ids), finish_reason=shapes.finish(gen), rid=common.new_id(), started=started
    )
    meta.update(_logprob_fields(state, body, prompt, gen.output_ids))
    meta.update(spec.sglang_meta(state.spec_decode, gen.output_ids))
    result: dict[str, Any] = {
        "text": text,
        "output_ids": _output_ids_field(state, prompt, gen.output_ids),
        "meta_info": meta,
    }
    if body.get("return_prompt_token_ids"):
        result["prompt_token_ids"] = list(prompt)
    if state.cfg.quirk("no-id-fields"):
        result.pop("output_ids")
        result.pop("prompt_token_ids", None)
    return result


def _generate_events(
    state: SimState, body: dict[str, Any], prompt: list[int], gen: Generation, started: float
) -> list[str]:
    """One SSE chunk per token: cumulative text/ids by default, deltas with incremental-streaming."""
    sp = body.get("sampling_params") or {}
    skip = bool(sp.get("skip_special_tokens", True))
    out = gen.output_ids
    n = len(out)
    keep = bool(sp.get("no_stop_trim"))
    drop = common.stop_drop(gen, keep)
    texts = list(accumulate(common.cut_texts(state.stream_pieces(out, skip), drop), initial=""))
    texts[n] = common.cut_texts([state.decode(shapes.text_ids(gen, keep), skip)], drop)[0]
    ids_field = _output_ids_field(state, prompt, out)
    offset = len(ids_field) - n  # the prompt-prefix bug's extra ids
    incremental = bool(state.cfg.quirk("incremental-streaming"))
    rid = common.new_id()
    events = []
    for k in range(1, n + 1):
        last = k == n
        if incremental:
            text = texts[k][len(texts[k - 1]) :] if texts[k].startswith(texts[k - 1]) else ""
            ids = ids_field[: offset + 1] if k == 1 else [out[k - 1]]
        else:
            text, ids = texts[k], ids_field[: offset + k]
        meta = shapes.meta(
            prompt, k, finish_reason=shapes.finish(gen) if last else None, rid=rid, started=started if last else None
        )
        # logprob arrays: cumulative by default, the chunk's slice with incremental streaming
        meta.update(_logprob_fields(state, body, prompt, out[:k], k - 1 if incremental else 0))
        if last:
            meta.update(spec.sglang_meta(state.spec_decode, out))
        chunk: dict[str, Any] = {"text": text, "output_ids": ids, "meta_info": meta}
        if state.cfg.quirk("no-id-fields"):
            chunk.pop("output_ids")
        events.append(sse(chunk))
    events.append(common.DONE)
    return events


def tokenize_body(state: SimState, body: dict[str, Any]) -> list[int]:
    if body.get("messages") is not None:
        kwargs = body.get("chat_template_kwargs") or {}
        messages, render_kwargs = tools.request_render(body["messages"], body, kwargs, "sglang")
        return state.render(messages, render_kwargs, bool(body.get("add_generation_prompt", True)))
    return requests.tokenize_text(state.tokenizer, body)
