"""The `tokview` script's entry point: Ctrl-C while Python is still importing the command ends it quietly.

Importing `tokview.cli` and what it pulls in takes ~50 ms; a Ctrl-C then raised KeyboardInterrupt inside some
module's import, before `cli.main` could catch it, and Python printed its own traceback. Until the import is done,
SIGINT exits at once with 130 (nothing has started, so nothing is lost); then Python's handler is back and every
command handles Ctrl-C as before. Only the script does this: importing `tokview` as a library leaves signals alone.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType


def _quit_while_importing(signum: int, frame: FrameType | None) -> None:
    os._exit(128 + signum)  # nothing started yet: no buffers, files or children to close


def main() -> int:
    previous = signal.signal(signal.SIGINT, _quit_while_importing)
    from tokview.cli import main as run

    signal.signal(signal.SIGINT, previous)
    return run()


if __name__ == "__main__":
    sys.exit(main())
