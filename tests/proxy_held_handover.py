"""`tokview proxy` whose hand-over of its backlog to the recorder (`RecorderProcess._drain_blocking`) waits until a
signal comes: what a big backlog written to a slow recorder's pipe looks like to a second SIGTERM or Ctrl-C.
It says "handing over" on stderr when it starts waiting. Run as `python proxy_held_handover.py proxy ARGS…`."""

from __future__ import annotations

import sys
import time

from tokview.proxy import recorder_process

_original = recorder_process.RecorderProcess._drain_blocking


def _held(self: recorder_process.RecorderProcess) -> None:
    print("handing over", file=sys.stderr, flush=True)
    time.sleep(60)  # a signal whose handler raises ends it
    _original(self)


if __name__ == "__main__":
    recorder_process.RecorderProcess._drain_blocking = _held  # type: ignore[method-assign]
    from tokview.cli import main

    sys.exit(main(sys.argv[1:]))
