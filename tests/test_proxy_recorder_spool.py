"""A recorder process that falls behind (a burst on busy cores, its lower priority) never grows the proxy's memory
past a bound and never loses an answer: the rest is spooled to a file beside the store and recorded after
(issue 24 item 5)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson

from tokview.core.profiles import ModelProfile
from tokview.core.tokenizer import TokenizerAdapter
from tokview.proxy.app import Upstream
from tokview.proxy.recorder import Finished
from tokview.proxy.recorder_process import RecorderProcess
from tokview.proxy.serve import ProxyConfig, open_recorder
from tokview.store import Store

UP = "http://127.0.0.1:9"


def _finished(capture: Any, n: int) -> Finished:
    """A whole non-streamed chat answer with ids, padded to ~20 KB (so a few fill the pipe)."""
    body = {
        "id": f"chatcmpl-{n}",
        "object": "chat.completion",
        "prompt_token_ids": capture.prompt_ids,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": capture.content},
                "finish_reason": "stop",
                "token_ids": capture.output_ids,
            }
        ],
        "padding": "x" * 20_000,
    }
    request = {"model": "m", "messages": capture.messages, "user": f"u{n}"}
    return Finished(
        "chat", "vllm", UP, {}, None, request, {"body": request}, orjson.dumps(body), False, 0.01, None, f"u{n}"
    )


@contextmanager
def _recorder(
    db: Path, tok: TokenizerAdapter, profile: ModelProfile, say: Callable[[str], None] | None = None
) -> Iterator[RecorderProcess]:
    config = ProxyConfig([UP], db=str(db), tokenizer=tok, profile=profile, record_in="process")
    if say is not None:
        config = dataclasses.replace(config, say=say)
    recorder = open_recorder(config, [Upstream(UP, "vllm", None, {}, None)])
    assert isinstance(recorder, RecorderProcess)
    try:
        yield recorder
    finally:
        if recorder.process.is_alive():
            os.kill(recorder.process.pid or 0, signal.SIGCONT)


def _hand_over(recorder: RecorderProcess, items: list[Finished]) -> None:
    """Take every item on a running loop (as the proxy's loop does), then let the loop say the pipe is writable."""

    async def run() -> None:
        for item in items:
            recorder.take(item)
        await asyncio.sleep(0.05)

    asyncio.run(run())


def stalled_in_a_script(args_path: str) -> tuple[RecorderProcess, int, str, int]:
    """For a script run as the proxy's own process (kill tests): the recorder the pickled (db, tokenizer folder,
    profile, items, upstream) describe, its child stopped and every item handed over, what the pipe could not take
    spooled past 100 KB. Returns (recorder, the child's pid, db, how many items were handed over)."""
    import pickle

    from tokview.core.tokenizer import load_tokenizer

    with open(args_path, "rb") as f:
        db, tok_dir, profile, items, up = pickle.load(f)
    config = ProxyConfig([up], db=db, tokenizer=load_tokenizer(tok_dir), profile=profile, record_in="process")
    recorder = open_recorder(config, [Upstream(up, "vllm", None, {}, None)])
    assert isinstance(recorder, RecorderProcess)
    recorder.spool_over = 100_000
    child = recorder.process.pid or 0
    os.kill(child, signal.SIGSTOP)
    _hand_over(recorder, items)
    return recorder, child, db, len(items)


def _stored_users(db: Path) -> list[str]:
    with Store(db) as store:
        return sorted(p for (p,) in store.query("SELECT prompt_id FROM samples"))


def test_a_stalled_recorder_holds_a_bounded_backlog_in_memory_spools_the_rest_and_records_it_all(
    tmp_path: Path, kimi_tok: TokenizerAdapter, kimi_profile: ModelProfile, make_capture: Callable[..., Any]
) -> None:
    capture = make_capture("what is two and two")
    items = [_finished(capture, n) for n in range(40)]  # ~0.8 MB: the pipe takes a few, 100 KB wait in memory
    with _recorder(tmp_path / "s.duckdb", kimi_tok, kimi_profile) as recorder:
        comm = Path(f"/proc/{recorder.process.pid}/comm")
        assert not comm.exists() or comm.read_text().strip() == "tokview-record"  # as `top` and `pgrep` name it
        recorder.spool_over = 100_000
        os.kill(recorder.process.pid or 0, signal.SIGSTOP)  # a recorder that gets no CPU for a while
        _hand_over(recorder, items)
        spool_dir = Path(recorder._spool_dir or "")
        assert spool_dir.parent == tmp_path  # beside the store, not in /tmp (often memory)
        assert sorted(p.name for p in spool_dir.iterdir()) == ["owner.lock", "run_id", "spool-000001", "store"]
        assert recorder.memory_peak <= 100_000 + 25_000
        assert recorder.spooled > 500_000
        os.kill(recorder.process.pid or 0, signal.SIGCONT)
        recorder.close()
        assert (recorder.recorded, recorder.failed, recorder.not_recorded) == (40, 0, 0)
        assert recorder.backlog_said().startswith("the recorder's backlog peaked at ")
        assert not spool_dir.exists()
    assert _stored_users(tmp_path / "s.duckdb") == sorted(f"user:u{n}" for n in range(40))


def test_answers_spooled_before_the_forwarding_process_dies_are_recorded_by_the_child(
    tmp_path: Path, kimi_tok: TokenizerAdapter, kimi_profile: ModelProfile, make_capture: Callable[..., Any]
) -> None:
    """The parent's pipe closes with notes still waiting in its memory (as a SIGKILL closes it): the child records
    what the pipe held and every answer of the spool file, whole on disk; only what waited in memory is lost."""
    capture = make_capture("what is two and two")
    items = [_finished(capture, n) for n in range(40)]
    with _recorder(tmp_path / "k.duckdb", kimi_tok, kimi_profile) as recorder:
        recorder.spool_over = 100_000
        os.kill(recorder.process.pid or 0, signal.SIGSTOP)
        _hand_over(recorder, items)
        in_memory = sum(1 for frame in recorder._pending if len(frame) > 10_000)  # whole answers, not notes
        recorder._jobs.close()  # the parent gone: what it held in memory is lost with it
        os.kill(recorder.process.pid or 0, signal.SIGCONT)
        recorder.process.join(60)
        assert recorder.process.exitcode == 0
    stored = _stored_users(tmp_path / "k.duckdb")
    assert 40 - in_memory - 1 <= len(stored) <= 40 - in_memory  # the one cut mid-write to the pipe, at most
    assert stored == sorted(set(stored))
    assert {f"user:u{n}" for n in range(40 - 10, 40)} <= set(stored)  # the last answers: all spooled, all kept


def test_a_store_folder_where_no_spool_can_be_made_leaves_the_backlog_in_memory(tmp_path: Path) -> None:
    """Not a traceback at start: the store's own error says what is wrong with its folder."""
    from tokview.proxy.serve import spool_dir_for

    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x")
    assert spool_dir_for(str(not_a_folder / "p.duckdb")) is None
    made = spool_dir_for(str(tmp_path / "p.duckdb"))
    assert made is not None and Path(made).parent == tmp_path and Path(made).name.startswith(".tokview-proxy-spool-")


def _next_start(db: Path, tok: TokenizerAdapter, profile: ModelProfile) -> list[str]:
    """What the store holds after the next proxy start (it records the spools a dead run left) and its close."""
    with _recorder(db, tok, profile) as recorder:
        recorder.close()
    return _stored_users(db)


def test_answers_spooled_whole_survive_a_recorder_killed_alone(
    tmp_path: Path, kimi_tok: TokenizerAdapter, kimi_profile: ModelProfile, make_capture: Callable[..., Any]
) -> None:
    """The recorder child alone dies (the OOM killer, a kill -9 of its pid): the forwarding process keeps the spool
    folder as it closes (it removed it whatever the child's end, and the answers whole in it were never recorded),
    counts every answer it could not hand over, and the next start records the spooled ones."""
    from tokview.proxy.spool_folder import records

    capture = make_capture("what is two and two")
    items = [_finished(capture, n) for n in range(40)]
    db = tmp_path / "b.duckdb"
    with _recorder(db, kimi_tok, kimi_profile) as recorder:
        recorder.spool_over = 100_000
        os.kill(recorder.process.pid or 0, signal.SIGSTOP)
        _hand_over(recorder, items)
        spooled = len(list(records(str(Path(recorder._spool_dir or "") / "spool-000001"))))
        assert spooled >= 30
        os.kill(recorder.process.pid or 0, signal.SIGKILL)
        recorder.process.join(10)
        recorder.close()
        assert Path(recorder._spool_dir or "").is_dir()
        assert recorder.not_recorded > 1  # each answer it still held, not one for all
    assert len(_next_start(db, kimi_tok, kimi_profile)) >= spooled


def test_answers_spooled_while_the_store_is_held_are_all_recorded(
    tmp_path: Path, kimi_tok: TokenizerAdapter, kimi_profile: ModelProfile, make_capture: Callable[..., Any]
) -> None:
    """Another command holds the store past `lock_timeout`: the recorder says it is not landing and records on into
    parts (it stopped recording there, and dropped every answer after, the store free again or not). Answers spooled
    while it was behind are recorded too, and everything lands once the store is free."""
    capture = make_capture("what is two and two")
    items = [_finished(capture, n) for n in range(40)]
    db = tmp_path / "h.duckdb"
    said: list[str] = []
    config = ProxyConfig(
        [UP],
        db=str(db),
        tokenizer=kimi_tok,
        profile=kimi_profile,
        record_in="process",
        lock_timeout=0.5,
        say=said.append,
    )
    recorder = open_recorder(config, [Upstream(UP, "vllm", None, {}, None)])
    assert isinstance(recorder, RecorderProcess)
    recorder.spool_over = 100_000
    with Store(db) as holder, holder.hold():  # another tokview command holds the store for a while
        _hand_over(recorder, [_finished(capture, 99)])
        deadline = time.monotonic() + 20
        while not any("NOT LANDING" in line for line in said):
            assert time.monotonic() < deadline, said
            time.sleep(0.05)
    os.kill(recorder.process.pid or 0, signal.SIGSTOP)  # the store is free again; the recorder is behind
    _hand_over(recorder, items)
    os.kill(recorder.process.pid or 0, signal.SIGCONT)
    recorder.close()
    assert recorder.not_recorded == 0
    assert len(_stored_users(db)) == 41
    assert not any("STOPPED RECORDING" in line for line in said), said


_KILLED_AS_ITS_SPOOL_IS_READ = r"""
import os, signal, sys, threading, time
from test_proxy_recorder_spool import stalled_in_a_script

recorder, child, db, _ = stalled_in_a_script(sys.argv[1])
spool = os.path.join(recorder._spool_dir, "spool-000001")
parts = db + ".parts"

def kill_once_read():  # the child has read the whole file (its SpoolDone came) or removed it: both die now
    while os.path.exists(spool) and not (os.path.isdir(parts) and os.listdir(parts)):
        time.sleep(0.0002)
    os.kill(child, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)

threading.Thread(target=kill_once_read, daemon=True).start()
os.kill(child, signal.SIGCONT)
recorder._drain_blocking()  # every frame it held, then the file's SpoolDone; the pipe stays open
time.sleep(60)
"""


def test_a_spool_file_is_removed_only_once_its_answers_are_written(
    tmp_path: Path, kimi_tok: TokenizerAdapter, kimi_profile: ModelProfile, make_capture: Callable[..., Any]
) -> None:
    """The child read a spool file whole and removed it at once, its answers still in the writer's queue: both
    proxy processes killed before the next part lost all of them, answered and whole on disk a moment before. Killed
    at the first of the file going or a part appearing, the next start has every spooled answer."""
    import pickle
    import subprocess
    import sys

    from tokview.proxy.spool_folder import records

    capture = make_capture("what is two and two")
    items = [_finished(capture, n) for n in range(40)]
    db = tmp_path / "d.duckdb"
    args = tmp_path / "args.pickle"
    args.write_bytes(pickle.dumps((str(db), str(getattr(kimi_tok, "source", "")), kimi_profile, items, UP)))
    tests = Path(__file__).resolve().parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests), str(tests.parent)])}
    done = subprocess.run(
        [sys.executable, "-c", _KILLED_AS_ITS_SPOOL_IS_READ, str(args)],
        cwd=tests.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    spool_dirs = [p for p in tmp_path.iterdir() if p.name.startswith(".tokview-proxy-spool-")]
    [spool_dir] = spool_dirs
    spooled = sum(len(list(records(str(f)))) for f in spool_dir.glob("spool-*"))
    assert spooled >= 30  # the file is still there: its answers were not written yet when both died
    assert len(_next_start(db, kimi_tok, kimi_profile)) >= spooled


def test_by_default_a_killed_forwarding_process_loses_no_answer_it_finished(
    tmp_path: Path, kimi_tok: TokenizerAdapter, kimi_profile: ModelProfile, make_capture: Callable[..., Any]
) -> None:
    """What the pipe cannot take goes to the spool at once (SPOOL_OVER_BYTES is 0): the forwarding process gone (its
    pipe closed as a SIGKILL closes it) with a stalled recorder behind, every answer it had finished is recorded, the
    one cut mid-write to the pipe at most excepted (held in memory up to 16 MB, they were lost with it)."""
    capture = make_capture("what is two and two")
    items = [_finished(capture, n) for n in range(40)]
    with _recorder(tmp_path / "m.duckdb", kimi_tok, kimi_profile) as recorder:
        os.kill(recorder.process.pid or 0, signal.SIGSTOP)
        _hand_over(recorder, items)
        assert recorder.memory_peak < 25_000  # one answer's frame at most: the one the pipe took part of
        recorder._jobs.close()
        os.kill(recorder.process.pid or 0, signal.SIGCONT)
        recorder.process.join(60)
        assert recorder.process.exitcode == 0
    assert _stored_users(tmp_path / "m.duckdb") == sorted(
        f"user:u{n}" for n in range(40)
    )  # the first of the backlog too


def test_a_recorder_process_that_dies_is_said_at_once_as_stopped_recording(
    tmp_path: Path, kimi_tok: TokenizerAdapter, kimi_profile: ModelProfile, make_capture: Callable[..., Any]
) -> None:
    """An OOM-killed child: the proxy went on forwarding and said nothing until its exit, every answer after it
    unrecorded. It says STOPPED RECORDING once, as it does for a held store, and nothing when it closes normally."""
    capture = make_capture("what is two and two")
    said: list[str] = []
    with _recorder(tmp_path / "k.duckdb", kimi_tok, kimi_profile, said.append) as recorder:
        _hand_over(recorder, [_finished(capture, 1)])
        os.kill(recorder.process.pid or 0, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while not any("STOPPED RECORDING" in line for line in said):
            assert time.monotonic() < deadline, said
            time.sleep(0.05)
        _hand_over(recorder, [_finished(capture, 2)])
        recorder.close()
    [line] = [line for line in said if "STOPPED RECORDING" in line]
    assert f"the recorder process (pid {recorder.process.pid}) ended." in line
    assert any("ended with exit code -9" in said_line for said_line in said), said  # at its close
    assert not recorder.recording and recorder.not_recorded >= 1

    quiet: list[str] = []
    with _recorder(tmp_path / "q.duckdb", kimi_tok, kimi_profile, quiet.append) as recorder:
        _hand_over(recorder, [_finished(capture, 1)])
        recorder.close()
    assert not any("STOPPED RECORDING" in line for line in quiet), quiet
