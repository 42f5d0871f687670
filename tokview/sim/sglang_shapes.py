"""What SGLang puts around its ids on both its surfaces (`/generate` and chat): `meta_info`, the finish
reason object, and which ids its detokenizer turns into `text`."""

from __future__ import annotations

import time
from typing import Any, Literal, TypedDict

from tokview.sim.model import Generation


class LengthFinish(TypedDict):
    """`meta_info.finish_reason` of an output cut at its length."""

    type: Literal["length"]
    length: int


class StopFinish(TypedDict):
    """`meta_info.finish_reason` of an output that stopped (`matched`: the stop id, None when none matched)."""

    type: Literal["stop"]
    matched: int | str | None


def finish(gen: Generation) -> LengthFinish | StopFinish:
    if gen.finish_reason == "length":
        return {"type": "length", "length": len(gen.output_ids)}
    return {"type": "stop", "matched": gen.matched}


def text_ids(gen: Generation, no_stop_trim: bool) -> list[int]:
    """The ids the detokenizer turns into `text`: without the matched stop id unless no_stop_trim (a stop string's
    ids stay: its text is cut instead, `common.stop_drop`)."""
    if isinstance(gen.matched, int) and not no_stop_trim:
        return gen.output_ids[:-1]
    return gen.output_ids


def meta(
    prompt: list[int],
    n_out: int,
    *,
    finish_reason: LengthFinish | StopFinish | None,
    rid: str,
    started: float | None,
    reasoning_tokens: int = 0,
) -> dict[str, Any]:
    info: dict[str, Any] = {
        "id": rid,
        "finish_reason": finish_reason,
        "prompt_tokens": len(prompt),
        "weight_version": "default",
        "num_retractions": 0,
        "reasoning_tokens": reasoning_tokens,
        "completion_tokens": n_out,
        "cached_tokens": 0,
        "weight_versions": [{"version": "default", "start": 0, "end": n_out}],
        "cached_tokens_details": None,
        "dp_rank": None,
    }
    if started is not None:
        info["e2e_latency"] = round(time.monotonic() - started, 6)
        info["response_sent_to_client_ts"] = time.time()
    return info
