"""The proxy's closing counts on a full disk: an answer is counted recorded only once its part is written."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tokview.proxy.recorder import Recorder
from tokview.store import Store


def _fill(where: Path) -> None:
    """Write until the file system says it is full (the filler stays)."""
    with open(where / "filler", "wb") as out:
        try:
            while True:
                out.write(b"\0" * (1 << 20))
                out.flush()
        except OSError:
            pass


def test_answers_a_full_disk_kept_from_their_part_are_counted_not_recorded(
    small_disk: Path, kimi_tok: Any, kimi_profile: Any, make_capture: Any
) -> None:
    """Three answers the full disk kept from the store were said recorded: `6 recorded … 6 NOT recorded` for 3 stored."""
    said: list[str] = []
    store = Store(small_disk / "p.duckdb")
    store.put_run("r", settings={"mode": "proxy"})
    recorder = Recorder(store, profile=kimi_profile, tokenizer=kimi_tok, run_id="r", land_s=0.01, say=said.append)
    for n in range(2):
        capture = make_capture(f"question {n}", answer=f"answer {n}")
        recorder.sample(capture, messages=capture.messages, named=None, user=f"u{n}", answer_message=None)
    deadline = time.monotonic() + 30
    while store.count_samples() < 2:
        assert time.monotonic() < deadline, "the first answers never landed"
        time.sleep(0.02)
    _fill(small_disk)
    for n in range(2, 5):
        capture = make_capture(f"question {n}", answer=f"answer {n}")
        recorder.sample(capture, messages=capture.messages, named=None, user=f"u{n}", answer_message=None)
    recorder.close()
    (small_disk / "filler").unlink()
    stored = store.count_samples()
    store.close()
    assert stored == 2
    assert (recorder.recorded, recorder.not_recorded) == (2, 3), said
    assert any("STOPPED RECORDING" in line for line in said), said
