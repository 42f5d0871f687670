"""Write a selection of stored samples in one trainer's format, with a manifest and token counts.

Every export leaves three things beside each other: the data, `<name>.manifest.json` (tokenizer and
chat-template hashes, profile, servers, parser, sampling settings, counts: the provenance a
drafter run needs), and `<name>.token_freq.json` ({output id: count} over the exported output ids,
for draft-vocabulary selection). A sample whose loss mask has no 1 is refused and counted.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokview.core import segments as seg
from tokview.core.finding_context import Vocabulary, vocabulary_of
from tokview.core.findings import ERROR, default_severity, unknown_alternatives
from tokview.core.json_value import strict_json_line
from tokview.core.profiles import ModelProfile, ProfileError, detect_profile, get_profile, with_tokenizer_stops
from tokview.core.record import Capture
from tokview.core.tokenizer import TokenizerAdapter
from tokview.errors import describe_error
from tokview.export import rerender as rr
from tokview.export.export_error import ExportError
from tokview.export.formats import ExportItem, Refused, row_ids
from tokview.export.manifest import Provenance, build_manifest
from tokview.export.output import (
    OutputError,
    Plan,
    add_sidecar,
    clean_stale_partials,
    commit,
    discard_temps,
    forget_sidecar,
    make_temps,
    open_stream,
    plan_output,
    refuse_another_exports_sidecars,
)
from tokview.export.registry import (
    ERRORS,
    EVERY_SIDECAR,
    MANIFEST,
    TEMPLATE,
    TOKEN_FREQ,
    ExportFormat,
    Rows,
    export_format,
)
from tokview.export.row_shapes import RowShapes, move_exemplars_first, shapes_section
from tokview.export.side_fields import thresholds_manifest
from tokview.export.specforge_template import TemplateChooser, TemplateRefused, served_kwargs
from tokview.export.trainers import Conformance, Lengths
from tokview.secrets import scrub, scrub_optional
from tokview.store import Store, export_rows
from tokview.store.export_rows import SELECTIONS, SampleKey, Selection, normal_tags
from tokview.store.sample_rows import capture_from_row
from tokview.store.store import is_duckdb_file

CHUNK = 256
UNKNOWN_ID = "unknown_token_id"


REFUSED_NAMED = 20
"""Sample ids named per refusal reason in the manifest (`refused_examples`)."""


@dataclass
class ExportResult:
    out: Path
    manifest_path: Path | None
    token_freq_path: Path | None
    selected: int
    exported: int
    refused: dict[str, int] = field(default_factory=dict)
    refused_examples: dict[str, list[str]] = field(default_factory=dict)
    """The first REFUSED_NAMED sample ids refused for each reason (counted only, they had to be found by a diff)."""
    manifest: dict[str, Any] = field(default_factory=dict)
    left_out: dict[str, Any] = field(default_factory=dict)
    """`--select approved`: approved samples not exported because they are invalid (count, by reason)."""
    retokenize_drift: int = 0
    """Exported samples whose output ids are not the tokenizer's encoding of their text."""
    template_path: Path | None = None
    errors_path: Path | None = None
    """speculators' `<name>.errors.jsonl` (the failed requests), when written."""
    data_sha256: str | None = None
    data_bytes: int | None = None
    conformance: Conformance | None = None
    lengths: Lengths | None = None
    """`trainers.Lengths` of the exported rows: the longest, and the rows each trainer's default would cut."""
    template: dict[str, Any] | None = None
    template_refused: str | None = None
    freq: Counter[int] = field(default_factory=Counter)
    seen: Provenance | None = None
    profiles: _Profiles | None = None
    select: str = ""
    include_invalid: bool = False
    """`--select approved --include-invalid`: approved samples with error findings are in (the manifest says so)."""
    run: str | None = None
    tokenizer: TokenizerAdapter | None = None
    thresholds: dict[str, Any] | None = None
    """--max-acceptance / --max-nll and what they left out (the manifest records them)."""
    tag_selection: dict[str, list[str]] | None = None
    """--tag / --without-tag as compared (lower case), when given."""
    by_tag: dict[str, int] = field(default_factory=dict)
    """How many exported samples carry each tag (lower case)."""
    table_section: dict[str, Any] = field(default_factory=dict)
    """What a table writer reports for the manifest (`trajectory`: conversations, rows, splits)."""
    row_shapes: dict[str, Any] = field(default_factory=dict)
    """Rows moved to the front of a JSONL file so a trainer's JSON loader sees every row shape in its first read
    (`export.row_shapes`), when any was."""
    late_in_stream: int = 0
    """Rows of a streamed export (`--out -`, a FIFO) whose shape first appears past a JSON loader's first read: a
    stream cannot be reordered, so its summary warns that `datasets.load_dataset('json')` fails on what it wrote."""


def sidecar(out: Path, suffix: str) -> Path:
    """Where the export writes `<stem>.<suffix>` for data file `out` (Parquet keeps its full name)."""
    name = out.name
    stem = name if name.lower().endswith(".parquet") else (name[: -len(out.suffix)] if out.suffix else name)
    return out.with_name(f"{stem}.{suffix}")


def selected_ids(
    store: Store, selection: Selection, *, include_invalid: bool = False
) -> tuple[list[SampleKey], dict[str, Any]]:
    """((sample_id, prompt_id, turn, gen_index, run_id) in export order, what was left out and why).

    `approved` exports approved samples that are also valid: a person's approval does not make a
    truncated or broken sample trainable unless `include_invalid` says so; the ones left out are
    counted by their error codes.
    """
    if selection.select not in SELECTIONS:
        raise ExportError(f"unknown selection {selection.select!r} (choose from {', '.join(SELECTIONS)})")
    left_out: dict[str, Any] = {}
    valid_only = _valid_only(selection, include_invalid)
    if valid_only:
        bad = export_rows.invalid_codes(store, selection)
        if bad:
            reasons: Counter[str] = Counter()
            for codes in bad:
                reasons.update([c for c in codes if default_severity(c) == ERROR] or ["invalid"])
            left_out = {"invalid": len(bad), "by_reason": dict(sorted(reasons.items()))}
            never = sum(UNKNOWN_ID in codes for codes in bad)  # refused whatever the flags (`_outside`)
            if never:
                left_out["never_exported"] = never
    return export_rows.selected_keys(store, selection, valid_only=valid_only), left_out


class _Profiles:
    """The profile each sample was analysed with, by name, with one fallback for unknown names."""

    def __init__(self, default: ModelProfile | None, tokenizer: TokenizerAdapter, *, override: bool = False) -> None:
        self.default, self.tokenizer, self.override = default, tokenizer, override
        self.cache: dict[str | None, ModelProfile] = {}

    def get(self, name: str | None) -> ModelProfile:
        if self.override and self.default is not None:  # `--profile` named on the command line: every sample's
            self.cache[name] = self.default
            return self.default
        if self.default is not None and name == self.default.name:  # the run's own (a .toml profile) or --profile
            self.cache[name] = self.default
        if name not in self.cache:
            try:
                # `plain` stored by name names no stop ids: the tokenizer's, or the stop would be answer text
                self.cache[name] = with_tokenizer_stops(get_profile(name), self.tokenizer) if name else self._fallback()
            except ProfileError:
                self.cache[name] = self._fallback()
        return self.cache[name]

    def _fallback(self) -> ModelProfile:
        if self.default is None:
            self.default = detect_profile(self.tokenizer)
        return self.default


def export(
    store: Store,
    fmt: str,
    out: str | Path,
    *,
    select: str = "valid",
    run: str | None = None,
    tokenizer: TokenizerAdapter,
    profile: ModelProfile | None = None,
    include_invalid: bool = False,
    max_acceptance: float | None = None,
    max_nll: float | None = None,
    tags: Sequence[str] = (),
    without_tags: Sequence[str] = (),
    profile_override: bool = False,
) -> ExportResult:
    """Write the selected samples in the format named `fmt` with its sidecars; ExportError (one line) when it
    cannot. `tags`: only samples carrying every one; `without_tags`: none carrying any (without case).
    `profile`: the rules of samples whose stored profile is unknown, or of every sample with `profile_override`
    (`--profile` named on the command line)."""
    form = export_format(fmt)
    form.check_out_name(out)
    selection = Selection(select, run, max_acceptance, max_nll, _tags(tags), _tags(without_tags))
    try:
        plan = plan_output(out, f"train.{form.file.suffix}")
        ids, left_out = selected_ids(store, selection, include_invalid=include_invalid)
        thresholds = thresholds_manifest(store, selection)
        if not ids:
            raise ExportError(
                f"no samples match {_selection_text(selection)}"
                + (f" ({_left_out_text(left_out)})" if left_out else "")
                + thresholds_text(thresholds)
            )
        for side in form.sidecars:
            add_sidecar(plan, side.key, side.suffix)
        for side in EVERY_SIDECAR:
            if side not in form.sidecars:
                forget_sidecar(plan, side.suffix)
        _refuse_the_store(plan, Path(store.path))
        _refuse_a_prompts_file(plan, store)
        refuse_another_exports_sidecars(plan)
    except OutputError as exc:
        raise ExportError(str(exc)) from None
    clean_stale_partials(plan)
    # Every file is written beside its final name and renamed at the end (sidecars first, data last),
    # so a failed or killed export never leaves a half-written file, or new data beside an old
    # manifest, under the names a trainer reads; the temp files go either way.
    make_temps(plan)
    try:
        result = _export_to(
            store,
            form,
            plan=plan,
            ids=ids,
            select=select,
            run=run,
            tokenizer=tokenizer,
            profile=profile,
            profile_override=profile_override,
            still_selected=_still_selected(selection, include_invalid),
        )
        if result.exported == 0:  # a trainer would read an empty file as data: the file there stays as it was
            refused = ", ".join(f"{n} {why}" for why, n in result.refused.items()) or "none"
            raise ExportError(
                f"every one of the {result.selected} selected samples was refused (refused: {refused}): nothing "
                "written, no file replaced"
            )
        result.left_out = left_out
        result.thresholds = thresholds
        result.include_invalid = include_invalid and selection.select == "approved"
        result.tag_selection = (
            {"with": list(selection.tags), "without": list(selection.without_tags)}
            if selection.tags or selection.without_tags
            else None
        )
        _write_sidecars(store, form, plan, run, result)
        commit(plan)
    except BrokenPipeError:  # `export --out - | head`: the reader has what it wanted (exit 141, like stats)
        raise
    except OSError as exc:  # a full disk, a folder gone mid-export: nothing half-written is left
        raise ExportError(
            f"cannot write {plan.data.final if plan.data else 'the export'}: {describe_error(exc)}"
        ) from None
    finally:
        discard_temps(plan)
    return result


def _refuse_the_store(plan: Plan, db: Path) -> None:
    """An export that would replace a store: the one it reads, or any other DuckDB database (its file,
    WAL or parts), through any name or link. A store is months of curated samples; a trainer's file is
    remade in seconds."""
    store = Path(os.path.realpath(db))
    own = {store, store.with_name(store.name + ".wal")}
    parts = store.with_name(store.name + ".parts")
    finals = [Path(os.path.realpath(t.final)) for t in plan.targets()]
    fd = plan.descriptor
    if fd is not None:  # `--out /dev/fd/N`: the file the descriptor has open (this process's own store, maybe)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                fd = None
        except OSError:
            raise OutputError(f"--out {plan.name}: descriptor {fd} is not open") from None
        if fd is not None:
            finals.append(Path(os.path.realpath(f"/proc/self/fd/{fd}")))
    for final in finals:
        if final in own:
            raise OutputError(f"--out {plan.name} would overwrite the store it exports ({db}): choose another file")
        if final == parts or parts in final.parents:  # its landing would read the file as a part, or remove it;
            raise OutputError(  # a file at the folder's own name would fail every later batch (its parts go there)
                f"--out {final} is the parts folder of the store it exports, or inside it ({parts}): choose another "
                "file"
            )
        other = _database_behind(final)
        if other is not None:
            raise OutputError(
                f"--out {plan.name}: {final} {other}: refusing to overwrite it (a tokview store?); choose another file"
            )


def _refuse_a_prompts_file(plan: Plan, store: Store) -> None:
    """An export onto the prompts file a run of this store was generated from (its recorded `source`): `--out
    prompts.jsonl` replaced 1,200 prompts with the 30 samples exported so far, and the run could not go on."""
    finals = {Path(os.path.realpath(t.final)) for t in plan.targets()}
    for run in store.runs():
        source = run.get("source")
        if not isinstance(source, str) or "://" in source or not source.strip():
            continue
        if Path(os.path.realpath(source)) in finals:
            raise OutputError(
                f"--out {plan.name} is the prompts file run {run['run_id']} was generated from ({source}): "
                "choose another file"
            )


def _database_behind(path: Path) -> str | None:
    """What DuckDB database `path` would overwrite ("is a DuckDB database", "is the WAL of …"), else None."""
    if is_duckdb_file(path):
        return "is a DuckDB database"
    if path.name.endswith(".wal") and is_duckdb_file(path.with_name(path.name[: -len(".wal")])):
        return f"is the write-ahead log of the DuckDB database {path.with_name(path.name[: -len('.wal')])}"
    for folder in (path, *path.parents):  # the folder's own name too: a file there fails that store's batches
        if folder.name.endswith(".parts") and is_duckdb_file(folder.with_name(folder.name[: -len(".parts")])):
            where = "is the parts folder" if folder == path else "is in the parts folder"
            return f"{where} of the DuckDB database {folder.with_name(folder.name[: -len('.parts')])}"
    return None


def _valid_only(selection: Selection, include_invalid: bool) -> bool:
    """`approved` exports the approved samples that are also valid, unless `--include-invalid`."""
    return selection.select == "approved" and not include_invalid


def _still_selected(selection: Selection, include_invalid: bool) -> tuple[str, list[Any]]:
    """The clause `selected_ids` picked the samples by, to check again as rows are read."""
    return selection.where(valid_only=_valid_only(selection, include_invalid))


def _tags(tags: Sequence[str]) -> tuple[str, ...]:
    """`--tag` values as the selection compares them; ExportError for an empty one (it would match nothing)."""
    normal = normal_tags(tags)
    if "" in normal:
        raise ExportError("a tag cannot be empty (--tag / --without-tag)")
    return normal


def _selection_text(selection: Selection) -> str:
    """The selection as the flags that ask for it: `--select all --run r1 --tag hard --max-nll 2`."""
    flags = [f"--select {selection.select}"]
    flags += [f"--run {selection.run}"] if selection.run else []
    flags += [f"--tag {t}" for t in selection.tags] + [f"--without-tag {t}" for t in selection.without_tags]
    flags += [
        f"--{k.replace('_', '-')} {v:g}"
        for k, v in (("max_acceptance", selection.max_acceptance), ("max_nll", selection.max_nll))
        if v is not None
    ]
    return " ".join(flags)


def _left_out_text(left_out: dict[str, Any]) -> str:
    reasons = ", ".join(f"{n} {code}" for code, n in left_out.get("by_reason", {}).items())
    return (
        f"left out {left_out['invalid']} approved but invalid samples"
        + (f": {reasons}" if reasons else "")
        + f"; --include-invalid exports them{include_invalid_caveat(left_out)}"
    )


def include_invalid_caveat(left_out: dict[str, Any]) -> str:
    """What `--include-invalid` still leaves out: a sample with an id outside the vocabulary is never exported."""
    never = left_out.get("never_exported", 0)
    return f" but the {never} with {UNKNOWN_ID} (an id outside the vocabulary is never exported)" if never else ""


class _Sink:
    """The data's destination: the temp file of a regular --out, or the stream (-, FIFO, device)."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.digest = hashlib.sha256()
        self.size = 0
        self.fh = open(plan.data.temp, "wb") if plan.data else open_stream(plan)  # noqa: SIM115 (closed by finish/abort)
        self.shapes = RowShapes()  # a stream cannot be reordered: noted still, to warn (`late_in_stream`)

    def write(self, record: dict[str, Any]) -> None:
        data = strict_json_line(record)
        self.digest.update(data)
        self.size += len(data)
        self.fh.write(data)
        self.shapes.note(record, len(data))

    def close(self) -> None:
        self.fh.close()


def _export_to(
    store: Store,
    fmt: ExportFormat,
    *,
    plan: Plan,
    ids: list[SampleKey],
    select: str,
    run: str | None,
    tokenizer: TokenizerAdapter,
    profile: ModelProfile | None,
    profile_override: bool = False,
    still_selected: tuple[str, list[Any]] | None = None,
) -> ExportResult:
    """`still_selected`: the selection's clause, checked again as each chunk of rows is read (a review committed
    while the export runs: another process may write between chunks, and a sample rejected after the ids were
    picked was exported under `--select approved`)."""
    profiles = _Profiles(profile, tokenizer, override=profile_override)
    freq: Counter[int] = Counter()
    refused: Counter[str] = Counter()
    examples: dict[str, list[str]] = {}

    def refuse(reason: str, sample_id: str) -> None:
        refused[reason] += 1
        named = examples.setdefault(reason, [])
        if len(named) < REFUSED_NAMED:
            named.append(sample_id)

    seen = Provenance()
    exported: list[tuple[str, str]] = []
    drift = 0
    builder = fmt.build_row
    chooser = _choose_template(store, fmt, ids, profiles, tokenizer)
    template = chooser.template if chooser else None
    conformance = Conformance(fmt.rerender, tokenizer, template)
    lengths = Lengths()
    table_section: dict[str, Any] = {}
    made: Any = None  # what a table writer made (TableWriter)
    row_id_of = dict(
        zip(
            (i.sample_id for i in ids),
            row_ids(
                [(i.prompt_id, i.run_id, i.turn, i.gen_index, i.sample_id) for i in ids], gen0=fmt.rows is Rows.IDS
            ),
        )
    )
    if fmt.preflight is not None:  # before anything is written (or a FIFO's reader is woken)
        for name in export_rows.profile_names(store, [i.sample_id for i in ids]):
            fmt.preflight(tokenizer, profiles.get(name))
    sink = _Sink(plan) if builder is not None else None
    vocabulary = vocabulary_of(tokenizer)
    try:
        for start in range(0, len(ids), CHUNK):
            chunk = [i.sample_id for i in ids[start : start + CHUNK]]
            rows = store.rows_for(chunk, still_selected)  # a sample reviewed otherwise since it was selected: not read
            if len(rows) < len(chunk):
                refused["no_longer_selected"] += len(chunk) - len(rows)
            for row in rows:
                if not row["output_ids"]:  # the loss mask (1 per output id) would be all 0
                    refuse("no_supervised_tokens", row["sample_id"])
                    continue
                capture = capture_from_row(row)
                if _outside(vocabulary, capture):
                    # whatever --select: a trainer's embedding lookup fails
                    refuse("ids_outside_vocabulary", row["sample_id"])
                    continue
                prof = profiles.get(row["profile"])
                item = ExportItem(
                    row["sample_id"],
                    row["prompt_id"],
                    capture,
                    row["turn"],
                    row["gen_index"],
                    row_id_of[row["sample_id"]],
                )
                if builder is not None and sink is not None:  # row by row (a table format is written below)
                    try:
                        if chooser is not None and fmt.writes_template:  # rows are masked by that one template
                            chooser.check(chooser.layout(capture.settings, prof))
                        record = builder(item, prof, tokenizer)
                    except Refused as why:
                        refuse(why.reason, row["sample_id"])
                        continue
                    if conformance.paths():
                        mask = record.get("loss_mask") or seg.loss_mask(capture.prompt_ids, capture.output_ids)
                        conformance.check(
                            record, rr.Rendered(capture.input_ids, mask), served_kwargs(capture.settings, prof)
                        )
                    sink.write(record)
                exported.append((row["sample_id"], row_id_of[row["sample_id"]]))
                drift += _tally(row, capture, prof, freq, lengths, seen)
        if fmt.write_table is not None:
            # A table is read again when it is written, after every chunk was checked: a sample reviewed otherwise
            # in between (the loop's whole length for the first chunk) is left out here, and the tallies made again.
            kept = export_rows.still_selected(store, [e[0] for e in exported], still_selected)
            if len(kept) < len(exported):
                refused["no_longer_selected"] += len(exported) - len(kept)
                exported = [e for e in exported if e[0] in kept]
                freq, lengths, seen, drift = Counter(), Lengths(), Provenance(), 0
                for start in range(0, len(exported), CHUNK):
                    for row in store.rows_for([e[0] for e in exported[start : start + CHUNK]]):
                        capture = capture_from_row(row)
                        drift += _tally(row, capture, profiles.get(row["profile"]), freq, lengths, seen)
            made = fmt.write_table(store, exported, plan, profiles.get)
            if hasattr(made, "section"):  # rows that are not one per sample (trajectory): their own lengths
                table_section = {fmt.name: made.section()}
                lengths = Lengths()
                for n in made.row_lengths:
                    lengths.add(n)
    finally:
        if sink is not None:
            sink.close()
    result = ExportResult(
        plan.data.final if plan.data else Path(plan.name),
        _final(plan, MANIFEST.key),
        _final(plan, TOKEN_FREQ.key),
        len(ids),
        len(exported),
        dict(sorted(refused.items())),
        {k: examples[k] for k in sorted(examples)},
    )
    result.freq, result.seen, result.profiles, result.select, result.run = freq, seen, profiles, select, run
    result.tokenizer, result.retokenize_drift, result.conformance = tokenizer, drift, conformance
    result.lengths = lengths
    result.table_section = table_section
    result.by_tag = export_rows.tag_counts(store, [e[0] for e in exported])
    result.template = template
    result.template_refused = chooser.refused if chooser else None
    shapes = sink.shapes if sink is not None else getattr(made, "shapes", None)
    if plan.data is not None and shapes is not None and shapes.late_exemplars():
        result.row_shapes = shapes_section(move_exemplars_first(plan.data.temp, shapes), shapes)
        sink = None  # the file was rewritten: hashed below
    elif shapes is not None and shapes.late_exemplars():  # a stream: what a file would have had moved, said
        result.late_in_stream = shapes.late_count()
    if sink is not None:
        result.data_sha256, result.data_bytes = sink.digest.hexdigest(), sink.size
    elif plan.data is not None:
        result.data_sha256, result.data_bytes = _file_hash(plan.data.temp)
    return result


def _tally(
    row: dict[str, Any], capture: Capture, prof: ModelProfile, freq: Counter[int], lengths: Lengths, seen: Provenance
) -> int:
    """Count one exported sample into the manifest's tallies; 1 when it holds `retokenize_drift`."""
    lengths.add(len(capture.prompt_ids) + len(capture.output_ids))
    freq.update(capture.output_ids)
    seen.add(row, capture, served_kwargs(capture.settings, prof))
    return int("retokenize_drift" in (row.get("codes") or []))


def _final(plan: Plan, key: str) -> Path | None:
    target = plan.sidecars.get(key)
    return target.final if target else None


def _file_hash(path: Path) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def _settings_or_empty(text: str | None) -> dict[str, Any]:
    """A row's stored settings for the template's layout; {} for a damaged one (its sample is named when it is read)."""
    try:
        settings = json.loads(text) if text else {}
    except ValueError:
        return {}
    return settings if isinstance(settings, dict) else {}


def _choose_template(
    store: Store, fmt: ExportFormat, ids: list[SampleKey], profiles: _Profiles, tokenizer: TokenizerAdapter
) -> TemplateChooser | None:
    """Derive the ChatTemplate from the served layouts (a format that writes it: refuse when none fits)."""
    if not fmt.uses_template:
        return None
    chooser = TemplateChooser(tokenizer)
    for settings, prof, n in export_rows.served_layouts(store, [i.sample_id for i in ids]):
        chooser.count(chooser.layout(_settings_or_empty(settings), profiles.get(prof)), n)
    try:
        chooser.template = chooser.choose()
    except TemplateRefused as exc:
        if fmt.writes_template:
            raise ExportError(
                f"--format {fmt.name} refused: no SpecForge ChatTemplate can express the served "
                f"layout: {exc}; use --format speculators (token-exact)"
            ) from None
        chooser.refused = str(exc)
    return chooser


def _write_sidecars(store: Store, fmt: ExportFormat, plan: Plan, run: str | None, result: ExportResult) -> None:
    """Token counts, errors, SpecForge template and manifest, into their temp files (committed later)."""
    if TOKEN_FREQ.key in plan.sidecars:
        with open(plan.sidecars[TOKEN_FREQ.key].temp, "w", encoding="utf-8") as fh:
            json.dump({str(t): n for t, n in sorted(result.freq.items())}, fh)
    if ERRORS.key in plan.sidecars:
        _write_errors(store, run, plan.sidecars[ERRORS.key].temp)
        result.errors_path = plan.sidecars[ERRORS.key].final
    if TEMPLATE.key in plan.sidecars:
        with open(plan.sidecars[TEMPLATE.key].temp, "w", encoding="utf-8") as fh:
            json.dump(result.template, fh, indent=2, ensure_ascii=False)
        result.template_path = plan.sidecars[TEMPLATE.key].final
    result.manifest = scrub(build_manifest(store, fmt, plan, result))
    if result.thresholds:  # --max-acceptance / --max-nll and what they left out
        result.manifest["thresholds"] = result.thresholds
    result.manifest.update(result.table_section)
    if MANIFEST.key in plan.sidecars:
        with open(plan.sidecars[MANIFEST.key].temp, "w", encoding="utf-8") as fh:
            json.dump(result.manifest, fh, indent=2, ensure_ascii=False, default=str)


def thresholds_text(thresholds: dict[str, Any] | None) -> str:
    """What the thresholds left out, and why: `--max-nll` on a store never scored matched nothing, and said only that
    (and the summary of an export that wrote some rows said nothing of the rest)."""
    if not thresholds:
        return ""
    said = {
        "left_out_not_scored": "with no target score (run `tokview score` first)",
        "left_out_above_max_nll": "above --max-nll",
        "left_out_no_spec_decode": "with no acceptance length (served without speculative decoding metrics)",
        "left_out_above_max_acceptance": "above --max-acceptance",
    }
    parts = [f"{thresholds[k]} {why}" for k, why in said.items() if thresholds.get(k)]
    return f"; of the samples before the thresholds: {', '.join(parts)}" if parts else ""


def _write_errors(store: Store, run: str | None, path: Path) -> None:
    """speculators' `<name>.errors.jsonl`: the requests that failed (not samples, never exported)."""
    with open(path, "w", encoding="utf-8") as fh:
        for failure in store.failures(run):
            fh.write(
                json.dumps(
                    {
                        "id": failure["prompt_id"],
                        "metadata": {
                            "sample_id": failure["sample_id"],
                            "error": scrub_optional(failure["reason"]),
                            "endpoint": scrub_optional(failure["server"]),
                        },
                    }
                )
                + "\n"
            )


def _outside(vocabulary: Vocabulary, capture: Capture) -> bool:
    """Whether the sample's ids hold one the export's tokenizer does not have (`--select all` selects
    `unknown_token_id` samples too, and a trainer's embedding lookup fails on such an id or reads junk): its prompt
    and output ids, and the top-K alternatives a distillation trainer indexes its logits by (the served ones and a
    scoring target's, which no analysis saw)."""
    if vocabulary.unknown_positions(capture.prompt_ids) or vocabulary.unknown_positions(capture.output_ids):
        return True
    return any(unknown_alternatives(vocabulary, tops) for tops in (capture.output_top_ids, capture.target_top_ids))
