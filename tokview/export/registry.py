"""Every export format, declared once: how its rows are written, under which suffix, with which sidecars,
whether its rows are ids or text, which trainer paths read it and which checks run before it is written.

Why one table: the writer, the trainer paths in the manifest and the CLI all ask "what does this format
do?", and a format's name compared in each of them (the way it was) let them drift apart (a speculators
manifest told its reader to register a SpecForge template only the specforge format writes). Here each
question is a field of the format's entry, and nothing outside this module compares a format's name
(tests/test_export_registry.py checks that). A new format (trajectory rows, say) is one more entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from tokview.core.profiles import ModelProfile
from tokview.export import formats, preflight, trainers
from tokview.export.export_error import ExportError
from tokview.export.output import Plan
from tokview.export.parquet_table import write_parquet
from tokview.export.trajectory import write_trajectories
from tokview.store import Store


class Rows(Enum):
    """What a row trains on: the served ids themselves, or text a trainer tokenizes again."""

    IDS = "ids"
    """input_ids + loss_mask exactly as served (token-exact); row ids follow speculators' `{id}_gen{k}`."""
    TEXT = "text"
    """A conversation a trainer re-renders through a chat template; row ids follow SpecForge's `{id}#turn{k}`."""


@dataclass(frozen=True)
class FileKind:
    """The kind of data file a format writes."""

    label: str
    suffix: str
    """The suffix of the example name an error suggests (`train.jsonl`)."""
    suffixes: tuple[str, ...]
    """`--out` names that say this kind: another kind's format refuses them."""
    instead: str
    """What to pass to get this kind, said when an `--out` name asks for it from another kind's format."""
    hf_loader: str
    """The `datasets.load_dataset` builder that reads it."""


JSONL = FileKind("JSONL", "jsonl", (".jsonl", ".json", ".ndjson"), "--format speculators for JSONL", "json")
PARQUET = FileKind("Parquet", "parquet", (".parquet",), "--format parquet", "parquet")
FILE_KINDS = (JSONL, PARQUET)


@dataclass(frozen=True)
class Sidecar:
    """A file written beside the data as `<stem>.<suffix>` (see `output.add_sidecar`)."""

    key: str
    suffix: str


MANIFEST = Sidecar("manifest", "manifest.json")
TOKEN_FREQ = Sidecar("token_freq", "token_freq.json")
ERRORS = Sidecar("errors", "errors.jsonl")
"""speculators' `<name>.errors.jsonl`: the requests that failed."""
TEMPLATE = Sidecar("template", "specforge_template.json")
"""The SpecForge ChatTemplate derived from the served layout: the rows are trained through it."""
EVERY_EXPORT = (MANIFEST, TOKEN_FREQ)
EVERY_SIDECAR = (MANIFEST, TOKEN_FREQ, ERRORS, TEMPLATE)
"""Every sidecar any format writes: one an export of another format left beside the same name is removed with the
new data's commit (a speculators export over a specforge one kept the old template beside the new rows)."""

RowBuilder = Callable[[formats.ExportItem, ModelProfile, Any], dict[str, Any]]
ProfileOf = Callable[[str | None], ModelProfile]
"""The profile a stored sample was analysed with, by its recorded name."""

TableWriter = Callable[[Store, list[tuple[str, str]], Plan, ProfileOf], Any]
"""(store, [(sample_id, row id)] in export order, plan, the profile of a stored profile name): writes the whole
data file at once; may return what it made (an object with `section()` for the manifest and `row_lengths`, and a
JSONL writer its `shapes`: `export.row_shapes.RowShapes`)."""
Preflight = Callable[[Any, ModelProfile], None]
"""(tokenizer, a profile the selection was analysed with): raises ExportError when the format cannot serve it."""
TrainerPaths = Callable[[trainers.PathsContext], dict[str, Any]]


@dataclass(frozen=True)
class ExportFormat:
    """One export format: everything the writer, the manifest and the CLI need to know about it."""

    name: str
    """`--format NAME`."""
    label: str
    """How the CLI's help names it."""
    file: FileKind
    rows: Rows
    trainer_paths: TrainerPaths
    """The manifest's `trainers` section: how each trainer reads the file, exactly or not."""
    build_row: RowBuilder | None = None
    """One JSON line per sample; None when `write_table` writes the file."""
    write_table: TableWriter | None = None
    extra_sidecars: tuple[Sidecar, ...] = ()
    """Beside the manifest and token counts every export writes."""
    checks_template: bool = False
    """Derive the SpecForge ChatTemplate from the served layouts to count how its paths re-render the rows
    (none fitting is a warning). A format with the TEMPLATE sidecar derives it too, and then none fitting
    refuses the export and a row served in another layout is refused."""
    rerender: tuple[trainers.RerenderPath, ...] = ()
    """The trainer paths each written row is re-rendered through (the manifest's `rerender`)."""
    preflight: Preflight | None = None
    """Run once per profile in the selection before anything is written."""
    loss_mask: str = (
        "0 for every prompt id, 1 for every output id (stop id included); input_ids = prompt ids + output ids exactly "
        "as served"
    )
    """The manifest's `loss_mask`: what the rows' mask covers."""

    def __post_init__(self) -> None:
        if (self.build_row is None) == (self.write_table is None):
            raise ValueError(f"export format {self.name}: exactly one of build_row and write_table")

    @property
    def sidecars(self) -> tuple[Sidecar, ...]:
        return (*EVERY_EXPORT, *self.extra_sidecars)

    @property
    def writes_template(self) -> bool:
        return TEMPLATE in self.extra_sidecars

    @property
    def uses_template(self) -> bool:
        """The served layout's ChatTemplate is derived: the file may be trained through a SpecForge template."""
        return self.checks_template or self.writes_template

    def check_out_name(self, out: str | Path) -> None:
        """`--format parquet --out x.jsonl` (or the reverse) would put one format under the other's name."""
        suffix = Path(str(out)).suffix.lower()
        name = Path(str(out)).name.lower()
        for side in EVERY_SIDECAR:  # `--out t.manifest.json` replaced the manifest of t.jsonl with data
            if name.endswith(f".{side.suffix}") and name != f".{side.suffix}":
                raise ExportError(
                    f"--out {out} is named as an export's {side.suffix} file (what `tokview export` writes beside its "
                    "data): choose another name"
                )
        if suffix in COMPRESSED_SUFFIXES:  # `x.jsonl.gz` held plain text: `load_dataset` (by the name) failed on it
            plain = Path(str(out)).with_suffix("")
            if plain.suffix.lower() not in self.file.suffixes:
                plain = plain.with_suffix("." + self.file.suffix)
            after = (
                "(Parquet compresses its columns itself)"
                if self.file is not JSONL
                else f"and compress it afterwards (`{COMPRESSED_SUFFIXES[suffix]} {plain}`)"
            )
            how = " uncompressed" if self.file is JSONL else ""
            raise ExportError(
                f"--out {out} names a compressed file, but tokview writes {self.file.label}{how}: use {plain} {after}"
            )
        for kind in FILE_KINDS:
            if kind is not self.file and suffix in kind.suffixes:
                raise ExportError(
                    f"--format {self.name} writes {self.file.label}, but --out {out} names a {suffix} file: "
                    f"use {Path(str(out)).with_suffix('.' + self.file.suffix)} (or {kind.instead})"
                )


COMPRESSED_SUFFIXES = {
    ".gz": "gzip",
    ".gzip": "gzip",
    ".zst": "zstd",
    ".zstd": "zstd",
    ".bz2": "bzip2",
    ".xz": "xz",
    ".lz4": "lz4",
    ".zip": "zip",
}
"""Names of compressed files (and the tool that makes one): an export written under one is plain text a reader
decompresses and fails on."""


FORMATS: dict[str, ExportFormat] = {
    f.name: f
    for f in (
        ExportFormat(
            name="speculators",
            label="speculators",
            file=JSONL,
            rows=Rows.IDS,
            build_row=formats.speculators_row,
            extra_sidecars=(ERRORS,),
            checks_template=True,
            rerender=(trainers.PREFORMATTED_PATH,),
            trainer_paths=trainers.ids_row_paths,
        ),
        ExportFormat(
            name="specforge",
            label="SpecForge",
            file=JSONL,
            rows=Rows.TEXT,
            build_row=formats.specforge_row,
            extra_sidecars=(TEMPLATE,),
            rerender=trainers.TEXT_ROW_PATHS,
            trainer_paths=trainers.conversation_paths,
        ),
        ExportFormat(
            name="sharegpt",
            label="ShareGPT",
            file=JSONL,
            rows=Rows.TEXT,
            build_row=formats.sharegpt_row,
            checks_template=True,
            rerender=trainers.TEXT_ROW_PATHS,
            trainer_paths=trainers.conversation_paths,
        ),
        ExportFormat(
            name="kimi-inline",
            label="Kimi inline",
            file=JSONL,
            rows=Rows.TEXT,
            build_row=formats.kimi_inline_row,
            checks_template=True,
            rerender=trainers.TEXT_ROW_PATHS,
            trainer_paths=trainers.conversation_paths,
            preflight=preflight.reasoning_renders_once_inline,
        ),
        ExportFormat(
            name="trajectory",
            label="trajectory (one row per conversation)",
            file=JSONL,
            rows=Rows.IDS,
            write_table=write_trajectories,
            trainer_paths=trainers.trajectory_paths,
            loss_mask="0 for every prompt id, 1 for every output id (stop id included); input_ids = the first turn's "
            "prompt ids + output ids, then per turn the ids its prompt adds (mask 0) and its output ids, as served",
        ),
        ExportFormat(
            name="parquet",
            label="Parquet",
            file=PARQUET,
            rows=Rows.IDS,
            write_table=write_parquet,
            trainer_paths=trainers.parquet_paths,
        ),
    )
}
DEFAULT_FORMAT = "speculators"
"""Token-exact, and read by both trainers as it is."""
TRAJECTORY_FORMAT = "trajectory"
"""What `tokview export --trajectory` means."""


def export_format(name: str) -> ExportFormat:
    """The registered format called `name`; ExportError (one line) naming the choices when there is none."""
    found = FORMATS.get(name)
    if found is None:
        raise ExportError(f"unknown format {name!r} (choose from {', '.join(FORMATS)})")
    return found
