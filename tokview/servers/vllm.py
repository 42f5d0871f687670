"""vLLM capture clients: `POST /v1/chat/completions` (plain and SSE) and `POST /v1/completions`.

vLLM gives ids when asked with `return_token_ids` (protocols.md §2.2): on chat, `prompt_token_ids`
at the top and `token_ids` in the choice; on a stream, prompt ids on the first chunk and id deltas
after; on completions, both in the choice. The reasoning field is `reasoning` from 0.16 on and
`reasoning_content` before: we read both and record which one carried it.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from tokview.core import logprobs as lp
from tokview.core import spec_decode
from tokview.core.record import Capture
from tokview.core.tool_calls import fold_stream_tool_calls
from tokview.servers.backend import Advice, Backend, Call, Captured, Probe
from tokview.servers.chat import ChatBackend, chat_logprob_fields, finish_chat_capture, parse_chat
from tokview.servers.errors import CaptureFailed, IdsNotReturned, Retryable
from tokview.servers.http import ServerClient
from tokview.servers.info import ServerInfo
from tokview.servers.request import normalize_usage
from tokview.servers.shapes import (
    check_prompt_echo,
    finish_of,
    first_choice,
    ids_of,
    int_list,
    logprob_fields,
    object_of,
    text_of,
    too_long_to_score,
)
from tokview.untrusted_text import has_lone_surrogate

REASONING_KEYS = ("reasoning", "reasoning_content")
EFFORT_FIELD = "reasoning_effort"
"""vLLM's request field for the reasoning effort, and gpt-oss's template kwarg of the same name: sent in both places
with one value (serving_chat applies chat_template_kwargs after it, so the templates that read the kwarg agree)."""


def sampling_body(settings: dict[str, Any], model: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "max_tokens": settings["max_new_tokens"],
        "temperature": settings["temperature"],
        "top_p": settings["top_p"],
        "return_token_ids": True,
    }
    if model:
        body["model"] = model
    if settings.get("seed") is not None:
        body["seed"] = settings["seed"]
    return body


def chat_body(
    messages: list[dict[str, Any]], settings: dict[str, Any], model: str | None, stream: bool
) -> dict[str, Any]:
    body = {
        "messages": messages,
        **sampling_body(settings, model),
        "chat_template_kwargs": settings["chat_template_kwargs"],
        "stream": stream,
    }
    if settings.get("logprobs") is not None:  # ids, not strings: two tokens can print the same
        body.update(logprobs=True, top_logprobs=int(settings["logprobs"]), return_tokens_as_token_ids=True)
    if settings.get("tools"):  # an agent trace's row-level tools: rendered by the template, parsed back as calls
        body["tools"] = settings["tools"]
    effort = (settings["chat_template_kwargs"] or {}).get(EFFORT_FIELD)
    if isinstance(effort, str):  # vLLM's Harmony path (gpt-oss) reads the effort here, never the template kwargs
        body[EFFORT_FIELD] = effort
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def merge_chat_stream(
    chunks: list[dict[str, Any]], where: str = "POST /v1/chat/completions (stream)", logprobs_asked: bool = False
) -> dict[str, Any]:
    """Fold chat chunks into one answer: prompt ids from the first, id and text deltas after.

    Any shape no server sends (a choice that is not an object, ids that are not integers, a text
    delta that is not a string) raises Retryable "malformed response", never a TypeError.

    A stream of plain chunks (one choice, text deltas and ids, no logprobs or tool calls: what every
    generation without them streams) is merged in one quick pass (`_merge_plain`) whose checks run once over
    the whole answer; anything else, or anything those checks refuse, takes the chunk-by-chunk walk
    (`merge_chat_stream_walk`), so the result and every error are the walk's. Why: the walk's dozen calls per
    chunk were ~10% of the proxy recorder's CPU per stream (0.35 ms of a 256-chunk stream)."""
    merged = _merge_plain(chunks, where, logprobs_asked)
    return merged if merged is not None else merge_chat_stream_walk(chunks, where, logprobs_asked)


_PLAIN_DELTA_KEYS = frozenset(("role", "content", "reasoning", "reasoning_content"))


def _merge_plain(chunks: list[dict[str, Any]], where: str, logprobs_asked: bool) -> dict[str, Any] | None:
    """`merge_chat_stream_walk`'s result for a stream of plain chunks, or None when a chunk is not one (or a
    check fails: the walk then says which and where)."""
    prompt_ids: Any = None
    id_lists: list[list[Any]] = []
    texts: dict[str, list[str]] = {"content": [], "reasoning": [], "reasoning_content": []}
    seen_keys: set[str] = set()
    finish = matched = None
    usage: dict[str, Any] = {}
    spec = None
    for chunk in chunks:
        if type(chunk) is not dict:
            return None
        if prompt_ids is None and type(chunk.get("prompt_token_ids")) is list:
            prompt_ids = chunk["prompt_token_ids"]
        if type(chunk.get("usage")) is dict:
            usage = chunk["usage"]
        if "metrics" in chunk:
            spec = spec_decode.from_vllm(chunk) or spec
        choices = chunk.get("choices")
        if not choices:
            continue
        if type(choices) is not list or len(choices) != 1:
            return None
        choice = choices[0]
        if type(choice) is not dict or choice.get("index", 0) != 0 or choice.get("logprobs") is not None:
            return None
        if "prompt_token_ids" in choice:
            return None
        ids = choice.get("token_ids")
        if ids is not None:
            if type(ids) is not list:
                return None
            id_lists.append(ids)
        delta = choice.get("delta")
        if type(delta) is not dict or not delta.keys() <= _PLAIN_DELTA_KEYS:
            return None
        for key, text in delta.items():
            if key != "role":
                seen_keys.add(key)
                if type(text) is str:
                    if text:
                        texts[key].append(text)
                elif text is not None:
                    return None
        if choice.get("finish_reason"):
            try:
                finish, _ = finish_of(choice["finish_reason"], where)
            except Retryable:
                return None
            matched = choice.get("matched_stop", choice.get("stop_reason"))
    joined = {key: "".join(parts) for key, parts in texts.items() if parts}
    if any(has_lone_surrogate(text) for text in joined.values()):
        return None
    output = list(itertools.chain.from_iterable(id_lists))
    try:
        ids_of(output, where, "token_ids")
        if prompt_ids is not None:
            ids_of(prompt_ids, where, "prompt_token_ids")
    except Retryable:
        return None
    field_name = next((k for k in REASONING_KEYS if k in joined), None) or next(
        (k for k in REASONING_KEYS if k in seen_keys), None
    )
    saw_ids = bool(id_lists)
    side = chat_logprob_fields(None, output if saw_ids else None, where, logprobs_asked)
    return {
        "prompt_ids": prompt_ids,
        "output_ids": output if saw_ids else None,
        "finish_reason": finish,
        "matched_stop": matched,
        "reasoning": joined.get(field_name) if field_name else None,
        "content": joined.get("content"),
        "reasoning_field": field_name,
        "tool_calls": None,
        "usage": normalize_usage(usage),
        "spec_decode": None if spec is None else spec.to_dict(),
        **side,
    }


def merge_chat_stream_walk(
    chunks: list[dict[str, Any]], where: str = "POST /v1/chat/completions (stream)", logprobs_asked: bool = False
) -> dict[str, Any]:
    """`merge_chat_stream` chunk by chunk, every field of every chunk checked where it is: any stream's merge,
    and the reference the quick pass is tested against."""
    prompt_ids: list[int] | None = None
    output_ids: list[int] = []
    saw_ids = False
    texts: dict[str, list[str]] = {"content": [], "reasoning": [], "reasoning_content": []}
    seen_keys: set[str] = set()
    finish = matched = None
    usage: dict[str, Any] = {}
    spec = None
    logprob_entries: list[Any] | None = None
    for chunk in chunks:
        if prompt_ids is None and isinstance(chunk.get("prompt_token_ids"), list):
            prompt_ids = chunk["prompt_token_ids"]
        if isinstance(chunk.get("usage"), dict):
            usage = chunk["usage"]
        spec = spec_decode.from_vllm(chunk) or spec  # rides the final usage chunk (include_usage)
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            raise Retryable(f"malformed response from {where}: choices is not a list")
        for choice in choices:
            choice = object_of(choice, where, "a choice")
            if choice.get("index", 0) != 0:
                continue
            if prompt_ids is None and isinstance(choice.get("prompt_token_ids"), list):
                prompt_ids = choice["prompt_token_ids"]
            ids = choice.get("token_ids")
            if ids is not None:
                saw_ids = True
                output_ids.extend(ids_of(ids, where, "token_ids"))
            chunk_logprobs = choice.get("logprobs")
            if isinstance(chunk_logprobs, dict) and isinstance(chunk_logprobs.get("content"), list):
                logprob_entries = (logprob_entries or []) + chunk_logprobs["content"]
            delta = object_of(choice.get("delta"), where, "delta")
            for key in texts:
                if key in delta:
                    seen_keys.add(key)
                    if text_of(delta[key], where, f"delta.{key}"):
                        texts[key].append(delta[key])
            if choice.get("finish_reason"):
                finish, _ = finish_of(choice["finish_reason"], where)
                matched = choice.get("matched_stop", choice.get("stop_reason"))
    field_name = next((k for k in REASONING_KEYS if texts[k]), None) or next(
        (k for k in REASONING_KEYS if k in seen_keys), None
    )
    reasoning = "".join(texts[field_name]) if field_name and texts[field_name] else None
    content = "".join(texts["content"]) if texts["content"] else None
    if prompt_ids is not None:
        ids_of(prompt_ids, where, "prompt_token_ids")
    output = output_ids if saw_ids else None
    side = chat_logprob_fields(
        None if logprob_entries is None else {"content": logprob_entries}, output, where, logprobs_asked
    )
    return {
        "prompt_ids": prompt_ids,
        "output_ids": output,
        "finish_reason": finish,
        "matched_stop": matched,
        "reasoning": reasoning,
        "content": content,
        "reasoning_field": field_name,
        "tool_calls": fold_stream_tool_calls(chunks),
        "usage": normalize_usage(usage),
        "spec_decode": None if spec is None else spec.to_dict(),
        **side,
    }


def completions_body(
    prompt_ids: list[int], settings: dict[str, Any], model: str | None, *, skip_special_tokens: bool = False
) -> dict[str, Any]:
    body = {
        "prompt": list(prompt_ids),
        **sampling_body(settings, model),
        "skip_special_tokens": skip_special_tokens,
        "include_stop_str_in_output": True,
        "stream": False,
    }
    if settings.get("logprobs") is not None:
        body.update(logprobs=int(settings["logprobs"]), return_tokens_as_token_ids=True)
    return body


def score_body(ids: list[int], top_k: int, model: str | None) -> dict[str, Any]:
    """The ids as prompt, one token generated, `prompt_logprobs` for every prompt position (K = 0 sent as 1)."""
    body: dict[str, Any] = {
        "prompt": ids,
        "max_tokens": 1,
        "temperature": 0.0,
        "prompt_logprobs": max(1, top_k),
        "return_token_ids": True,
    }
    if model:
        body["model"] = model
    return body


class VllmChat(ChatBackend):
    """vLLM's chat endpoint, plain and SSE: `prompt_token_ids` at the top, `token_ids` in the choice."""

    server = "vllm"
    server_name = "vLLM"
    recorded_as = "vllm-chat"
    refuses_unparsed_tools = True  # "auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser

    async def capture(self, client: ServerClient, info: ServerInfo, call: Call) -> Captured:
        body = self._body(client, info, call)
        started = time.perf_counter()
        raw = await client.post_json(self.path, body)
        fields = parse_chat(raw, "POST /v1/chat/completions", "logprobs" in body)
        return self._captured(client, info, call=call, body=body, fields=fields, raw=raw, started=started)

    async def stream(self, client: ServerClient, info: ServerInfo, call: Call) -> Captured:
        body = self._body(client, info, call)
        started = time.perf_counter()
        chunks = [c async for c in client.stream_sse(self.path, body)]
        fields = merge_chat_stream(chunks, "POST /v1/chat/completions (stream)", "logprobs" in body)
        raw = {"stream": True, "n_chunks": len(chunks), "chunks": chunks}
        return self._captured(client, info, call=call, body=body, fields=fields, raw=raw, started=started)

    @staticmethod
    def _body(client: ServerClient, info: ServerInfo, call: Call) -> dict[str, Any]:
        if not call.messages:
            raise CaptureFailed(
                "vLLM's chat endpoint needs messages (it takes no prompt ids): use mode raw "
                "(/v1/completions with a token-id prompt)",
                url=client.url,
            )
        return chat_body(call.messages, call.settings, info.model, call.stream)

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
        latency = time.perf_counter() - started
        return finish_chat_capture(
            fields, call=call, client=client, info=info, body=body, raw=raw, endpoint=self.recorded_as, latency=latency
        )

    def tool_parser_flags(self, parser: str) -> str:
        return f"--enable-auto-tool-choice --tool-call-parser {parser}"  # tools without it: HTTP 400

    def reasoning_field_advice(self, field: str | None) -> Advice | None:
        if field != "reasoning_content":
            return None
        return Advice(
            "warn",
            "the reasoning arrives in `reasoning_content` (vLLM before 0.16)",
            "clients reading only `reasoning` get nothing: read `reasoning` and fall back to "
            "`reasoning_content` (tokview does), or upgrade vLLM to ≥0.16",
        )


class VllmCompletions(Backend):
    """The exact-id path on vLLM: `/v1/completions` with a token-id prompt, `choices[].token_ids` out."""

    server = "vllm"
    server_name = "vLLM"
    endpoint = "completions"
    path = "/v1/completions"
    ids_field = "choices[].token_ids"
    exact_ids = True
    recorded_as = "vllm-completions"
    detokenized_key = "prompt"

    async def capture(self, client: ServerClient, info: ServerInfo, call: Call) -> Captured:
        """Our prompt ids in, the raw sampled ids out."""
        if call.prompt_ids is None:
            raise CaptureFailed("vLLM /v1/completions needs prompt ids")
        prompt_ids, settings = call.prompt_ids, call.settings
        body = completions_body(prompt_ids, settings, info.model, skip_special_tokens=call.skip_special_tokens)
        started = time.perf_counter()
        data = await client.post_json("/v1/completions", body)
        where = "POST /v1/completions"
        if not isinstance(data, dict) or not isinstance(data.get("choices"), list) or not data["choices"]:
            raise Retryable(f"malformed response from {where}: expected an object with choices")
        choice = object_of(data["choices"][0], where, "choices[0]")
        output = choice.get("token_ids")
        if output is None:
            raise IdsNotReturned(
                f"{where} returned no token_ids: this vLLM build ignores return_token_ids (it needs vLLM ≥0.10.2)",
                url=client.url,
            )
        output = ids_of(output, where, "token_ids")
        check_prompt_echo(where, prompt_ids, echoed=choice.get("prompt_token_ids"))
        finish, _ = finish_of(choice.get("finish_reason"), where)
        try:
            found = (
                lp.from_vllm_completion(choice.get("logprobs"), output, int(body["logprobs"]))
                if "logprobs" in body
                else None
            )
        except lp.LogprobShapeError as exc:
            raise Retryable(f"malformed response from {where}: {exc}") from None
        spec = spec_decode.from_vllm(data)
        capture = Capture(
            spec_decode=None if spec is None else spec.to_dict(),
            **logprob_fields(found),
            prompt_ids=list(prompt_ids),
            output_ids=list(output),
            finish_reason=finish,
            matched_stop=choice.get("stop_reason"),
            text=text_of(choice.get("text"), where, "text"),
            usage=normalize_usage(data.get("usage")),
            settings=settings,
            endpoint=self.recorded_as,
            raw_request=client.audit_request("POST", "/v1/completions", body),
            raw_response=data,
            latency_s=time.perf_counter() - started,
            **info.stamp(),
        )
        return Captured(capture, capture.output_ids)

    async def stream(self, client: ServerClient, info: ServerInfo, call: Call) -> Captured:
        """Captured whole: a completions stream adds nothing the ids need."""
        return await self.capture(client, info, call)

    async def probe(self, probe: Probe) -> None:
        if not probe.prompt_ids:
            return
        info = probe.info
        body: dict[str, Any] = {
            "prompt": probe.prompt_ids,
            "max_tokens": 1,
            "temperature": 0.0,
            "return_token_ids": True,
        }
        if info.model:
            body["model"] = info.model
        answer, why = await probe.ask(lambda: probe.client.post_json(self.path, body))
        info.features["completions_ids"] = int_list(first_choice(answer).get("token_ids")) is not None
        if why:
            info.details["completions_error"] = why

    def recognises(self, features: dict[str, Any]) -> bool:
        return bool(features.get("completions_ids"))

    async def score(
        self, client: ServerClient, info: ServerInfo, ids: list[int], start: int, top_k: int
    ) -> lp.TokenLogprobs:
        where = "POST /v1/completions (score)"
        too_long_to_score(where, info, ids, client.url)
        data = await client.post_json(self.path, score_body(ids, top_k, info.model))
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or not choices:
            raise Retryable(f"malformed response from {where}: expected an object with choices")
        choice = object_of(choices[0], where, "choices[0]")
        if choice.get("prompt_logprobs") is None:
            raise CaptureFailed(
                f"{where} returned no prompt_logprobs: this server cannot score stored samples", url=client.url
            )
        return lp.from_vllm_prompt(choice["prompt_logprobs"], ids, start, top_k)
