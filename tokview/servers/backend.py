"""One interface for every endpoint family tokview captures from (the way harlequin puts each database
behind one adapter class).

SGLang `/generate`, SGLang chat, vLLM chat and vLLM completions each are one `Backend` subclass that
knows its own request body, answer shapes, 1-token probe, scoring request and what the doctor should
say about it. Callers (capture, features, score, the doctor) pick a class from `tokview.servers.registry`
and call it; none of them switches on a server's name, so a new endpoint family or a new captured field
touches one class per server.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from tokview.core import logprobs as lp
from tokview.core.record import Capture
from tokview.servers.errors import CaptureFailed
from tokview.servers.http import ServerClient
from tokview.servers.info import ServerInfo

Ask = Callable[[Callable[[], Awaitable[Any]]], Awaitable[tuple[Any, str | None]]]
"""Run one probe request under the probe's retry policy: (answer, None) or (None, why it failed)."""


@dataclass(frozen=True)
class Call:
    """One request's inputs, in the form every endpoint family takes them.

    `prompt_ids` are sent verbatim where the endpoint takes ids; `require_ids` makes an answer without
    token ids a failure (a dual capture's chat half passes False: its ids are only compared).
    """

    settings: dict[str, Any]
    messages: list[dict[str, Any]] | None = None
    prompt_ids: list[int] | None = None
    stream: bool = False
    skip_special_tokens: bool = False
    require_ids: bool = True


@dataclass
class Captured:
    """A capture and the output ids exactly as the endpoint returned them (None: it returned none)."""

    capture: Capture
    returned_ids: list[int] | None


@dataclass
class Probe:
    """What one endpoint's 1-token probe needs, and the prompt ids it leaves for the next probe."""

    client: ServerClient
    ask: Ask
    info: ServerInfo
    template_kwargs: dict[str, Any]
    prompt_ids: list[int] | None = None


@dataclass(frozen=True)
class Advice:
    """What the doctor says about one finding of an endpoint family (status warn or fail)."""

    status: str
    detail: str
    recommendation: str = ""


class Backend(ABC):
    """One endpoint family of one server kind: capture, stream, probe, score and doctor advice."""

    server: ClassVar[str]
    """The server kind as `ServerInfo.kind` spells it: sglang | vllm."""
    server_name: ClassVar[str]
    """How people write it: SGLang | vLLM."""
    endpoint: ClassVar[str]
    """generate | chat | completions (with `server`, the registry key)."""
    path: ClassVar[str]
    """The HTTP path it posts to."""
    ids_field: ClassVar[str]
    """Where the output ids come back, as the doctor names it."""
    exact_ids: ClassVar[bool]
    """It takes our prompt ids verbatim and returns the sampled ids: the raw path."""
    recorded_as: ClassVar[str]
    """`Capture.endpoint` of what it captures (stored: never renamed)."""
    logprob_ids: ClassVar[bool] = True
    """It can name each logprob's token by id (`--logprobs`): SGLang's chat endpoint names them by text only."""
    kwargs_take_tools: ClassVar[bool] = True
    """`chat_template_kwargs` may carry `tools` (vLLM merges them over its own); SGLang's chat endpoint passes the
    request's tools beside them, and a `tools` kwarg fails every request ("multiple values for keyword argument")."""
    refuses_unparsed_tools: ClassVar[bool] = False
    """Started without a tool parser, it refuses a request with tools (vLLM: HTTP 400) rather than answer it unparsed
    (SGLang renders the tools and returns the calls as text): an answer without `tool_calls` is then the parser's."""
    context_reserve: ClassVar[int] = 0
    """Ids of the context a request's prompt + max tokens must leave unused: SGLang refuses a total that reaches its
    context length (`>=`, HTTP 400), vLLM only one past it."""

    @property
    def key(self) -> tuple[str, str]:
        return (self.server, self.endpoint)

    async def run(self, client: ServerClient, info: ServerInfo, call: Call) -> Captured:
        """`stream` when the call asks for SSE, else `capture`."""
        if call.stream:
            return await self.stream(client, info, call)
        return await self.capture(client, info, call)

    @abstractmethod
    async def capture(self, client: ServerClient, info: ServerInfo, call: Call) -> Captured:
        """One non-streaming request, its answer checked and turned into a Capture."""

    @abstractmethod
    async def stream(self, client: ServerClient, info: ServerInfo, call: Call) -> Captured:
        """The same over SSE, the chunks folded into one Capture (or a plain request where the endpoint
        cannot give ids on a stream)."""

    @abstractmethod
    async def probe(self, probe: Probe) -> None:
        """A 1-token request: fill `probe.info.features` with what this endpoint returns."""

    def recognises(self, features: dict[str, Any]) -> bool:
        """Whether the probe's features prove the server is of this kind (for servers whose info
        endpoints said nothing)."""
        return False

    detokenized_key: str | None = None
    """Where this server's `/detokenize` answer holds the text of the ids sent (None: it has no such endpoint)."""

    async def score(
        self, client: ServerClient, info: ServerInfo, ids: list[int], start: int, top_k: int
    ) -> lp.TokenLogprobs:
        """The server's logprob of every id from `start` on, nothing generated."""
        raise CaptureFailed(f"{self.path} cannot score stored samples", url=client.url)

    def reasoning_field_advice(self, field: str | None) -> Advice | None:
        """What the doctor should warn about the reasoning field this endpoint filled (None: nothing)."""
        return None

    def tool_parser_flags(self, parser: str) -> str:
        """The server flags that make its chat endpoint parse tool calls with `parser` (vLLM's name for it)."""
        return f"--tool-call-parser {parser}"
