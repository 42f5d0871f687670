"""What the store hands out (rows for lists, whole samples for the detail view) and how a capture
becomes a database row and back.

Secrets never reach the file: request headers or bodies that carry an API key, credentials in a
URL (`http://user:token@host`) and the `TOKVIEW_API_KEY` value anywhere in a string are scrubbed
here, the one place every capture, run and failure passes through on its way to disk.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tokview.core.alignment import DRIFT, HIDDEN, KEPT, PARTIAL
from tokview.core.findings import ERROR, Finding
from tokview.core.record import Capture

STATUSES = ("pending", "approved", "rejected")
SECRET_KEYS = {"api_key", "apikey", "authorization", "x-api-key", "proxy-authorization", "api-key"}
REDACTED = "[redacted]"
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@?#]+@")
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+")
_ALIGN_LETTER = {KEPT: "k", PARTIAL: "p", HIDDEN: "h", DRIFT: "d"}
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


@dataclass(frozen=True)
class SampleRow:
    """The light columns of one sample: what a list of 100,000 needs and nothing more."""

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


def scrub_text(text: str) -> str:
    """One string without credentials: URL userinfo removed (the URL stays usable), bearer/basic
    tokens and the env key's value masked. Used for failure reasons, server URLs and anything printed."""
    key = os.environ.get("TOKVIEW_API_KEY") or ""
    if key and key in text:
        text = text.replace(key, REDACTED)
    if "@" in text:
        text = _URL_USERINFO.sub(r"\1", text)
    return _BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", text)


def scrub(value: Any) -> Any:
    """A copy without API keys: secret-named keys masked, every string passed through `scrub_text`."""
    if isinstance(value, dict):
        return {k: (REDACTED if str(k).lower() in SECRET_KEYS else scrub(v)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrub(v) for v in value]
    if isinstance(value, str):
        return scrub_text(value)
    return value


def scrub_optional(text: str | None) -> str | None:
    return None if text is None else scrub_text(text)


def to_json(value: Any) -> str | None:
    if value is None:
        return None
    return json.dumps(scrub(value), ensure_ascii=False, default=str)


def from_json(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def alignment_letters(statuses: tuple[str, ...] | None) -> str | None:
    return None if statuses is None else "".join(_ALIGN_LETTER.get(s, "?") for s in statuses)


def error_count(findings: tuple[Finding, ...] | list[Finding]) -> int:
    return sum(1 for f in findings if f.severity == ERROR)


# Columns written for a sample, in order (status is left alone on re-write).
SAMPLE_COLUMNS = (
    "sample_id", "prompt_id", "run_id", "gen_index", "turn", "prompt_ids", "output_ids", "parsed_output_ids",
    "finish_reason", "matched_stop", "valid", "n_errors", "codes", "prompt_len", "output_len", "supervised",
    "text", "reasoning", "content", "reasoning_field", "usage", "settings", "messages", "endpoint", "server_url",
    "server_kind", "server_version", "model", "output_logprobs", "raw_request", "raw_response",
    "parsed_raw_response", "latency_s", "alignment", "profile", "created_at",
)
CAPTURE_COLUMNS = (
    "prompt_ids", "output_ids", "parsed_output_ids", "finish_reason", "matched_stop", "text", "reasoning",
    "content", "reasoning_field", "usage", "settings", "messages", "endpoint", "server_url", "server_kind",
    "server_version", "model", "output_logprobs", "raw_request", "raw_response", "parsed_raw_response",
    "latency_s",
)
JSON_FIELDS = {"matched_stop", "usage", "settings", "messages", "raw_request", "raw_response",
               "parsed_raw_response"}


def sample_params(sample_id: str, prompt_id: str, run_id: str | None, capture: Capture, analysis: Any,
                  gen_index: int | None, turn: int | None, profile: str | None) -> list[Any]:
    c = capture
    findings = analysis.findings
    values = {
        "sample_id": sample_id, "prompt_id": prompt_id, "run_id": run_id, "gen_index": gen_index, "turn": turn,
        "prompt_ids": list(c.prompt_ids), "output_ids": list(c.output_ids),
        "parsed_output_ids": None if c.parsed_output_ids is None else list(c.parsed_output_ids),
        "finish_reason": c.finish_reason, "valid": analysis.valid, "n_errors": error_count(findings),
        "codes": [f.code for f in findings], "prompt_len": len(c.prompt_ids), "output_len": len(c.output_ids),
        "supervised": int(sum(analysis.loss_mask)), "text": c.text, "reasoning": c.reasoning,
        "content": c.content, "reasoning_field": c.reasoning_field, "endpoint": c.endpoint,
        "server_url": scrub_optional(c.server_url), "server_kind": c.server_kind, "server_version": c.server_version,
        "model": c.model, "output_logprobs": None if c.output_logprobs is None else list(c.output_logprobs),
        "latency_s": c.latency_s,
        "alignment": alignment_letters(analysis.alignment.statuses if analysis.alignment else None),
        "profile": profile, "created_at": datetime.now(),
    }
    for name in JSON_FIELDS:
        values[name] = to_json(getattr(c, name))
    return [values[name] for name in SAMPLE_COLUMNS]


def capture_from_row(row: dict[str, Any]) -> Capture:
    data = {name: row[name] for name in CAPTURE_COLUMNS}
    for name in JSON_FIELDS:
        if name in data:
            data[name] = from_json(data[name])
    data["usage"] = data.get("usage") or {}
    data["settings"] = data.get("settings") or {}
    data["prompt_ids"] = list(data["prompt_ids"])
    data["output_ids"] = list(data["output_ids"])
    return Capture(**data)
