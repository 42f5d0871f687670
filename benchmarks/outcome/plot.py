"""The outcome benchmark's plot (runs in the benchmark venv, which has matplotlib): `plot.py results.json out.png`.

Left: mean acceptance length per condition with its 95% bootstrap interval. Right: per-position acceptance
(share of verify steps that accepted at least k drafts), one line per condition, with intervals.
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main(argv: list[str]) -> int:
    src, dst = argv
    with open(src, encoding="utf-8") as f:
        results = json.load(f)
    rows = results["conditions"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    names = [r["condition"] for r in rows]
    values = [r["acceptance_length"]["value"] for r in rows]
    errs = [
        [r["acceptance_length"]["value"] - r["acceptance_length"]["low"] for r in rows],
        [r["acceptance_length"]["high"] - r["acceptance_length"]["value"] for r in rows],
    ]
    colors = ["#1f77b4", "#ff7f0e", "#7f7f7f", "#2ca02c"][: len(rows)]
    left.bar(names, values, yerr=errs, capsize=6, color=colors)
    left.set_ylabel("mean acceptance length (tokens / verify step)")
    left.set_ylim(1.0, max(1.2, max(r["acceptance_length"]["high"] for r in rows) * 1.08))
    left.set_title("acceptance length, 95% bootstrap CI")
    for i, r in enumerate(rows):
        left.text(
            i, 1.02, r["label"].split(" ", 1)[1], rotation=90, va="bottom", ha="center", fontsize=7, color="white"
        )
    for r, color in zip(rows, colors):
        pos = r["per_position"]
        xs = list(range(1, len(pos) + 1))
        ys = [p["value"] for p in pos]
        right.errorbar(xs, ys, yerr=[[p["value"] - p["low"] for p in pos], [p["high"] - p["value"] for p in pos]],
                       marker="o", capsize=4, label=r["label"], color=color)  # fmt: skip
    right.set_xticks([1, 2, 3])
    right.set_xlabel("draft position k")
    right.set_ylabel("share of steps accepting >= k drafts")
    right.set_title("per-position acceptance")
    right.legend(fontsize=7)
    s = results["settings"]
    fig.suptitle(f"SmolLM2-135M + 1-layer EAGLE-3 head, vLLM-CPU ({s['name']}: {s['n_train']} train prompts, "
                 f"{rows[0]['held_out_samples']} held out)", fontsize=10)  # fmt: skip
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
