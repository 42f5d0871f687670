"""A spool folder left beside the store when both proxy processes died (SIGKILL, power loss) is recorded at the
next proxy start on that store, each answer once, then removed; a live proxy's folder is never touched
(issue 24: nothing already stored is lost)."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from test_proxy_recorder_spool import UP, _finished, _hand_over, _recorder, _stored_users

from tokview.core.profiles import ModelProfile
from tokview.core.tokenizer import TokenizerAdapter
from tokview.proxy.app import Upstream
from tokview.proxy.recorder_process import RecorderProcess
from tokview.proxy.serve import ProxyConfig, open_recorder
from tokview.proxy.spool_folder import records
from tokview.store import Store

_DYING_PROXY = r"""
import os, signal, sys, time
from test_proxy_recorder_spool import stalled_in_a_script
from tokview.store import Store

recorder, child, db, handed = stalled_in_a_script(sys.argv[1])
in_memory = sum(1 for frame in recorder._pending if len(frame) > 10_000)
os.kill(child, signal.SIGCONT)
recorder._spool.close()
recorder._spool = None  # no SpoolDone: the child records every answer, notes and all, but keeps the spool file
recorder._drain_blocking()


def landed() -> int:
    try:
        with Store(db, lock_timeout=0.05) as store:
            return int(store.query("SELECT count(*) FROM samples")[0][0])
    except Exception:  # the child holds the store for a moment
        return 0


deadline = time.monotonic() + 120
while landed() < handed and time.monotonic() < deadline:
    time.sleep(0.05)
print(in_memory, flush=True)
os.kill(child, signal.SIGKILL)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _spool_folders(folder: Path) -> list[Path]:
    return sorted(folder.glob(".tokview-proxy-spool*"))


def test_a_spool_left_by_a_killed_proxy_is_recorded_once_at_the_next_start_and_removed(
    tmp_path: Path, kimi_tok: TokenizerAdapter, kimi_profile: ModelProfile, make_capture: Callable[..., Any]
) -> None:
    """Both processes SIGKILLed after the child recorded the spooled answers but before it removed their spool
    file: the next start records the spool again, and each answer is still stored once."""
    capture = make_capture("what is two and two")
    items = [_finished(capture, n) for n in range(40)]
    db = tmp_path / "d.duckdb"
    args = tmp_path / "args.pickle"
    args.write_bytes(pickle.dumps((str(db), str(kimi_tok.source), kimi_profile, items, UP)))
    repo = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo / "tests"), str(repo)])}
    done = subprocess.run(
        [sys.executable, "-c", _DYING_PROXY, str(args)], cwd=repo, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    in_memory = int(done.stdout)
    with Store(db) as store:  # lands the parts the child wrote before it was killed
        assert store.query("SELECT count(*) FROM samples")[0][0] == 40
    (left,) = _spool_folders(tmp_path)  # left behind, its answers whole: nobody picks it up
    spools = [p.name for p in left.iterdir() if p.name.startswith("spool-") and not p.name.startswith("spool-c")]
    assert spools == ["spool-000001"]  # and the child's journal of what the pipe brought (`spool-c…`)
    spooled = len(list(records(str(left / "spool-000001"))))
    assert 30 <= spooled <= 40 - in_memory  # all recorded by the child before the kill: to be stored once

    # a proxy on another store in the same folder leaves it alone (it took the answers into its own store)
    other = tmp_path / "other.duckdb"
    config = ProxyConfig([UP], db=str(other), tokenizer=kimi_tok, profile=kimi_profile, record_in="thread")
    neighbour = open_recorder(config, [Upstream(UP, "vllm", None, {}, None)])
    assert neighbour is not None
    neighbour.close()
    assert _spool_folders(tmp_path) == [left]
    with Store(other) as store:
        assert store.query("SELECT count(*) FROM samples")[0][0] == 0

    config = ProxyConfig([UP], db=str(db), tokenizer=kimi_tok, profile=kimi_profile, record_in="process")
    recorder = open_recorder(config, [Upstream(UP, "vllm", None, {}, None)])
    assert isinstance(recorder, RecorderProcess)
    _hand_over(recorder, [_finished(capture, 40)])  # and the new proxy records as usual
    recorder.close()
    assert (recorder.recorded, recorder.not_recorded) == (1, 0)
    assert _stored_users(db) == sorted(f"user:u{n}" for n in range(41))  # each answer once
    assert _spool_folders(tmp_path) == []


def test_the_spool_folder_of_a_live_proxy_is_left_alone_and_an_empty_dead_one_removed(
    tmp_path: Path, kimi_tok: TokenizerAdapter, kimi_profile: ModelProfile, make_capture: Callable[..., Any]
) -> None:
    """A second proxy on the same store while the first one's recorder is behind: the first one's spool is its
    own (still being read); an empty folder of a dead proxy is simply removed."""
    capture = make_capture("what is two and two")
    items = [_finished(capture, n) for n in range(40)]
    db = tmp_path / "l.duckdb"
    dead = tmp_path / ".tokview-proxy-spool-deadbeef"  # a proxy's that died before it spooled anything
    dead.mkdir()
    (dead / "owner.lock").touch()
    with _recorder(db, kimi_tok, kimi_profile) as first:
        first.spool_over = 100_000
        with Store(db):  # the child has let go of the store (the second proxy opens it), then it gets no CPU
            os.kill(first.process.pid or 0, signal.SIGSTOP)
        _hand_over(first, items)
        live = Path(first._spool_dir or "")
        before = sorted(p.name for p in live.iterdir())
        config = ProxyConfig([UP], db=str(db), tokenizer=kimi_tok, profile=kimi_profile, record_in="thread")
        second = open_recorder(config, [Upstream(UP, "vllm", None, {}, None)])
        assert second is not None
        second.close()
        assert sorted(p.name for p in live.iterdir()) == before
        assert _spool_folders(tmp_path) == [live]
        with Store(db) as store:
            assert store.query("SELECT count(*) FROM samples")[0][0] == 0
        os.kill(first.process.pid or 0, signal.SIGCONT)
        first.close()
        assert (first.recorded, first.not_recorded) == (40, 0)
    assert _stored_users(db) == sorted(f"user:u{n}" for n in range(40))
    assert _spool_folders(tmp_path) == []


def test_a_leftover_is_its_stores_and_goes_with_it_when_the_store_moves(tmp_path: Path) -> None:
    """A folder names its store, by path and by file id: another store beside it leaves it alone, even once its
    store is gone from that path; the store renamed (or its folder moved on its file system) takes it. A path holding
    a CR is compared as written."""
    from tokview.proxy import spool_folder

    for name in ("a.duckdb", "w\rx.duckdb"):
        db = tmp_path / name
        db.write_bytes(b"")
        folder = spool_folder.make(str(db), "run-1")
        assert folder is not None
        spool_folder.release(folder)  # its proxy is gone
        other = tmp_path / "other.duckdb"
        other.write_bytes(b"")
        assert list(spool_folder.leftovers(str(other))) == []  # not the other store's
        [mine] = spool_folder.leftovers(str(db))
        assert (mine.path, mine.run_id) == (folder, "run-1")
        os.close(mine.fd)
        moved = tmp_path / f"moved-{len(name)}.duckdb"
        db.rename(moved)
        assert list(spool_folder.leftovers(str(other))) == [], "a store gone from its path is still not the other's"
        [taken] = spool_folder.leftovers(str(moved))
        assert taken.path == folder
        taken.remove()


def test_a_refused_start_leaves_no_spool_folder(tmp_path: Path, kimi_tok: TokenizerAdapter, kimi_profile: ModelProfile):
    """The folder was made before the recorder child refused the store (no DuckDB file; `--db /dev/null` made one in
    /dev), and no later start removed it: each refused start left a `.tokview-proxy-spool-*` behind."""
    import pytest

    from tokview.errors import TokviewError

    db = tmp_path / "notes.duckdb"
    db.write_text("not a database\n")
    config = ProxyConfig([UP], db=str(db), tokenizer=kimi_tok, profile=kimi_profile, record_in="process")
    with pytest.raises(TokviewError, match="not a DuckDB"):
        open_recorder(config, [Upstream(UP, "vllm", None, {}, None)])
    assert _spool_folders(tmp_path) == []
    assert db.read_text() == "not a database\n"
