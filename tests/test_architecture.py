"""The shape architecture.md asks for, checked on the source: a Textual-free core, no import cycles.

What counts as an import edge (module A -> module B), parsed with `ast`:
- every `import` / `from ... import` that can run: at module level (also inside module-level `if`,
  `try`, `with`, class bodies) AND inside function and method bodies. A lazy import hides a cycle
  from Python's loader but not from the design: the two modules still cannot be read, tested or
  moved apart (servers/doctor.py <-> doctor_checks.py import each other only lazily), so a cycle
  is broken by moving what both need into a third module, not by importing late;
- not an import under `if TYPE_CHECKING:` (it never runs; annotations only);
- `from pkg import name` points at `pkg.name` when that is a module, else at `pkg` (its `__init__`);
  importing `a.b.c` is an edge to `a.b.c` only, not to the packages `a` and `a.b` whose `__init__`
  Python runs first (counting those would make every `pkg/__init__.py` that re-exports its own
  submodules a cycle).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tokview"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def runtime_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement that can run, at any depth, except those under `if TYPE_CHECKING:`."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
            return
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            children: list[ast.AST] = list(node.orelse)
        else:
            children = list(ast.iter_child_nodes(node))
        for child in children:
            visit(child)

    visit(tree)
    return found


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in runtime_imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            graph[name] |= {t for t in targets if t in files and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)


def _one_cycle(graph: dict[str, set[str]], component: set[str], start: str) -> list[str]:
    """A shortest path start → … → start inside the component (breadth first)."""
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt_frontier = []
        for node in frontier:
            for nxt in sorted(graph[node] & component):
                if nxt == start:
                    return paths[node] + [start]
                if nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    nxt_frontier.append(nxt)
        frontier = nxt_frontier
    raise AssertionError(f"{start} is in a component without a cycle through it")


def describe(graph: dict[str, set[str]], component: list[str]) -> str:
    """`a, b, c: a -> b -> a; c -> a -> c`: one component's modules, and a shortest cycle through each
    (a cycle already shown from another of its modules is not repeated)."""
    loops: dict[frozenset[str], str] = {}
    for module in component:
        loop = _one_cycle(graph, set(component), module)
        loops.setdefault(frozenset(loop), " -> ".join(loop))
    return f"{', '.join(component)}: " + "; ".join(loops.values())


def test_no_import_cycles_in_tokview():
    graph = import_graph()
    found = [describe(graph, c) for c in cycles(graph)]
    assert not found, "import cycles in tokview/ (lazy imports count, TYPE_CHECKING ones do not):\n" + "\n".join(found)


def test_the_cycle_finder_names_a_cycle_and_skips_type_checking_imports():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert describe(graph, ["a", "b", "c"]) == "a, b, c: a -> b -> c -> a"
    two_loops = {"a": {"b", "c"}, "b": {"a"}, "c": {"a"}}
    assert describe(two_loops, ["a", "b", "c"]) == "a, b, c: a -> b -> a; c -> a -> c"
    assert cycles({"a": {"b"}, "b": set()}) == []
    source = (
        "from typing import TYPE_CHECKING\nimport os\nif TYPE_CHECKING:\n    import hints_only\nelse:\n"
        "    import in_else\ntry:\n    import in_try\nexcept ImportError:\n    import in_except\n"
        "def f():\n    import in_function\nclass K:\n    import in_class\n    def m(self):\n        import in_method\n"
    )
    names = [a.name for node in runtime_imports(ast.parse(source)) for a in node.names]
    assert names == ["TYPE_CHECKING", "os", "in_else", "in_try", "in_except", "in_function", "in_class", "in_method"]


def test_the_graph_resolves_relative_and_from_package_imports():
    graph = import_graph()
    assert "tokview.store.store" in graph["tokview.store"]  # `from tokview.store.store import Store`
    assert "tokview.store" in graph["tokview.export.writer"]  # `from tokview.store import Store`
    assert "tokview.store.export_rows" in graph["tokview.export.writer"]  # `from tokview.store import export_rows`


def store_sql_calls(tree: ast.AST) -> list[int]:
    """Lines that run SQL through a store: `store.query(...)` / `store.execute(...)` (or `self.store…`)."""
    lines = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("query", "execute")
        ):
            target = node.func.value
            name = (
                target.id if isinstance(target, ast.Name) else target.attr if isinstance(target, ast.Attribute) else ""
            )
            if name.endswith("store"):
                lines.append(node.lineno)
    return lines


def test_export_and_batch_run_no_sql_on_the_store():
    """The store's tables are named only in tokview/store/ (export_rows.py holds what export and score read)."""
    assert store_sql_calls(ast.parse("x = store.query('SELECT 1')\nself.store.execute('x')\nconn.execute('y')")) == [
        1,
        2,
    ]
    offenders = {
        str(p.relative_to(ROOT)): lines
        for folder in ("export", "batch")
        for p in sorted((PACKAGE / folder).rglob("*.py"))
        if (lines := store_sql_calls(ast.parse(p.read_text())))
    }
    assert offenders == {}


def test_core_never_imports_textual():
    code = (
        "import sys, json, tokview.core, tokview.core.analysis, tokview.core.tokenizer, tokview.core.prompts, "
        "tokview.core.kimi_layout, tokview.core.profiles;"
        "bad=[m for m in ('textual','httpx','duckdb') if m in sys.modules]; print(json.dumps(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_no_module_outside_ui_imports_textual():
    offenders = [
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if "ui" not in p.relative_to(PACKAGE).parts[:1]
        and any(line.lstrip().startswith(("import textual", "from textual")) for line in p.read_text().splitlines())
    ]
    assert offenders == []


def test_a_worker_child_never_imports_duckdb(tmp_path: Path):
    """A `--workers` child (or a Ray task) only writes parts: what it imports, and a sample it analyses
    and writes through `PartSink`, must not load DuckDB (~50 ms and ~25 MB a process)."""
    code = f"""
import sys, json
sys.path.insert(0, {str(ROOT / "tests")!r})
from tokview.batch.workers import child_main, RemoteTodo
from tokview.batch.config import BatchConfig
from tokview.batch.capture_loop import capture_all
from tokview.batch.writer_thread import GroupWriter
from tokview.store.part_sink import PartSink
import tokview.batch.ray_shards
import builders
config = BatchConfig(servers=["http://127.0.0.1:9"])
tokenizer, profile = config.tokenizer_and_profile()  # what the child does first
pool = config.server_pool(tokenizer, profile)
sink = PartSink({str(tmp_path / "s.duckdb")!r})
writer = GroupWriter(sink, profile=builders.profile(), tokenizer=builders.kimi(), run_id="run1", ingest=False)
class Item:
    sample_id, prompt_id, index, turn = "p1@s", "p1", 0, None
writer.add_sample(Item(), builders.make_capture())
writer.close()
print(json.dumps([writer.ok, len(list(sink.parts_dir.iterdir())), "duckdb" in sys.modules]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [1, 1, False]
