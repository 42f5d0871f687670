"""Every endpoint family tokview speaks, keyed by (server kind, endpoint), and what `--backend` picks.

`--backend` names a server (sglang, vllm) or SGLang's chat endpoint alone (sglang-chat); `auto` takes
the kind the probe found. A `ServerChoice` is the pair of endpoint families a capture then uses: the
raw path (exact ids) and the parsed chat path.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokview.servers.backend import Backend
from tokview.servers.errors import CaptureFailed
from tokview.servers.info import ServerInfo
from tokview.servers.sglang import SglangChat, SglangGenerate
from tokview.servers.vllm import VllmChat, VllmCompletions

ENDPOINTS: dict[tuple[str, str], Backend] = {
    b.key: b for b in (SglangChat(), VllmChat(), SglangGenerate(), VllmCompletions())
}
"""(server kind, endpoint) → the class that speaks it, in probe order: chat first (its answer names the
served prompt ids the raw probes then send), then the raw paths."""
SERVER_KINDS = frozenset(b.server for b in ENDPOINTS.values())


def context_reserve(kind: str | None) -> int:
    """The ids a server of this kind wants left unused past prompt + max tokens (`Backend.context_reserve`)."""
    return max((b.context_reserve for b in ENDPOINTS.values() if b.server == kind), default=0)


@dataclass(frozen=True)
class ServerChoice:
    """What one `--backend` value captures with: `raw` gives exact ids, `chat` the server's parse."""

    name: str
    """As recorded in a capture's settings: sglang | sglang-chat | vllm."""
    raw: Backend
    chat: Backend
    chat_only: bool = False
    """The user asked for the chat endpoint: a raw capture goes to chat (its ids are the only ones)."""

    @property
    def server(self) -> str:
        return self.raw.server


CHOICES: dict[str, ServerChoice] = {
    "sglang": ServerChoice("sglang", ENDPOINTS["sglang", "generate"], ENDPOINTS["sglang", "chat"]),
    "sglang-chat": ServerChoice(
        "sglang-chat", ENDPOINTS["sglang", "generate"], ENDPOINTS["sglang", "chat"], chat_only=True
    ),
    "vllm": ServerChoice("vllm", ENDPOINTS["vllm", "completions"], ENDPOINTS["vllm", "chat"]),
}
AUTO = "auto"
BACKEND_NAMES = (AUTO, *CHOICES)
"""What `--backend` takes."""


def choose(backend: str, info: ServerInfo) -> ServerChoice:
    """The endpoint pair for `--backend` on this server (auto: the kind its probe found)."""
    name = info.kind if backend == AUTO else backend
    choice = CHOICES.get(name)
    if choice is not None:
        return choice
    if backend == AUTO:
        raise CaptureFailed(f"cannot tell whether {info.url} is SGLang or vLLM: pass --backend", url=info.url)
    raise ValueError(f"unknown backend {backend!r} (known: {', '.join(BACKEND_NAMES)})")


def kind_mismatch(asked: str, info: ServerInfo, flag: str) -> str | None:
    """Why a server cannot be spoken to as the kind a flag asked for (`--backend`, the proxy's `--kind`), when its
    info endpoints say it is the other kind; None when it is that kind, or its kind is not known for sure. Said before
    any generation: every prompt of a batch on vLLM with `--backend sglang` failed on SGLang's /generate (a 404)."""
    if not info.kind_said or info.kind not in SERVER_KINDS or asked not in SERVER_KINDS or asked == info.kind:
        return None
    found = f"{server_name(info.kind)}{f' {info.version}' if info.version else ''}"
    return (
        f"{info.url} is {found} (as it says), not {server_name(asked)} as {flag} says: drop {flag} (the kind the "
        f"server says is used) or pass {flag} {info.kind}"
    )


def for_kind(kind: str) -> list[Backend]:
    """The endpoint families a server of this kind may have (all of them for an unknown kind)."""
    return [b for b in ENDPOINTS.values() if kind not in SERVER_KINDS or b.server == kind]


def server_name(kind: str) -> str | None:
    """SGLang / vLLM for a known kind, else None."""
    return next((b.server_name for b in ENDPOINTS.values() if b.server == kind), None)
