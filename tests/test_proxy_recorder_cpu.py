"""The proxy's recorder reads a whole stream in bulk, with the same chunks as event by event (issue 24 item 5).

Profiled, parsing each SSE event on its own (`sse.data_of`: a split, a join and an `orjson.loads` per event) was
the largest single cost of the recorder process: ~0.8 ms of a 256-chunk stream's ~3.8 ms.
"""

from __future__ import annotations

import time

import orjson
import pytest

from tokview.proxy.sse import DONE, EventSplitter, data_of, stream_chunks


def _one_by_one(raw: bytes) -> tuple[list[dict], bool]:
    """What the recorder must find: every event's data, parsed event by event (`data_of`)."""
    splitter = EventSplitter()
    events = list(splitter.feed(raw))
    if rest := splitter.rest():
        events.append(rest)
    chunks, done = [], False
    for event in events:
        data = data_of(event)
        if data is DONE:
            done = True
        elif isinstance(data, dict):
            chunks.append(data)
    return chunks, done


def _chunk(i: int) -> dict:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": f"tok{i} \u00e9"}, "logprobs": None, "finish_reason": None}],
        "token_ids": [1000 + i],
    }


def _stream(n: int, sep: bytes = b"\n\n", done: bytes = b"data: [DONE]") -> bytes:
    return b"".join(b"data: " + orjson.dumps(_chunk(i)) + sep for i in range(n)) + (done + sep if done else b"")


ODD_STREAMS = {
    "plain": _stream(5),
    "no space after data:": b'data:{"a":1}\n\ndata:[DONE]\n\n',
    "crlf": _stream(3, b"\r\n\r\n"),
    "a comment": b": ping\n\n" + _stream(2),
    "an event field": b'event: delta\ndata: {"a":1}\n\n' + _stream(1),
    "two data lines": b'data: {"a":\ndata: 1}\n\n' + _stream(1),
    "bad json in the middle": _stream(1)[:-14] + b"data: {oops\n\n" + _stream(1),
    "a non-object": b"data: 5\n\ndata: [1]\n\n" + _stream(1),
    "cut mid-event": _stream(3, done=b"")[:-20],
    "no done": _stream(3, done=b""),
    "only done": b"data: [DONE]\n\n",
    "empty": b"",
    "done mid-stream": b"data: [DONE]\n\n" + _stream(2, done=b""),
    "escaped newlines in a string": b'data: {"c":"x\\n\\ndata: y"}\n\n' + _stream(1),
    "a trailing event without its blank line": _stream(2) + b'data: {"z":1}',
    "whitespace around the payload": b'data:   {"a":1}  \n\ndata: [DONE] \n\n',
}


@pytest.mark.parametrize("name", list(ODD_STREAMS))
def test_a_stream_read_in_bulk_gives_the_chunks_event_by_event_does(name: str) -> None:
    raw = ODD_STREAMS[name]
    assert stream_chunks(raw) == _one_by_one(raw)


def test_a_256_chunk_stream_read_in_bulk_gives_its_chunks_event_by_event() -> None:
    """What it costs against one `orjson.loads` of the same chunks is measured in `benchmarks/bench_recorder.py`
    (x1.6 there; event by event it was ~5-8x): as a timed assertion here it failed on a loaded CI machine."""
    raw = _stream(256)
    assert stream_chunks(raw) == _one_by_one(raw)
    chunks, done = stream_chunks(raw)
    assert done and [c["token_ids"] for c in chunks] == [[1000 + i] for i in range(256)]


def test_under_a_steady_load_the_recorder_lands_every_few_seconds_not_every_gap(
    tmp_path, kimi_tok, kimi_profile, make_capture
) -> None:
    """Each landing costs ~30-50 ms of CPU however few samples it holds (the file opened, a transaction, the
    file closed): at one landing per `land_s` gap under a harness's steady traffic, that was ~1.3 ms of the
    recorder's ~4 ms a stream. Under load it lands every LAND_BUSY_S; every sample still lands, token-exact."""
    from tokview.proxy.recorder import Recorder
    from tokview.store import Store

    captures = [make_capture(f"question number {i}") for i in range(50)]
    with Store(tmp_path / "r.duckdb") as store:
        store.put_run("r", settings={"mode": "proxy"})
        recorder = Recorder(store, profile=kimi_profile, tokenizer=kimi_tok, run_id="r", land_s=0.02)
        for capture in captures:  # ~50 answers a second for ~1 s
            recorder.sample(capture, messages=capture.messages, named=None, user=None, answer_message=None)
            time.sleep(0.02)
        during = recorder.lander.landings
        recorder.close()
        rows = store.query("SELECT prompt_ids, output_ids FROM samples ORDER BY sample_id")
    assert [(list(p), list(o)) for p, o in rows] == [(c.prompt_ids, c.output_ids) for c in captures]
    assert during <= 3, f"{during} landings in ~1 s of steady load"


def test_landings_are_spaced_by_ten_times_what_they_took_up_to_a_bound(tmp_path, kimi_tok, kimi_profile) -> None:
    """A landing of a few rows costs more the more the store holds (DuckDB's checkpoint rewrites the table's last
    row group: 5 ms at an agent's first long row, 236 ms at its 120th), so the recorder spaces landings by their
    cost: at most a tenth of its time, and never more than LAND_MAX_S apart."""
    from tokview.proxy.recorder import LAND_MAX_S, Recorder
    from tokview.store import Store

    with Store(tmp_path / "r.duckdb") as store:
        store.put_run("r", settings={"mode": "proxy"})
        recorder = Recorder(store, profile=kimi_profile, tokenizer=kimi_tok, run_id="r", land_s=0.05)
        try:
            for took, gap in [(0.001, 0.05), (0.2, 2.0), (1.5, 15.0), (10.0, LAND_MAX_S)]:
                recorder.lander.last_took = took
                recorder._landed_at = time.monotonic() - 10
                recorder._landed(1)  # one sample in 10 s since the last landing: not busy
                assert recorder.lander.every_s == pytest.approx(gap)
        finally:
            recorder.close()


def test_the_gap_set_as_a_landing_is_told_applies_after_that_landing() -> None:
    """`on_landed` runs before the lander sets the time of its next landing, so a gap it sets (the recorder's) holds
    from this landing on, not from the one after."""
    import threading

    from tokview.batch.workers import Lander

    landed_at: list[float] = []

    class Parts:
        def ingest(self) -> tuple[int, int]:
            landed_at.append(time.monotonic())
            return 1, 0

    lander: Lander | None = None

    def widen(samples: int) -> None:
        assert lander is not None
        lander.every_s = 3600.0

    lander = Lander(Parts(), every_s=0.0, live=True, on_landed=widen)
    try:
        lander.poke()
        deadline = time.monotonic() + 30
        while not landed_at and time.monotonic() < deadline:
            time.sleep(0.01)
        lander.poke()  # written right after: waits the gap the first landing set
        time.sleep(0.5)
        assert len(landed_at) == 1
    finally:
        closed = threading.Thread(target=lander.close)
        closed.start()
        closed.join(30)
    assert len(landed_at) == 2  # the close lands what was poked
