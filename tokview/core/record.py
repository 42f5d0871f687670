"""The capture: the one record everything in tokview shows, stores, checks and exports.

It holds what the server saw and produced (prompt ids, output ids), what its text fields said
(under whichever field name it used), the request's settings, and the raw request and response for
audit. Everything else (segments, loss mask, findings) is derived from it by pure functions.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Capture:
    """One generation exactly as served."""

    prompt_ids: list[int]
    output_ids: list[int]
    finish_reason: str | None = None
    """Normalised to `stop`, `length`, `abort` or whatever the server said."""
    matched_stop: int | str | None = None
    text: str | None = None
    """The raw completion text (SGLang `/generate` `text`, vLLM completions `text`)."""
    reasoning: str | None = None
    """The reasoning text the parser returned, from whichever field carried it."""
    content: str | None = None
    reasoning_field: str | None = None
    """Which field carried the reasoning (`reasoning`, `reasoning_content`), or None if none did."""
    tool_calls: list[dict[str, Any]] | None = None
    """The server's `tool_calls` as {id, name, arguments} records (`core.tool_calls.server_tool_calls`), in its
    order; None when the answer had no such field (a raw endpoint, or no tool parser ran). Not a store column:
    read back from the stored raw body (`store.sample_rows.capture_from_row`)."""
    parsed_output_ids: list[int] | None = None
    """In a dual capture, the ids the parsed chat path returned (None if it returned none)."""
    usage: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    """Sampling params, max_new_tokens, thinking, chat_template_kwargs, seed."""
    messages: list[dict[str, Any]] | None = None
    """The conversation the prompt ids were rendered from (for `prompt_render_mismatch`)."""
    endpoint: str = "sglang-generate"
    server_url: str | None = None
    server_kind: str | None = None
    server_version: str | None = None
    model: str | None = None
    output_logprobs: list[float] | None = None
    """Per output position: the sampled token's logprob (when asked for, `--logprobs K`)."""
    output_top_ids: list[list[int]] | None = None
    """Per output position: the top-K alternative ids the server returned."""
    output_top_logprobs: list[list[float]] | None = None
    spec_decode: dict[str, Any] | None = None
    """The server's speculative-decoding metrics, normalised (`core.spec_decode.SpecDecode.to_dict`)."""
    target_logprobs: list[float | None] | None = None
    """Per output position: the logprob a target gave the stored token (`tokview score`)."""
    target_top_ids: list[list[int]] | None = None
    target_top_logprobs: list[list[float]] | None = None
    target_score: dict[str, Any] | None = None
    """Who scored it and the summary: server, model, mean_nll, low_prob_share, thresholds, off_policy."""
    raw_request: dict[str, Any] | None = None
    raw_response: Any = None
    parsed_raw_response: Any = None
    latency_s: float | None = None

    @property
    def input_ids(self) -> list[int]:
        """prompt + output: the sequence a drafter trains on."""
        return list(self.prompt_ids) + list(self.output_ids)

    @property
    def aligned_output_ids(self) -> list[int]:
        """The ids the text fields came from: the parsed path's in a dual capture, else output_ids."""
        return self.output_ids if self.parsed_output_ids is None else self.parsed_output_ids

    @property
    def paths_diverge(self) -> bool:
        """A dual capture whose parsed path generated other ids than the raw path."""
        return self.parsed_output_ids is not None and list(self.parsed_output_ids) != list(self.output_ids)

    @property
    def thinking(self) -> bool | None:
        return self.settings.get("thinking")

    @property
    def has_text_fields(self) -> bool:
        return any(v is not None for v in (self.text, self.reasoning, self.content))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def settings_key(settings: dict[str, Any]) -> str:
    """A short stable hash of generation settings: two runs with other settings never collide."""
    canonical = json.dumps(settings, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


GIVEN_ONLY_SETTINGS = ("logprobs", "chat_template_kwargs")
"""Run settings recorded only when given (absent: not asked for, the default): a run record without one was made
without it, never by an older tokview that did not know it."""


def changed_settings(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The settings two records of one run disagree on, sorted: every key both hold, and each `GIVEN_ONLY_SETTINGS`
    key either holds (`--logprobs 2` on a run made without it changes every sample id: compared only where both
    held it, a resume under the run's name made a second copy of every prompt into it). A key only one holds
    otherwise is one an older tokview did not record: not a difference."""
    keys = (old.keys() & new.keys()) | {k for k in GIVEN_ONLY_SETTINGS if k in old or k in new}
    return sorted(k for k in keys if old.get(k) != new.get(k))


def canonical_hash(obj: object) -> str:
    canonical = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def sample_id_for(prompt_id: str, settings: dict[str, Any], index: int, turn: int | None = None) -> str:
    """Stable id: same prompt + same settings + same index → same id, so re-runs resume."""
    return f"{sample_head(prompt_id, turn)}@{settings_key(settings)}_gen{index}"


_ENDS_LIKE_A_TURN = re.compile(r"#turn\d+#*\Z")


def sample_head(prompt_id: str, turn: int | None) -> str:
    """A sample id's part before `@`: the prompt id, and `#turn{t}` for a turn of a multi-turn row.

    A one-turn row whose own id ends like a turn (`x#turn1`, or that and `#`s: `x#turn1#`) gets a `#` more: its sample
    id was the one of turn 1 of a row `x` in the same file, and one replaced the other in the store (the run counted
    both). With the `#`s counted in, no two ids get one head."""
    if turn is not None:
        return f"{prompt_id}#turn{turn}"
    if "#turn" in prompt_id and _ENDS_LIKE_A_TURN.search(prompt_id):
        return f"{prompt_id}#"
    return prompt_id
