"""Ctrl-C while the `tokview` script is still importing its command: exit 130 quietly, never Python's traceback."""

from __future__ import annotations

import signal
import subprocess
import sys

# A finder that presses Ctrl-C the moment Python starts importing tokview.cli (what a user's Ctrl-C in the first
# ~50 ms of any command meets), then lets the import go on.
PRESS_DURING_IMPORT = """
import os, signal, sys
class Press:
    def find_spec(self, name, path=None, target=None):
        if name == "tokview.cli":
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # the handler runs between bytecodes
                pass
        return None
sys.meta_path.insert(0, Press())
sys.argv = ["tokview", "--version"]
from tokview.entry import main
sys.exit(main())
"""


def test_ctrl_c_while_the_command_imports_exits_130_without_a_traceback() -> None:
    done = subprocess.run([sys.executable, "-c", PRESS_DURING_IMPORT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 128 + signal.SIGINT, done.stderr
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr


def test_after_the_import_ctrl_c_is_python_s_again_and_a_library_import_leaves_it_alone() -> None:
    check = (
        "import signal, sys; import tokview, tokview.entry;"
        "assert signal.getsignal(signal.SIGINT) is signal.default_int_handler;"
        "sys.argv = ['tokview', '--version'];"
        "code = tokview.entry.main();"
        "assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, signal.getsignal(signal.SIGINT);"
        "sys.exit(code)"
    )
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()  # the version
