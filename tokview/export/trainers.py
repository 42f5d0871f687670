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
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tokview.export import rerender as rr

if TYPE_CHECKING:
    from tokview.core.tokenizer import TokenizerAdapter
    from tokview.export.registry import ExportFormat


@dataclass(frozen=True)
class Trainer:
    """A trainer that reads exports, and the maximum sequence length its default cuts rows to.

    speculators c05b95b `prepare_data.py --seq-length`, SpecForge a6b6b02 `data.max_length`: both cut a
    longer row to it, on every path, so the end of its answer (the stop id included) is never trained,
    while the row still looks healthy."""

    name: str
    length_setting: str
    default_length: int

    def length_flag(self, n_ids: int) -> str:
        """The setting as its command line writes it: ` --seq-length N` or ` data.max_length=N`."""
        setting = self.length_setting
        return f" {setting} {n_ids}" if setting.startswith("--") else f" {setting}={n_ids}"


SPECULATORS = Trainer("speculators", "--seq-length", rr.SPECULATORS_SEQ_LENGTH)
SPECFORGE = Trainer("specforge", "data.max_length", 2048)
TRAINERS = (SPECULATORS, SPECFORGE)


class Lengths:
    """The longest exported row, and how many rows each trainer's default maximum length would cut."""

    def __init__(self) -> None:
        self.longest = 0
        self.rows = 0
        self.over = Counter[str]()

    def add(self, n_ids: int) -> None:
        self.rows += 1
        self.longest = max(self.longest, n_ids)
        for trainer in TRAINERS:
            self.over[trainer.name] += n_ids > trainer.default_length

    def summary(self) -> dict[str, Any]:
        return {
            "longest_row_ids": self.longest,
            **{
                t.name: {"setting": t.length_setting, "default": t.default_length, "rows_longer": self.over[t.name]}
                for t in TRAINERS
            },
        }

    def warnings(self) -> list[str]:
        out = []
        for t in TRAINERS:
            if self.over[t.name]:
                out.append(
                    f"{self.over[t.name]} of {self.rows} rows are longer than {t.name}'s default {t.length_setting} "
                    f"{t.default_length} (the longest: {self.longest} ids): set {t.length_setting} to at least "
                    f"{self.longest}, or {t.name} cuts them and never trains the end of their answers"
                )
        return out

    def setting(self, trainer: Trainer) -> str:
        """The flag a trainer's exact command needs so no row is cut ('' when its default holds every row)."""
        return "" if self.longest <= trainer.default_length else trainer.length_flag(self.longest)


TOOL_ROWS_WHY = (
    "a tool row re-renders exactly only where the template renders its history as the server did for that turn "
    "and each call's arguments text is what loading it as JSON and the template's tojson give back (the trainer "
    "loads the arguments). Where they differ: Kimi's and Qwen3's templates write the reasoning of a tool loop in "
    "progress but drop it once a plain answer follows, so a row ending in the answer after a loop re-renders without "
    "the reasoning it was served with; Qwen3's writes a newline before a call whose turn has content, so vLLM's "
    '"\n\n" content (its hermes parser returns the blank after </think>) renders one newline more than the model '
    "wrote; a call whose arguments the model spelled otherwise than tojson does renders tojson's spelling"
)
BUILTIN_PATH_WARNINGS = {
    "kimi": "SpecForge's built-in kimi-k2-thinking / kimi-k2-instruct templates do not reproduce a Kimi server's ids: "
    "see warnings",
    "qwen": "SpecForge's built-in qwen3-thinking / qwen3-instruct / qwen templates do not reproduce a Qwen3 server's "
    "ids: see warnings",
}


def is_tool_row(row: dict[str, Any]) -> bool:
    """The row declares tools, or a turn of it calls one or is a tool's result."""
    turns = row.get("conversations") or []
    return bool(row.get("tools")) or any(
        isinstance(t, dict) and (t.get("tool_calls") or t.get("role", t.get("from")) == "tool") for t in turns
    )


@dataclass(frozen=True)
class RerenderPath:
    """One way a trainer re-reads an exported row (its name is the manifest's `rerender` key)."""

    name: str
    needs_template: bool
    """Read through the SpecForge ChatTemplate derived from the served layout: counted only when there is one."""
    outcome: Callable[[dict[str, Any], rr.Rendered, TokenizerAdapter, dict[str, Any] | None, dict[str, Any]], str]
    """(row, served ids and mask, tokenizer, template, served template kwargs) -> an `rr.OUTCOMES` value."""
    tool_rows_why: str = ""
    """Why a tool row may not be exact on this path (the manifest says it beside the tool rows' count)."""


def _speculators_render(
    row: dict[str, Any],
    served: rr.Rendered,
    tokenizer: TokenizerAdapter,
    _t: dict[str, Any] | None,
    kwargs: dict[str, Any],
) -> str:
    with_tools = rr.with_tools(kwargs, rr.row_tools(row))
    return rr.compare_render_rows(served, rr.render_boundaries(row["conversations"], tokenizer, with_tools))


def _specforge_parse(
    row: dict[str, Any],
    served: rr.Rendered,
    tokenizer: TokenizerAdapter,
    template: dict[str, Any] | None,
    _k: dict[str, Any],
) -> str:
    assert template is not None  # needs_template: asked only when there is one
    return rr.compare(served, rr.specforge_parse(row, template, tokenizer))


def _specforge_preformatted(
    row: dict[str, Any],
    served: rr.Rendered,
    tokenizer: TokenizerAdapter,
    template: dict[str, Any] | None,
    _k: dict[str, Any],
) -> str:
    assert template is not None  # needs_template: asked only when there is one
    return rr.compare(served, rr.specforge_mask(row["text"], template, tokenizer))


SPECFORGE_PATH = RerenderPath("specforge", True, _specforge_parse, TOOL_ROWS_WHY)
RENDER_PATH = RerenderPath(
    "speculators_render",
    False,
    _speculators_render,
    TOOL_ROWS_WHY + "; a render whose history changes between turns makes speculators drop the conversation "
    "(BoundaryUnstableError: render_failed)",
)
PREFORMATTED_PATH = RerenderPath("specforge_preformatted_text", True, _specforge_preformatted)
TEXT_ROW_PATHS = (SPECFORGE_PATH, RENDER_PATH)
"""A conversation row: SpecForge's own parse with the derived template, and speculators' render endpoint."""


class Conformance:
    """Re-renders each written row through the trainer paths its format names and counts the outcomes."""

    def __init__(
        self, rerender: tuple[RerenderPath, ...], tokenizer: TokenizerAdapter, template: dict[str, Any] | None
    ) -> None:
        self.rerender, self.tokenizer, self.template = rerender, tokenizer, template
        self.outcomes: dict[str, Counter[str]] = {}
        self.tool_outcomes: dict[str, Counter[str]] = {}
        self.examples: dict[str, list[str]] = {}

    def paths(self) -> list[RerenderPath]:
        return [p for p in self.rerender if self.template or not p.needs_template]

    def check(self, row: dict[str, Any], served: rr.Rendered, kwargs: dict[str, Any]) -> dict[str, str]:
        out = {}
        for path in self.paths():
            outcome = path.outcome(row, served, self.tokenizer, self.template, kwargs)
            self.outcomes.setdefault(path.name, Counter())[outcome] += 1
            if is_tool_row(row):
                self.tool_outcomes.setdefault(path.name, Counter())[outcome] += 1
            if not rr.is_exact(outcome) and len(self.examples.setdefault(path.name, [])) < 5:
                self.examples[path.name].append(str(row.get("id")))
            out[path.name] = outcome
        return out

    def summary(self) -> dict[str, Any]:
        result = {}
        for path in self.paths():
            counts = self.outcomes.get(path.name, Counter())
            rows = sum(counts.values())
            exact = counts[rr.EXACT] + counts[rr.EXACT_PLUS_SUFFIX]
            result[path.name] = {
                "rows": rows,
                "exact": exact,
                "differ": rows - exact,
                **{k: counts[k] for k in rr.OUTCOMES if counts[k]},
                "first_differing_ids": self.examples.get(path.name, []),
            }
            tools = self.tool_outcomes.get(path.name)
            if tools:
                exact_tools = tools[rr.EXACT] + tools[rr.EXACT_PLUS_SUFFIX]
                result[path.name]["tool_rows"] = {
                    "rows": sum(tools.values()),
                    "exact": exact_tools,
                    **{k: tools[k] for k in rr.OUTCOMES if tools[k] and not rr.is_exact(k)},
                    "why_not_exact": path.tool_rows_why,
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


@dataclass(frozen=True)
class PathsContext:
    """What a format's trainer paths are written from: the data file's name and what was written beside it."""

    data_name: str
    template_name: str | None
    kwargs: list[dict[str, Any]]
    lengths: Lengths
    hf_loader: str
    """The `datasets.load_dataset` builder for the data file ('json' or 'parquet')."""
    family: str = ""
    """The model family whose SpecForge built-in templates the manifest warns against (`BUILTIN_WARNINGS`)."""


def section(
    fmt: ExportFormat,
    *,
    data_name: str,
    template_name: str | None,
    kwargs: list[dict[str, Any]],
    retokenize_drift: int,
    exported: int,
    lengths: Lengths | None = None,
    family: str = "",
) -> dict[str, Any]:
    """The manifest's `trainers` section: per trainer, the exact way to train on this file (with the
    maximum length its longest row needs, when that is over the trainer's default), as `fmt` declares it."""
    context = PathsContext(data_name, template_name, kwargs, lengths or Lengths(), fmt.file.hf_loader, family)
    out = fmt.trainer_paths(context)
    out["retokenize_drift"] = (
        f"{retokenize_drift} of {exported} rows carry retokenize_drift: their output ids are not what the "
        "tokenizer gives for their text, so every path that tokenizes text trains on other ids for them; "
        "only pre-tokenized paths are exact for those rows"
    )
    return out


def ids_row_paths(ctx: PathsContext) -> dict[str, Any]:
    """Pre-tokenized rows (input_ids + loss_mask): every trainer reads them exactly as served."""
    seq_length, max_length = ctx.lengths.setting(SPECULATORS), ctx.lengths.setting(SPECFORGE)
    return {
        "speculators": {
            "exact": f"python scripts/prepare_data.py --model <target model> --data {ctx.data_name}{seq_length} "
            "--output <dir> (pre-tokenized rows pass through as served)"
        },
        "specforge": {
            "exact": f"data.prompts_path={ctx.data_name}{max_length} (prepare_prompt_tasks reads input_ids + "
            "loss_mask as they are)",
            "retokenizing": "data.is_preformatted=true re-tokenizes `text` and masks it with a chat "
            "template's regex: not exact (see rerender)",
        },
        "hf_trl": {
            "exact": f"load_dataset('{ctx.hf_loader}', data_files='{ctx.data_name}'); train on input_ids with "
            "labels = input_ids where loss_mask == 1, else -100",
            "retokenizing": "any loader that tokenizes `text` (or a chat template) again",
        },
    }


def trajectory_paths(ctx: PathsContext) -> dict[str, Any]:
    """Conversation rows of served ids: read exactly as the per-generation ids rows, one row per conversation."""
    out = ids_row_paths(ctx)
    out["note"] = (
        "one row per conversation (split where a turn's prompt does not extend the previous turn's prompt + "
        "output ids, see trajectory): every served output has mask 1, the ids between them (tool results, "
        "user turns, headers) mask 0; metadata.turns gives each turn's output span"
    )
    for trainer in out.values():  # no `text` field: nothing to re-tokenize
        if isinstance(trainer, dict):
            trainer.pop("retokenizing", None)
    return out


def parquet_paths(ctx: PathsContext) -> dict[str, Any]:
    """The same columns as the JSONL ids rows, but both trainers' loaders read .json/.jsonl only
    (speculators c05b95b, SpecForge a6b6b02): they go through the JSONL export."""
    out = ids_row_paths(ctx)
    out["speculators"]["exact"] = (
        "not read directly (prepare_data.py loads .json/.jsonl): export --format speculators and pass that file "
        "with --data"
    )
    out["specforge"]["exact"] = (
        "not read directly (prompts_path reads JSONL): export --format speculators and set data.prompts_path to it"
    )
    return out


def conversation_paths(ctx: PathsContext) -> dict[str, Any]:
    """Conversation rows (text): read through a chat template, so exact only where it renders the served ids."""
    max_length = ctx.lengths.setting(SPECFORGE)
    kw = json.dumps(ctx.kwargs[0]) if len(ctx.kwargs) == 1 and ctx.kwargs[0] else None
    render = (
        f"python scripts/prepare_data.py --model <target model> --data {ctx.data_name}"
        f"{ctx.lengths.setting(SPECULATORS)} --render-endpoint "
        "http://<vLLM serving the same model and chat template>"
        + (f" (start vLLM with --default-chat-template-kwargs '{kw}': prepare_data.py sends none)" if kw else "")
    )
    register = (
        "from specforge.data.template import TEMPLATE_REGISTRY, ChatTemplate; "
        f"TEMPLATE_REGISTRY.register('tokview', ChatTemplate(**json.load(open('{ctx.template_name}')))); "
        f"then train with data.chat_template=tokview{max_length} and train_only_last_turn: true"
    )
    return {
        "specforge": {
            "path": register
            if ctx.template_name
            else "no template written: this format is read through its own chat template only",
            "warning": BUILTIN_PATH_WARNINGS.get(
                ctx.family,
                "SpecForge's built-in templates were not checked against these served ids"
                + (": register this one" if ctx.template_name else ""),
            ),
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
        "tools": "a row with tools carries `tools` as JSON text (both trainers json.loads it; as a list, "
        "datasets versions that infer one Arrow struct for all rows give each tool the other rows' keys as "
        "null, which the template then renders), assistant `tool_calls` in the "
        "OpenAI shape with the call id and arguments text as the model wrote them, and `tool` turns with "
        "`tool_call_id` (and `name`); SpecForge keeps tool_call_id and name only with a thinking parser, "
        "speculators drops name; see rerender.*.tool_rows for which tool rows are exact on which path",
    }
