"""Prompts longer than the server's context are failed before they are sent (`over_max_length`).

A 50 MB prompt line used to be tokenized whole (GBs of encodings), sent as a JSON body of millions of
ids, and only then refused by the server with a 400. The servers report their context length
(`max_model_len`, found by the probe), so a prompt is measured first, as cheaply as the numbers allow:

1. a lower bound, without tokenizing: no token stands for more bytes than the longest one in the
   vocabulary, so `content bytes / longest token` tokens at least. A gigantic prompt stops here.
2. an upper bound, without tokenizing: every token stands for at least one byte of the rendered text
   (byte-level BPE), so a prompt whose rendered text has fewer bytes than the limit fits.
3. only in between, the exact count: the prompt rendered and tokenized as the raw path sends it.

Before any of that, a prompt whose text is larger than `max_prompt_bytes()` (8 MiB unless
`TOKVIEW_MAX_PROMPT_MB` says otherwise) is failed as `prompt_too_large`, naming the limit: tokenizing
text costs ~200 bytes of memory per byte (a 50 MB prompt against a server reporting a 4M context
peaked at 10 GB, counting its 45M tokens to learn it did not fit), and no context a server offers today
holds more than a few MiB of text.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from tokview.batch.prompt_size import MAX_PROMPT_ENV, max_prompt_bytes
from tokview.core.served_tools import tools_as_served
from tokview.core.tokenizer import TokenizerError
from tokview.servers.registry import context_reserve
from tokview.servers.request import CaptureRequest, resolve_settings

if TYPE_CHECKING:
    from tokview.core.profiles import ModelProfile
    from tokview.core.tokenizer import TokenizerAdapter
    from tokview.servers.pool import ServerPool

OVER_MAX_LENGTH = "over_max_length"
PROMPT_TOO_LARGE = "prompt_too_large"
SLACK_PER_MESSAGE = 2
"""Tokens a tokenizer may add that no rendered byte stands for (a SentencePiece word-start marker)."""

UNKNOWN_LONGEST_TOKEN = 1024
"""Bytes assumed for the longest token when the vocabulary cannot be read (generous: real vocabularies'
longest entries are a few dozen bytes)."""

_longest_token: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def too_large(request: CaptureRequest) -> str | None:
    """`prompt_too_large: …` naming the limit when the prompt's text is over it; counted without copying it."""
    limit = max_prompt_bytes()
    size = text_bytes(request.messages or [])
    if size <= limit:
        return None
    return (
        f"{PROMPT_TOO_LARGE}: the prompt has {size:,} bytes of text, over the {limit:,}-byte limit "
        f"({MAX_PROMPT_ENV}={limit / (1 << 20):g}); not tokenized or sent"
    )


def server_limit(server_info: Iterable[dict[str, Any]]) -> int | None:
    """The smallest context length the answering servers report (they serve one model), else None."""
    limits = [d["max_model_len"] for d in server_info if d.get("healthy", True) and d.get("max_model_len")]
    return min(limits) if limits else None


def longest_token_bytes(tokenizer: TokenizerAdapter) -> int:
    """Bytes of the longest vocabulary entry (special tokens included), counted generously."""
    if tokenizer not in _longest_token:
        try:
            vocab = tokenizer.vocab_tokens()
            longest = max((len(str(t).encode("utf-8", "replace")) for t in vocab), default=0)
        except Exception:  # a tokenizer class without a readable vocabulary: a weak but safe bound
            longest = 0
        _longest_token[tokenizer] = longest or UNKNOWN_LONGEST_TOKEN
    return _longest_token[tokenizer]


def text_bytes(value: object) -> int:
    """UTF-8 bytes of every string in a message list (contents, roles, reasoning), without copying it."""
    if isinstance(value, str):
        return len(value) if value.isascii() else len(value.encode("utf-8", "surrogatepass"))
    if isinstance(value, dict):
        return sum(text_bytes(v) for v in value.values())
    if isinstance(value, list):
        return sum(text_bytes(v) for v in value)
    return 0


def render_kwargs(
    request: CaptureRequest, profile: ModelProfile | None, server_kind: str | None = None
) -> dict[str, Any]:
    """The template kwargs a server renders this request's prompt with: the profile's and the request's, and
    an agent trace's `tools` as that server renders them (`core.served_tools`: the tool declarations are part of the
    prompt, as `prompt_render_mismatch` and the servers render them; without them a prompt that fits only without
    its tools would be sent)."""
    kwargs = resolve_settings(request.settings, profile)["chat_template_kwargs"]
    tools = tools_as_served(request.settings.get("tools"), server_kind, request.settings.get("tool_choice"))
    return {**kwargs, "tools": tools} if tools else kwargs


def prompt_length(
    request: CaptureRequest,
    tokenizer: TokenizerAdapter,
    profile: ModelProfile | None,
    limit: int,
    server_kind: str | None = None,
) -> tuple[int, bool]:
    """(tokens, exact): `exact` False means a bound that already decides the comparison with `limit`."""
    if request.prompt_ids:
        return len(request.prompt_ids), True
    messages = request.messages or []
    content = text_bytes(messages)
    if content >= limit:  # else the lower bound cannot reach the limit: skip the vocabulary scan
        lower = -(-content // longest_token_bytes(tokenizer))
        if lower >= limit:
            return lower, False
    kwargs = render_kwargs(request, profile, server_kind)
    text = tokenizer.render_text(messages, add_generation_prompt=True, template_kwargs=kwargs)
    upper = text_bytes(text) + SLACK_PER_MESSAGE * (len(messages) + 1)
    if upper < limit:
        return upper, False
    return exact_prompt_tokens(request, tokenizer, profile, server_kind), True


def check_prompt(pool: ServerPool, request: CaptureRequest) -> tuple[str | None, int | None]:
    """(`over_max_length: …` when the prompt leaves no room for one output token, the output tokens that
    fit when fewer than `max_new_tokens` do): one measure of the prompt answers both.

    Called by the runner before each capture. An over-long prompt is recorded as failed without being
    sent, and (it is the prompt's fault, not the server's) it does not count toward stopping after
    failures in a row. A prompt within `max_new_tokens` of the limit is sent asking for the room there
    is: vLLM refuses prompt + `max_tokens` over `max_model_len` (HTTP 400) instead of stopping there,
    so a generous `--max-new-tokens` failed every long prompt that fits (and 20 in a row stopped the
    run); the answer is now cut at the limit (`finish_reason` length: `truncated`). SGLang refuses a
    total that reaches the limit (`>=`), so there one id of it is left unused (`context_reserve`).
    A server that reports no context length, or a run without a local tokenizer, is not checked (the
    server's own refusal is recorded as before). Only prompts near the limit are tokenized. A prompt
    over the size limit (`too_large`) is failed first, whatever the server and tokenizer."""
    oversized = too_large(request)
    if oversized is not None:
        return oversized, None
    tokenizer, profile = getattr(pool, "tokenizer", None), getattr(pool, "profile", None)
    info = pool.server_info()
    kinds = {d.get("kind") for d in info if d.get("healthy", True)}
    limit, kind = server_limit(info), next(iter(kinds)) if len(kinds) == 1 else None
    if limit is None or tokenizer is None:
        return None, None
    wanted = request.settings.get("max_new_tokens")
    if not isinstance(wanted, int) or isinstance(wanted, bool) or wanted < 1:
        wanted = None
    usable = limit - max(map(context_reserve, kinds), default=0)  # SGLang refuses a total reaching its limit
    fits = usable - wanted if wanted else usable  # fewer prompt tokens than this leave all the room asked for
    try:
        tokens, exact = prompt_length(request, tokenizer, profile, fits, kind)
        if not exact and tokens < fits:  # an upper bound under it: the common case, nothing tokenized
            return None, None
        if not exact and tokens < usable:  # a lower bound that does not decide: count
            tokens, exact = exact_prompt_tokens(request, tokenizer, profile, kind), True
    except (TokenizerError, ValueError):
        return None, None  # a template that cannot render this prompt: the capture path reports it in its own words
    if tokens >= usable:
        measure = f"{tokens} tokens" if exact else f"at least {tokens} tokens (counted without tokenizing it)"
        return (
            f"{OVER_MAX_LENGTH}: the prompt has {measure}; the server's max_model_len is {limit}, "
            f"which leaves no room for output: shorten or drop this prompt"
        ), None
    room = usable - tokens
    return None, (room if wanted and room < wanted else None)


def exact_prompt_tokens(
    request: CaptureRequest, tokenizer: TokenizerAdapter, profile: ModelProfile | None, server_kind: str | None = None
) -> int:
    """The prompt's token count as the raw path sends it (rendered and tokenized; the render is cached)."""
    if request.prompt_ids:
        return len(request.prompt_ids)
    messages = request.messages or []
    kwargs = render_kwargs(request, profile, server_kind)
    count = getattr(tokenizer, "render_length", None)  # the cached ids' length, not a copy of them
    if count is None:
        return len(tokenizer.render(messages, add_generation_prompt=True, template_kwargs=kwargs))
    return int(count(messages, add_generation_prompt=True, template_kwargs=kwargs))
