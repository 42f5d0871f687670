"""How each trainer reads an export exactly, and a count of the rows a re-tokenizing path would change.

Goes in every manifest as `trainers` (the exact path per trainer, and what the re-tokenizing paths do)
and `rerender` (per trainer path: how many exported rows re-render to the served ids and mask, by the
rules in `export.rerender`). Pre-tokenized rows (speculators, Parquet) are exact by construction; a
text row is exact only when the run's template renders it back to the served ids, which a sample with
a non-canonical token split (`retokenize_drift`) never does.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from tokview.export import rerender as rr

SPECFORGE_PATH = "specforge"
RENDER_PATH = "speculators_render"
PREFORMATTED_PATH = "specforge_preformatted_text"
TEXT_FORMATS = ("specforge", "sharegpt", "kimi-inline")


TRAINER_LIMITS = {"speculators": ("--seq-length", rr.SPECULATORS_SEQ_LENGTH), "specforge": ("data.max_length", 2048)}
"""Each trainer's default maximum sequence length (speculators c05b95b `prepare_data.py --seq-length`,
SpecForge a6b6b02 `data.max_length`): both cut a longer row to it, on every path, so the end of its
answer (the stop id included) is never trained, while the row still looks healthy."""


class Lengths:
    """The longest exported row, and how many rows each trainer's default maximum length would cut."""

    def __init__(self) -> None:
        self.longest = 0
        self.rows = 0
        self.over = Counter[str]()

    def add(self, n_ids: int) -> None:
        self.rows += 1
        self.longest = max(self.longest, n_ids)
        for trainer, (_, limit) in TRAINER_LIMITS.items():
            self.over[trainer] += n_ids > limit

    def summary(self) -> dict[str, Any]:
        return {
            "longest_row_ids": self.longest,
            **{
                trainer: {"setting": setting, "default": limit, "rows_longer": self.over[trainer]}
                for trainer, (setting, limit) in TRAINER_LIMITS.items()
            },
        }

    def warnings(self) -> list[str]:
        out = []
        for trainer, (setting, limit) in TRAINER_LIMITS.items():
            if self.over[trainer]:
                out.append(
                    f"{self.over[trainer]} of {self.rows} rows are longer than {trainer}'s default {setting} "
                    f"{limit} (the longest: {self.longest} ids): set {setting} to at least {self.longest}, or "
                    f"{trainer} cuts them and never trains the end of their answers"
                )
        return out

    def setting(self, trainer: str) -> str:
        """The flag a trainer's exact command needs so no row is cut ('' when its default holds every row)."""
        name, limit = TRAINER_LIMITS[trainer]
        if self.longest <= limit:
            return ""
        return f" {name} {self.longest}" if name.startswith("--") else f" {name}={self.longest}"


class Conformance:
    """Re-renders each written row through the trainers' paths and counts the outcomes."""

    def __init__(self, fmt: str, tokenizer: Any, template: dict[str, Any] | None) -> None:
        self.fmt, self.tokenizer, self.template = fmt, tokenizer, template
        self.outcomes: dict[str, Counter[str]] = {}
        self.examples: dict[str, list[str]] = {}

    def paths(self) -> list[str]:
        if self.fmt in TEXT_FORMATS:
            return [SPECFORGE_PATH, RENDER_PATH] if self.template else [RENDER_PATH]
        if self.fmt == "speculators" and self.template:
            return [PREFORMATTED_PATH]
        return []

    def check(self, row: dict[str, Any], served: rr.Rendered, kwargs: dict[str, Any]) -> dict[str, str]:
        out = {}
        for path in self.paths():
            if path == RENDER_PATH:
                outcome = rr.compare_render_rows(
                    served, rr.render_boundaries(row["conversations"], self.tokenizer, kwargs)
                )
            elif self.template is None:  # paths() names the template's paths only when there is one
                continue
            elif path == SPECFORGE_PATH:
                outcome = rr.compare(served, rr.specforge_parse(row, self.template, self.tokenizer))
            else:
                outcome = rr.compare(served, rr.specforge_mask(row["text"], self.template, self.tokenizer))
            self.outcomes.setdefault(path, Counter())[outcome] += 1
            if not rr.is_exact(outcome) and len(self.examples.setdefault(path, [])) < 5:
                self.examples[path].append(str(row.get("id")))
            out[path] = outcome
        return out

    def summary(self) -> dict[str, Any]:
        result = {}
        for path in self.paths():
            counts = self.outcomes.get(path, Counter())
            rows = sum(counts.values())
            exact = counts[rr.EXACT] + counts[rr.EXACT_PLUS_SUFFIX]
            result[path] = {
                "rows": rows,
                "exact": exact,
                "differ": rows - exact,
                **{k: counts[k] for k in rr.OUTCOMES if counts[k]},
                "first_differing_ids": self.examples.get(path, []),
            }
        return result

    def line(self) -> str:
        """One line for the export summary: `specforge 5/5 exact, speculators_render 4/5 exact`."""
        parts = []
        for path, s in self.summary().items():
            differ = (rr.IDS_DIFFER, rr.MASK_DIFFER, rr.HISTORY_SUPERVISED, rr.FAILED)
            detail = ", ".join(f"{s[k]} {k}" for k in differ if s.get(k))
            parts.append(f"{path} {s['exact']}/{s['rows']} exact" + (f" ({detail})" if detail else ""))
        return "; ".join(parts)


def section(
    fmt: str,
    data_name: str,
    template_name: str | None,
    kwargs: list[dict[str, Any]],
    retokenize_drift: int,
    exported: int,
    lengths: Lengths | None = None,
) -> dict[str, Any]:
    """The manifest's `trainers` section: per trainer, the exact way to train on this file (with the
    maximum length its longest row needs, when that is over the trainer's default)."""
    lengths = lengths or Lengths()
    seq_length, max_length = lengths.setting("speculators"), lengths.setting("specforge")
    kw = json.dumps(kwargs[0]) if len(kwargs) == 1 and kwargs[0] else None
    render = (
        f"python scripts/prepare_data.py --model <target model> --data {data_name}{seq_length} --render-endpoint "
        "http://<vLLM serving the same model and chat template>"
        + (f" (start vLLM with --default-chat-template-kwargs '{kw}': prepare_data.py sends none)" if kw else "")
    )
    drift = (
        f"{retokenize_drift} of {exported} rows carry retokenize_drift: their output ids are not what the "
        "tokenizer gives for their text, so every path that tokenizes text trains on other ids for them; "
        "only pre-tokenized paths are exact for those rows"
    )
    if fmt in ("speculators", "parquet"):
        loader = (
            f"load_dataset('parquet', data_files='{data_name}')"
            if fmt == "parquet"
            else f"load_dataset('json', data_files='{data_name}')"
        )
        out: dict[str, Any] = {
            "speculators": {
                "exact": f"python scripts/prepare_data.py --model <target model> --data {data_name}{seq_length} "
                "--output <dir> (pre-tokenized rows pass through as served)"
            },
            "specforge": {
                "exact": f"data.prompts_path={data_name}{max_length} (prepare_prompt_tasks reads input_ids + "
                "loss_mask as they are)",
                "retokenizing": "data.is_preformatted=true re-tokenizes `text` and masks it with a chat "
                "template's regex: not exact (see rerender)",
            },
            "hf_trl": {
                "exact": f"{loader}; train on input_ids with labels = input_ids where loss_mask == 1, else -100",
                "retokenizing": "any loader that tokenizes `text` (or a chat template) again",
            },
        }
        if fmt == "parquet":  # both trainers' loaders read .json/.jsonl only (speculators c05b95b, SpecForge a6b6b02)
            out["speculators"]["exact"] = (
                "not read directly (prepare_data.py loads .json/.jsonl): export --format "
                "speculators and pass that file with --data"
            )
            out["specforge"]["exact"] = (
                "not read directly (prompts_path reads JSONL): export --format speculators "
                "and set data.prompts_path to it"
            )
    else:
        register = (
            "from specforge.data.template import TEMPLATE_REGISTRY, ChatTemplate; "
            f"TEMPLATE_REGISTRY.register('tokview', ChatTemplate(**json.load(open('{template_name}')))); "
            f"then train with data.chat_template=tokview{max_length} and train_only_last_turn: true"
        )
        out = {
            "specforge": {
                "path": register
                if template_name
                else "no template written: this format is read through its own chat template only",
                "warning": "SpecForge's built-in kimi-k2-thinking / kimi-k2-instruct templates do not "
                "reproduce a Kimi server's ids: see warnings",
            },
            "speculators": {
                "path": render,
                "note": "speculators refuses conversation files without --render-endpoint; it makes "
                "one row per assistant turn, the last of which is this row's generation: the rows of a "
                "multi-turn sample's history turns supervise the prompts file's answers, which this run "
                "did not serve (counted as history_supervised in rerender); the exact_alternative has none",
            },
            "hf_trl": {
                "path": "tokenizer.apply_chat_template(conversation) with the run's chat template and "
                "template kwargs, supervising only the last assistant turn"
            },
            "exact_alternative": "export --format speculators: input_ids + loss_mask exactly as served, for "
            "speculators prepare_data.py --data and SpecForge data.prompts_path",
        }
    out["retokenize_drift"] = drift
    return out
