"""One capture on one server: pick the endpoint pair (`registry.choose`), get the prompt ids, merge dual paths.

The raw path gives the exact ids (SGLang /generate, vLLM /v1/completions with a token-id prompt);
the chat path gives what the server's parser made of them. A dual capture runs both with the same
settings and seed and keeps the ids of the first and the text fields of the second, so the
findings compare what the server really did on both.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from tokview.core.record import Capture
from tokview.core.tokenizer import TokenizerError
from tokview.servers.backend import Call, Captured
from tokview.servers.errors import CaptureFailed
from tokview.servers.http import ServerClient
from tokview.servers.info import ServerInfo
from tokview.servers.registry import BACKEND_NAMES, ServerChoice, choose
from tokview.servers.request import CaptureRequest

if TYPE_CHECKING:
    from tokview.core.tokenizer import TokenizerAdapter

BACKENDS = BACKEND_NAMES
"""What `--backend` takes (the pool validates against it)."""


async def prompt_ids_for(
    client: ServerClient,
    info: ServerInfo,
    request: CaptureRequest,
    settings: dict[str, Any],
    tokenizer: TokenizerAdapter | None,
) -> list[int]:
    """Prompt ids for the raw path: given ids, else the local template, else the server's /tokenize."""
    if request.prompt_ids:
        return list(request.prompt_ids)
    assert request.messages
    if tokenizer is not None:
        try:
            return tokenizer.render(
                request.messages, add_generation_prompt=True, template_kwargs=settings["chat_template_kwargs"]
            )
        except (TokenizerError, ValueError) as exc:
            raise CaptureFailed(f"cannot render the prompt locally: {exc}") from None
    if info.features.get("tokenize_messages") is False:
        raise CaptureFailed(
            "no tokenizer to render the prompt, and the server's /tokenize does not take messages: "
            "give --tokenizer DIR",
            url=info.url,
        )
    body: dict[str, Any] = {
        "messages": request.messages,
        "add_generation_prompt": True,
        "chat_template_kwargs": settings["chat_template_kwargs"],
    }
    if info.model:
        body["model"] = info.model
    try:
        data = await client.post_json("/tokenize", body)
    except CaptureFailed as exc:
        raise CaptureFailed(
            f"no tokenizer to render the prompt, and the server's /tokenize failed ({exc.reason}): "
            f"give --tokenizer DIR",
            url=info.url,
        ) from None
    tokens = data.get("tokens") if isinstance(data, dict) else None
    if not isinstance(tokens, list):
        raise CaptureFailed(
            "no tokenizer to render the prompt, and /tokenize returned no tokens: give --tokenizer DIR", url=info.url
        )
    return tokens


async def raw_capture(
    client: ServerClient,
    info: ServerInfo,
    *,
    choice: ServerChoice,
    request: CaptureRequest,
    settings: dict[str, Any],
    tokenizer: TokenizerAdapter | None,
    skip_special_tokens: bool = False,
) -> Capture:
    """The exact-id path of `choice` with our prompt ids (rendered here when only messages were given)."""
    prompt_ids = await prompt_ids_for(client, info, request, settings, tokenizer)
    call = Call(
        settings,
        messages=request.messages,
        prompt_ids=prompt_ids,
        stream=request.stream,
        skip_special_tokens=skip_special_tokens,
    )
    return (await choice.raw.run(client, info, call)).capture


async def chat_capture(
    client: ServerClient,
    info: ServerInfo,
    choice: ServerChoice,
    request: CaptureRequest,
    settings: dict[str, Any],
    *,
    require_ids: bool = True,
) -> Captured:
    """The parsed chat path of `choice`; the output ids as returned ride along (None: none came back)."""
    call = Call(
        settings,
        messages=request.messages,
        prompt_ids=request.prompt_ids,
        stream=request.stream,
        require_ids=require_ids,
    )
    return await choice.chat.run(client, info, call)


def merge_dual(raw: Capture, chat: Capture, chat_ids: list[int] | None) -> Capture:
    """Ids from the raw path; reasoning/content/field name from the chat path.

    `text` is left empty on purpose: the text fields of a dual capture describe the parsed path,
    so a reasoning that no chat field carried is not masked by the raw path's full text (which
    stays in `raw_response`).
    """
    raw_request = dict(raw.raw_request or {})
    raw_request["parsed"] = chat.raw_request
    return dataclasses.replace(
        raw,
        endpoint="dual",
        text=None,
        reasoning=chat.reasoning,
        content=chat.content,
        reasoning_field=chat.reasoning_field,
        tool_calls=chat.tool_calls,
        parsed_output_ids=None if chat_ids is None else list(chat_ids),
        parsed_raw_response=chat.raw_response,
        raw_request=raw_request,
        latency_s=(raw.latency_s or 0.0) + (chat.latency_s or 0.0),
    )


CHAT_LOGPROBS_BY_TEXT = (
    "--logprobs with --mode chat on {server}: its chat endpoint names logprob tokens by text, not id; use --mode raw "
    "or dual"
)
"""Short: a run's summary shows a failure reason cut at ~200 characters."""
KWARGS_TOOLS_ON_CHAT = (
    "--chat-template-kwargs may not set tools with --mode {mode} on {server}: its chat endpoint passes the request's "
    "tools itself (give them in the rows, or use --mode raw)"
)
"""Said before the run when --backend names such a server, per capture once a probe found one (`--backend auto`)."""


async def capture_on(
    client: ServerClient,
    info: ServerInfo,
    *,
    backend: str,
    request: CaptureRequest,
    settings: dict[str, Any],
    tokenizer: TokenizerAdapter | None,
) -> Capture:
    """One attempt at one capture on one server (retries are the pool's business)."""
    choice = choose(backend, info)
    mode = request.mode
    if mode == "raw" and choice.chat_only:
        mode = "chat"  # the user asked for SGLang's chat endpoint: its ids are the only ones
    recorded = {**settings, "backend": choice.name, "mode": mode, "stream": request.stream}
    if mode == "chat" and not choice.chat.logprob_ids and settings.get("logprobs") is not None:
        raise CaptureFailed(CHAT_LOGPROBS_BY_TEXT.format(server=choice.chat.server_name), url=info.url)
    kwargs = settings.get("chat_template_kwargs")
    if mode != "raw" and not choice.chat.kwargs_take_tools and isinstance(kwargs, dict) and "tools" in kwargs:
        raise CaptureFailed(KWARGS_TOOLS_ON_CHAT.format(mode=mode, server=choice.chat.server_name), url=info.url)
    if mode == "raw":
        capture = await raw_capture(
            client, info, choice=choice, request=request, settings=settings, tokenizer=tokenizer
        )
    elif mode == "chat":
        capture = (await chat_capture(client, info, choice, request, settings)).capture
    else:
        raw = await raw_capture(client, info, choice=choice, request=request, settings=settings, tokenizer=tokenizer)
        chat = await chat_capture(client, info, choice, request, settings, require_ids=False)
        capture = merge_dual(raw, chat.capture, chat.returned_ids)
    _check_output_length(capture, settings.get("max_new_tokens"), info.url)
    capture.settings = recorded
    capture.messages = request.messages
    return capture


OVERRUN_SLACK = 16
"""Output ids past the `max_tokens` asked that are taken for a server's quirk rather than a broken answer."""


def _check_output_length(capture: Capture, asked: object, url: str) -> None:
    """An answer with far more output ids than `max_tokens` asked for is not a generation of this request: refused
    before it is analysed. (A server answering 24 million ids to a 1,024-token request had them stored, flagged,
    a 200 MB store, and the batch spent minutes analysing them, deaf to SIGTERM.)"""
    if not isinstance(asked, int) or isinstance(asked, bool) or asked < 1:
        return
    if len(capture.output_ids) > asked + OVERRUN_SLACK:
        raise CaptureFailed(
            f"malformed response: {len(capture.output_ids)} output ids for a request of max_tokens {asked}", url=url
        )
