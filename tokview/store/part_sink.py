"""What a batch writer needs of the store without opening it: `PartSink`, and the store's errors.

A `--workers` child and a Ray task only write parts (`parts.py`); the parent lands them. Importing
DuckDB's Python package costs ~50 ms of start-up and ~25 MB of memory per process, so these live
apart from `store.py`: a child never imports DuckDB (a test holds the worker's imports to that).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tokview.core.record import Capture
from tokview.secrets import Secrets, scrub_optional, scrub_text, url_secrets
from tokview.store import parts
from tokview.store.errors import StoreError as StoreError
from tokview.store.errors import StoreFull as StoreFull
from tokview.store.errors import is_disk_full, no_room_said
from tokview.store.sample_rows import SAMPLE_COLUMNS, SampleIdentity, capture_secrets, masked_text, sample_params

if TYPE_CHECKING:
    from tokview.core.analysis import Analysis


class PartWriter(Protocol):
    """What a batch writer writes through: a `Store`, a `PartSink` (a `--workers` child), a Ray task's
    `CollectingSink` or the proxy's recorder. `ingest` lands the parts written (a sink that does not own the store
    lands nothing)."""

    def sample_record(self, key: SampleIdentity, capture: Capture, analysis: Analysis) -> dict[str, Any]: ...
    def write_part(self, samples: list[bytes], failures: list[dict[str, Any]]) -> None: ...
    def ingest(self) -> tuple[int, int]: ...


class PartSink:
    """Writes parts for a store without opening its DuckDB file: what `--workers` children and Ray tasks use."""

    def __init__(
        self, path: str | Path, server_urls: Iterable[str] = (), *, parts_dir: Callable[[], Path] | None = None
    ) -> None:
        """`parts_dir`: where the parts go when not beside the file (a `:memory:` store's folder, made on first
        use)."""
        self.path = str(path)
        self._secrets: tuple[str, ...] = ()
        self._parts_dir = parts_dir
        self.add_server_urls(server_urls)

    @property
    def parts_dir(self) -> Path:
        return self._parts_dir() if self._parts_dir is not None else parts.parts_dir(self.path)

    @property
    def secrets(self) -> tuple[str, ...]:
        """The server credentials masked in every payload written (see `add_server_urls`)."""
        return self._secrets

    def add_server_urls(self, urls: Iterable[str]) -> None:
        """Mask these URLs' user names and passwords in every payload written from now on."""
        self._secrets = tuple(dict.fromkeys([*self._secrets, *(v for u in urls for v in url_secrets(u))]))

    def ingest(self) -> tuple[int, int]:
        return 0, 0  # the process that owns the store lands the parts

    def sample_record(
        self,
        key: SampleIdentity,
        capture: Capture,
        analysis: Analysis,
    ) -> dict[str, Any]:
        """One sample as a part line: the same columns (and scrubbing) as `put_sample`, plus its findings, their
        details masked as its payloads are (`stopped_by_request` quotes the stop string a server echoed)."""
        record = dict(
            zip(
                SAMPLE_COLUMNS,
                sample_params(key, capture, analysis, secrets=self._secrets),
            )
        )
        masked = capture_secrets(capture, self._secrets)
        record["findings"] = [
            {
                "code": f.code,
                "severity": f.severity,
                "detail": masked_text(f.detail, masked),
                "positions": list(f.positions),
            }
            for f in analysis.findings
        ]
        return record

    def write_part(self, samples: Sequence[dict[str, Any] | bytes], failures: Sequence[dict[str, Any]] = ()) -> None:
        """Hand finished samples and failures to the store without opening it (see `parts.py`).

        Raises StoreFull when the disk is full (nothing half-written is left), StoreError otherwise."""
        clean: list[dict[str, Any] | bytes] = [
            {
                "prompt_id": f.get("prompt_id"),
                "sample_id": f.get("sample_id"),
                "run_id": f.get("run_id"),
                "reason": scrub_text(str(f.get("reason") or ""), Secrets.of(list(self._secrets))),
                "server": scrub_optional(f.get("server")),
                "at": f.get("at") or _now(),
            }
            for f in failures
        ]
        try:
            parts.write_part(self.parts_dir, parts.SAMPLES_SUFFIX, list(samples))
            parts.write_part(self.parts_dir, parts.FAILURES_SUFFIX, clean)
        except OSError as exc:
            if is_disk_full(exc):
                raise StoreFull(f"{no_room_said(exc)} ({self.parts_dir})") from None
            raise StoreError(f"cannot write to {self.parts_dir}: {exc.strerror or exc}") from None


def _now() -> str:
    from datetime import datetime

    return datetime.now().isoformat(sep=" ")
