"""The logprobs a harness asked for itself, kept with its sample.

Why: a harness that asks for logprobs (an RL loop, a scorer) gets the target's own per-token logprobs for every id
the proxy records; they were left inside the stored raw answer, and the sample's `output_logprobs` (what
`tokview batch --logprobs` fills, what exports and the app's heat view read) stayed empty. The proxy never adds
logprobs to a request (the client's answer must be the upstream's own), so only what the client asked for is kept:
the sampled token's logprob per output id, and the alternatives' ids when the client asked for them as ids
(`return_tokens_as_token_ids`); alternatives named by their text are left out (two tokens can print the same). An
answer whose logprobs do not line up with its ids (a vLLM before 0.31 streams no entry for a marker id) keeps none:
the sample itself is never refused for its side data.
"""

from __future__ import annotations

from typing import Any

from tokview.core import logprobs as lp
from tokview.core.json_value import as_pydantic_bool
from tokview.servers.shapes import first_choice, logprob_fields


def client_logprobs(
    answer: object, *, chat: bool, stream: bool, settings: dict[str, Any], output_ids: list[int]
) -> dict[str, Any]:
    """The capture's logprob fields from the client's own request for them (`chat`: the chat endpoint's, else
    completions'); {} when it asked for none or they cannot be lined up with the ids. `answer` holds one choice (the
    recorder's `choice_view` of an `n` > 1 answer)."""
    asked = settings.get("logprobs")
    if asked is None:  # most requests: nothing read (the recorder's hot path)
        return {}
    if chat and as_pydantic_bool(asked) is not True:
        return {}
    if not chat:
        asked = _as_count(asked)
        if asked is None:
            return {}
    chunks = answer if stream and isinstance(answer, list) else [answer]
    choices = [first_choice(c) for c in chunks]
    try:
        if chat:
            content = _joined(choices, "content")
            if content is None:
                return {}
            try:
                found = lp.from_vllm_chat({"content": content}, output_ids)
            except lp.LogprobShapeError:  # alternatives named by their text: the sampled ones alone
                found = lp.sampled_only(
                    [e.get("logprob") if isinstance(e, dict) else None for e in content], output_ids
                )
        else:
            merged = {
                "token_logprobs": _joined(choices, "token_logprobs"),
                "top_logprobs": _joined(choices, "top_logprobs"),
            }
            try:
                found = lp.from_vllm_completion(merged, output_ids, asked)
            except lp.LogprobShapeError:
                found = lp.sampled_only(merged["token_logprobs"], output_ids)
    except lp.LogprobShapeError:  # NaN, or not numbers at all: the answer's own trouble, never the sample's
        return {}
    return logprob_fields(found) if found is not None else {}


def _as_count(value: object) -> int | None:
    """Completions' `logprobs` as the servers' pydantic reads an int in its lax mode (`true` is 1, `"2"` is 2, `2.0`
    is 2); None for anything else, or below 0."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    return value if type(value) is int and value >= 0 else None


def _joined(choices: list[dict[str, Any]], key: str) -> list[Any] | None:
    """`logprobs[key]` of every chunk's choice, joined in order; None when no chunk has it (or one has another shape)."""
    out: list[Any] = []
    seen = False
    for choice in choices:
        held = choice.get("logprobs")
        part = held.get(key) if isinstance(held, dict) else None
        if part is None:
            continue
        if not isinstance(part, list):
            return None
        seen = True
        out += part
    return out if seen else None
