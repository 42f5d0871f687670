"""Kill points chosen by events, not sleeps: files appearing (inotify), stderr lines, requests a server saw.

A kill matrix is only worth keeping if each kill lands where it says: "SIGKILL when the first part is
renamed into place" must not drift to "whenever 0.3 s had passed on a loaded box". `Watch` reports files
created or renamed into a folder the moment the kernel sees them; `Proc` runs a tokview command in its
own process group (so a group kill never reaches pytest), reads its stderr as it comes, and kills the
process, its group or one of its worker children.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import struct
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

IN_MODIFY, IN_CLOSE_WRITE, IN_MOVED_TO, IN_CREATE = 0x2, 0x8, 0x80, 0x100
_EVENT = struct.Struct("iIII")
_libc = ctypes.CDLL("libc.so.6", use_errno=True)


class Watch:
    """Names created or renamed into `folder` since the watch began (Linux inotify, read without blocking)."""

    def __init__(self, folder: Path, mask: int = IN_CREATE | IN_MOVED_TO) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.fd = _libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0 or _libc.inotify_add_watch(self.fd, str(folder).encode(), mask) < 0:
            raise OSError(ctypes.get_errno(), "inotify")
        self.names: list[str] = []

    def poll(self, wait_s: float = 0.0) -> list[str]:
        """Read what has happened (waiting up to `wait_s` for a first event); returns every name so far."""
        if select.select([self.fd], [], [], wait_s)[0]:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                data = b""
            at = 0
            while at < len(data):
                _, _, _, size = _EVENT.unpack_from(data, at)
                at += _EVENT.size
                self.names.append(data[at : at + size].rstrip(b"\0").decode())
                at += size
        return self.names

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _ppid_and_state(pid: int) -> tuple[int, str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[1]), fields[0]


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper is not)."""
    got = _ppid_and_state(pid)
    return got is not None and got[1] not in ("Z", "X")


def children(pid: int) -> list[int]:
    """Live direct children of `pid`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            got = _ppid_and_state(int(entry))
            if got is not None and got[0] == pid and got[1] not in ("Z", "X"):
                found.append(int(entry))
    return found


def workers(pid: int) -> list[int]:
    """`batch --workers N`'s spawned capture children (not multiprocessing's resource tracker)."""
    out = []
    for child in children(pid):
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmdline:
            out.append(child)
    return out


class Proc:
    """A tokview command in its own session; stderr collected line by line as it arrives."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
        self.popen = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.pid = self.popen.pid
        self.lines: list[str] = []
        self.stdout = b""
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()
        self._out = threading.Thread(target=self._read_stdout, daemon=True)
        self._out.start()
        self.tree: set[int] = {self.pid}
        """Every pid of the run seen so far (the parent and the workers it spawned)."""

    def _read_stderr(self) -> None:
        assert self.popen.stderr is not None
        for raw in self.popen.stderr:
            self.lines.append(raw.decode("utf-8", "replace"))

    def _read_stdout(self) -> None:
        assert self.popen.stdout is not None
        self.stdout = self.popen.stdout.read()

    @property
    def stderr(self) -> str:
        return "".join(self.lines)

    def wait_for(self, what: str, ready: Callable[[], bool], timeout: float = 60) -> bool:
        """Poll `ready` every 2 ms until true (True) or the process ends first (False). A timeout fails."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is None:
                self.tree.update(workers(self.pid))
            if ready():
                if self.popen.poll() is None:  # a child may have been spawned since the look above
                    self.tree.update(workers(self.pid))
                return True
            if self.popen.poll() is not None:
                return False
            time.sleep(0.002)
        self.kill_group(signal.SIGKILL)
        raise AssertionError(f"waited {timeout}s for {what}; stderr so far:\n{self.stderr}")

    def send(self, sig: int, target: str) -> None:
        """`target`: "process" (the pid alone), "group" (its whole process group) or "worker" (one child)."""
        if target == "group":
            self.kill_group(sig)
        elif target == "worker":
            (child, *_) = workers(self.pid)
            os.kill(child, sig)
        else:
            os.kill(self.pid, sig)

    def kill_group(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass

    def finish(self, timeout: float = 60) -> int:
        """Wait for the process and every worker it had to be gone; returns the exit code."""
        try:
            code = self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_group(signal.SIGKILL)
            raise AssertionError(f"still running {timeout}s after the signal; stderr:\n{self.stderr}") from None
        deadline = time.monotonic() + timeout
        while any(alive(p) for p in self.tree) and time.monotonic() < deadline:
            time.sleep(0.01)
        left = [p for p in self.tree if alive(p)]
        if left:
            self.kill_group(signal.SIGKILL)
            raise AssertionError(f"pids {left} outlived their run by {timeout}s")
        self._reader.join(timeout=5)
        self._out.join(timeout=5)
        return code
