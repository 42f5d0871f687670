"""A SIGKILL of the forwarding process with a stalled recorder loses no answer it finished. The first answer of each
backlog was lost (3 kill tests in 9): the pipe took part of its frame and its tail waited in the forwarding process's
memory, or the full pipe took none of it and it was held whole there. An answer the pipe cannot take whole is spooled
now, as every answer behind it is (`RecorderProcess.take`)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import pickle
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from test_proxy_recorder_spool import _finished, _recorder

from tokview.core.profiles import ModelProfile
from tokview.core.tokenizer import TokenizerAdapter
from tokview.store import Store


@contextmanager
def _stopped(recorder: Any) -> Iterator[None]:
    """The recorder child stopped (a recorder behind on busy cores), and always let go again."""
    os.kill(recorder.process.pid or 0, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(recorder.process.pid or 0, signal.SIGCONT)


def _take_all_then_die(recorder: Any, items: list[Any]) -> None:
    """Hand `items` over while the child is stopped, then close the pipe as a SIGKILL of this process closes it."""

    async def run() -> None:
        for item in items:
            recorder.take(item)
        await asyncio.sleep(0.05)

    with _stopped(recorder):
        asyncio.run(run())
        assert not (recorder._pending and _is_cut(recorder._pending[0])), "an answer cut in the pipe"
        recorder._jobs.close()
    recorder.process.join(60)
    assert recorder.process.exitcode == 0


def _is_cut(frame: bytes) -> bool:
    try:
        pickle.loads(frame[4:])
    except Exception:
        return True
    return False


def _rows(db: Path) -> list[str]:
    with Store(db) as store:
        return sorted(p for (p,) in store.query("SELECT prompt_id FROM samples"))


def _small(capture: Any, n: int) -> Any:
    item = _finished(capture, n)
    raw = item.raw.replace(b'"padding":"' + b"x" * 20_000 + b'"', b'"padding":"' + b"x" * 1_500 + b'"')
    return dataclasses.replace(item, raw=raw)


def test_an_answer_larger_than_the_pipe_has_room_for_survives_a_killed_forwarding_process(
    tmp_path: Path, kimi_tok: TokenizerAdapter, kimi_profile: ModelProfile, make_capture: Callable[..., Any]
) -> None:
    """~20 KB answers: the pipe (64 KB) took two and part of the third, whose tail was then in memory only."""
    capture = make_capture("what is two and two")
    with _recorder(tmp_path / "c.duckdb", kimi_tok, kimi_profile) as recorder:
        _take_all_then_die(recorder, [_finished(capture, n) for n in range(40)])
        assert recorder.spooled > 0
    assert _rows(tmp_path / "c.duckdb") == sorted(f"user:u{n}" for n in range(40))


def test_an_answer_the_full_pipe_takes_none_of_survives_a_killed_forwarding_process(
    tmp_path: Path, kimi_tok: TokenizerAdapter, kimi_profile: ModelProfile, make_capture: Callable[..., Any]
) -> None:
    """Answers under PIPE_BUF: the full pipe took the first of the backlog not at all, and it was held whole in
    memory (not spooled as those behind it were)."""
    capture = make_capture("what is two and two")
    items = [_small(capture, n) for n in range(80)]
    assert len(pickle.dumps(items[0])) < 4000
    with _recorder(tmp_path / "z.duckdb", kimi_tok, kimi_profile) as recorder:
        _take_all_then_die(recorder, items)
    assert _rows(tmp_path / "z.duckdb") == sorted(f"user:u{n}" for n in range(80))


def test_the_room_said_is_taken_whole_after_many_small_writes_left_pages_part_filled() -> None:
    """Seven 2,100-byte frames unread: each left a page part filled, and a write of the room estimated from the bytes
    unread alone was cut (36,864 of 45,006 bytes)."""
    import fcntl
    from types import SimpleNamespace

    from tokview.proxy.recorder_process import RecorderProcess

    read_end, write_end = os.pipe()
    try:
        fcntl.fcntl(write_end, fcntl.F_SETFL, fcntl.fcntl(write_end, fcntl.F_GETFL) | os.O_NONBLOCK)
        fake = SimpleNamespace(_fd=write_end, _writes_unread=0)
        for _ in range(7):
            assert RecorderProcess._pipe_room(fake) >= 2_100  # type: ignore[arg-type]
            os.write(write_end, b"x" * 2_100)
            fake._writes_unread += 1
        room = RecorderProcess._pipe_room(fake)  # type: ignore[arg-type]
        assert room > 0
        assert os.write(write_end, b"y" * room) == room
    finally:
        os.close(read_end)
        os.close(write_end)
