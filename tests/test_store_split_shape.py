"""The store package's shape, checked on the source: no class over 400 lines, BEGIN/COMMIT/ROLLBACK written in
one place (the transaction context manager of `connection.py`), `Store` composing a `PartSink` rather than
inheriting one, the store's errors in their own module, and the wide signatures keyword-only."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

STORE = Path(__file__).resolve().parents[1] / "tokview" / "store"
MAX_CLASS_LINES = 400


def _trees() -> dict[str, ast.Module]:
    return {p.name: ast.parse(p.read_text(), str(p)) for p in sorted(STORE.glob("*.py"))}


def test_no_class_in_the_store_package_is_over_400_lines():
    sizes = {
        f"{name}:{node.name}": (node.end_lineno or node.lineno) - node.lineno + 1
        for name, tree in _trees().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
    }
    too_long = {cls: n for cls, n in sizes.items() if n > MAX_CLASS_LINES}
    assert too_long == {}


_STATEMENT = re.compile(r"(BEGIN( TRANSACTION)?|COMMIT|ROLLBACK)\s*(;|$)", re.IGNORECASE)


def _transaction_words(tree: ast.Module) -> list[str]:
    """String constants that are (or start) a BEGIN, COMMIT or ROLLBACK statement."""
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _STATEMENT.match(node.value.strip())
    ]


def test_begin_commit_and_rollback_are_written_only_in_the_connection_module():
    written = {name: _transaction_words(tree) for name, tree in _trees().items()}
    elsewhere = {name: words for name, words in written.items() if words and name != "connection.py"}
    assert elsewhere == {}
    assert sorted(set(written["connection.py"])) == ["BEGIN TRANSACTION", "COMMIT", "ROLLBACK"]


def test_store_composes_a_part_sink_instead_of_inheriting_one(tmp_path):
    from tokview.store.part_sink import PartSink
    from tokview.store.store import Store

    assert PartSink not in Store.__mro__
    with Store(tmp_path / "s.duckdb", ["http://ann:hunter22@gpu:30000"]) as store:
        store.write_part([{"sample_id": "x"}])
        written = [p.name for p in store.parts_dir.iterdir()]
    assert len(written) == 1


def test_the_store_errors_live_in_their_own_module_and_are_the_same_class_everywhere():
    from tokview import store
    from tokview.store import errors, part_sink
    from tokview.store import store as store_module

    assert errors.StoreError.__module__ == "tokview.store.errors"
    assert part_sink.StoreError is errors.StoreError
    assert store.StoreError is errors.StoreError
    assert store_module.StoreFull is errors.StoreFull


def test_a_sample_identity_is_one_value_whose_optional_ints_go_by_keyword():
    from tokview.store.sample_rows import SampleIdentity, sample_params

    kinds = {name: p.kind for name, p in inspect.signature(sample_params).parameters.items()}
    assert [name for name, kind in kinds.items() if kind is inspect.Parameter.KEYWORD_ONLY] == ["secrets"]
    assert next(iter(kinds)) == "key"
    with pytest.raises(TypeError):
        SampleIdentity("s", "p", "run", 0, 1)  # gen_index and turn by position: refused
    key = SampleIdentity("s", "p", "run", gen_index=0, turn=1)
    assert (key.gen_index, key.turn, key.profile) == (0, 1, None)


def test_a_sample_row_is_built_by_keyword():
    from tokview.store.sample_rows import SampleRow

    with pytest.raises(TypeError):
        SampleRow("s", "p", None, "pending", True, "stop", 1, 2, [], 0)


def test_record_verdict_takes_what_follows_the_reason_by_keyword(tmp_path):
    from tokview.store.store import Store

    parameters = inspect.signature(Store.record_verdict).parameters
    positional = [n for n, p in parameters.items() if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert positional == ["self", "sample_id", "status", "reason"]
