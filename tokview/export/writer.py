"""Write a selection of stored samples in one trainer's format, with a manifest and token counts.

Every export leaves three things beside each other: the data, `<name>.manifest.json` (tokenizer and
chat-template hashes, profile, servers, parser, sampling settings, counts: the provenance a
drafter run needs), and `<name>.token_freq.json` ({output id: count} over the exported output ids,
for draft-vocabulary selection). A sample whose loss mask has no 1 is refused and counted.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tokview.core.profiles import ModelProfile, ProfileError, detect_profile, get_profile, with_tokenizer_stops
from tokview.export.formats import FORMATS, JSONL_FORMATS, ExportItem, Refused
from tokview.store import Store
from tokview.store.records import capture_from_row, scrub, scrub_optional

SELECTIONS = {"valid": "valid AND status <> 'rejected'", "approved": "status = 'approved'", "all": "true"}
CHUNK = 256


class ExportError(ValueError):
    """The export cannot be made (unknown format, nothing selected, unwritable path)."""


@dataclass
class ExportResult:
    out: Path
    manifest_path: Path
    token_freq_path: Path
    selected: int
    exported: int
    refused: dict[str, int] = field(default_factory=dict)
    manifest: dict[str, Any] = field(default_factory=dict)


def sidecar(out: Path, suffix: str) -> Path:
    stem = out.name[: -len(out.suffix)] if out.suffix else out.name
    return out.with_name(f"{stem}.{suffix}")


def selected_ids(store: Store, select: str, run: str | None) -> list[tuple[str, str, int | None, int | None]]:
    """(sample_id, prompt_id, turn, gen_index) in export order: by prompt, then turn, then index."""
    if select not in SELECTIONS:
        raise ExportError(f"unknown selection {select!r} (choose from {', '.join(SELECTIONS)})")
    where, params = SELECTIONS[select], []
    if run is not None:
        where += " AND run_id = ?"
        params.append(run)
    return [tuple(r) for r in store.query(
        f"SELECT sample_id, prompt_id, turn, gen_index FROM samples WHERE {where} "
        "ORDER BY prompt_id, coalesce(turn, -1), coalesce(gen_index, 0), run_id, sample_id", params)]


class _Profiles:
    """The profile each sample was analysed with, by name, with one fallback for unknown names."""

    def __init__(self, default: ModelProfile | None, tokenizer: Any) -> None:
        self.default, self.tokenizer, self.cache = default, tokenizer, {}

    def get(self, name: str | None) -> ModelProfile:
        if name not in self.cache:
            try:
                # `plain` stored by name names no stop ids: the tokenizer's, or the stop would be answer text
                self.cache[name] = with_tokenizer_stops(get_profile(name), self.tokenizer) if name else \
                    self._fallback()
            except ProfileError:
                self.cache[name] = self._fallback()
        return self.cache[name]

    def _fallback(self) -> ModelProfile:
        if self.default is None:
            self.default = detect_profile(self.tokenizer)
        return self.default


def export(store: Store, fmt: str, out: str | Path, *, select: str = "valid", run: str | None = None,
           tokenizer: Any, profile: ModelProfile | None = None) -> ExportResult:
    if fmt not in FORMATS:
        raise ExportError(f"unknown format {fmt!r} (choose from {', '.join(FORMATS)})")
    out = Path(out)
    if out.is_dir():
        raise ExportError(f"--out {out} is a directory: give a file name (e.g. {out / ('train.' + _suffix(fmt))})")
    ids = selected_ids(store, select, run)
    if not ids:
        raise ExportError(f"no samples match --select {select}" + (f" --run {run}" if run else ""))
    out.parent.mkdir(parents=True, exist_ok=True)  # only once there is something to write
    # The data is written beside its final name and renamed at the end, so a failed export never
    # leaves a half-written file under the name a trainer reads; the temp file goes either way.
    fd, tmp_name = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".partial")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        result = _export_to(store, fmt, out, tmp, ids, select, run, tokenizer, profile)
    finally:
        tmp.unlink(missing_ok=True)
    return result


def _default_mode() -> int:
    """0o666 minus the umask: what `open(path, "w")` gives the manifest beside the data.

    Read from /proc where there is one: setting the umask to read it back is process-wide, and the
    UI exports from a worker thread while other threads create files."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def _suffix(fmt: str) -> str:
    return "parquet" if fmt == "parquet" else "jsonl"


def _export_to(store: Store, fmt: str, out: Path, tmp: Path, ids: list[tuple], select: str, run: str | None,
               tokenizer: Any, profile: ModelProfile | None) -> ExportResult:
    profiles = _Profiles(profile, tokenizer)
    freq: Counter[int] = Counter()
    refused: Counter[str] = Counter()
    seen = _Provenance()
    k_of: Counter[str] = Counter()
    exported: list[str] = []
    builder = JSONL_FORMATS.get(fmt)
    with (open(tmp, "w", encoding="utf-8") if builder is not None else nullcontext()) as fh:
        for start in range(0, len(ids), CHUNK):
            for row in store.rows_for([i[0] for i in ids[start:start + CHUNK]]):
                if not row["output_ids"]:  # the loss mask (1 per output id) would be all 0
                    refused["no_supervised_tokens"] += 1
                    continue
                capture = capture_from_row(row)
                item = ExportItem(row["sample_id"], row["prompt_id"], capture, row["turn"], row["gen_index"],
                                  k_of[row["prompt_id"]])
                if builder is not None:
                    try:
                        record = builder(item, profiles.get(row["profile"]), tokenizer)
                    except Refused as why:
                        refused[why.reason] += 1
                        continue
                    fh.write(json.dumps(record, ensure_ascii=False) + "\n")
                k_of[row["prompt_id"]] += 1
                exported.append(row["sample_id"])
                freq.update(capture.output_ids)
                seen.add(row, capture)
    if fmt == "parquet":
        _write_parquet(store, exported, tmp)
    os.chmod(tmp, _default_mode())  # mkstemp makes 0600; the data gets the mode any new file would
    os.replace(tmp, out)
    result = ExportResult(out, sidecar(out, "manifest.json"), sidecar(out, "token_freq.json"), len(ids),
                          len(exported), dict(sorted(refused.items())))
    with open(result.token_freq_path, "w", encoding="utf-8") as fh:
        json.dump({str(t): n for t, n in sorted(freq.items())}, fh)
    result.manifest = scrub(_manifest(store, fmt, select, run, tokenizer, profiles, seen, result))
    with open(result.manifest_path, "w", encoding="utf-8") as fh:
        json.dump(result.manifest, fh, indent=2, ensure_ascii=False, default=str)
    if fmt == "speculators":
        _write_errors(store, run, sidecar(out, "errors.jsonl"))
    return result


# The Parquet loss mask is built in SQL, 0 per prompt id and 1 per output id: the same rule as
# `core.segments.loss_mask` (tests/test_export_review.py checks every exported row against it).
PARQUET_LOSS_MASK = "list_concat([0 FOR x IN s.prompt_ids], [1 FOR x IN s.output_ids])"


def _write_parquet(store: Store, sample_ids: list[str], out: Path) -> None:
    """DuckDB's own Parquet writer, with the speculators columns plus tokview's review columns."""
    target = str(out).replace("'", "''")
    store.execute(
        "COPY (SELECT s.prompt_id || '_gen' || CAST(row_number() OVER (PARTITION BY s.prompt_id "
        "ORDER BY coalesce(s.turn, -1), coalesce(s.gen_index, 0), s.run_id, s.sample_id) - 1 AS VARCHAR) AS id, "
        "s.prompt_id AS primary_id, s.sample_id, s.run_id, s.turn, "
        "list_concat(s.prompt_ids, s.output_ids) AS input_ids, "
        f"{PARQUET_LOSS_MASK} AS loss_mask, "
        "s.prompt_len, s.output_len, s.finish_reason, s.status, s.valid, s.codes "
        "FROM samples s JOIN (SELECT unnest(?::VARCHAR[]) AS sid) q ON s.sample_id = q.sid "
        f"ORDER BY s.prompt_id, coalesce(s.turn, -1), coalesce(s.gen_index, 0), s.run_id, s.sample_id) "
        f"TO '{target}' (FORMAT parquet)", [sample_ids])


def _write_errors(store: Store, run: str | None, path: Path) -> None:
    """speculators' `<name>.errors.jsonl`: the requests that failed (not samples, never exported)."""
    where, params = ("WHERE run_id = ?", [run]) if run else ("", [])
    rows = store.query(f"SELECT prompt_id, sample_id, reason, server FROM failures {where} "
                       "ORDER BY prompt_id, sample_id, \"at\"", params)
    with open(path, "w", encoding="utf-8") as fh:
        for prompt_id, sample_id, reason, server in rows:
            fh.write(json.dumps({"id": prompt_id, "metadata": {
                "sample_id": sample_id, "error": scrub_optional(reason), "endpoint": scrub_optional(server)}}) + "\n")


class _Provenance:
    """Servers, settings, parsers and runs seen across the exported samples."""

    def __init__(self) -> None:
        self.servers: set[tuple] = set()
        self.settings: dict[str, dict] = {}
        self.fields: set[str] = set()
        self.endpoints: set[str] = set()
        self.runs: set[str] = set()
        self.finish: Counter[str] = Counter()

    def add(self, row: dict[str, Any], capture: Any) -> None:
        self.servers.add((capture.server_kind, capture.server_version, capture.server_url))
        self.settings[json.dumps(capture.settings, sort_keys=True, default=str)] = capture.settings
        if capture.reasoning_field:
            self.fields.add(capture.reasoning_field)
        self.endpoints.add(capture.endpoint)
        if row["run_id"]:
            self.runs.add(row["run_id"])
        self.finish[str(capture.finish_reason)] += 1


def _manifest(store: Store, fmt: str, select: str, run: str | None, tokenizer: Any, profiles: _Profiles,
              seen: _Provenance, result: ExportResult) -> dict[str, Any]:
    runs = [r for r in store.runs() if r["run_id"] in seen.runs]
    used = sorted({p.name for p in profiles.cache.values()})
    parsers = sorted({p.reasoning_parser for p in profiles.cache.values() if p.reasoning_parser})
    fingerprint = tokenizer.fingerprint()
    return {
        "tokview_export": 1,
        "format": fmt,
        "data": result.out.name,
        "token_freq": result.token_freq_path.name,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "select": select,
        "run": run,
        "counts": {"selected": result.selected, "exported": result.exported,
                   "refused": sum(result.refused.values()), "refused_by_reason": result.refused,
                   "finish_reason": dict(sorted(seen.finish.items()))},
        "tokenizer": {"source": tokenizer.name, "hash": fingerprint, "chat_template_hash": tokenizer.template_hash(),
                      "loaded_by": getattr(tokenizer, "loaded_by", None),
                      "matches_runs": all(r["tokenizer_hash"] in (None, fingerprint) for r in runs)},
        "profile": used[0] if len(used) == 1 else used,
        "servers": [{"kind": k, "version": v, "url": u} for k, v, u in sorted(seen.servers, key=str)],
        "endpoints": sorted(seen.endpoints),
        "parser": {"reasoning_parser": parsers[0] if len(parsers) == 1 else parsers,
                   "reasoning_fields": sorted(seen.fields)},
        "sampling": [seen.settings[k] for k in sorted(seen.settings)],
        "runs": [{k: r[k] for k in ("run_id", "profile", "tokenizer_hash", "template_hash", "server_info",
                                    "settings", "source")} for r in runs],
        "loss_mask": "0 for every prompt id, 1 for every output id (stop id included); input_ids = prompt ids + "
                     "output ids exactly as served",
        **({"trainer_hint": "set a thinking chat template and train_only_last_turn: true"}
           if fmt in ("specforge", "kimi-inline") else {}),
    }
