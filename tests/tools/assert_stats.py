"""Count the test suite's asserts and the compound ones (`assert a and b`), whose failure does not say which
fact broke. Run: `python tests/tools/assert_stats.py [--files] [PATHS...]` (default: tests/).

Only a top-level `and` counts as compound: `assert not (a and b)` or `assert (a and b) or c` state one fact.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def is_compound(node: ast.Assert) -> bool:
    return isinstance(node.test, ast.BoolOp) and isinstance(node.test.op, ast.And)


def count_file(path: Path) -> tuple[int, int]:
    """(asserts, compound asserts) in one Python file."""
    asserts = [n for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(n, ast.Assert)]
    return len(asserts), sum(is_compound(n) for n in asserts)


def python_files(paths: list[Path]) -> list[Path]:
    found: list[Path] = []
    for path in paths:
        found.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    return [p for p in found if "__snapshots__" not in p.parts and p.resolve() != Path(__file__).resolve()]


def main(argv: list[str]) -> int:
    per_file = "--files" in argv
    paths = [Path(a) for a in argv if a != "--files"] or [TESTS]
    total = compound = 0
    rows = []
    for path in python_files(paths):
        n, c = count_file(path)
        total, compound = total + n, compound + c
        if c:
            rows.append((c, n, path))
    if per_file:
        for c, n, path in sorted(rows, reverse=True):
            print(f"{c:5d} / {n:5d}  {path}")
    share = 100 * compound / total if total else 0.0
    print(f"asserts: {total}  compound (top-level and): {compound}  share: {share:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
