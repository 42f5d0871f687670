"""Run every benchmark in this folder, one after another: `python benchmarks/run.py [NAME ...]`.

Each `bench_*.py` measures tokview beside a baseline in the same run and prints ratios, so the
figures mean something on whatever machine runs them.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(names: list[str]) -> int:
    scripts = sorted(HERE.glob("bench_*.py"))
    if names:
        scripts = [s for s in scripts if any(n in s.stem for n in names)]
    worst = 0
    for script in scripts:
        print(f"== {script.stem}", flush=True)
        t0 = time.perf_counter()
        code = subprocess.call([sys.executable, str(script)])
        print(f"   ({script.stem}: {time.perf_counter() - t0:.1f} s, exit {code})\n", flush=True)
        worst = max(worst, code)
    return worst


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
