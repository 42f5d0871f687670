"""What the store hands out (rows for lists, whole samples for the detail view) and how a capture
becomes a database row and back.

Secrets never reach the file, and training data is never rewritten to keep them out: metadata goes
through `scrub`, payloads (messages, bodies, settings) through `scrub_payload`, with the known values of
`capture_secrets` (tokview/secrets.py holds the rules).
"""

from __future__ import annotations

import json
import re
from array import array
from dataclasses import KW_ONLY, dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import orjson

from tokview.core.alignment import DRIFT, HIDDEN, KEPT, PARTIAL, Alignment
from tokview.core.findings import ERROR, Finding
from tokview.core.record import Capture
from tokview.core.tool_calls import tool_calls_of_response
from tokview.errors import first_line
from tokview.secrets import (
    SECRET_KEY_HINTS,
    SECRET_KEYS,
    known_secrets,
    scrub,
    scrub_optional,
    scrub_payload,
    url_secrets,
)
from tokview.store.elided_ids import BODY_COLUMNS, ID_COLUMNS, elide, elide_messages, restore
from tokview.store.errors import StoreError
from tokview.store.packed_chunks import RESPONSE_COLUMNS, pack, unpack
from tokview.store.token_data import SIDE_COLUMNS, side_fields, side_values
from tokview.store.tool_call_text import tool_calls_text

if TYPE_CHECKING:
    from tokview.core.analysis import Analysis

STATUSES = ("pending", "approved", "rejected")


@dataclass(frozen=True, slots=True)
class SampleIdentity:
    """Who a sample is: its id, the prompt and run it belongs to, where it sits (which generation of its prompt,
    which turn of its chain) and the profile it was analysed under. One value, so the writers that hand a sample
    on (`PartWriter`: the store, a worker's sink, a Ray task's sink, the proxy's recorder) pass it whole."""

    sample_id: str
    prompt_id: str
    run_id: str | None
    _: KW_ONLY  # two optional ints side by side: never by position
    gen_index: int | None = None
    turn: int | None = None
    profile: str | None = None


_JSON_ESCAPED = re.compile(r'["\\\x00-\x1f]')


class _Letters(dict[str, str]):
    """Status → letter; an unknown status reads "?" (`__missing__`, so `map` can look up in C)."""

    def __missing__(self, _status: str) -> str:
        return "?"


_ALIGN_LETTER = _Letters({KEPT: "k", PARTIAL: "p", HIDDEN: "h", DRIFT: "d"})
ALIGN_STATUS = {v: k for k, v in _ALIGN_LETTER.items()}


class UnknownSample(KeyError):
    """No sample with this id is in the store."""


@dataclass(frozen=True)
class SampleFilter:
    """What the sample list shows; None means "any"."""

    status: str | None = None
    code: str | None = None
    run_id: str | None = None
    text: str | None = None
    """Case-insensitive substring of the sample id, prompt id, reasoning or content."""
    valid: bool | None = None
    max_acceptance: float | None = None
    """Only samples whose mean acceptance length is at most this (samples without spec metrics are left out)."""
    max_nll: float | None = None
    """Only samples whose target mean NLL is at most this (unscored samples are left out)."""


@dataclass(frozen=True, kw_only=True)
class SampleRow:
    """The light columns of one sample: what a list of 100,000 needs and nothing more (built by keyword)."""

    sample_id: str
    prompt_id: str
    run_id: str | None
    status: str
    valid: bool
    finish_reason: str | None
    prompt_len: int
    output_len: int
    codes: list[str]
    n_errors: int
    acceptance_length: float | None = None
    """Mean acceptance length from the server's spec-decode metrics (None: none captured)."""
    mean_nll: float | None = None
    """The scoring target's mean NLL, nats/token (None: not scored)."""


@dataclass
class StoredSample:
    """One sample in full: the capture, its findings and its review history."""

    sample_id: str
    prompt_id: str
    run_id: str | None
    capture: Capture
    findings: list[Finding]
    status: str
    valid: bool
    n_errors: int
    notes: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    turn: int | None = None
    gen_index: int | None = None
    profile: str | None = None
    alignment: list[str] | None = None
    """Per aligned id: kept / partial / hidden / drift (as computed when it was stored)."""
    created_at: datetime | None = None

    def overturned_by(self, status: str, reviewer: str | None) -> str | None:
        """`rejected by bob (cut)`: the standing opposite verdict of another reviewer than `reviewer` that a new
        `status` would overturn, else None. The app asks first: a verdict made elsewhere (`tokview review`, another
        reviewer's app) after its list was read is not on the row the person sees, and a key press overturned it
        unseen. One's own verdict is changed without a question, as before."""
        opposite = {"approved": "rejected", "rejected": "approved"}.get(status)
        live = [h for h in self.history if h["kind"] == "verdict" and not h["undone"]]
        if opposite is None or self.status != opposite or not live or live[-1].get("who") == reviewer:
            return None
        last = live[-1]
        by = f" by {last['who']}" if last.get("who") else ""
        why = f" ({last['reason']})" if last.get("reason") else ""
        return f"{opposite}{by}{why}"

    def says_already(self, status: str, reason: str | None = None) -> bool:
        """Whether its latest verdict still standing is this one (a rejection: for this reason). The app records
        nothing then: approving an approved sample recorded a second action, which `u` took back with nothing
        to show for it."""
        live = [h for h in self.history if h["kind"] == "verdict" and not h["undone"]]
        return self.status == status and bool(live) and (status != "rejected" or live[-1]["reason"] == reason)


def to_json(value: object, secrets: list[str] | None = None) -> str | None:
    """A payload as JSON, through `scrub_payload` (`secrets` default: the env key only).

    A body of plain JSON types whose dump holds nothing `scrub_payload` could mask is returned as
    dumped: walking a 2,000-id response to find nothing cost ~50 µs a sample, more than dumping it
    (~6 µs). Anything else (something to mask, a type orjson writes only through `default`, such as a
    named tuple or a str subclass) takes the walk, exactly as before."""
    if value is None:
        return None
    secrets = known_secrets() if secrets is None else secrets
    try:
        text = orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_SUBCLASS).decode()
    except (TypeError, orjson.JSONEncodeError):
        text = None
    if text is not None and _nothing_to_mask(text, secrets):
        return text
    clean = scrub_payload(value, secrets)
    try:  # orjson: ~10x faster on the id arrays every body carries; same JSON, no spaces
        return orjson.dumps(clean, default=str, option=orjson.OPT_NON_STR_KEYS).decode()
    except (TypeError, orjson.JSONEncodeError):  # ints beyond 64 bits, lone surrogates: the stdlib copes
        return json.dumps(clean, ensure_ascii=False, default=str)


def _nothing_to_mask(text: str, secrets: list[str]) -> bool:
    """True when `scrub_payload` would leave the payload dumped as `text` unchanged.

    It changes only a key named like a secret (its name would be in the lowered text), a URL with
    userinfo (an "@" in the text) and a secret's exact value inside a string (the value itself would
    be in the text, unless it holds a character JSON escapes: those always take the walk). A hit
    here that the walk would not mask (a secret's digits inside an id array) only costs the walk."""
    if "@" in text or any(secret in text or _json_escaped(secret) for secret in secrets):
        return False
    lowered = text.lower()
    if not any(hint in lowered for hint in SECRET_KEY_HINTS):
        return True  # two scans of a 10 kB body instead of one per secret key name
    return not any(key in lowered for key in SECRET_KEYS)


def _json_escaped(value: str) -> bool:
    """True when JSON writes `value` otherwise than as its own characters (quote, backslash, control)."""
    return _JSON_ESCAPED.search(value) is not None


def metadata_json(value: object) -> str | None:
    """Metadata (server info) as JSON, through `scrub`."""
    return None if value is None else json.dumps(scrub(value), ensure_ascii=False, default=str)


def servers_union(stored: str | None, given: str | None) -> str | None:
    """A run's `server_info` (JSON lists) once it met the `given` servers too: one entry per url, the given ones first
    (the app offers a run's first server again) and where both name it. A run resumed against another server, or
    merged with a shard of it that another server made, kept only the last one's version and features."""
    old, new = _json_or_none(stored), _json_or_none(given)  # a damaged list (edited by hand) is none
    if not isinstance(old, list) or not isinstance(new, list):
        return given if isinstance(new, list) or not isinstance(old, list) else stored
    given_urls = {_url_of(e) for e in new}
    union = list(new) + [e for e in old if _url_of(e) not in given_urls]
    return json.dumps(union, ensure_ascii=False, default=str)


def _json_or_none(text: str | None) -> Any:
    try:
        return from_json(text)
    except ValueError:
        return None


def _url_of(entry: object) -> str:
    url = entry.get("url") if isinstance(entry, dict) else None
    return url if isinstance(url, str) else json.dumps(entry, sort_keys=True, default=str)


def from_json(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def alignment_letters(alignment: Alignment | None) -> str | None:
    """One letter per aligned id (k/p/h/d), built a run of equal statuses at a time."""
    if alignment is None:
        return None
    return "".join(_ALIGN_LETTER[status] * n for status, n in alignment.status_runs())


def error_count(findings: tuple[Finding, ...] | list[Finding]) -> int:
    return sum(1 for f in findings if f.severity == ERROR)


# Columns written for a sample, in order (status is left alone on re-write).
SAMPLE_COLUMNS = (
    "sample_id",
    "prompt_id",
    "run_id",
    "gen_index",
    "turn",
    "prompt_ids",
    "output_ids",
    "parsed_output_ids",
    "finish_reason",
    "matched_stop",
    "valid",
    "n_errors",
    "codes",
    "prompt_len",
    "output_len",
    "supervised",
    "text",
    "reasoning",
    "content",
    "reasoning_field",
    "usage",
    "settings",
    "messages",
    "endpoint",
    "server_url",
    "server_kind",
    "server_version",
    "model",
    "output_logprobs",
    "raw_request",
    "raw_response",
    "parsed_raw_response",
    "raw_ids_at",  # where the id lists taken out of the raw bodies go back (elided_ids.py)
    "prompt_from",  # the earlier turn whose ids begin the prompt, when prompt_ids holds only the rest (prompt_refs.py)
    "prompt_from_len",
    "latency_s",
    "alignment",
    "profile",
    "created_at",
    "tool_calls_text",  # the search box's (tool_call_text.py)
) + SIDE_COLUMNS
CAPTURE_COLUMNS = (
    "prompt_ids",
    "output_ids",
    "parsed_output_ids",
    "finish_reason",
    "matched_stop",
    "text",
    "reasoning",
    "content",
    "reasoning_field",
    "usage",
    "settings",
    "messages",
    "endpoint",
    "server_url",
    "server_kind",
    "server_version",
    "model",
    "output_logprobs",
    "raw_request",
    "raw_response",
    "parsed_raw_response",
    "latency_s",
)
JSON_FIELDS = {"matched_stop", "usage", "settings", "messages", "raw_request", "raw_response", "parsed_raw_response"}


def capture_secrets(capture: Capture, extra: tuple[str, ...] | list[str] = ()) -> list[str]:
    """The exact values to mask in this capture's payloads: the env key, `extra` (the store's known
    server credentials) and any credentials in the capture's own server or request URL."""
    urls: list[str | None] = [capture.server_url]
    request: dict[str, Any] = capture.raw_request if isinstance(capture.raw_request, dict) else {}
    urls.append(request.get("url") if isinstance(request.get("url"), str) else None)
    parsed = request.get("parsed")
    urls.append(parsed.get("url") if isinstance(parsed, dict) and isinstance(parsed.get("url"), str) else None)
    return known_secrets([*extra, *(v for u in urls for v in url_secrets(u))])


def masked_text(text: str | None, secrets: list[str]) -> str | None:
    """A model's text (or the served model name) with the known credentials a server echoed into it masked, exactly
    as its raw response is (`secrets`: `capture_secrets`). The ids keep what the model generated: tokview stores ids
    as served."""
    return text if not text else str(scrub_payload(text, secrets))


def sample_params(
    key: SampleIdentity, capture: Capture, analysis: Analysis, *, secrets: tuple[str, ...] | list[str] = ()
) -> list[Any]:
    """The values of one sample's row, in SAMPLE_COLUMNS order: its payloads masked (`capture_secrets`), its
    id lists taken out of the raw bodies (`elided_ids.py`)."""
    c = capture
    masked = capture_secrets(c, secrets)
    findings = analysis.findings
    values = {
        "sample_id": key.sample_id,
        "prompt_id": key.prompt_id,
        "run_id": key.run_id,
        "gen_index": key.gen_index,
        "turn": key.turn,
        "prompt_ids": list(c.prompt_ids),
        "output_ids": list(c.output_ids),
        "parsed_output_ids": None if c.parsed_output_ids is None else list(c.parsed_output_ids),
        "finish_reason": c.finish_reason,
        "valid": analysis.valid,
        "n_errors": error_count(findings),
        "codes": [f.code for f in findings],
        "prompt_len": len(c.prompt_ids),
        "output_len": len(c.output_ids),
        "supervised": int(sum(analysis.loss_mask)),
        "text": masked_text(c.text, masked),
        "reasoning": masked_text(c.reasoning, masked),
        "content": masked_text(c.content, masked),
        "reasoning_field": c.reasoning_field,
        "endpoint": c.endpoint,
        "server_url": scrub_optional(c.server_url),
        "server_kind": c.server_kind,
        "server_version": c.server_version,
        "model": masked_text(c.model, masked),
        "output_logprobs": None if c.output_logprobs is None else list(c.output_logprobs),
        "latency_s": c.latency_s,
        "alignment": alignment_letters(analysis.alignment),
        "profile": key.profile,
        "created_at": datetime.now(),
        "prompt_from": None,  # the proxy's recorder sets them on the part line (prompt_refs.py)
        "prompt_from_len": None,
        "tool_calls_text": masked_text(tool_calls_text(c.tool_calls), masked),
    }
    id_lists = {name: getattr(c, name) for name in ID_COLUMNS}
    places: dict[str, list[list[Any]]] = {}
    for name in JSON_FIELDS:
        value = getattr(c, name)
        if name in BODY_COLUMNS:  # stored without the id lists the row holds (see elided_ids.py)
            value, at = elide(value, id_lists)
            if name == "raw_request":  # nor the messages its `messages` column holds
                value, sent = elide_messages(value, c.messages)
                at += sent
            if at:
                places[name] = at
            if name in RESPONSE_COLUMNS:  # a long stream's chunks, packed (packed_chunks.py)
                value = pack(value, lambda chunks: to_json(chunks, masked))
        values[name] = to_json(value, masked)
    values["raw_ids_at"] = orjson.dumps(places).decode() if places else None
    values.update(side_values(c))
    return [values[name] for name in SAMPLE_COLUMNS]


def capture_from_row(row: dict[str, Any]) -> Capture:
    """The capture a stored row holds, its bodies as served; StoreError naming the sample when the row is damaged (a
    column that is not the JSON it should be, an id list holding a NULL: edited by hand or by another tool)."""
    try:
        return _capture_from_row(row)
    except (ValueError, TypeError, AttributeError, KeyError) as exc:  # json's JSONDecodeError is a ValueError
        why = f"{type(exc).__name__}: {first_line(exc, 160)}"
        raise StoreError(f"sample {row.get('sample_id')}: its stored row is damaged ({why})") from None


def _capture_from_row(row: dict[str, Any]) -> Capture:
    for name in ID_COLUMNS:
        ids = row.get(name)
        if ids:
            try:
                array("I", ids)  # one C pass, faster than `None in ids`: a NULL or a negative id is no token id
            except TypeError:
                raise ValueError(f"{name} holds a NULL id") from None
            except OverflowError:
                raise ValueError(f"{name} holds a negative id ({min(ids)})") from None
    if row.get("prompt_from") is not None:  # a reader that forgot `prompt_refs.whole_prompts` would read a cut prompt
        raise StoreError(f"sample {row.get('sample_id')}: its prompt ids were read without their earlier turn's")
    data = {name: row[name] for name in CAPTURE_COLUMNS}
    for name in JSON_FIELDS:
        if name in data:
            data[name] = from_json(data[name])
            if name in RESPONSE_COLUMNS:
                data[name] = unpack(data[name])
    places = row.get("raw_ids_at")
    if places:
        id_lists: dict[str, Any] = {name: row.get(name) for name in ID_COLUMNS}
        put_back = json.loads(places)
        if any(place[-1] == "messages" for at in put_back.values() for place in at):
            id_lists["messages"] = from_json(row.get("messages"))  # parsed again: the body's copy, not the column's
        for name, at in put_back.items():
            data[name] = restore(data[name], at, id_lists)
    data["usage"] = data.get("usage") or {}
    data["settings"] = data.get("settings") or {}
    for name in ("usage", "settings"):
        if not isinstance(data[name], dict):
            raise ValueError(f"{name} is a JSON {type(data[name]).__name__}, not an object")
    data["prompt_ids"] = list(data["prompt_ids"])
    data["output_ids"] = list(data["output_ids"])
    data.update(side_fields(row))
    # the server's tool_calls are in the stored chat body (a dual capture's parsed path): no column of their own
    chat_body = data.get("parsed_raw_response") if data.get("endpoint") == "dual" else data.get("raw_response")
    data["tool_calls"] = tool_calls_of_response(chat_body)
    return Capture(**data)
