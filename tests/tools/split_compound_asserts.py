"""Split compound asserts into one assert per fact: `assert a and b, msg` -> `assert a, msg` / `assert b, msg`.

The same meaning: `and` stops at the first false operand and so does a run of asserts; the message is kept on
each. Only a top-level `and` is split (`assert not (a and b)` and `assert a and b or c` are one fact each). An
assert that shares its line with another statement, or that holds a comment inside its expression, is left
alone and listed. Needs libcst (not a test dependency): `python tests/tools/split_compound_asserts.py FILES`,
then `ruff format FILES`; `--verify FILES` then proves each file's syntax tree is its committed one (git HEAD)
with only the compound asserts split; `tests/tools/assert_stats.py` counts what is left.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import libcst as cst
from libcst.metadata import PositionProvider


def and_operands(expr: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The operands of a chain of `and`s (nested `and`s flattened, their grouping parentheses dropped)."""
    if isinstance(expr, cst.BooleanOperation) and isinstance(expr.operator, cst.And):
        return and_operands(expr.left) + and_operands(expr.right)
    return [expr]


def standalone(expr: cst.BaseExpression) -> cst.BaseExpression:
    """`expr`, parenthesised when it spans lines without its own brackets (legal only inside the old parens)."""
    code = cst.Module([]).code_for_node(expr)
    if "\n" in code and not expr.lpar:
        return expr.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return expr


def has_comment(node: cst.CSTNode) -> bool:
    found = False

    class Finder(cst.CSTVisitor):
        def visit_Comment(self, node: cst.Comment) -> None:
            nonlocal found
            found = True

    node.visit(Finder())
    return found


class Splitter(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self) -> None:
        self.split = 0
        self.skipped: list[int] = []

    def _compound(self, node: cst.CSTNode) -> bool:
        return (
            isinstance(node, cst.Assert)
            and isinstance(node.test, cst.BooleanOperation)
            and isinstance(node.test.operator, cst.And)
        )

    def leave_SimpleStatementSuite(
        self, original: cst.SimpleStatementSuite, updated: cst.SimpleStatementSuite
    ) -> cst.SimpleStatementSuite:
        if any(self._compound(s) for s in original.body):
            self.skipped.append(self.get_metadata(PositionProvider, original).start.line)
        return updated

    def leave_SimpleStatementLine(
        self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
    ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
        if not any(self._compound(s) for s in original.body):
            return updated
        line = self.get_metadata(PositionProvider, original).start.line
        if len(original.body) != 1 or has_comment(original.body[0]):
            self.skipped.append(line)
            return updated
        node = updated.body[0]
        assert isinstance(node, cst.Assert)
        operands = [standalone(op) for op in and_operands(node.test)]
        lines = []
        for i, operand in enumerate(operands):
            first, last = i == 0, i == len(operands) - 1
            lines.append(
                updated.with_changes(
                    body=[node.with_changes(test=operand, whitespace_after_assert=cst.SimpleWhitespace(" "))],
                    leading_lines=updated.leading_lines if first else [],
                    trailing_whitespace=updated.trailing_whitespace if last else cst.TrailingWhitespace(),
                )
            )
        self.split += 1
        return cst.FlattenSentinel(lines)


def split_file(path: Path) -> tuple[int, list[int]]:
    """Rewrite `path` in place; (asserts split, lines of compound asserts left alone)."""
    wrapper = cst.MetadataWrapper(cst.parse_module(path.read_text(encoding="utf-8")))
    splitter = Splitter()
    new = wrapper.visit(splitter)
    if splitter.split:
        path.write_text(new.code, encoding="utf-8")
    return splitter.split, splitter.skipped


def split_ast(tree: ast.AST) -> ast.AST:
    """`tree` with every top-level-`and` assert replaced by one assert per operand (the reference rewrite)."""

    def operands(expr: ast.expr) -> list[ast.expr]:
        if isinstance(expr, ast.BoolOp) and isinstance(expr.op, ast.And):
            return [leaf for value in expr.values for leaf in operands(value)]
        return [expr]

    class Reference(ast.NodeTransformer):
        def visit_Assert(self, node: ast.Assert) -> list[ast.Assert]:
            return [ast.Assert(test=op, msg=node.msg) for op in operands(node.test)]

    return Reference().visit(tree)


def verify(name: str) -> bool:
    """True when `name`'s syntax tree is its git HEAD version's with only the compound asserts split."""
    old = subprocess.run(["git", "show", f"HEAD:./{name}"], capture_output=True, text=True, check=True).stdout
    new = Path(name).read_text(encoding="utf-8")
    return ast.dump(split_ast(ast.parse(old))) == ast.dump(ast.parse(new))


def main(argv: list[str]) -> int:
    if argv[:1] == ["--verify"]:
        bad = [name for name in argv[1:] if not verify(name)]
        print(f"verified {len(argv) - 1 - len(bad)} files; differ beyond the split: {bad}")
        return 1 if bad else 0
    for name in argv:
        count, skipped = split_file(Path(name))
        left = f"; left alone at lines {skipped}" if skipped else ""
        print(f"{name}: {count} split{left}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
