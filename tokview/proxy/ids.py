"""Which request fields make a server return token ids, and how to take them out of its answer again.

The client must get exactly what the upstream would have sent without them (issue 24), so the answer is
edited as bytes, never re-serialised: only the spans of the id values the proxy asked for change.
What each server sends without them (recordings/tools/README.md §3, §4):

- vLLM (`return_token_ids`): the keys are always there; without the flag they hold `null`
  (`"token_ids":null`, `"prompt_token_ids":null`). On a stream, a chunk that only carries an id (the
  delta is `{}` and nothing finishes: think and tool-call markers) is not sent at all.
- SGLang, not streaming (`return_token_ids`): `prompt_token_ids` / `response_token_ids` (`token_ids` on
  other builds) are added to the choice; without the flag they are absent.
- SGLang, streaming chat: `return_token_ids` is refused (HTTP 400), so the proxy asks for
  `return_input_ids_in_sglext` + `return_output_ids_in_sglext` instead; the ids come in one extra chunk
  (`choices: []`, `sglext: {input_ids, output_ids}`) that is dropped, or as an `sglext` key that is removed.
- SGLang, `/v1/completions`: `return_token_ids` streaming or not (its request model has neither the sglext flags nor
  `return_prompt_token_ids`, which it ignores); a chunk's `token_ids` hold its new ids and the first chunk's
  `prompt_token_ids` the prompt's, keys removed as for a whole answer; no chunk comes only for them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from tokview.core.json_value import as_pydantic_bool as _as_bool
from tokview.core.server_versions import VLLM_MARKER_LOGPROBS, at_least
from tokview.proxy.sse import EventSplitter, data_of

VLLM, SGLANG = "vllm", "sglang"
RETURN_TOKEN_IDS = "return_token_ids"
RETURN_PROMPT_TOKEN_IDS = "return_prompt_token_ids"
"""SGLang's flag for the prompt's ids alone: a client that sets it gets `prompt_token_ids` through the proxy too."""
SGLEXT_FLAGS = ("return_input_ids_in_sglext", "return_output_ids_in_sglext")
VLLM_ID_KEYS = (b"token_ids", b"prompt_token_ids")
SGLANG_ID_KEYS = (b"prompt_token_ids", b"response_token_ids", b"token_ids")
SGLEXT_KEY = b"sglext"


@dataclass(frozen=True)
class Injection:
    """What the proxy added to one request, and so what it takes out of the answer."""

    kind: str
    """vllm | sglang (what the upstream is)."""
    fields: tuple[str, ...]
    """The request fields the proxy set to true (those the client had not asked for itself)."""
    stream: bool
    kept: tuple[bytes, ...] = ()
    """Id keys the client asked for itself by another flag (SGLang's `return_prompt_token_ids`): never stripped."""
    marker_logprobs: bool = True
    """The upstream sends a marker id's empty-delta chunk on its own when logprobs were asked for (vLLM 0.31 and
    later, or a version not known): such a chunk is the client's, not one only the id flag made it send."""

    @property
    def strips(self) -> bool:
        return bool(self.fields)

    @property
    def token_ids(self) -> bool:
        return RETURN_TOKEN_IDS in self.fields

    @property
    def sglext(self) -> bool:
        return any(f in self.fields for f in SGLEXT_FLAGS)


def id_fields(kind: str, stream: bool, endpoint: str | None = None) -> tuple[str, ...]:
    """The request fields that make this server return ids on this kind of request (`endpoint`: chat, completions,
    None for chat)."""
    if kind == SGLANG and stream and endpoint != "completions":
        return SGLEXT_FLAGS
    return (RETURN_TOKEN_IDS,)


def echo_hides_ids(body: dict[str, Any], kind: str, endpoint: str | None) -> bool:
    """A vLLM `/v1/completions` request with `echo`: vLLM empties the echoed prompt text when asked for ids
    (serving_completion: `if request.return_token_ids: prompt_text = ""`), so the proxy asks for none and the client
    reads the echo; the generation is recorded as a failure that says so (it has no ids to record)."""
    return kind == VLLM and endpoint == "completions" and bool(_as_bool(body.get("echo")))


def sends_marker_logprobs(kind: str, version: object) -> bool:
    """Whether this upstream's chat stream sends a marker id's chunk for its logprobs (`VLLM_MARKER_LOGPROBS`)."""
    return kind != VLLM or at_least(version, VLLM_MARKER_LOGPROBS)


def inject(
    body: dict[str, Any], kind: str, endpoint: str | None = None, version: object = None
) -> tuple[dict[str, Any], Injection]:
    """The body to send upstream (the client's own dict with the id fields set) and what was added (`version`: the
    upstream's, as probed).

    A field the client set true itself (`true`, `1`, `"yes"`: what the server reads as true) is left alone and
    its ids reach the client: it asked for them. A value the server would refuse is left alone too. When the
    client set one of SGLang's two sglext flags itself, the other is not added: their ids share one object,
    and an answer edited to take out only the other's would be a guess at what SGLang sends with one flag."""
    stream = bool(_as_bool(body.get("stream")))  # "false" is a string the server reads as false
    if echo_hides_ids(body, kind, endpoint):
        return body, Injection(kind, (), stream)
    fields = id_fields(kind, stream, endpoint)
    asked = {f: _as_bool(body.get(f)) for f in fields}
    if any(v is None for v in asked.values()) or (fields == SGLEXT_FLAGS and any(asked.values())):
        return body, Injection(kind, (), stream)
    added = tuple(f for f in fields if not asked[f])
    if not added:
        return body, Injection(kind, (), stream)
    sent = dict(body)
    for name in added:
        sent[name] = True
    own = kind == SGLANG and endpoint != "completions" and _as_bool(body.get(RETURN_PROMPT_TOKEN_IDS))
    kept = (b"prompt_token_ids",) if own else ()  # on completions SGLang ignores the flag: the ids are ours
    return sent, Injection(kind, added, stream, kept, sends_marker_logprobs(kind, version))


def with_fields(body: bytes, fields: tuple[str, ...], *, empty: bool) -> bytes | None:
    """The client's own body bytes with `"FIELD":true` written before its closing brace, for each field; None when
    the body is not UTF-8 JSON ending in `}` (the caller re-serialises it). `empty`: the object has no keys.

    Why not re-serialise: a body re-written by a JSON library is another request (orjson writes a NaN or 1e400
    the client sent as null, so a request the server refuses was answered). A field the client set false itself is
    written again, true, after it: the servers read a JSON object's last value of a key (Python's json)."""
    if json.detect_encoding(body) not in ("utf-8", "utf-8-sig"):
        return None
    end = len(body.rstrip(_SPACE))
    if not end or body[end - 1 : end] != b"}":
        return None
    added = b",".join(b'"' + name.encode() + b'":true' for name in fields)
    return body[: end - 1] + (b"" if empty else b",") + added + b"}" + body[end:]


_KEY = re.compile(rb'"(token_ids|prompt_token_ids|response_token_ids|sglext)"\s*:\s*')
_SPACE = b" \t\r\n"


_BRACKET = re.compile(rb"[\[\]{}]")


def _value_end(raw: bytes, start: int) -> int:
    """The index just past the JSON array or object that starts at `start` (ids hold no strings).

    A byte-by-byte walk cost 65 µs for 256 ids, ~1 ms for a 2,000-token answer, on the client's path: a flat
    array (every id list but SGLang's nested ones) ends at its first `]`, one search in C; anything nested
    goes from bracket to bracket (the regex skips the digits in C)."""
    if raw[start : start + 1] == b"[":
        end = raw.find(b"]", start)
        if end >= 0 and raw.find(b"[", start + 1, end) < 0 and raw.find(b"{", start + 1, end) < 0:
            return end + 1
    depth = 0
    for m in _BRACKET.finditer(raw, start):
        if m.group() in b"[{":
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                return m.end()
    raise ValueError("an id value is not closed")


def strip_body(raw: bytes, injection: Injection) -> bytes:
    """One JSON answer (a whole body or one SSE chunk's data) without the ids the proxy asked for."""
    if not injection.strips:
        return raw
    keys: tuple[bytes, ...]
    if injection.kind == VLLM:
        keys, remove = (VLLM_ID_KEYS if injection.token_ids else ()), False
    else:
        keys = (SGLANG_ID_KEYS if injection.token_ids else ()) + ((SGLEXT_KEY,) if injection.sglext else ())
        remove = True
    keys = tuple(k for k in keys if k not in injection.kept)
    if not keys:
        return raw
    out, pos = [], 0
    for m in _KEY.finditer(raw):
        if m.start() < pos or m.group(1) not in keys:
            continue
        value_start = m.end()
        if raw[value_start : value_start + 1] not in (b"[", b"{"):
            continue  # null already, or a shape we did not ask for: left as sent
        value_end = _value_end(raw, value_start)
        if not remove:
            out += [raw[pos:value_start], b"null"]
            pos = value_end
            continue
        start, end = m.start(), value_end
        before = raw[:start].rstrip(_SPACE)
        if before.endswith(b",") and len(before) > pos:  # a comma a key removed before it took is not there
            start = len(before) - 1
        else:  # the first key of its object: take the comma after it instead
            after = len(raw) - len(raw[end:].lstrip(_SPACE))
            if raw[after : after + 1] == b",":
                end = after + 1
        out.append(raw[pos:start])
        pos = end
    if pos == 0:
        return raw
    out.append(raw[pos:])
    return b"".join(out)


def may_be_id_only(event: bytes, injection: Injection) -> bool:
    """Whether a stream event could be an id-only chunk (`id_only_chunk` decides): a byte search, so the
    loop parses only the few events that might be (an empty delta `{}`, or SGLang's `sglext` chunk)."""
    return SGLEXT_KEY in event if injection.kind == SGLANG else b"{}" in event


def id_only_chunk(chunk: object, injection: Injection) -> bool:
    """A stream chunk the upstream sent only because the proxy asked for ids (dropped, not forwarded).

    vLLM: every choice's delta is empty and none finishes (a marker id), and none carries logprobs where the
    upstream sends such a chunk for its logprobs anyway (`Injection.marker_logprobs`: vLLM 0.31 and later, where a
    harness lining its logprobs up with `completion_tokens` lost the `</think>` entry when it was dropped; before
    0.31 vLLM skipped it, logprobs or not). A usage on it (`stream_options.
    continuous_usage_stats`) does not keep it: without `return_token_ids` vLLM skips such a chunk before it adds
    the usage (serving_chat's `continue`), and the next chunk's usage counts its token anyway.
    SGLang: the sglext chunk (`choices: []`, no usage, `sglext`)."""
    if not injection.strips or not isinstance(chunk, dict):
        return False
    choices = chunk.get("choices")
    if injection.kind == SGLANG:
        return injection.sglext and "sglext" in chunk and choices == [] and not chunk.get("usage")
    if not injection.token_ids or not isinstance(choices, list) or not choices:
        return False
    for choice in choices:
        if not isinstance(choice, dict) or choice.get("delta") != {} or choice.get("finish_reason") is not None:
            return False
        if injection.marker_logprobs and choice.get("logprobs") is not None:
            return False
    return True


_BLANK_LINE = re.compile(rb"\r\n\r\n|\n\r\n|\n\n|\r\r")


def strip_rest(rest: bytes, injection: Injection) -> bytes:
    """What is left of a stream when it ends (`EventSplitter.rest`), as the client gets it: a last event with no
    blank line after it, or events parted by bare CRs (which no server sends), each taken out or stripped as
    `strip_events` does whole ones, so no id the proxy asked for reaches the client."""
    if not injection.strips or not rest:
        return rest
    events, start = [], 0
    for m in _BLANK_LINE.finditer(rest):
        events.append(rest[start : m.end()])
        start = m.end()
    if start < len(rest):
        events.append(rest[start:])
    return b"".join(_kept_events(events, injection))


def _kept_events(events: Iterable[bytes], injection: Injection) -> Iterator[bytes]:
    """Each event as the client gets it, taken one by one: id-only chunks dropped, the others stripped."""
    for event in events:
        if not (may_be_id_only(event, injection) and id_only_chunk(data_of(event), injection)):
            yield strip_body(event, injection)


def strip_events(whole: bytes, injection: Injection) -> tuple[bytes, int]:
    """Whole stream events (`EventSplitter.feed_whole`) as the client gets them, and how many there are.

    One pass over the read's bytes: only the events that may be id-only (`may_be_id_only`) are parsed, each
    alone; the runs between them are stripped in one `strip_body` call each. A read often holds a whole stream,
    whose last chunk has an empty delta too (`"delta":{}` with its finish): taking every event of such a read
    one by one was half the proxy's forwarding CPU. CR LF events (no server sends them) go event by event."""
    if not injection.strips:
        return whole, whole.count(b"\n\n")
    if b"\r" in whole:
        splitter = EventSplitter()
        kept = list(_kept_events(splitter.feed(whole), injection))
        extra = splitter.rest()  # line endings past the last blank line (CR LF CR LF CR LF): sent on as they came
        return b"".join(kept) + extra, len(kept)
    marker = SGLEXT_KEY if injection.kind == SGLANG else b"{}"
    hit = whole.find(marker)
    if hit < 0:
        return strip_body(whole, injection), whole.count(b"\n\n")
    out, done, dropped = [], 0, 0
    while hit >= 0:
        start = whole.rfind(b"\n\n", done, hit)
        start = done if start < 0 else start + 2
        end = whole.find(b"\n\n", hit) + 2  # a whole read ends with a blank line
        if start > done:
            out.append(strip_body(whole[done:start], injection))
        event = whole[start:end]
        if id_only_chunk(data_of(event), injection):
            dropped += 1
        else:
            out.append(strip_body(event, injection))
        done = end
        hit = whole.find(marker, done)
    if done < len(whole):
        out.append(strip_body(whole[done:], injection))
    return b"".join(out), whole.count(b"\n\n") - dropped
