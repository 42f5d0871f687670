"""One harness request as `tokview proxy` would forward and record it, sent by `tokview doctor`.

The proxy asks for ids with the fields `ids.inject` adds (vLLM's `return_token_ids` on a stream too, SGLang's sglext
flags on a chat stream) and turns the answer into a sample with `capture.build_capture`. The doctor sends its probe
the same way, so what it judges is what the proxy would record: whether the tool parser returns the calls the ids
hold, and whether a streamed turn records the ids an unstreamed one does (a server that drops the id-only chunks of
a call's markers records calls without them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokview.core.profiles import ModelProfile
from tokview.core.record import Capture
from tokview.proxy.capture import CHAT, NoIds, build_capture, settings_of
from tokview.proxy.ids import inject
from tokview.servers.errors import CaptureFailed, Retryable
from tokview.servers.http import ServerClient
from tokview.servers.retry import RetryPolicy

CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True)
class Proxied:
    """What the proxy would record of one request: its capture, or why there is none."""

    capture: Capture | None
    error: str = ""
    status: int | None = None
    """The HTTP status of a refused request (None: not refused by status)."""
    no_ids: bool = False
    """The server answered without ids: the proxy records such a request as a failure."""


async def ask_as_proxied(
    client: ServerClient,
    policy: RetryPolicy,
    kind: str,
    body: dict[str, Any],
    profile: ModelProfile | None,
    *,
    stream: bool,
) -> Proxied:
    """`body` (an OpenAI chat request, as a harness writes it) sent whole or streamed, with the fields the proxy
    injects for a server of `kind`, and recorded as the proxy records it."""
    asked = {**body, "stream": stream, **({"stream_options": {"include_usage": True}} if stream else {})}
    sent, _ = inject(asked, kind, CHAT)

    async def once() -> object:
        if stream:
            return [chunk async for chunk in client.stream_sse(CHAT_PATH, sent)]
        return await client.post_json(CHAT_PATH, sent)

    try:
        answer = await policy.run(once)
        capture = build_capture(
            CHAT,
            kind,
            answer,
            stream=stream,
            settings=settings_of(asked, profile, None),
            messages=body.get("messages"),
            raw_request=asked,
            stamp={},
            latency_s=0.0,
        )
    except CaptureFailed as exc:
        return Proxied(None, exc.reason, exc.status)
    except NoIds as exc:
        return Proxied(None, str(exc), no_ids=True)
    except (ValueError, Retryable) as exc:  # a malformed answer: the proxy records a failure
        return Proxied(None, f"malformed answer: {exc}")
    return Proxied(capture)
