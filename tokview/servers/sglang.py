"""SGLang capture clients: native `POST /generate` (exact ids) and `POST /v1/chat/completions`.

`/generate` is the most exact path (protocols.md §1.3): we send our own prompt ids, ask for
`skip_special_tokens: false` and `no_stop_trim: true` so `text` shows every id, and keep
`output_ids` verbatim. Streams come in two shapes (cumulative by default, incremental with
`--incremental-streaming-output`); `stream_mode` tells them apart from the ids themselves.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from tokview.core import logprobs as lp
from tokview.core import spec_decode
from tokview.core.record import Capture
from tokview.servers.errors import CaptureFailed, Retryable
from tokview.servers.http import ServerClient
from tokview.servers.info import ServerInfo
from tokview.servers.request import normalize_finish, normalize_usage, pick_reasoning


def generate_body(
    prompt_ids: list[int], settings: dict[str, Any], *, stream: bool = False, skip_special_tokens: bool = False
) -> dict[str, Any]:
    sampling: dict[str, Any] = {
        "max_new_tokens": settings["max_new_tokens"],
        "temperature": settings["temperature"],
        "top_p": settings["top_p"],
        "skip_special_tokens": skip_special_tokens,
        "no_stop_trim": True,
    }
    if settings.get("seed") is not None:
        sampling["sampling_seed"] = settings["seed"]
    body: dict[str, Any] = {"input_ids": list(prompt_ids), "sampling_params": sampling, "stream": stream}
    if settings.get("logprobs") is not None:  # output tokens only (logprob_start_len -1), ids in the triples
        body.update(return_logprob=True, top_logprobs_num=int(settings["logprobs"]), logprob_start_len=-1)
    return body


def logprob_fields(found: lp.TokenLogprobs | None) -> dict[str, Any]:
    """Capture fields for the sampled logprobs and top-K alternatives (all None when none came back)."""
    if found is None:
        return {"output_logprobs": None, "output_top_ids": None, "output_top_logprobs": None}
    return {
        "output_logprobs": found.logprobs,
        "output_top_ids": found.top_ids,
        "output_top_logprobs": found.top_logprobs,
    }


def side_data(meta: dict[str, Any], output_ids: list[int], where: str) -> dict[str, Any]:
    """Spec-decode metrics and logprobs from one /generate meta_info."""
    try:
        found = lp.from_sglang_output(meta, output_ids)
    except lp.LogprobShapeError as exc:
        raise Retryable(f"malformed response from {where}: {exc}") from None
    spec = spec_decode.from_sglang(meta)
    return {"spec_decode": None if spec is None else spec.to_dict(), **logprob_fields(found)}


def stream_mode(chunks_ids: list[list[int]], completion_tokens: int | None) -> str:
    """`cumulative` when every chunk's ids extend the previous chunk's, else `incremental`.

    The final `completion_tokens` settles streams where both readings fit (e.g. a repeated id).
    """
    concat_len = sum(len(c) for c in chunks_ids)
    last_len = len(chunks_ids[-1]) if chunks_ids else 0
    if isinstance(completion_tokens, int) and concat_len != last_len:
        if completion_tokens == last_len:
            return "cumulative"
        if completion_tokens == concat_len:
            return "incremental"
    extends = all(len(cur) >= len(prev) and cur[: len(prev)] == prev for prev, cur in itertools.pairwise(chunks_ids))
    return "cumulative" if extends else "incremental"


def ids_of(value: Any, where: str, what: str = "output ids") -> list[int]:
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise Retryable(f"malformed response from {where}: {what} are not a list of integers")
    return value


def optional_ids_of(value: Any, where: str, what: str) -> list[int] | None:
    return None if value is None else ids_of(value, where, what)


def object_of(value: Any, where: str, what: str) -> dict[str, Any]:
    """`value` as a dict (None → {}); anything else is a malformed answer, retried like garbage."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise Retryable(f"malformed response from {where}: {what} is not an object ({type(value).__name__})")
    return value


def text_of(value: Any, where: str, what: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise Retryable(f"malformed response from {where}: {what} is not a string ({type(value).__name__})")
    return value


def finish_of(value: Any, where: str) -> tuple[str | None, int | str | None]:
    """normalize_finish, refusing shapes no server sends (a number, a list)."""
    if value is not None and not isinstance(value, (str, dict)):
        raise Retryable(f"malformed response from {where}: finish_reason is a {type(value).__name__}")
    return normalize_finish(value)


def capture_from_generate(data: Any, prompt_ids: list[int], *, where: str = "POST /generate") -> dict[str, Any]:
    """The id and text fields of one /generate answer (a dict, or a one-element batch list)."""
    if isinstance(data, list) and len(data) == 1:
        data = data[0]
    if not isinstance(data, dict) or "meta_info" not in data:
        raise Retryable(f"malformed response from {where}: expected an object with meta_info")
    if "output_ids" not in data:
        raise CaptureFailed(
            f"{where} returned no output_ids: this SGLang build does not return ids "
            f"(upgrade SGLang, or start it with --skip-tokenizer-init)"
        )
    meta = object_of(data["meta_info"], where, "meta_info")
    raw_finish = meta.get("finish_reason")
    finish, matched = finish_of(raw_finish, where)
    if finish == "abort":  # {"type": "abort", "message": ...}, or a bare "abort" from some builds
        message = raw_finish.get("message") if isinstance(raw_finish, dict) else None
        raise CaptureFailed(f"SGLang aborted the request on {where}: {message or 'no message'}")
    output_ids = ids_of(data["output_ids"], where)
    return {
        "prompt_ids": list(prompt_ids),
        "output_ids": output_ids,
        "finish_reason": finish,
        "matched_stop": matched,
        "text": text_of(data.get("text"), where, "text"),
        "usage": normalize_usage(meta),
        **side_data(meta, output_ids, where),
    }


async def capture_generate(
    client: ServerClient,
    info: ServerInfo,
    prompt_ids: list[int],
    settings: dict[str, Any],
    *,
    stream: bool = False,
    skip_special_tokens: bool = False,
) -> Capture:
    body = generate_body(prompt_ids, settings, stream=stream, skip_special_tokens=skip_special_tokens)
    started = time.perf_counter()
    if not stream:
        data = await client.post_json("/generate", body)
        fields, raw = capture_from_generate(data, prompt_ids), data
    else:
        fields, raw = await _generate_stream(client, body, prompt_ids)
    return Capture(
        **fields,
        settings=settings,
        endpoint="sglang-generate",
        raw_request=client.audit_request("POST", "/generate", body),
        raw_response=raw,
        latency_s=time.perf_counter() - started,
        **info.stamp(),
    )


async def _generate_stream(
    client: ServerClient, body: dict[str, Any], prompt_ids: list[int]
) -> tuple[dict[str, Any], Any]:
    chunks: list[dict[str, Any]] = []
    async for chunk in client.stream_sse("/generate", body):
        if "output_ids" not in chunk and "text" not in chunk:
            raise Retryable("malformed response from POST /generate: a stream chunk has neither output_ids nor text")
        chunks.append(chunk)
    if not chunks:
        raise Retryable("malformed response from POST /generate: the stream carried no chunks")
    where = "POST /generate (stream)"
    ids_per_chunk = [ids_of(c.get("output_ids") or [], where) for c in chunks]
    texts = [text_of(c.get("text"), where, "text") for c in chunks]
    last_meta = object_of(chunks[-1].get("meta_info"), where, "meta_info")
    mode = stream_mode(ids_per_chunk, last_meta.get("completion_tokens"))
    if mode == "cumulative":
        output_ids, text = ids_per_chunk[-1], texts[-1]
        raw = {"stream": True, "mode": mode, "n_chunks": len(chunks), "chunks": [chunks[0], chunks[-1]]}
        last_logprobs = last_meta.get("output_token_logprobs")
        if isinstance(last_logprobs, list) and len(last_logprobs) != len(output_ids):
            # cumulative ids but per-chunk logprob slices (a build that slices them anyway): join the slices
            last_meta = {**last_meta, **incremental_logprobs(chunks, where)}
    else:
        output_ids = [i for c in ids_per_chunk for i in c]
        text = "".join(t or "" for t in texts)
        raw = {"stream": True, "mode": mode, "n_chunks": len(chunks), "chunks": chunks}
        last_meta = {**last_meta, **incremental_logprobs(chunks, where)}
    fields = capture_from_generate(
        {"output_ids": output_ids, "text": text, "meta_info": last_meta}, prompt_ids, where=where
    )
    return fields, raw


def incremental_logprobs(chunks: list[dict[str, Any]], where: str) -> dict[str, Any]:
    """With --incremental-streaming-output the logprob arrays are sliced per chunk: join them."""
    out: dict[str, Any] = {}
    for key in ("output_token_logprobs", "output_top_logprobs"):
        parts = [object_of(c.get("meta_info"), where, "meta_info").get(key) for c in chunks]
        if any(p is not None for p in parts):
            out[key] = [e for p in parts if isinstance(p, list) for e in p]
    return out


# -- /v1/chat/completions -------------------------------------------------------------------
CHAT_ID_FIELDS = ("token_ids", "response_token_ids")


def chat_body(
    messages: list[dict[str, Any]] | None, prompt_ids: list[int] | None, settings: dict[str, Any], model: str | None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "messages": messages or [],
        "max_tokens": settings["max_new_tokens"],
        "temperature": settings["temperature"],
        "top_p": settings["top_p"],
        "chat_template_kwargs": settings["chat_template_kwargs"],
        "separate_reasoning": True,
        "return_token_ids": True,
        "stream": False,
    }
    if model:
        body["model"] = model
    if settings.get("seed") is not None:
        body["seed"] = settings["seed"]
    if not messages and prompt_ids:
        body["input_ids"] = list(prompt_ids)  # SGLang then skips its own template
    return body


def chat_ids(data: dict[str, Any], choice: dict[str, Any]) -> tuple[list[int] | None, list[int] | None, str | None]:
    """(prompt ids, output ids, name of the output-id field) from any build's chat answer."""
    sglext = data.get("sglext") if isinstance(data.get("sglext"), dict) else {}
    choice_ext = choice.get("sglext") if isinstance(choice.get("sglext"), dict) else {}
    prompt = choice.get("prompt_token_ids") or data.get("prompt_token_ids") or sglext.get("input_ids")
    for name in CHAT_ID_FIELDS:
        if isinstance(choice.get(name), list):
            return prompt, choice[name], name
    ext_out = choice_ext.get("output_ids") or sglext.get("output_ids")
    if isinstance(ext_out, list) and ext_out and isinstance(ext_out[0], list):
        index = choice.get("index", 0)
        ext_out = ext_out[index] if isinstance(index, int) and 0 <= index < len(ext_out) else None
    if isinstance(ext_out, list):
        return prompt, ext_out, "sglext.output_ids"
    return prompt, None, None


def chat_logprob_fields(logprobs: Any, output_ids: list[int] | None, where: str, asked: bool) -> dict[str, Any]:
    """OpenAI-style `logprobs.content` (asked with return_tokens_as_token_ids) aligned to the output ids.

    Read only when we asked: logprobs someone else's defaults added carry strings, not ids."""
    if not asked or logprobs is None or output_ids is None:
        return logprob_fields(None)
    try:
        return logprob_fields(lp.from_vllm_chat(logprobs, output_ids))
    except lp.LogprobShapeError as exc:
        raise Retryable(f"malformed response from {where}: {exc}") from None


def parse_chat(data: Any, where: str, logprobs_asked: bool = False) -> dict[str, Any]:
    """Capture fields of an OpenAI-style chat answer (SGLang or vLLM), ids possibly None."""
    if not isinstance(data, dict) or not isinstance(data.get("choices"), list) or not data["choices"]:
        raise Retryable(f"malformed response from {where}: expected an object with choices")
    choice = object_of(data["choices"][0], where, "choices[0]")
    message = object_of(choice.get("message"), where, "choices[0].message")
    prompt, output, _ = chat_ids(data, choice)
    prompt = optional_ids_of(prompt, where, "prompt token ids")
    output = optional_ids_of(output, where, "output token ids")
    reasoning, field_name = pick_reasoning(message)
    finish, _ = finish_of(choice.get("finish_reason"), where)
    matched = choice.get("matched_stop", choice.get("stop_reason"))
    spec = spec_decode.from_vllm(data)  # vLLM's top-level metrics; SGLang chat has none
    return {
        "spec_decode": None if spec is None else spec.to_dict(),
        **chat_logprob_fields(choice.get("logprobs"), output, where, logprobs_asked),
        "prompt_ids": prompt,
        "output_ids": output,
        "finish_reason": finish,
        "matched_stop": matched,
        "reasoning": text_of(reasoning, where, f"message.{field_name}"),
        "content": text_of(message.get("content"), where, "message.content"),
        "reasoning_field": field_name,
        "usage": normalize_usage(data.get("usage")),
    }


async def capture_chat(
    client: ServerClient,
    info: ServerInfo,
    messages: list[dict[str, Any]] | None,
    prompt_ids: list[int] | None,
    settings: dict[str, Any],
    *,
    require_ids: bool = True,
) -> tuple[Capture, list[int] | None]:
    """SGLang chat, non-streaming only: SGLang refuses ids on a chat stream (HTTP 400).

    Returns the capture and the output ids exactly as returned (None when the build sent none).
    """
    body = chat_body(messages, prompt_ids, settings, info.model)
    started = time.perf_counter()
    data = await client.post_json("/v1/chat/completions", body)
    fields = parse_chat(data, "POST /v1/chat/completions")
    return finish_chat_capture(
        fields, require_ids, client, info, body, data, settings, messages, "sglang-chat", time.perf_counter() - started
    )


def finish_chat_capture(
    fields: dict[str, Any],
    require_ids: bool,
    client: ServerClient,
    info: ServerInfo,
    body: dict[str, Any],
    raw: Any,
    settings: dict[str, Any],
    messages: list[dict[str, Any]] | None,
    endpoint: str,
    latency: float,
) -> tuple[Capture, list[int] | None]:
    returned = fields["output_ids"]
    if (fields["output_ids"] is None or fields["prompt_ids"] is None) and require_ids:
        raise CaptureFailed(
            "the chat endpoint returned no token ids (no prompt_token_ids / token_ids / "
            "response_token_ids): this server build cannot give exact ids on chat; use the "
            "raw path (SGLang /generate, vLLM /v1/completions)",
            url=client.url,
        )
    fields["prompt_ids"] = list(fields["prompt_ids"] or [])
    fields["output_ids"] = list(fields["output_ids"] or [])
    capture = Capture(
        **fields,
        settings=settings,
        messages=messages,
        endpoint=endpoint,
        raw_request=client.audit_request("POST", "/v1/chat/completions", body),
        raw_response=raw,
        latency_s=latency,
        **info.stamp(),
    )
    return capture, returned
