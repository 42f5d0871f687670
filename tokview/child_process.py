"""How tokview starts a Python child of its own (`python -P -m tokview.…`): the batch's landing child, the slice
cache's builder.

The child must run this tokview, whatever the working folder holds: `-P` keeps the folder off its path, and the
folder this package was imported from goes first on PYTHONPATH."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def module_command(module: str) -> list[str]:
    """The command line that runs `python -m module` with this interpreter and the working folder off the path."""
    return [sys.executable, "-P", "-m", module]


def child_env() -> dict[str, str]:
    """This process's environment with this tokview's folder first on PYTHONPATH."""
    here = str(Path(__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))}
