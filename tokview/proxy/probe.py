"""One harness request as `tokview proxy` would forward and record it, sent by `tokview doctor`.

The proxy asks for ids with the fields `ids.inject` adds (vLLM's `return_token_ids` on a stream too, SGLang's sglext
flags on a chat stream) and folds the answer with the same functions the recorder uses. Sending one request this way
streamed and once whole tells, before a harness runs, whether a streamed turn records the same ids as an unstreamed
one: a server that drops the id-only chunks of a tool call's markers records calls without them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokview.core.tool_calls import fold_stream_tool_calls, tool_calls_of_response
from tokview.proxy.capture import chat_fields, chat_stream_fields
from tokview.proxy.ids import inject
from tokview.servers.http import ServerClient

CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True)
class ProxiedAnswer:
    """What the proxy's recorder would read off one chat answer."""

    output_ids: list[int] | None
    """None: the answer carried no output ids (the proxy records the request as a failure)."""
    tool_calls: list[dict[str, Any]] | None


async def ask_as_proxied(client: ServerClient, kind: str, body: dict[str, Any], *, stream: bool) -> ProxiedAnswer:
    """`body` (an OpenAI chat request, as a harness writes it) sent streamed or whole, with the fields the proxy
    injects for a server of `kind`. Raises what `ServerClient` raises (Retryable, CaptureFailed)."""
    asked = {**body, "stream": stream, **({"stream_options": {"include_usage": True}} if stream else {})}
    sent, _ = inject(asked, kind, "chat")
    if stream:
        chunks = [chunk async for chunk in client.stream_sse(CHAT_PATH, sent)]
        return ProxiedAnswer(chat_stream_fields(chunks)["output_ids"], fold_stream_tool_calls(chunks))
    data = await client.post_json(CHAT_PATH, sent)
    return ProxiedAnswer(chat_fields(data)["output_ids"], tool_calls_of_response(data))
