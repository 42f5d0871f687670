"""A recorder process that falls behind (a burst on busy cores, its lower priority) never grows the proxy's memory
past a bound and never loses an answer: the rest is spooled to a file beside the store and recorded after
(issue 24 item 5)."""

from __future__ import annotations

import asyncio
import os
import signal
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
def _recorder(db: Path, tok: TokenizerAdapter, profile: ModelProfile) -> Iterator[RecorderProcess]:
    config = ProxyConfig([UP], db=str(db), tokenizer=tok, profile=profile, record_in="process")
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


def _stored_users(db: Path) -> list[str]:
    with Store(db) as store:
        return sorted(p for (p,) in store.query("SELECT prompt_id FROM samples"))


def test_a_stalled_recorder_holds_a_bounded_backlog_in_memory_spools_the_rest_and_records_it_all(
    tmp_path: Path, kimi_tok: TokenizerAdapter, kimi_profile: ModelProfile, make_capture: Callable[..., Any]
) -> None:
    capture = make_capture("what is two and two")
    items = [_finished(capture, n) for n in range(40)]  # ~0.8 MB: the pipe takes a few, 100 KB wait in memory
    with _recorder(tmp_path / "s.duckdb", kimi_tok, kimi_profile) as recorder:
        recorder.spool_over = 100_000
        os.kill(recorder.process.pid or 0, signal.SIGSTOP)  # a recorder that gets no CPU for a while
        _hand_over(recorder, items)
        spool_dir = Path(recorder._spool_dir or "")
        assert spool_dir.parent == tmp_path  # beside the store, not in /tmp (often memory)
        assert sorted(p.name for p in spool_dir.iterdir()) == ["owner.lock", "run_id", "spool-000001"]
        assert recorder.memory_peak <= 100_000 + 25_000
        assert recorder.spooled > 500_000
        os.kill(recorder.process.pid or 0, signal.SIGCONT)
        recorder.close()
        assert (recorder.recorded, recorder.failed, recorder.not_recorded) == (40, 0, 0)
        assert recorder.backlog_said() is not None
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
