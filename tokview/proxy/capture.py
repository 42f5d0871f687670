"""A proxied generation as the capture record `tokview batch` makes: the same fields from the same parsers.

Chat answers go through `servers.chat.parse_chat` and chat streams through `servers.vllm.merge_chat_stream`
(both servers' deltas, their `tool_calls` folded); the proxy adds only what a harness's traffic has that a
batch's has not: SGLang's `sglext` ids on a stream and completions with a text prompt.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tokview.core.json_value import as_pydantic_bool
from tokview.core.record import Capture
from tokview.proxy.client_logprobs import client_logprobs
from tokview.proxy.ids import SGLEXT_FLAGS, id_fields
from tokview.servers.chat import parse_chat
from tokview.servers.request import normalize_usage
from tokview.servers.shapes import finish_of, ids_of, object_of, optional_ids_of, text_of
from tokview.servers.vllm import merge_chat_stream

if TYPE_CHECKING:
    from tokview.core.profiles import ModelProfile

CHAT, COMPLETIONS = "chat", "completions"
ENDPOINT_PATHS = {"/v1/chat/completions": CHAT, "/v1/completions": COMPLETIONS}
SAMPLING_KEYS = (
    "model",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "n",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logprobs",
    "top_logprobs",
    "ignore_eos",
    "skip_special_tokens",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "reasoning_effort",
    "include_reasoning",
    "separate_reasoning",
)


class NoIds(ValueError):
    """The upstream answered but gave no token ids (a build without them): recorded as a failure."""


def settings_of(body: dict[str, Any], profile: ModelProfile | None, max_model_len: int | None) -> dict[str, Any]:
    """The request's sampling settings, tools and template kwargs, as a capture's settings."""
    settings = {k: body[k] for k in SAMPLING_KEYS if k in body}
    kwargs = body.get("chat_template_kwargs")
    key = getattr(profile, "thinking_kwarg", None)
    settings["chat_template_kwargs"] = dict(kwargs) if isinstance(kwargs, dict) else None
    settings["thinking"] = bool(kwargs[key]) if isinstance(kwargs, dict) and key and key in kwargs else None
    settings["stream"] = bool(as_pydantic_bool(body.get("stream")))  # as the server read it: "false" is false
    for flag in ("add_generation_prompt", "continue_final_message"):  # how the prompt was rendered (a prefill)
        read = as_pydantic_bool(body[flag]) if flag in body and body[flag] is not None else None
        if read is not None:  # as the server read it: "true" and 1 are true
            settings[flag] = read
    settings["mode"] = "proxy"
    if max_model_len:
        settings["max_model_len"] = max_model_len
    return settings


def _sglext(data: dict[str, Any]) -> tuple[list[int] | None, list[int] | None]:
    ext = data.get("sglext")
    if not isinstance(ext, dict):
        return None, None
    prompt, out = ext.get("input_ids"), ext.get("output_ids")
    if isinstance(out, list) and out and isinstance(out[0], list):
        out = out[0]
    return prompt, out


def chat_fields(data: object) -> dict[str, Any]:
    return parse_chat(data, "POST /v1/chat/completions")


def chat_stream_fields(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    where = "POST /v1/chat/completions (stream)"
    fields = merge_chat_stream(chunks, where)
    if fields["prompt_ids"] is not None and fields["output_ids"] is not None:
        return fields  # vLLM's ids (or SGLang's non-streamed): no sglext to look for chunk by chunk
    for chunk in chunks:
        prompt, out = _sglext(chunk)
        if fields["prompt_ids"] is None and prompt is not None:
            fields["prompt_ids"] = ids_of(prompt, where, "sglext.input_ids")
        if fields["output_ids"] is None and out is not None:
            fields["output_ids"] = ids_of(out, where, "sglext.output_ids")
    return fields


def completion_fields(data: object) -> dict[str, Any]:
    where = "POST /v1/completions"
    if not isinstance(data, dict) or not isinstance(data.get("choices"), list) or not data["choices"]:
        raise ValueError(f"malformed response from {where}: expected an object with choices")
    choice = object_of(data["choices"][0], where, "choices[0]")
    ext_prompt, ext_out = _sglext(data)
    prompt = choice.get("prompt_token_ids") or data.get("prompt_token_ids") or ext_prompt
    out = next((choice[k] for k in ("token_ids", "response_token_ids") if isinstance(choice.get(k), list)), ext_out)
    finish, matched = finish_of(choice.get("finish_reason"), where)
    return {
        "prompt_ids": optional_ids_of(prompt, where, "prompt token ids"),
        "output_ids": optional_ids_of(out, where, "output token ids"),
        "finish_reason": finish,
        "matched_stop": choice.get("matched_stop", choice.get("stop_reason", matched)),
        "text": text_of(choice.get("text"), where, "text"),
        "usage": normalize_usage(data.get("usage")),
    }


def completion_stream_fields(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    where = "POST /v1/completions (stream)"
    prompt: list[int] | None = None
    out: list[int] = []
    saw_ids = False
    texts: list[str] = []
    finish = matched = None
    usage: dict[str, Any] = {}
    for chunk in chunks:
        if isinstance(chunk.get("usage"), dict):
            usage = chunk["usage"]
        ext_prompt, ext_out = _sglext(chunk)
        prompt = prompt or ext_prompt
        if ext_out is not None:
            saw_ids, out = True, list(ext_out)
        for choice in chunk.get("choices") or ():
            choice = object_of(choice, where, "a choice")
            if choice.get("index", 0) != 0:
                continue
            prompt = prompt or choice.get("prompt_token_ids")
            key = next((k for k in ("token_ids", "response_token_ids") if choice.get(k) is not None), None)
            if key is not None:  # the first named, as for a whole answer (SGLang may rename it, as on chat)
                saw_ids = True
                out.extend(ids_of(choice[key], where, key))
            if text_of(choice.get("text"), where, "text"):
                texts.append(choice["text"])
            if choice.get("finish_reason"):
                finish, _ = finish_of(choice["finish_reason"], where)
                matched = choice.get("matched_stop", choice.get("stop_reason"))
    return {
        "prompt_ids": optional_ids_of(prompt, where, "prompt token ids"),
        "output_ids": out if saw_ids else None,
        "finish_reason": finish,
        "matched_stop": matched,
        "text": "".join(texts),
        "usage": normalize_usage(usage),
    }


def choice_indexes(answer: object, *, stream: bool) -> list[int]:
    """The choice indexes an answer holds, in order: [0] unless the client asked for `n` > 1."""
    seen: set[int] = set()
    for chunk in (answer if isinstance(answer, list) else ()) if stream else (answer,):
        choices = chunk.get("choices") if isinstance(chunk, dict) else None
        for choice in choices if isinstance(choices, list) else ():
            index = choice.get("index", 0) if isinstance(choice, dict) else 0
            if type(index) is int and index >= 0:
                seen.add(index)
    return sorted(seen) or [0]


MAX_CHOICES = 128
"""Choices of one answer recorded at most: each is read off the whole answer (`choice_view`), so an answer of
thousands of streamed choices would cost their square. The rest are recorded as failures, each with its index."""


def choice_view(answer: Any, index: int, *, stream: bool) -> Any:
    """The answer as if choice `index` were its only one (as index 0): what `build_capture` reads. Its usage is left
    out: it counts every choice's tokens, so each choice's count would disagree with its ids."""

    def one(chunk: Any) -> Any:
        if not isinstance(chunk, dict):
            return chunk
        out = {k: v for k, v in chunk.items() if k != "usage"}
        choices = chunk.get("choices")
        if isinstance(choices, list):
            out["choices"] = [{**c, "index": 0} for c in choices if isinstance(c, dict) and c.get("index", 0) == index]
        ext = chunk.get("sglext")
        outputs = ext.get("output_ids") if isinstance(ext, dict) else None
        if isinstance(ext, dict) and isinstance(outputs, list) and outputs and isinstance(outputs[0], list):
            out["sglext"] = {**ext, "output_ids": outputs[index] if index < len(outputs) else None}
        return out

    return [one(chunk) for chunk in answer] if stream else one(answer)


def build_capture(
    endpoint: str,
    kind: str,
    answer: object,
    *,
    stream: bool,
    settings: dict[str, Any],
    messages: list[dict[str, Any]] | None,
    raw_request: dict[str, Any],
    stamp: dict[str, Any],
    latency_s: float,
) -> Capture:
    """The capture of one finished answer (`answer`: the parsed body, or the list of parsed stream chunks).

    Raises NoIds when the upstream sent no ids, ValueError (Retryable is one) when the answer is malformed."""
    raw_response: object = answer
    if stream:
        if not isinstance(answer, list):
            raise ValueError(f"a stream's answer is its list of chunks, not a {type(answer).__name__}")
        fields = chat_stream_fields(answer) if endpoint == CHAT else completion_stream_fields(answer)
        # the chunks as sent: their tool calls are folded from them (`core.tool_calls`), as fields["tool_calls"]
        raw_response = {"stream": True, "n_chunks": len(answer), "chunks": answer}
    else:
        fields = chat_fields(answer) if endpoint == CHAT else completion_fields(answer)
    if fields.get("prompt_ids") is None or fields.get("output_ids") is None:
        how = "the sglext ids" if id_fields(kind, stream, endpoint) == SGLEXT_FLAGS else "return_token_ids"
        raise NoIds(f"the upstream returned no token ids on {endpoint}{' (stream)' if stream else ''} ({how} asked)")
    chat = endpoint == CHAT
    fields.update(client_logprobs(answer, chat=chat, stream=stream, settings=settings, output_ids=fields["output_ids"]))
    return Capture(
        **fields,
        settings=settings,
        messages=messages,
        endpoint=f"{kind}-{endpoint}",
        raw_request=raw_request,
        raw_response=raw_response,
        latency_s=latency_s,
        **stamp,
    )


def served_model(answer: object) -> str | None:
    """The model the answer names (a stream's first chunk naming one); None when it names none. Only said when it
    differs from the start-up probe's (`Recorder`): a sample keeps the probe's name, since SGLang and vLLM echo the
    name the request gave ("default", an alias), which says nothing of the checkpoint."""
    if isinstance(answer, dict):
        model = answer.get("model")
    elif isinstance(answer, list):
        model = next((c.get("model") for c in answer if isinstance(c, dict) and c.get("model")), None)
    else:
        model = None
    return model if isinstance(model, str) and model else None
