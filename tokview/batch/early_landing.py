"""The landing child of a `tokview batch` into a new store, started as the process starts.

Why: the child (`landing_process.py`) imports the store package and DuckDB (~0.25 s on 2 cores, half of it DuckDB
2's own package) and makes a spare store before it can land anything. Started from `run_batch`, ~0.15 s into the
process, it became the last thing a one-prompt run waited for once the tokenizer loaded in ~0.1 s
(`core.vocab_slices`): the batch's answer was written and analysed ~0.1 s before the child was ready to land it.
`cli.main` starts it before it builds the parser, from the command line alone (`batch`, its `--db`, neither
`--help` nor `--ray`) and only when the store's file does not exist yet; `LandingChild.start` takes it when it was
started for the same path. One nobody takes (another path, an error before the run began) is told to end at exit:
its input closes, so it removes its spare and exits, as for any run that never begins.
"""

from __future__ import annotations

import atexit
import json
import subprocess
from collections.abc import Sequence
from pathlib import Path

FLAGS = ("--db", "--ray", "--help")
UNTAKEN_WAIT_S = 5.0
"""How long the exit waits for an untaken child to remove its spare (it has nothing else to do)."""

_started: dict[str, subprocess.Popen[bytes]] = {}


SPARE_MARK = ".tokview-new-"


def spare_path(path: str, pid: int) -> Path:
    """Where the child `pid` makes the store `path` before the run begins: beside it (one file system, so it can be
    linked into place), hidden, named by the pid that owns it."""
    file = Path(path).expanduser()
    return file.with_name(f".{file.name}{SPARE_MARK}{pid}")


def remove_database(file: Path) -> None:
    """Remove a DuckDB file and its write-ahead log, whichever exist."""
    for leftover in (file, file.with_name(file.name + ".wal")):
        try:
            leftover.unlink()
        except OSError:  # not there, or not ours to insist on (a later child sweeps it)
            pass


def spawn(path: str) -> subprocess.Popen[bytes] | None:
    """Start a landing child and tell it the store it will make (`{"prepare": path}`); None when none could start."""
    from tokview.child_process import child_env, module_command

    try:
        proc = subprocess.Popen(
            module_command("tokview.batch.landing_process"),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=child_env(),
            start_new_session=True,  # a Ctrl-C on the terminal is the batch's to handle
        )
    except OSError:
        return None
    try:
        assert proc.stdin is not None
        proc.stdin.write(json.dumps({"prepare": path}).encode() + b"\n")
        proc.stdin.flush()
    except OSError:  # it is gone already
        _end(proc, kill=True)
        return None
    return proc


def batch_store(argv: Sequence[str]) -> str | None:
    """The store a `tokview batch` command line plainly names (its `--db`, else the default); None for any other
    command, for `--help` and `--ray` (whose runs land in this process), and for a flag spelled otherwise (an
    abbreviation): the run then starts its child itself, as before."""
    from tokview.default_store import DEFAULT_DB

    if not argv or argv[0] != "batch":
        return None
    path = DEFAULT_DB
    rest = list(argv[1:])
    for i, arg in enumerate(rest):
        if arg in ("-h", "--help", "--ray") or arg.startswith("--ray="):
            return None
        flag = arg.split("=", 1)[0]
        if flag.startswith("--") and len(flag) > 2 and flag not in FLAGS and any(f.startswith(flag) for f in FLAGS):
            return None  # an abbreviation argparse would take for one of these
        if arg == "--db":
            if i + 1 >= len(rest):
                return None
            path = rest[i + 1]
        elif arg.startswith("--db="):
            path = arg.removeprefix("--db=")
    return path if path.strip() else None


def start_early(argv: Sequence[str]) -> None:
    """Start the child for the new store this command line names, if it names one that does not exist yet."""
    from tokview.batch.store_opener import StoreOpener

    path = batch_store(argv)
    try:
        if path is None or path in _started or not StoreOpener(path).holds_nothing():
            return
    except Exception:  # a path the run itself will report on (too long, an unknown ~user): only a speed-up lost
        return
    proc = spawn(path)
    if proc is not None:
        if not _started:
            atexit.register(_end_untaken)
        _started[path] = proc


def take(path: str) -> subprocess.Popen[bytes] | None:
    """The child `start_early` started for this path, if it is still running (then it is the caller's)."""
    proc = _started.pop(path, None)
    if proc is not None and proc.poll() is not None:
        _end(proc)
        return None
    return proc


def _end_untaken() -> None:
    """At exit. A second Ctrl-C while it waits (the first stopped the run) is taken as "don't wait": the child is
    killed and its spare removed, with no traceback after the run's one line."""
    for path in list(_started):
        proc = _started.pop(path)
        try:
            ended = _end(proc)
        except KeyboardInterrupt:
            ended = _end(proc, kill=True)
        if not ended:  # killed: its spare is its own (named by its pid), removed here
            remove_database(spare_path(path, proc.pid))


def _end(proc: subprocess.Popen[bytes], *, kill: bool = False) -> bool:
    """Close its pipes and wait for it; False when it had to be killed after `UNTAKEN_WAIT_S`."""
    for stream in (proc.stdin, proc.stdout):
        try:
            if stream is not None:
                stream.close()
        except OSError:
            pass
    if kill:
        proc.kill()
    try:
        proc.wait(timeout=UNTAKEN_WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return False
    return not kill
