"""Structural comparison of server answers with the tools recordings (tests/recordings/kimi_tools).

A skeleton keeps a response's structure (keys, nesting, null vs value, "" vs text, the literal value of
a few keys) and drops what differs by model and vocabulary (words, ids, counts). Streams compare the
skeletons of their chunks with runs of equal chunks collapsed (SGLang batches text deltas by timing;
another model writes other words in other numbers of tokens). Used by tests/test_sim_tools.py against
the simulator; a live tier can hold a real server's answers to the same requests to the same shapes.
"""

from __future__ import annotations

import json
from typing import Any

from facts import RECORDINGS

TOOLS_REC = RECORDINGS / "kimi_tools"
RECORDED = sorted(p.name.removesuffix(".req.json") for p in TOOLS_REC.glob("*.req.json"))

LITERAL_KEYS = {"finish_reason", "object", "role", "type"}
UNCOMPARED_KEYS = {"cached_tokens_details"}  # the recorded /generate hit the prefix cache, a new simulator cannot


def skeleton(value: Any, key: str | None = None) -> Any:
    if isinstance(value, dict):
        return {k: skeleton(v, k) for k, v in value.items() if k not in UNCOMPARED_KEYS}
    if isinstance(value, list):
        if value and all(type(i) is int for i in value):
            return "ids"
        return [skeleton(v) for v in value]
    if key in LITERAL_KEYS or value is None:
        return value
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "num"
    return "text" if value else ""


def _is_argument_chunk(chunk: Any) -> bool:
    delta = (chunk.get("choices") or [{}])[0].get("delta") or {} if isinstance(chunk, dict) else {}
    return bool(delta.get("tool_calls"))


def stream_skeleton(events: list[Any]) -> list[Any]:
    """Chunk skeletons, runs collapsed; an empty vLLM delta between two argument chunks is dropped (an
    argument token whose text vLLM holds back, e.g. a lone `}`: the recorded vocabulary merged `"}`)."""
    kept = [
        e
        for k, e in enumerate(events)
        if not (
            0 < k < len(events) - 1
            and isinstance(e, dict)
            and e.get("choices")
            and e["choices"][0].get("delta") == {}
            and e["choices"][0].get("finish_reason") is None
            and _is_argument_chunk(events[k - 1])
            and _is_argument_chunk(events[k + 1])
        )
    ]
    out: list[Any] = []
    for e in kept:
        shape = skeleton(e)
        if not out or out[-1] != shape:
            out.append(shape)
    return out


def sse_events(text: str) -> list[Any]:
    return [
        (raw if raw == "[DONE]" else json.loads(raw))
        for line in text.splitlines()
        if line.startswith("data:")
        for raw in [line[5:].strip()]
    ]
