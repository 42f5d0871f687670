"""The simulator's seams are typed: a parameter typed exactly `Any` there is a join mypy cannot check (the
request handlers, the ASGI callables, the sampling settings, the JSON a handler sends). A value that is truly
any JSON is a `JsonValue`; one the code narrows with isinstance is an `object`."""

from __future__ import annotations

import ast
from pathlib import Path

SIM = Path(__file__).resolve().parents[1] / "tokview" / "sim"


def any_parameters(path: Path) -> list[str]:
    """`file:line function(parameter)` for each parameter annotated exactly `Any` (`*args`/`**kwargs` included)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        a = node.args
        params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *(p for p in (a.vararg, a.kwarg) if p)]
        for p in params:
            if p.annotation is not None and ast.unparse(p.annotation) in ("Any", "typing.Any"):
                found.append(f"{path.name}:{node.lineno} {node.name}({p.arg})")
    return found


def test_no_simulator_parameter_is_typed_any() -> None:
    found = [hit for path in sorted(SIM.glob("*.py")) for hit in any_parameters(path)]
    assert found == []


def test_the_any_check_sees_every_kind_of_parameter(tmp_path: Path) -> None:
    source = tmp_path / "mod.py"
    source.write_text(
        "from typing import Any\nimport typing\n"
        "def f(a: Any, /, b: int, *c: Any, d: typing.Any, **e: Any) -> Any: ...\n"
        "async def g(x: dict[str, Any], y: object) -> None: ...\n"
    )
    assert any_parameters(source) == ["mod.py:3 f(a)", "mod.py:3 f(d)", "mod.py:3 f(c)", "mod.py:3 f(e)"]
