"""What to capture (`CaptureRequest`) and the settings every endpoint family shares.

Settings are resolved once, before any request, so the same numbers go to the raw path and to the
chat path of a dual capture, and the capture records exactly what was sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tokview.core.profiles import ModelProfile

MODES = ("raw", "chat", "dual")
DEFAULT_SETTINGS: dict[str, Any] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "max_new_tokens": 1024,
    "thinking": None,
    "seed": None,
}


@dataclass
class CaptureRequest:
    """One generation to capture.

    `messages` is the conversation (rendered locally or by the server); `prompt_ids`, when given,
    are sent as they are (multi-turn generation points must never be re-rendered). `mode` picks the
    path: `raw` (exact ids: SGLang /generate, vLLM /v1/completions), `chat` (the parsed chat
    endpoint) or `dual` (both, merged). `stream` asks for SSE where the endpoint supports it.
    """

    messages: list[dict[str, Any]] | None
    prompt_ids: list[int] | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    mode: str = "raw"
    stream: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown capture mode {self.mode!r} (known: {', '.join(MODES)})")
        if not self.messages and not self.prompt_ids:
            raise ValueError("a capture request needs messages or prompt_ids")


def resolve_settings(settings: dict[str, Any], profile: ModelProfile | None) -> dict[str, Any]:
    """Fill defaults and make `thinking` and `chat_template_kwargs` agree with each other."""
    resolved = dict(DEFAULT_SETTINGS)
    resolved.update({k: v for k, v in settings.items() if v is not None or k not in DEFAULT_SETTINGS})
    if profile is not None and not profile.has_reasoning:
        resolved["thinking"] = None  # a plain model has no thinking to switch: record none, send no kwarg
    kwargs = settings.get("chat_template_kwargs")
    key = profile.thinking_kwarg if profile is not None else None
    if kwargs is None:
        kwargs = profile.template_kwargs(resolved["thinking"]) if profile is not None else {}
    elif resolved["thinking"] is None and key and key in kwargs:
        resolved["thinking"] = bool(kwargs[key])
    resolved["chat_template_kwargs"] = dict(kwargs)
    return resolved


def normalize_usage(*sources: dict[str, Any] | None) -> dict[str, int]:
    """prompt_tokens / completion_tokens / reasoning_tokens from OpenAI usage or SGLang meta_info."""
    usage: dict[str, int] = {}
    for src in sources:
        if not isinstance(src, dict):
            continue
        for key in ("prompt_tokens", "completion_tokens", "reasoning_tokens"):
            if isinstance(src.get(key), int) and key not in usage:
                usage[key] = src[key]
        details = src.get("completion_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("reasoning_tokens"), int):
            usage.setdefault("reasoning_tokens", details["reasoning_tokens"])
    return usage


def normalize_finish(finish: object) -> tuple[str | None, int | str | None]:
    """SGLang's `{"type": "stop", "matched": 163586}` → ("stop", 163586); strings pass through."""
    if isinstance(finish, dict):
        return finish.get("type"), finish.get("matched")
    if isinstance(finish, str) or finish is None:
        return finish, None
    return str(finish), None


def pick_reasoning(message: dict[str, Any]) -> tuple[str | None, str | None]:
    """(reasoning text, field name): `reasoning` first (vLLM ≥0.16), then `reasoning_content`.

    The field name is recorded even when its value is null, so a doctor can tell which name the
    server uses; a non-null value wins over a null one.
    """
    present = [k for k in ("reasoning", "reasoning_content") if k in message]
    for key in present:
        if message[key] is not None:
            return message[key], key
    return None, (present[0] if present else None)
