"""A landing reads several small sample parts as one file (`landing.one_file`): DuckDB's `read_json` costs a few ms
for each file it is given, and an agent's turns land a part each. Nothing else changes: every line lands, a part
cut short stays a line of its own, big parts are read as they are, and no copy is left behind."""

from __future__ import annotations

import os
from pathlib import Path

from builders import kimi, make_capture, profile

from tokview.core.analysis import analyze
from tokview.store import SampleIdentity, Store, landing
from tokview.store.parts import complete_parts


def _record(store: Store, sid: str) -> dict:
    cap = make_capture(f"question {sid}")
    return store.sample_record(
        SampleIdentity(sid, f"p-{sid}", "run1", gen_index=0), cap, analyze(cap, profile(), kimi())
    )


def _reads(monkeypatch) -> list[list[Path]]:
    seen: list[list[Path]] = []
    real = landing.land_samples

    def recorded(conn, files, columns, types):
        seen.append([Path(f) for f in files])
        return real(conn, files, columns, types)

    monkeypatch.setattr(landing, "land_samples", recorded)
    return seen


def test_small_parts_land_as_one_file_and_leave_nothing_behind(tmp_path, monkeypatch):
    db = tmp_path / "s.duckdb"
    with Store(db) as store:
        for sid in ("a", "b", "c"):
            store.write_part([_record(store, sid)])
        last = complete_parts(store.parts_dir)[0][-1]
        last.write_bytes(last.read_bytes().rstrip(b"\n"))  # its last line without its newline
        reads = _reads(monkeypatch)
        assert store.ingest() == (3, 0)
        assert len(reads) == 1 and len(reads[0]) == 1 and reads[0][0].name.startswith(".landing-")
        assert sorted(r[0] for r in store.query("SELECT sample_id FROM samples")) == ["a", "b", "c"]
        assert list(store.parts_dir.iterdir()) == []  # the parts landed and removed, the copy removed


def test_big_parts_are_read_as_they_are(tmp_path, monkeypatch):
    monkeypatch.setattr(landing, "JOIN_BYTES_PER_FILE", 1)
    db = tmp_path / "s.duckdb"
    with Store(db) as store:
        for sid in ("a", "b"):
            store.write_part([_record(store, sid)])
        parts = complete_parts(store.parts_dir)[0]
        reads = _reads(monkeypatch)
        assert store.ingest() == (2, 0)
        assert reads == [parts]


def _small_parts(tmp_path: Path, n: int) -> tuple[Path, list[Path]]:
    folder = tmp_path / "parts"
    folder.mkdir()
    files = [folder / f"part-{k}.samples.jsonl" for k in range(n)]
    for f in files:
        f.write_text('{"x": 1}\n')
    return folder, files


def test_a_copy_that_cannot_be_written_reads_the_parts_as_they_are(tmp_path):
    folder, files = _small_parts(tmp_path, 2)
    assert landing.one_file(files, tmp_path / "missing-folder") is None
    assert landing.one_file(files[:1], folder) is None  # one part: nothing to join
    joined = landing.one_file(files, folder)
    assert joined is not None and joined.read_bytes() == b'{"x": 1}\n{"x": 1}\n'


def test_a_disk_without_room_to_spare_reads_the_parts_as_they_are(tmp_path, monkeypatch):
    """A copy that fit took the room DuckDB then needed: every landing failed on a nearly full disk until space was
    freed. The parts are joined only with twice their size and a margin free."""
    import shutil
    from collections import namedtuple

    folder, files = _small_parts(tmp_path, 3)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(1 << 30, (1 << 30) - (1 << 20), 1 << 20))
    assert landing.one_file(files, folder) is None
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(1 << 40, 0, 1 << 40))
    assert landing.one_file(files, folder) is not None
    monkeypatch.setattr(landing, "JOIN_MAX_BYTES", 8)  # and never a copy past the cap
    assert landing.one_file(files, folder) is None


def test_a_copy_a_killed_landing_left_is_removed_at_the_next_one(tmp_path):
    """A landing killed between its copy and its end left `.landing-<pid>-N….tmp` for an hour (the stale `.tmp`
    rule): the next landing, which holds the store as any landing does, removes another process's copy at once.
    Its own process's copies, any other `.tmp` (a batch's part being written), and copies seen without the store
    held (opening it read-only) wait for the hour."""
    db = tmp_path / "s.duckdb"
    other = os.getpid() + 1  # alive or not: a landing of it would hold the store
    with Store(db) as store:
        store.write_part([_record(store, "a")])
        left = store.parts_dir / f".landing-{other}-3.samples.jsonl.tmp"
        trial = store.parts_dir / f".trial-{other}-1.samples.jsonl.tmp"
        mine = store.parts_dir / f".landing-{os.getpid()}-0.samples.jsonl.tmp"
        writing = store.parts_dir / f"part-{other}.samples.jsonl.tmp"
        for f in (left, trial, mine, writing):
            f.write_bytes(b"{}\n")
        complete_parts(store.parts_dir)  # not held for writing: nothing taken
        assert left.exists() and trial.exists()
        assert store.ingest() == (1, 0)
        assert not left.exists() and not trial.exists()
        assert mine.exists() and writing.exists()
