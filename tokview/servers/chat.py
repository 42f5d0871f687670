"""The OpenAI chat answer, as SGLang and vLLM both send it: where the ids are, the reasoning field,
logprobs, and the 1-token probe of `/v1/chat/completions` both servers answer alike.

The two servers' chat endpoints differ in their request bodies and streams (their own classes in
sglang.py and vllm.py); what they return in a plain answer is read here, once.
"""

from __future__ import annotations

from typing import Any, ClassVar

from tokview.core import logprobs as lp
from tokview.core import spec_decode
from tokview.core.record import Capture
from tokview.core.tool_calls import server_tool_calls
from tokview.servers.backend import Backend, Call, Captured, Probe
from tokview.servers.errors import CaptureFailed, Retryable
from tokview.servers.http import ServerClient
from tokview.servers.info import ServerInfo
from tokview.servers.request import normalize_usage, pick_reasoning
from tokview.servers.shapes import (
    finish_of,
    first_choice,
    int_list,
    logprob_fields,
    object_of,
    optional_ids_of,
    text_of,
)

CHAT_PATH = "/v1/chat/completions"
CHAT_ID_FIELDS = ("token_ids", "response_token_ids")
PROBE_MESSAGES = [{"role": "user", "content": "hi"}]


def chat_ids(data: dict[str, Any], choice: dict[str, Any]) -> tuple[list[int] | None, list[int] | None, str | None]:
    """(prompt ids, output ids, name of the output-id field) from any build's chat answer."""
    sglext = data.get("sglext")
    sglext = sglext if isinstance(sglext, dict) else {}
    choice_ext = choice.get("sglext")
    choice_ext = choice_ext if isinstance(choice_ext, dict) else {}
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


def served_prompt_ids(data: object) -> list[int] | None:
    """The prompt ids a chat answer says the server rendered (None when it names none)."""
    if isinstance(data, dict) and data.get("choices"):
        prompt, _, _ = chat_ids(data, data["choices"][0])
        if prompt:
            return list(prompt)
    return None


def chat_logprob_fields(logprobs: object, output_ids: list[int] | None, where: str, asked: bool) -> dict[str, Any]:
    """OpenAI-style `logprobs.content` (asked with return_tokens_as_token_ids) aligned to the output ids.

    Read only when we asked: logprobs someone else's defaults added carry strings, not ids."""
    if not asked or logprobs is None or output_ids is None:
        return logprob_fields(None)
    try:
        return logprob_fields(lp.from_vllm_chat(logprobs, output_ids))
    except lp.LogprobShapeError as exc:
        raise Retryable(f"malformed response from {where}: {exc}") from None


def parse_chat(data: object, where: str, logprobs_asked: bool = False) -> dict[str, Any]:
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
        "tool_calls": server_tool_calls(message.get("tool_calls")),
        "usage": normalize_usage(data.get("usage")),
    }


def finish_chat_capture(
    fields: dict[str, Any],
    *,
    call: Call,
    client: ServerClient,
    info: ServerInfo,
    body: dict[str, Any],
    raw: object,
    endpoint: str,
    latency: float,
) -> Captured:
    """The capture of a plain chat answer whose `fields` were read off `raw` (the parsed answer to
    `body`), for SGLang's and vLLM's chat alike; keyword-only, since its inputs are alike in type."""
    returned = fields["output_ids"]
    if (fields["output_ids"] is None or fields["prompt_ids"] is None) and call.require_ids:
        raise CaptureFailed(
            "the chat endpoint returned no token ids (no prompt_token_ids / token_ids / "
            "response_token_ids): this server build cannot give exact ids on chat; run a build that returns them "
            "(`tokview doctor --server URL` says what it answers), or, for prompts without tools, the raw path "
            "(--mode raw: SGLang /generate, vLLM /v1/completions)",
            url=client.url,
        )
    fields["prompt_ids"] = list(fields["prompt_ids"] or [])
    fields["output_ids"] = list(fields["output_ids"] or [])
    capture = Capture(
        **fields,
        settings=call.settings,
        messages=call.messages,
        endpoint=endpoint,
        raw_request=client.audit_request("POST", CHAT_PATH, body),
        raw_response=raw,
        latency_s=latency,
        **info.stamp(),
    )
    return Captured(capture, returned)


class ChatBackend(Backend):
    """What both servers' chat endpoints share: the path, the id fields and the probe."""

    endpoint: ClassVar[str] = "chat"
    path: ClassVar[str] = CHAT_PATH
    ids_field: ClassVar[str] = "prompt ids + token ids"
    exact_ids: ClassVar[bool] = False

    async def probe(self, probe: Probe) -> None:
        """Which id fields and which reasoning field a 1-token chat answer carries."""
        info, f = probe.info, probe.info.features
        body: dict[str, Any] = {
            "messages": PROBE_MESSAGES,
            "max_tokens": 1,
            "temperature": 0.0,
            "return_token_ids": True,
            "chat_template_kwargs": probe.template_kwargs,
            "stream": False,
        }
        if info.model:
            body["model"] = info.model
        answer, why = await probe.ask(lambda: probe.client.post_json(CHAT_PATH, body))
        f["chat"] = answer is not None
        f["chat_ids_field"] = f["chat_prompt_ids_field"] = f["reasoning_field"] = None
        choice = first_choice(answer)
        if choice:
            served_prompt, _, ids_field = chat_ids(answer, choice)
            served_prompt = int_list(served_prompt)
            f["chat_ids_field"] = ids_field
            if isinstance(choice.get("prompt_token_ids"), list):
                f["chat_prompt_ids_field"] = "choices[].prompt_token_ids"
            elif isinstance(answer.get("prompt_token_ids"), list):
                f["chat_prompt_ids_field"] = "prompt_token_ids"
            elif served_prompt is not None:
                f["chat_prompt_ids_field"] = "sglext.input_ids"
            message = choice.get("message")
            f["reasoning_field"] = pick_reasoning(message)[1] if isinstance(message, dict) else None
            info.details["probe_prompt_ids"] = served_prompt
            probe.prompt_ids = probe.prompt_ids or served_prompt
        elif why:
            info.details["chat_error"] = why
