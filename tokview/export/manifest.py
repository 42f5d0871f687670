"""The manifest beside every export: provenance, counts, how each trainer reads the file exactly.

Provenance (tokenizer and chat-template hashes, profile, servers, parser, sampling settings, runs) is
what a drafter run needs to know what it trains on; `trainers` and `rerender` say which trainer paths
reproduce the served ids (see `export.trainers`); `data_sha256` names the data file the manifest was
written with, so a manifest beside other data (an interrupted export) can be told apart.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from tokview.export.output import Plan
from tokview.export.registry import FORMATS, ExportFormat, Rows
from tokview.export.specforge_template import BUILTIN_WARNINGS, builtin_family
from tokview.export.trainers import section
from tokview.store import Store

if TYPE_CHECKING:
    from tokview.core.record import Capture
    from tokview.export.writer import ExportResult


def builtin_template_warning(fmt: ExportFormat, template_name: str | None, family: str = "kimi") -> str:
    """The warning against SpecForge's built-in templates of the family (Kimi's, Qwen3's), ending with what this
    export offers instead: only a format with the template sidecar writes a template to register (the speculators
    manifest told its reader to register one that was never written)."""
    warning = BUILTIN_WARNINGS[family]
    if template_name:
        return f"{warning} Register {template_name}, written beside this file."
    if fmt.rows is Rows.IDS:
        return (
            f"{warning} This file needs no template: set data.prompts_path to it (input_ids and loss_mask as served)."
        )
    writer = next(f.name for f in FORMATS.values() if f.writes_template)
    return f"{warning} export --format {writer} writes a template to register (a .specforge_template.json)."


def unfit_warning(unfit: Counter[str]) -> str:
    """What the exported rows no default selection takes are (`Provenance.unfit`), in one sentence."""
    said = {
        "cut_by_max_tokens": ("was", "were", "cut by max tokens"),
        "with_error_findings": ("has", "have", "other error findings"),
        "rejected": ("was", "were", "rejected by a reviewer"),
    }
    parts = [f"{unfit[k]} {one if unfit[k] == 1 else many} {what}" for k, (one, many, what) in said.items() if unfit[k]]
    return f"of the exported rows, {', '.join(parts)}: a trainer learns from them as from the rest (--select valid leaves them out)"


class Provenance:
    """Servers, settings, parsers and runs seen across the exported samples."""

    def __init__(self) -> None:
        self.servers: set[tuple[str | None, str | None, str | None]] = set()
        self.settings: dict[str, dict[str, Any]] = {}
        self.fields: set[str] = set()
        self.endpoints: set[str] = set()
        self.runs: set[str] = set()
        self.finish: Counter[str] = Counter()
        self.kwargs: dict[str, dict[str, Any]] = {}
        self.unfit: Counter[str] = Counter()
        """Exported rows no default selection would take (`--select all`): error findings, cut by max tokens,
        rejected by a reviewer. The manifest only counted finish reasons, and nothing said it."""

    def add(self, row: dict[str, Any], capture: Capture, kwargs: dict[str, Any]) -> None:
        self.kwargs[json.dumps(kwargs, sort_keys=True, default=str)] = kwargs
        self.servers.add((capture.server_kind, capture.server_version, capture.server_url))
        shared = {k: v for k, v in capture.settings.items() if k != "chain"}  # a chain turn's own record, not a setting
        self.settings[json.dumps(shared, sort_keys=True, default=str)] = shared
        if capture.reasoning_field:
            self.fields.add(capture.reasoning_field)
        self.endpoints.add(capture.endpoint)
        if row["run_id"]:
            self.runs.add(row["run_id"])
        self.finish[str(capture.finish_reason)] += 1
        if "truncated" in (row.get("codes") or ()):  # cut mid-turn (a whole turn that ends at the limit is not)
            self.unfit["cut_by_max_tokens"] += 1
        elif row.get("valid") is False:  # counted once: `truncated` is an error finding too
            self.unfit["with_error_findings"] += 1
        if row.get("status") == "rejected":
            self.unfit["rejected"] += 1


def build_manifest(store: Store, fmt: ExportFormat, plan: Plan, result: ExportResult) -> dict[str, Any]:
    seen, profiles, tokenizer = result.seen, result.profiles, result.tokenizer
    assert seen is not None, "the writer fills in what it saw before the manifest is built"
    assert profiles is not None, "the writer fills in the profiles before the manifest is built"
    assert tokenizer is not None, "the writer fills in the tokenizer before the manifest is built"
    runs = [r for r in store.runs() if r["run_id"] in seen.runs]
    used = sorted({p.name for p in profiles.cache.values()})
    parsers = sorted({p.reasoning_parser for p in profiles.cache.values() if p.reasoning_parser})
    tool_parsers = sorted({p.tool_calls.parser for p in profiles.cache.values() if p.tool_calls is not None})
    fingerprint = tokenizer.fingerprint()
    family = builtin_family(used)
    template_name = result.template_path.name if result.template_path else None
    warnings = [builtin_template_warning(fmt, template_name, family)] if family and fmt.uses_template else []
    if result.template_refused and fmt.uses_template:
        warnings.append(
            f"no SpecForge ChatTemplate can express the served layout ({result.template_refused}): "
            "train on the speculators export through data.prompts_path"
        )
    if result.lengths is not None:
        warnings += result.lengths.warnings()
    if seen.unfit and result.select == "all":  # asked for (--include-invalid): counted, not warned of
        warnings.append(unfit_warning(seen.unfit))
    if result.row_shapes and not result.row_shapes["fits"]:
        warnings.append(
            f"the rows of every shape take {result.row_shapes['front_bytes']} bytes, more than the "
            f"{result.row_shapes['loader_read_bytes']} a JSON loader's first read fixes the columns from: "
            "datasets.load_dataset('json') may fail on a later row; export the runs apart (--run)"
        )
    counts = {
        "selected": result.selected,
        "exported": result.exported,
        "refused": sum(result.refused.values()),
        "refused_by_reason": result.refused,
        "refused_examples": result.refused_examples,
        "finish_reason": dict(sorted(seen.finish.items())),
        "retokenize_drift": result.retokenize_drift,
    }
    if seen.unfit:
        counts["unfit"] = dict(sorted(seen.unfit.items()))
    if result.left_out:
        counts["left_out"] = result.left_out
    if result.by_tag or result.tag_selection:
        counts["by_tag"] = result.by_tag
    return {
        "tokview_export": 2,
        "format": fmt.name,
        "data": plan.name,
        "data_sha256": result.data_sha256,
        "data_bytes": result.data_bytes,
        "token_freq": result.token_freq_path.name if result.token_freq_path else None,
        **({"specforge_template": template_name} if template_name else {}),
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "select": result.select,
        **({"include_invalid": True} if result.include_invalid else {}),
        "run": result.run,
        **({"tags": result.tag_selection} if result.tag_selection else {}),
        "counts": counts,
        **({"row_shapes": result.row_shapes} if result.row_shapes else {}),
        "tokenizer": {
            "source": tokenizer.name,
            "hash": fingerprint,
            "chat_template_hash": tokenizer.template_hash(),
            "loaded_by": getattr(tokenizer, "loaded_by", None),
            "matches_runs": all(r["tokenizer_hash"] in (None, fingerprint) for r in runs),
        },
        "profile": used[0] if len(used) == 1 else used,
        "servers": [{"kind": k, "version": v, "url": u} for k, v, u in sorted(seen.servers, key=str)],
        "endpoints": sorted(seen.endpoints, key=str),  # a hand-edited row's NULL among them
        "parser": {
            "reasoning_parser": parsers[0] if len(parsers) == 1 else parsers,
            "tool_call_parser": tool_parsers[0] if len(tool_parsers) == 1 else tool_parsers,
            "reasoning_fields": sorted(seen.fields),
        },
        "sampling": [seen.settings[k] for k in sorted(seen.settings)],
        "chat_template_kwargs": [seen.kwargs[k] for k in sorted(seen.kwargs)],
        "runs": [
            {
                k: r[k]
                for k in ("run_id", "profile", "tokenizer_hash", "template_hash", "server_info", "settings", "source")
            }
            for r in runs
        ],
        "loss_mask": fmt.loss_mask,
        "trainers": section(
            fmt,
            data_name=plan.name,
            template_name=template_name,
            kwargs=[seen.kwargs[k] for k in sorted(seen.kwargs)],
            retokenize_drift=result.retokenize_drift,
            exported=result.exported,
            lengths=result.lengths,
            family=family,
        ),
        "max_length": result.lengths.summary() if result.lengths is not None else {},
        "rerender": result.conformance.summary() if result.conformance else {},
        "warnings": warnings,
    }
