"""One reader process of the concurrency matrix: `tokview stats`, `show` or `export` in a loop on a live store.

Run as `python tests/hostile_readers.py KIND DB STOP OUT [SAMPLE_ID …]`. Each call goes through
`tokview.cli.main` inside this process (the start-up is paid once, so a dozen readers fit on a busy
2-core box and each still opens the store for every call, competing for the file like separate
commands), 0.2 s apart. After the first call it prints "ready"; it loops until the file STOP exists
(at least 2 calls, at most 400), then prints one JSON line: how many calls, and every call that failed
with its exit code and stderr. An export reader also checks each file it wrote is whole JSON lines with unique ids.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import time
from pathlib import Path

MAX_CALLS = 400
PACE_S = 0.2
"""Between calls: a monitor's polling rate, so a dozen readers share two cores with the batches they watch."""


def one_call(kind: str, db: str, out: Path, sample_ids: list[str], n: int) -> tuple[int, str, str]:
    """(exit code, stderr, what is wrong with the output if anything)."""
    from tokview.cli import main

    if kind == "stats":
        argv = ["stats", "--db", db] + (["--json"] if n % 2 else ["--samples", "--limit", "5"])
    elif kind == "show":
        argv = ["show", sample_ids[n % len(sample_ids)], "--db", db] + (["--json"] if n % 2 else [])
    else:
        argv = ["export", "--db", db, "--select", "all", "--out", str(out)]
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse and friends
            code = exc.code if isinstance(exc.code, int) else 1
    return code, err.getvalue(), whole_export(out) if code == 0 and kind == "export" else ""


def whole_export(out: Path) -> str:
    try:
        rows = [json.loads(line) for line in out.read_text().splitlines()]
    except (OSError, ValueError) as exc:
        return f"export output not whole JSON lines: {exc}"
    ids = [r["metadata"]["tokview_sample_id"] for r in rows]
    return "" if len(ids) == len(set(ids)) and ids else f"export output ids: {len(ids)} rows, {len(set(ids))} unique"


def main() -> int:
    kind, db, stop, out, *sample_ids = sys.argv[1:]
    failures = []
    calls = 0
    while calls < MAX_CALLS and (calls < 2 or not Path(stop).exists()):
        code, stderr, wrong = one_call(kind, db, Path(out), sample_ids, calls)
        calls += 1
        if code != 0 or wrong or "Traceback" in stderr or "internal error" in stderr:
            failures.append({"call": calls, "code": code, "stderr": stderr[-2000:], "output": wrong})
        if calls == 1:
            print("ready", flush=True)
        time.sleep(PACE_S)
    print(json.dumps({"kind": kind, "calls": calls, "failures": failures}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
