"""Prompts files for the batch tests (a helper module, no tests): what six modules each wrote for themselves."""

from __future__ import annotations

import json
from pathlib import Path


def prompts_file(path: Path, n: int) -> Path:
    """`n` one-message chat prompts (ids p0000, p0001, …; "question 0", …) as JSON lines at `path`."""
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"p{i:04d}", "messages": [{"role": "user", "content": f"question {i}"}]}) + "\n")
    return path
