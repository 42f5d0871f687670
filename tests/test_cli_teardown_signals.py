"""A stop that arrives after the command's work is done, while the interpreter joins its threads at exit, ends the
process quietly: a killed merge that had already merged printed a traceback from `threading._shutdown`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The command runs, then a thread the interpreter must join at exit keeps the process there for a moment.
SCRIPT = (
    "import sys, threading, time; from tokview.cli import main; code = main(); "
    "print('done', flush=True); threading.Thread(target=time.sleep, args=(1.5,)).start(); sys.exit(code)"
)


def test_a_ctrl_c_while_the_process_joins_its_threads_at_exit_prints_no_traceback(tmp_path):
    db = tmp_path / "t.duckdb"
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, "stats", "--db", str(db)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout is not None
    while "done" not in proc.stdout.readline():
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
    time.sleep(0.3)  # past `sys.exit`: the interpreter is joining the thread
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert proc.returncode in (0, 1), (proc.returncode, err)  # the command's own code (a missing store: 1)
