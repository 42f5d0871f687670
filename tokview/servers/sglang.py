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
from tokview.servers.backend import Backend, Call, Captured, Probe
from tokview.servers.chat import ChatBackend, finish_chat_capture, parse_chat
from tokview.servers.errors import CaptureFailed, IdsNotReturned, Retryable
from tokview.servers.http import ServerClient
from tokview.servers.info import ServerInfo
from tokview.servers.request import normalize_usage
from tokview.servers.shapes import (
    check_prompt_echo,
    finish_of,
    ids_of,
    logprob_fields,
    object_of,
    text_of,
    too_long_to_score,
)


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


def side_data(meta: dict[str, Any], output_ids: list[int], where: str, prompt_ids: list[int]) -> dict[str, Any]:
    """Spec-decode metrics and logprobs from one /generate meta_info."""
    try:
        found = lp.from_sglang_output(meta, output_ids, prompt_ids)
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


def capture_from_generate(data: object, prompt_ids: list[int], *, where: str = "POST /generate") -> dict[str, Any]:
    """The id and text fields of one /generate answer (a dict, or a one-element batch list)."""
    if isinstance(data, list) and len(data) == 1:
        data = data[0]
    if not isinstance(data, dict) or "meta_info" not in data:
        raise Retryable(f"malformed response from {where}: expected an object with meta_info")
    if "output_ids" not in data:
        raise IdsNotReturned(
            f"{where} returned no output_ids: this SGLang build does not return ids "
            f"(upgrade SGLang, or start it with --skip-tokenizer-init)"
        )
    meta = object_of(data["meta_info"], where, "meta_info")
    raw_finish = meta.get("finish_reason")
    finish, matched = finish_of(raw_finish, where)
    if finish == "abort":  # {"type": "abort", "message": ...}, or a bare "abort" from some builds
        message = raw_finish.get("message") if isinstance(raw_finish, dict) else None
        raise CaptureFailed(f"SGLang aborted the request on {where}: {message or 'no message'}")
    check_prompt_echo(where, prompt_ids, count=meta.get("prompt_tokens"))  # an abort counts 1 (a prompt too long)
    output_ids = ids_of(data["output_ids"], where)
    return {
        "prompt_ids": list(prompt_ids),
        "output_ids": output_ids,
        "finish_reason": finish,
        "matched_stop": matched,
        "text": text_of(data.get("text"), where, "text"),
        "usage": normalize_usage(meta),
        **side_data(meta, output_ids, where, prompt_ids),
    }


async def generate_stream(
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
            echo = len(output_ids) - len(last_logprobs)  # SGLang's prompt-prefix bug: the ids begin with the
            if not (0 < echo <= len(prompt_ids) and output_ids[:echo] == prompt_ids[-echo:]):  # prompt's tail
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


def score_body(ids: list[int], top_k: int) -> dict[str, Any]:
    """Nothing generated (`max_new_tokens: 0`); `input_token_logprobs` for every id from position 0."""
    return {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": 0, "temperature": 0.0},
        "return_logprob": True,
        "logprob_start_len": 0,
        "top_logprobs_num": top_k,
        "stream": False,
    }


class SglangGenerate(Backend):
    """Native `POST /generate`: our prompt ids in, `output_ids` verbatim out (the most exact path)."""

    server = "sglang"
    server_name = "SGLang"
    endpoint = "generate"
    path = "/generate"
    ids_field = "output_ids"
    exact_ids = True
    recorded_as = "sglang-generate"
    detokenized_key = "text"
    context_reserve = 1  # TokenizerManager: `max_new_tokens + input_token_num >= context_len` is a 400

    async def capture(self, client: ServerClient, info: ServerInfo, call: Call) -> Captured:
        body, prompt_ids, started = self._body(call), self._prompt_ids(call), time.perf_counter()
        data = await client.post_json(self.path, body)
        return self._captured(
            client,
            info,
            call=call,
            body=body,
            fields=capture_from_generate(data, prompt_ids),
            raw=data,
            started=started,
        )

    async def stream(self, client: ServerClient, info: ServerInfo, call: Call) -> Captured:
        body, prompt_ids, started = self._body(call), self._prompt_ids(call), time.perf_counter()
        fields, raw = await generate_stream(client, body, prompt_ids)
        return self._captured(client, info, call=call, body=body, fields=fields, raw=raw, started=started)

    @staticmethod
    def _prompt_ids(call: Call) -> list[int]:
        if call.prompt_ids is None:
            raise CaptureFailed("SGLang /generate needs prompt ids")
        return list(call.prompt_ids)

    def _body(self, call: Call) -> dict[str, Any]:
        return generate_body(
            self._prompt_ids(call), call.settings, stream=call.stream, skip_special_tokens=call.skip_special_tokens
        )

    def _captured(
        self,
        client: ServerClient,
        info: ServerInfo,
        *,
        call: Call,
        body: dict[str, Any],
        fields: dict[str, Any],
        raw: object,
        started: float,
    ) -> Captured:
        capture = Capture(
            **fields,
            settings=call.settings,
            endpoint=self.recorded_as,
            raw_request=client.audit_request("POST", self.path, body),
            raw_response=raw,
            latency_s=time.perf_counter() - started,
            **info.stamp(),
        )
        return Captured(capture, capture.output_ids)

    async def probe(self, probe: Probe) -> None:
        info, f = probe.info, probe.info.features
        body: dict[str, Any] = {"sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}
        body.update({"input_ids": probe.prompt_ids} if probe.prompt_ids else {"text": "hi"})
        gen, why = await probe.ask(lambda: probe.client.post_json(self.path, body))
        f["generate"] = isinstance(gen, (dict, list))
        gen0 = gen[0] if isinstance(gen, list) and gen else gen
        f["generate_ids"] = isinstance(gen0, dict) and isinstance(gen0.get("output_ids"), list)
        if why and info.kind == self.server:
            info.details["generate_error"] = why

    def recognises(self, features: dict[str, Any]) -> bool:
        return bool(features.get("generate"))

    async def score(
        self, client: ServerClient, info: ServerInfo, ids: list[int], start: int, top_k: int
    ) -> lp.TokenLogprobs:
        where = "POST /generate (score)"
        too_long_to_score(where, info, ids, client.url)
        data = await client.post_json(self.path, score_body(ids, top_k))
        if isinstance(data, list) and len(data) == 1:
            data = data[0]
        if not isinstance(data, dict):
            raise Retryable(f"malformed response from {where}: expected an object with meta_info")
        found = lp.from_sglang_input(object_of(data.get("meta_info"), where, "meta_info"), ids, start)
        if top_k == 0:
            found.top_ids = found.top_logprobs = None
        return found


# -- /v1/chat/completions -------------------------------------------------------------------
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
    if settings.get("tools"):  # an agent trace's row-level tools: rendered by the template, parsed back as calls
        body["tools"] = settings["tools"]
    if not messages and prompt_ids:
        body["input_ids"] = list(prompt_ids)  # SGLang then skips its own template
    return body


SGLANG_TOOL_PARSERS = {"hermes": "qwen25"}
"""SGLang's names for the tool parsers whose vLLM name differs (Qwen3's `<tool_call>` JSON)."""


class SglangChat(ChatBackend):
    """SGLang's OpenAI chat endpoint, non-streaming only: SGLang refuses ids on a chat stream (HTTP 400)."""

    server = "sglang"
    server_name = "SGLang"
    recorded_as = "sglang-chat"
    logprob_ids = False  # OpenAI-style entries: a token's text, and two tokens can print the same
    kwargs_take_tools = False
    context_reserve = 1

    def tool_parser_flags(self, parser: str) -> str:
        return f"--tool-call-parser {SGLANG_TOOL_PARSERS.get(parser, parser)}"

    async def capture(self, client: ServerClient, info: ServerInfo, call: Call) -> Captured:
        body = chat_body(call.messages, call.prompt_ids, call.settings, info.model)
        started = time.perf_counter()
        data = await client.post_json(self.path, body)
        fields = parse_chat(data, "POST /v1/chat/completions")
        latency = time.perf_counter() - started
        return finish_chat_capture(
            fields, call=call, client=client, info=info, body=body, raw=data, endpoint=self.recorded_as, latency=latency
        )

    async def stream(self, client: ServerClient, info: ServerInfo, call: Call) -> Captured:
        """Captured whole: asking for ids on a chat stream is SGLang's HTTP 400."""
        return await self.capture(client, info, call)
