"""The `spec_decode`, `logprobs` and `target_logprobs` parts of `tokview stats --json` and `show --json`.

One sample (`sample_side_json`) or the whole store (`store_side_stats`), always under the same
three keys, each null when nothing of its kind was captured, so scripts can test for presence.
Per-segment acceptance is aggregated only over samples whose steps could be placed (every decode
step drafted); `segments` is null when no sample could, never an estimate from totals.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from tokview.core import spec_decode as sd
from tokview.core.logprobs import mean_nll
from tokview.core.profiles import ModelProfile, ProfileError, get_profile
from tokview.core.record import Capture
from tokview.store.prompt_refs import REF_COLUMNS, whole_prompts

if TYPE_CHECKING:
    from tokview.store.connection import Database

NLL_BINS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
"""Upper edges (nats/token) of the NLL histogram; the last bin is everything above 8."""


def sample_side_json(capture: Capture, profile: ModelProfile | None) -> dict[str, Any]:
    """`spec_decode` (with `segments`), `logprobs` and `target_logprobs` of one sample."""
    spec = sd.summary(capture.spec_decode, capture.prompt_ids, capture.output_ids, capture.finish_reason, profile)
    logprobs = None
    if capture.output_logprobs is not None:
        logprobs = {
            "sampled": capture.output_logprobs,
            "top_ids": capture.output_top_ids,
            "top_logprobs": capture.output_top_logprobs,
            "mean_nll": mean_nll(capture.output_logprobs),
        }
    target = None
    if capture.target_logprobs is not None:
        target = {
            **(capture.target_score or {}),
            "logprobs": capture.target_logprobs,
            "top_ids": capture.target_top_ids,
            "top_logprobs": capture.target_top_logprobs,
        }
    return {"spec_decode": spec, "logprobs": logprobs, "target_logprobs": target}


def _profile(name: str | None, cache: dict[str | None, ModelProfile | None]) -> ModelProfile | None:
    if name not in cache:
        try:
            cache[name] = get_profile(name) if name else None
        except ProfileError:
            cache[name] = None
    return cache[name]


def _spec_stats(store: Database, default_profile: ModelProfile | None = None) -> dict[str, Any] | None:
    names = ("spec_decode", "prompt_ids", "output_ids", "finish_reason", "profile", "sample_id", "prompt_len")
    found = store.query(
        f"SELECT {', '.join(names)}, {', '.join(REF_COLUMNS)} FROM samples WHERE spec_decode IS NOT NULL"
    )
    if not found:
        return None
    dicts = [dict(zip((*names, *REF_COLUMNS), r)) for r in found]
    whole_prompts(store, dicts)  # a proxied turn may be stored past an earlier one (prompt_refs.py)
    rows = [(d["spec_decode"], d["prompt_ids"], d["output_ids"], d["finish_reason"], d["profile"]) for d in dicts]
    totals = {"steps": 0, "accepted": 0, "drafted": 0}
    schemas: dict[str, int] = {}
    segments = {name: {"tokens": 0, "steps": 0, "accepted": 0, "drafted": 0} for name in sd.SEGMENTS}
    placed = 0
    profiles: dict[str | None, ModelProfile | None] = {}
    for spec_json, prompt, output, finish, profile_name in rows:
        spec = sd.SpecDecode.from_dict(json.loads(spec_json))
        if spec is None:
            continue
        schemas[spec.schema] = schemas.get(spec.schema, 0) + 1
        if spec.accepted is not None and spec.steps is not None:  # steps without an accepted count (older SGLang
            for key in totals:  # builds) would read as nothing accepted: 1.00
                totals[key] += getattr(spec, key) or 0
        profile = _profile(profile_name, profiles) or default_profile
        placement = sd.place_steps(spec, len(output), finish)
        if profile is None or placement is None:
            continue
        from tokview.core.segments import token_kinds

        kinds = token_kinds(list(prompt), list(output), profile)[len(prompt) :]
        parts = sd.segment_acceptance(spec, placement, kinds) or {}
        placed += 1
        for name, part in parts.items():
            for key in segments[name]:
                segments[name][key] += part.get(key) or 0
    per_segment = {name: {**counts, **_rates(counts)} for name, counts in segments.items()}
    lengths = store.query(
        "SELECT quantile_cont(acceptance_length, 0.1), quantile_cont(acceptance_length, 0.5), "
        "quantile_cont(acceptance_length, 0.9), min(acceptance_length), max(acceptance_length) "
        "FROM samples WHERE acceptance_length IS NOT NULL"
    )[0]
    return {
        "samples": len(rows),
        "schemas": schemas,
        **totals,
        **_rates(totals),
        "acceptance_length": dict(zip(("p10", "p50", "p90", "min", "max"), lengths)),
        "placed_samples": placed,
        "segments": per_segment if placed else None,
    }


def _rates(counts: dict[str, int]) -> dict[str, float | None]:
    """Mean acceptance length (1 + accepted/steps) and acceptance rate (accepted/drafted); None over 0."""
    return {
        "mean_acceptance_length": 1 + counts["accepted"] / counts["steps"] if counts["steps"] else None,
        "acceptance_rate": counts["accepted"] / counts["drafted"] if counts["drafted"] else None,
    }


def _logprob_stats(store: Database) -> dict[str, Any] | None:
    n, tokens, mean = store.query(
        "SELECT count(*), sum(len(output_logprobs)), avg(list_avg(output_logprobs)) FROM samples "
        "WHERE output_logprobs IS NOT NULL"
    )[0]
    if not n:
        return None
    with_top = store.query("SELECT count(*) FROM samples WHERE output_top_ids IS NOT NULL")[0][0]
    return {
        "samples": n,
        "tokens": tokens,
        "mean_sampled_nll": None if mean is None else -mean,
        "samples_with_top_k": with_top,
    }


def _target_stats(store: Database) -> dict[str, Any] | None:
    n, mean, p50, p90, top = store.query(
        "SELECT count(*), avg(mean_nll), quantile_cont(mean_nll, 0.5), quantile_cont(mean_nll, 0.9), max(mean_nll) "
        "FROM samples WHERE target_score IS NOT NULL"
    )[0]
    if not n:
        return None
    edges = list(NLL_BINS)
    counts = store.query(
        "SELECT "
        + ", ".join(
            f"count(*) FILTER (WHERE mean_nll <= {e}" + (f" AND mean_nll > {edges[i - 1]})" if i else ")")
            for i, e in enumerate(edges)
        )
        + f", count(*) FILTER (WHERE mean_nll > {edges[-1]}) FROM samples WHERE target_score IS NOT NULL"
    )[0]
    off = store.query("SELECT count(DISTINCT sample_id) FROM findings WHERE code = 'off_policy'")[0][0]
    models = [
        r[0]
        for r in store.query(
            "SELECT DISTINCT json_extract_string(target_score, '$.model') FROM samples "
            "WHERE target_score IS NOT NULL ORDER BY 1"
        )
    ]
    return {
        "samples": n,
        "models": models,
        "off_policy": off,
        "mean_nll": {"mean": mean, "p50": p50, "p90": p90, "max": top},
        "nll_histogram": {"upper_edges": edges, "counts": list(counts)},
    }


def store_side_stats(store: Database, default_profile: ModelProfile | None = None) -> dict[str, Any]:
    """The three keys over the whole store (each null when no sample has that kind of data).

    `default_profile` segments samples stored without a known profile name (the app passes its own)."""
    return {
        "spec_decode": _spec_stats(store, default_profile),
        "logprobs": _logprob_stats(store),
        "target_logprobs": _target_stats(store),
    }


def render_side(st: dict[str, Any]) -> str:
    """The text lines of `tokview stats` for the three keys ('' when the store has none of them)."""
    lines = []
    spec = st.get("spec_decode")
    if spec:
        mal = spec["mean_acceptance_length"]
        lines.append(
            f"spec-decode {spec['samples']} samples, mean acceptance length "
            f"{'n/a' if mal is None else f'{mal:.2f}'} over {spec['steps']} steps"
        )
        if spec["segments"]:
            parts = [
                f"{name} {v['mean_acceptance_length']:.2f}"
                if v["mean_acceptance_length"] is not None
                else f"{name} n/a"
                for name, v in spec["segments"].items()
            ]
            lines.append(f"  per segment ({spec['placed_samples']} samples placed): {', '.join(parts)}")
        else:
            lines.append("  per segment: unavailable (no sample's steps cover its output)")
    if st.get("logprobs"):
        lines.append(f"logprobs    {st['logprobs']['samples']} samples, {st['logprobs']['tokens']} tokens")
    target = st.get("target_logprobs")
    if target:
        nll = target["mean_nll"]
        lines.append(
            f"target      {target['samples']} scored, mean NLL p50 {nll['p50']:.3f} p90 {nll['p90']:.3f}, "
            f"off_policy {target['off_policy']}"
        )
    return "\n".join(lines)
