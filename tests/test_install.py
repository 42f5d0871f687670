"""What installing tokview asks of an environment: no torch, and no cap on transformers (servers ship 5.x)."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import PackageNotFoundError, requires
from pathlib import Path

from packaging.requirements import Requirement

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def _core_requirements() -> list[Requirement]:
    return [Requirement(r) for r in tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_core_install_pulls_no_torch():
    """Walk the installed dependency closure of the core requirements (no extras): torch is not in it."""
    seen: set[str] = set()
    todo = [r for r in _core_requirements() if r.marker is None or r.marker.evaluate({"extra": ""})]
    while todo:
        req = todo.pop()
        name = _norm(req.name)
        if name in seen:
            continue
        seen.add(name)
        try:
            subs = requires(req.name) or []
        except PackageNotFoundError:
            continue  # an optional platform dependency that is not installed here
        for sub in map(Requirement, subs):
            if sub.marker is None or sub.marker.evaluate({"extra": ""}):
                todo.append(sub)
    assert "transformers" in seen
    assert "tiktoken" in seen  # the walk did reach the heavy ones
    assert not seen & {"torch", "tensorflow", "jax", "flax"}, sorted(seen)


def test_no_upper_bound_a_server_could_trip_on():
    """vLLM 0.32 and SGLang 0.5.23 ship transformers 5.19 and tokenizers 0.23: tokview must not cap either."""
    reqs = {_norm(r.name): r for r in _core_requirements()}
    for name in ("transformers", "tokenizers", "tiktoken", "jinja2", "httpx", "starlette", "uvicorn", "rich"):
        assert not any(s.operator in ("<", "<=", "==", "~=") for s in reqs[name].specifier), reqs[name]
    assert reqs["transformers"].specifier.contains("4.57.1")
    assert reqs["transformers"].specifier.contains("5.19.0")
