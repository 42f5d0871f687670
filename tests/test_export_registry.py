"""One `ExportFormat` registry: each export format is declared once (writer, suffix, sidecars, text or ids,
trainer paths, pre-flight checks), no other module compares a format's name, and a new format (such as
trajectory rows) is one more entry."""

from __future__ import annotations

import ast
import json
from dataclasses import replace
from pathlib import Path

import pytest
from builders import kimi, profile

from tokview.cli import main
from tokview.export import export, registry
from tokview.export.formats import ExportItem
from tokview.export.registry import FORMATS, ExportFormat

PACKAGE = Path(__file__).resolve().parents[1] / "tokview"
REGISTRY_MODULE = PACKAGE / "export" / "registry.py"


def _format_names() -> set[str]:
    return set(FORMATS)


def _names_in(node: ast.AST, constants: dict[str, set[str]], names: set[str]) -> set[str]:
    """The format names a comparison operand stands for: a literal, a literal tuple/list/set, or a module
    constant holding one of those."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & names
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return set().union(*(_names_in(e, constants, names) for e in node.elts)) if node.elts else set()
    if isinstance(node, ast.Name):
        return constants.get(node.id, set())
    if isinstance(node, ast.Attribute):
        return constants.get(node.attr, set())
    return set()


def _module_constants(tree: ast.Module, names: set[str]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            found = _names_in(stmt.value, out, names)
            if found:
                out[stmt.targets[0].id] = found
    return out


def format_name_comparisons(root: Path = PACKAGE) -> list[str]:
    """`file:line` of every comparison against a format name outside the registry module."""
    names = _format_names()
    hits: list[tuple[str, int]] = []
    for path in sorted(root.rglob("*.py")):
        if path == REGISTRY_MODULE:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        constants = _module_constants(tree, names)
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare) and any(
                _names_in(operand, constants, names) for operand in [node.left, *node.comparators]
            ):
                hits.append((str(path.relative_to(root.parent)), node.lineno))
    return [f"{name}:{line}" for name, line in sorted(hits)]


# -- declared once ----------------------------------------------------------------------------------------


def test_no_module_outside_the_registry_compares_a_format_name():
    assert format_name_comparisons() == []


def test_the_comparison_finder_sees_each_kind_of_comparison(tmp_path):
    """The check above can fail: a literal, a tuple of names and a module constant are each found."""
    pkg = tmp_path / "tokview"
    pkg.mkdir()
    (pkg / "a.py").write_text(
        'TEXT = ("specforge", "sharegpt")\n'
        'def f(fmt):\n    return fmt == "parquet"\n'
        'def g(fmt):\n    return fmt in ("speculators", "x")\n'
        "def h(fmt):\n    return fmt in TEXT\n"
        'def ok(path):\n    return path == "other"\n'
    )
    assert format_name_comparisons(pkg) == ["tokview/a.py:3", "tokview/a.py:5", "tokview/a.py:7"]


def test_every_format_declares_its_file_rows_sidecars_and_template_use():
    for name, fmt in FORMATS.items():
        assert fmt.name == name
        assert (fmt.build_row is None) != (fmt.write_table is None), name  # rows streamed, or a table written
    assert FORMATS["parquet"].file is registry.PARQUET
    assert [f.name for f in FORMATS.values() if f.rows is registry.Rows.IDS] == ["speculators", "trajectory", "parquet"]
    assert {f.name: [s.suffix for s in f.sidecars] for f in FORMATS.values()} == {
        "speculators": ["manifest.json", "token_freq.json", "errors.jsonl"],
        "specforge": ["manifest.json", "token_freq.json", "specforge_template.json"],
        "sharegpt": ["manifest.json", "token_freq.json"],
        "kimi-inline": ["manifest.json", "token_freq.json"],
        "trajectory": ["manifest.json", "token_freq.json"],
        "parquet": ["manifest.json", "token_freq.json"],
    }
    assert [f.name for f in FORMATS.values() if f.preflight is not None] == ["kimi-inline"]


def test_the_cli_offers_exactly_the_registered_formats(capsys):
    with pytest.raises(SystemExit):
        main(["export", "--help"])
    help_text = capsys.readouterr().out
    assert "{" + ",".join(FORMATS) + "}" in help_text


# -- a new format is one entry ----------------------------------------------------------------------------


def _trial_row(item: ExportItem, prof, tok) -> dict:
    """A stand-in for a later format (trajectory rows): only what its entry declares."""
    return {"id": item.row_id, "ids": list(item.capture.output_ids)}


def test_a_new_format_is_one_more_entry(sample_store, tmp_path, monkeypatch):
    base = FORMATS["sharegpt"]
    trial = replace(base, name="trial", label="Trial", build_row=_trial_row, rows=registry.Rows.IDS, rerender=())
    monkeypatch.setitem(FORMATS, "trial", trial)
    export(sample_store, "trial", tmp_path / "t.jsonl", select="all", tokenizer=kimi(), profile=profile())
    rows = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["p1_gen0", "p2_gen0"]  # ids rows take speculators' `_gen0` ids
    manifest = json.loads((tmp_path / "t.manifest.json").read_text())
    assert manifest["format"] == "trial"
    assert "exact_alternative" in manifest["trainers"]  # the trainer paths its entry named (sharegpt's)


def test_an_entry_that_both_streams_rows_and_writes_a_table_is_refused():
    with pytest.raises(ValueError, match="exactly one of build_row and write_table"):
        replace(FORMATS["speculators"], write_table=FORMATS["parquet"].write_table)
    with pytest.raises(ValueError, match="exactly one of build_row and write_table"):
        ExportFormat(
            name="none",
            label="None",
            file=registry.JSONL,
            rows=registry.Rows.TEXT,
            build_row=None,
            write_table=None,
            trainer_paths=FORMATS["sharegpt"].trainer_paths,
        )
