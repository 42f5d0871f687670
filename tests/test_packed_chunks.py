"""A long stream's chunks are stored packed in its raw body, and every reader gets them back as served.

The stream is real: vLLM 0.32's answer with a tool call (tests/recordings/proxy_tools), its first chunk holding the
prompt ids. Stored both ways a sample reaches the file
(`put_sample`, and a part that `ingest` lands)."""

from __future__ import annotations

import base64
import json
import zlib
from pathlib import Path
from typing import Any

import orjson
import pytest

from tokview.core.tool_calls import tool_calls_of_response
from tokview.proxy.sse import stream_chunks
from tokview.store import PartSink, SampleIdentity, Store
from tokview.store.packed_chunks import PACK_MIN_CHUNKS, PACKED_KEY, pack, unpack

REC = Path(__file__).resolve().parent / "recordings" / "proxy_tools"


def _served_stream() -> dict[str, Any]:
    chunks, done = stream_chunks((REC / "vllm_t1_stream.txt").read_bytes())
    assert done and len(chunks) >= PACK_MIN_CHUNKS, "the recording is too short to be packed: the test proves nothing"
    return {"stream": True, "n_chunks": len(chunks), "chunks": chunks}


def _stream_capture(make_capture: Any, body: dict[str, Any]) -> Any:
    cap = make_capture()
    cap.prompt_ids = list(body["chunks"][0]["prompt_token_ids"])
    cap.raw_response = body
    return cap


def _store(store: Store, cap: Any, via: str) -> str:
    import builders

    sid = f"s-{via}"
    analysis = builders.analyze(cap, builders.profile(), builders.kimi())
    if via == "put_sample":
        store.put_sample(sid, "p1", "run1", cap, analysis)
    else:
        sink = PartSink(store.path)
        sink.write_part([sink.sample_record(SampleIdentity(sid, "p1", "run1"), cap, analysis)])
        assert store.ingest()[0] == 1
    return sid


@pytest.mark.parametrize("via", ["put_sample", "part"])
def test_a_recorded_stream_is_stored_packed_and_read_back_as_served(
    tmp_path: Path, make_capture: Any, via: str
) -> None:
    served = _served_stream()
    served_text = json.dumps(served)
    cap = _stream_capture(make_capture, served)
    with Store(tmp_path / "s.duckdb") as store:
        sid = _store(store, cap, via)
        [(stored, n_chunks)] = store.query(
            "SELECT raw_response, raw_response->>'n_chunks' FROM samples WHERE sample_id = ?", [sid]
        )
        got = store.load_sample(sid).capture
    body = orjson.loads(stored)
    assert "chunks" not in body and isinstance(body[PACKED_KEY], str)
    assert list(body) == ["stream", "n_chunks", PACKED_KEY]  # the wrapper keeps its order, the key in its place
    assert int(n_chunks) == served["n_chunks"]  # the rest of the wrapper is still JSON for SQL
    assert len(stored) * 3 < len(served_text)
    assert json.dumps(got.raw_response) == served_text  # every chunk, key order and the prompt ids too
    assert got.tool_calls == tool_calls_of_response(served) != []
    assert json.dumps(cap.raw_response) == served_text  # the capture handed in was never changed


def test_a_secret_in_a_chunk_is_masked_before_it_is_packed(
    tmp_path: Path, make_capture: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "sk-live-echoed-in-a-chunk-12345"
    monkeypatch.setenv("TOKVIEW_API_KEY", secret)
    served = _served_stream()
    served["chunks"][3]["choices"][0]["delta"]["content"] = f"the key is {secret}"
    with Store(tmp_path / "s.duckdb") as store:
        sid = _store(store, _stream_capture(make_capture, served), "put_sample")
        [(stored,)] = store.query("SELECT raw_response FROM samples WHERE sample_id = ?", [sid])
        got = store.load_sample(sid).capture.raw_response
    packed = orjson.loads(stored)[PACKED_KEY]
    assert secret.encode() not in zlib.decompress(base64.b64decode(packed))
    text = got["chunks"][3]["choices"][0]["delta"]["content"]
    assert secret not in text and text.startswith("the key is ")
    assert len(got["chunks"]) == served["n_chunks"]


def test_short_streams_requests_and_other_bodies_are_stored_as_json(tmp_path: Path, make_capture: Any) -> None:
    served = _served_stream()
    short = {**served, "n_chunks": PACK_MIN_CHUNKS - 1, "chunks": served["chunks"][: PACK_MIN_CHUNKS - 1]}
    cap = _stream_capture(make_capture, short)
    cap.raw_request = {"stream": True, "chunks": list(range(40))}  # a request is never packed, whatever it holds
    with Store(tmp_path / "s.duckdb") as store:
        sid = _store(store, cap, "put_sample")
        [(request, response)] = store.query("SELECT raw_request, raw_response FROM samples WHERE sample_id = ?", [sid])
        got = store.load_sample(sid).capture
    assert orjson.loads(request)["chunks"] == list(range(40))
    assert PACKED_KEY not in orjson.loads(response)
    assert json.dumps(got.raw_response) == json.dumps(short)
    json_body = {"choices": [{"message": {"content": "x"}}] * 40}
    assert pack(json_body, json.dumps) is json_body


def test_chunks_the_store_cannot_write_as_utf8_stay_json() -> None:
    """The stdlib's JSON (the store's fallback) writes a lone surrogate as itself: not UTF-8, so not packed."""
    body = {"stream": True, "chunks": [{"delta": "\ud800"}] * PACK_MIN_CHUNKS}
    assert pack(body, lambda value: json.dumps(value, ensure_ascii=False)) is body


def test_unpack_leaves_what_it_cannot_read() -> None:
    broken = {"stream": True, "n_chunks": 20, PACKED_KEY: "not base64 at all!"}
    assert unpack(broken) is broken
    not_json = {"stream": True, PACKED_KEY: base64.b64encode(zlib.compress(b"{oops")).decode()}
    assert unpack(not_json) is not_json
    both = {"stream": True, "chunks": [], PACKED_KEY: "x"}  # a body with its chunks is never unpacked
    assert unpack(both) is both
    served = _served_stream()
    assert unpack(pack(served, json.dumps)) == served
