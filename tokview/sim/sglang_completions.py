"""SGLang's OpenAI completions endpoint (0.5.x `serving_completions`; the shapes its `CompletionRequest` and
`CompletionResponse` models give).

Unlike its chat endpoint, ids are asked for with `return_token_ids` whether or not the answer streams (nothing is
refused), and the sglext id flags do nothing here (the request model has no such fields: they are ignored, so a
client that asks by them gets no ids). A choice's keys: `index, text, logprobs, finish_reason, matched_stop`, then
with the flag `token_ids` (the output's ids; a stream chunk's new ones) and `prompt_token_ids` (on a stream, in each
choice's first chunk only); without it the two keys are left out, not null. The prompt is a text or one list of ids;
`echo` puts the prompt's text (ids decoded without special tokens) before the answer's, ids or not.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from tokview.core.json_value import JsonObject, as_pydantic_bool
from tokview.sim import common, faults, requests
from tokview.sim import sglang_shapes as shapes
from tokview.sim.common import SimState, sse
from tokview.sim.model import Generation, Sampling

DEFAULT_MAX_TOKENS = 16
"""`CompletionRequest.max_tokens`'s default, as OpenAI's."""


async def completions(state: SimState, request: Request, body: dict[str, Any]) -> Response:
    stream = as_pydantic_bool(body.get("stream"))  # pydantic's bool: "false" is false, " true" refused
    if stream is None:
        return faults.error_response("sglang", 400, faults.STREAM_NOT_A_BOOL, "BadRequest")
    try:
        prompt = requests.completion_prompt(state.tokenizer, body.get("prompt"))
        max_tokens = requests.positive_int(body.get("max_tokens", DEFAULT_MAX_TOKENS), "max_tokens")
        requests.include_usage(body)  # a malformed stream_options is the request's fault
        requests.one_choice(body)
        stop = requests.stop_strings(body.get("stop"))
    except ValueError as exc:
        return faults.error_response("sglang", 400, str(exc), "BadRequest")
    cut = common.context_room(state, prompt, max_tokens)
    if isinstance(cut, Response):
        return cut
    fault, early = await common.admit(state, request, stream)
    if early is not None:
        return early
    sampling: Sampling = {
        "max_tokens": cut,
        "stop_token_ids": body.get("stop_token_ids") or (),
        "ignore_eos": bool(body.get("ignore_eos")),
    }
    gen = state.generate(prompt, body, **common.with_stop(sampling, stop, body))
    echoed = ""
    if as_pydantic_bool(body.get("echo")):
        given = body.get("prompt")
        echoed = given if isinstance(given, str) else state.decode(prompt, True)
    if stream:
        return common.deliver_stream(
            _events(state, body, prompt, gen, echoed),
            fault,
            {"error": {"message": "simulated failure mid-stream (fault stream-error)"}},
        )
    keep, skip = bool(body.get("no_stop_trim")), bool(body.get("skip_special_tokens", True))
    text = common.cut_texts([state.decode(shapes.text_ids(gen, keep), skip)], common.stop_drop(gen, keep))[0]
    choice = _choice(gen, echoed + text, finished=True)
    if _ids(state, body):
        choice["token_ids"] = list(gen.output_ids)
        choice["prompt_token_ids"] = list(prompt)
    payload: JsonObject = {
        "id": common.new_id(),
        "object": "text_completion",
        "created": common.now(),
        "model": state.cfg.model_name,
        "choices": [choice],
        "usage": {**_usage(prompt, gen), "prompt_tokens_details": None, "completion_tokens_details": None},
        "metadata": {
            "weight_version": "default",
            "weight_versions": [{"version": "default", "start": 0, "end": len(gen.output_ids)}],
        },
    }
    return common.deliver_json(payload, fault)


def _ids(state: SimState, body: dict[str, Any]) -> bool:
    return bool(as_pydantic_bool(body.get("return_token_ids"))) and not state.cfg.quirk("no-id-fields")


def _choice(gen: Generation, text: str, *, finished: bool) -> dict[str, Any]:
    return {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": gen.finish_reason if finished else None,
        "matched_stop": gen.matched if finished else None,
    }


def _usage(prompt: list[int], gen: Generation) -> dict[str, Any]:
    out = len(gen.output_ids)
    return {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + out, "completion_tokens": out}


def _events(state: SimState, body: dict[str, Any], prompt: list[int], gen: Generation, echoed: str) -> list[str]:
    """One chunk per generated id (its text, and with the flag its id; the first also the prompt's ids and the
    echo), the last with the finish; then the usage chunk when asked for, and [DONE]."""
    rid, created, model = common.new_id(), common.now(), state.cfg.model_name
    out, ids = gen.output_ids, _ids(state, body)
    keep, skip = bool(body.get("no_stop_trim")), bool(body.get("skip_special_tokens", True))
    text_ids = shapes.text_ids(gen, keep)
    pieces = common.cut_texts(state.stream_pieces(text_ids, skip), common.stop_drop(gen, keep))
    events = []
    for pos, tid in enumerate(out):
        piece = (echoed if pos == 0 else "") + (pieces[pos] if pos < len(pieces) else "")
        choice = _choice(gen, piece, finished=pos == len(out) - 1)
        if ids:
            choice["token_ids"] = [tid]
            if pos == 0:
                choice["prompt_token_ids"] = list(prompt)
        chunk: dict[str, Any] = {"id": rid, "object": "text_completion", "created": created, "model": model}
        events.append(sse({**chunk, "choices": [choice], "usage": None}))
    if requests.include_usage(body):
        events.append(
            sse(
                {
                    "id": rid,
                    "object": "text_completion",
                    "created": created,
                    "model": model,
                    "choices": [],
                    "usage": {**_usage(prompt, gen), "reasoning_tokens": 0},
                }
            )
        )
    events.append(common.DONE)
    return events
