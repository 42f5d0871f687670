"""Where an export's files land, and how they land together.

- `--out` through a symlink writes to the symlink's target (the link stays); `--out -`, a FIFO or a
  character device (/dev/stdout) is streamed to, never replaced; any other non-regular file is
  refused. A regular file is replaced atomically.
- The data and its sidecars (manifest, token counts, errors, SpecForge template) are all written to
  temp files first, then renamed sidecars first and data last: a kill at any point leaves either the
  old data with whatever sidecars were renamed (the new manifest names the new data's sha256, so a
  reader can tell), or the new data beside all its new sidecars; never new data beside an old manifest.
- Temp files are named `.<final name>.<pid>.<random>.partial`; one left by a killed export (its pid
  gone) is removed by the next export to the same name.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from tokview.errors import TokviewError, describe_error


class OutputError(TokviewError):
    """The output path cannot be written as asked (one line, for the user)."""

    title = "export output"


@dataclass
class Target:
    """One final file of an export and the temp file it is written through."""

    final: Path
    tmp: Path | None = None

    @property
    def temp(self) -> Path:
        """The temp file being written: set by `make_temps`, gone after `commit` / `discard_temps`."""
        if self.tmp is None:
            raise RuntimeError(f"no temp file for {self.final} (make_temps not called, or already committed)")
        return self.tmp


@dataclass
class Plan:
    """The data target (a file or a stream) and the sidecar files beside it."""

    data: Target | None
    stream_path: str | None = None
    """`-` or a FIFO/character device path: the data is written straight to it."""
    sidecar_dir: Path | None = None
    sidecar_stem: str | None = None
    sidecars: dict[str, Target] = field(default_factory=dict)
    stale: list[Path] = field(default_factory=list)
    """Sidecars of other formats at this name: removed once the new data is in place (`commit`)."""

    @property
    def name(self) -> str:
        if self.descriptor is not None:
            return "/dev/stdout" if self.descriptor == 1 else f"/dev/fd/{self.descriptor}"
        return self.data.final.name if self.data else (self.stream_path or "-")

    @property
    def descriptor(self) -> int | None:
        """The open descriptor the data is written through (`--out /dev/stdout`, `/dev/fd/N`), else None."""
        if self.stream_path is not None and self.stream_path.startswith(_FD):
            return int(self.stream_path[len(_FD) :])
        return None

    def targets(self) -> list[Target]:
        return ([self.data] if self.data else []) + list(self.sidecars.values())


def _mode_of(path: Path, default: int) -> int:
    """The read/write/execute bits of the file at `path` (never its setuid, setgid or sticky bit: a data file is no
    program), or `default` when there is none."""
    try:
        return stat.S_IMODE(path.stat().st_mode) & 0o777
    except OSError:
        return default


def _default_mode() -> int:
    """0o666 minus the umask: what `open(path, "w")` would give.

    Read from /proc where there is one: setting the umask to read it back is process-wide, and the
    UI exports from a worker thread while other threads create files."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def _kind(path: Path) -> str | None:
    """'file', 'dir', 'stream' (FIFO or character device), 'other', or None when nothing is there."""
    try:
        st = os.stat(path)  # follows symlinks: the target decides
    except (FileNotFoundError, NotADirectoryError):
        return None  # nothing there (a parent that is a file is named by plan_output)
    except OSError as exc:
        raise OutputError(f"cannot use --out {path}: {exc.strerror or exc}") from None
    if stat.S_ISREG(st.st_mode):
        return "file"
    if stat.S_ISDIR(st.st_mode):
        return "dir"
    if stat.S_ISFIFO(st.st_mode) or stat.S_ISCHR(st.st_mode):
        return "stream"
    return "other"


_FD = "fd:"
_FD_PATH = re.compile(r"^/(?:proc/(?:self|thread-self|\d+)|dev)/fd/(\d+)$")


def _descriptor(path: str) -> int | None:
    """The open descriptor of this process `path` names (/dev/stdout, /dev/fd/N, /proc/self/fd/N, through any
    symlinks), None for any other path. Opened by name, a descriptor redirected to a file (`--out /dev/stdout >>
    log.jsonl`) is that file, and it was replaced: its earlier lines gone, sidecars written beside it."""
    current = os.path.abspath(path)
    for _ in range(16):
        found = _FD_PATH.match(current)
        if found and (
            not current.startswith("/proc/") or current.split("/")[2] in ("self", "thread-self", str(os.getpid()))
        ):
            return int(found.group(1))
        try:
            target = os.readlink(current)
        except OSError:
            return None
        current = os.path.normpath(os.path.join(os.path.dirname(current), target))
    return None


def through_links(path: Path) -> Path:
    """The file a write to `path` should replace: a symlink's (final) target, else the path itself."""
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def plan_output(out: str | Path, example: str) -> Plan:
    """Decide how to write `--out`; OutputError (one line) when it cannot be written."""
    if str(out) == "-":
        return Plan(data=None, stream_path="-")
    if not str(out).strip():  # Path("") is "." (the working directory): named as what it is, an empty path
        raise OutputError("--out is empty: give a file name (or - for standard output)")
    fd = _descriptor(str(out))
    if fd is not None:  # /dev/stdout, /dev/fd/N: written through the descriptor, never reopened nor replaced
        return Plan(data=None, stream_path=f"{_FD}{fd}")
    out = Path(out)
    kind = _kind(out)
    if kind == "dir":
        inside = not out.name.endswith(".parts")  # a store's parts folder takes no export: one beside it is named
        raise OutputError(
            f"--out {out} is a directory: give a file name (e.g. {out / example if inside else out.parent / example})"
        )
    if kind == "other":
        raise OutputError(f"--out {out} is not a regular file, FIFO or terminal: refusing to replace it")
    if kind == "stream":
        # a FIFO keeps its sidecars beside it; a device (/dev/stdout) has no folder to put them in
        fifo = stat.S_ISFIFO(os.stat(out).st_mode)
        return Plan(
            data=None,
            stream_path=str(out),
            sidecar_dir=out.parent if fifo else None,
            sidecar_stem=_stem(out.name) if fifo else None,
        )
    final = through_links(out)
    for parent in final.parents:  # the nearest existing ancestor must be a folder to create the file in
        if parent.exists():
            if not parent.is_dir():
                raise OutputError(f"--out {out}: {parent} is a file, not a folder")
            break
    return Plan(data=Target(final), sidecar_dir=final.parent, sidecar_stem=_stem(final.name))


def _stem(name: str) -> str:
    """Sidecars are named after the data file without its suffix (`train.jsonl` → `train.manifest.json`),
    except Parquet's, named after the full name (`train.parquet.manifest.json`)."""
    if name.lower().endswith(".parquet"):  # `T.PARQUET` too: its format is read so, whatever the case
        return name
    suffix = Path(name).suffix
    return name[: -len(suffix)] if suffix else name


def forget_sidecar(plan: Plan, suffix: str) -> None:
    """A sidecar this export does not write: any file of that name beside the data goes at the commit."""
    if plan.sidecar_dir is not None and plan.sidecar_stem is not None:
        plan.stale.append(plan.sidecar_dir / f"{plan.sidecar_stem}.{suffix}")


def add_sidecar(plan: Plan, key: str, suffix: str) -> Target | None:
    """Register a sidecar `<stem>.<suffix>`; None when the data goes to a device with no folder."""
    if plan.sidecar_dir is None or plan.sidecar_stem is None:
        return None
    path = plan.sidecar_dir / f"{plan.sidecar_stem}.{suffix}"
    kind = _kind(path)
    if kind not in (None, "file"):
        raise OutputError(f"{path} is not a regular file: refusing to replace it (move it or choose another --out)")
    target = Target(through_links(path))
    plan.sidecars[key] = target
    return target


def refuse_another_exports_sidecars(plan: Plan) -> None:
    """Refuse an `--out` whose sidecars are another export's: `t2.json` and `t2.jsonl` share `t2.manifest.json`, so
    the second export replaced the first one's manifest and token counts (and deleted its SpecForge template) while
    its data stayed, now described by the wrong manifest. A manifest whose data file is gone is no one's."""
    if plan.sidecar_dir is None or plan.sidecar_stem is None:
        return
    manifest = plan.sidecar_dir / f"{plan.sidecar_stem}.manifest.json"
    try:
        data = json.loads(manifest.read_text(encoding="utf-8")).get("data")
    except (OSError, ValueError, AttributeError):
        return  # none, unreadable, or not a manifest of ours: replaced as before
    if (
        isinstance(data, str)
        and data != plan.name
        and "/" not in data
        and _stem(data) == plan.sidecar_stem  # a renamed copy's manifest names its original: no one's here
        and (plan.sidecar_dir / data).is_file()
    ):
        raise OutputError(
            f"--out {plan.name}: {manifest.name} beside it describes {data}, another export whose sidecars share the "
            f"name {plan.sidecar_stem}; choose another --out (or remove {data} and its sidecars)"
        )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale_partials(plan: Plan) -> list[Path]:
    """Remove temp files an earlier, killed export left for these names (their writer's pid is gone)."""
    removed = []
    for target in plan.targets():
        prefix = f".{target.final.name}."
        for path in target.final.parent.glob(f"{glob_escape(prefix)}*.partial"):
            middle = path.name[len(prefix) : -len(".partial")]
            pid = middle.split(".", 1)[0]
            if pid.isdecimal() and (int(pid) == os.getpid() or _pid_alive(int(pid))):
                continue  # an export to this name running now (this one, or another process)
            try:
                path.unlink()
                removed.append(path)
            except OSError:
                pass
    return removed


def glob_escape(text: str) -> str:
    return "".join(f"[{c}]" if c in "*?[]" else c for c in text)


def make_temps(plan: Plan) -> None:
    """Create every temp file beside its final name (mode 0600 until committed)."""
    for target in plan.targets():
        try:
            target.final.parent.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(
                dir=target.final.parent, prefix=f".{target.final.name}.{os.getpid()}.", suffix=".partial"
            )
        except OSError as exc:  # a folder that cannot be made or written to: the user's --out
            discard_temps(plan)
            said = exc.strerror or describe_error(exc)  # not the temp file's name, which the user never gave
            raise OutputError(
                f"cannot write {target.final}: no file can be made in {target.final.parent} ({said})"
            ) from None
        os.close(fd)
        target.tmp = Path(name)


def discard_temps(plan: Plan) -> None:
    for target in plan.targets():
        if target.tmp is not None:
            target.tmp.unlink(missing_ok=True)


def commit(plan: Plan) -> None:
    """Sidecars first, data last (see the module docstring for why this order)."""
    mode = _default_mode()
    order = list(plan.sidecars.values()) + ([plan.data] if plan.data else [])
    data_mode = _mode_of(plan.data.final, mode) if plan.data else mode
    for target in order:
        # mkstemp makes 0600; a file replaced keeps its mode (a training file kept private stays so: it came out
        # 0644), a new sidecar takes the data file's, a new file the mode any new file would
        os.chmod(target.temp, _mode_of(target.final, data_mode))
    for target in order:
        os.replace(target.temp, target.final)
        target.tmp = None
    for path in plan.stale:  # after the data: a kill before leaves the old file, never the new data without its own
        path.unlink(missing_ok=True)


def open_stream(plan: Plan) -> IO[bytes]:
    if plan.stream_path is None:
        raise RuntimeError(f"{plan.name} is a file, not a stream")
    if plan.stream_path == "-":
        return os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    if plan.descriptor is not None:
        return os.fdopen(os.dup(plan.descriptor), "wb")
    return open(plan.stream_path, "wb")  # a FIFO or device: written to, never replaced
