"""`python screenshots/make_screenshots.py` (the README's way to remake its screenshots) runs: it had rotted on a
renamed import and failed before writing any."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_screenshot_script_writes_every_screenshot(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "screenshots" / "make_screenshots.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    written = sorted(p.name for p in tmp_path.glob("*.svg"))
    assert written == sorted(p.name for p in (ROOT / "screenshots").glob("*.svg"))
    assert "remap any of them by id in [keymap]" in (tmp_path / "help.svg").read_text().replace("&#160;", " ")
