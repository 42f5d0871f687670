"""A run kept as a file beside the parts (`store/run_files.py`): recorded by the next landing before its samples; one
that cannot be recorded is set aside, never keeping the store from opening or its parts from landing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokview.store import Store
from tokview.store.part_sink import PartSink
from tokview.store.parts import DAMAGED_DIR, parts_dir
from tokview.store.run_files import write_run_file
from tokview.store.sample_rows import SampleIdentity


def _part(db: Path, run_id: str, make_capture: Any) -> None:
    import builders

    capture = make_capture("q", answer="a")
    sink = PartSink(str(db))
    analysis = builders.analyze(capture, builders.profile(), builders.kimi())
    sink.write_part([sink.sample_record(SampleIdentity("s1", "p1", run_id), capture, analysis)])


def test_a_kept_run_is_recorded_before_its_samples_land_and_its_file_removed(tmp_path: Path, make_capture: Any) -> None:
    db = tmp_path / "s.duckdb"
    Store(db).close()
    write_run_file(parts_dir(str(db)), "r1", {"settings": {"mode": "proxy"}, "profile": "kimi-k2.5", "source": "x"})
    _part(db, "r1", make_capture)
    with Store(db) as store:
        assert store.count_samples() == 1
        assert store.query("SELECT run_id, profile, source FROM runs") == [("r1", "kimi-k2.5", "x")]
    assert not list(parts_dir(str(db)).glob("run-*"))


def test_a_run_file_that_cannot_be_recorded_is_set_aside_and_the_parts_land(tmp_path: Path, make_capture: Any) -> None:
    """A field this tokview's put_run does not take raised out of `Store()`: no command could open the store."""
    db = tmp_path / "s.duckdb"
    Store(db).close()
    write_run_file(parts_dir(str(db)), "r1", {"started_at": "2026-12-07"})
    _part(db, "r1", make_capture)
    said: list[str] = []
    with Store(db, on_wait=said.append) as store:
        assert store.count_samples() == 1
    assert (parts_dir(str(db)) / DAMAGED_DIR / "run-r1.json").exists()
    assert any("run-r1.json" in line and "set aside" in line for line in said), said
