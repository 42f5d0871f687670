"""A stored request keeps no second copy of the messages its row holds, and every reader gets them back as sent.

An agent's turn carries its whole conversation: a 40,000-token session stored it twice a turn, in the `messages`
column and in the request body (`raw_request.body.messages`), each ~175 KB written, landed and compressed again."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from tokview.store import PartSink, SampleIdentity, Store
from tokview.store.elided_ids import elide_messages

LONG = "the tool returned a value " * 4_000


def _agent_capture(make_capture: Any) -> Any:
    """A capture as the proxy makes it: the request body's messages are the capture's own list."""
    cap = make_capture(history=[{"role": "system", "content": LONG}])
    body = {"model": "m", "messages": cap.messages, "max_tokens": 40, "temperature": 0}
    cap.raw_request = {"method": "POST", "url": "http://u/v1/chat/completions", "headers": {}, "body": body}
    return cap


def _store(tmp_path: Path, cap: Any, via: str) -> tuple[Store, str]:
    import builders

    store = Store(tmp_path / "s.duckdb")
    if via == "put_sample":
        return store, builders.put(store, "p1", cap)
    sink = PartSink(store.path)
    analysis = builders.analyze(cap, builders.profile(), builders.kimi())
    sink.write_part([sink.sample_record(SampleIdentity("p1@part", "p1", "run1"), cap, analysis)])
    assert store.ingest()[0] == 1
    return store, "p1@part"


@pytest.mark.parametrize("via", ["put_sample", "part"])
def test_an_agent_turns_messages_are_stored_once_and_read_back_as_sent(
    tmp_path: Path, make_capture: Any, via: str
) -> None:
    cap = _agent_capture(make_capture)
    sent = copy.deepcopy(cap.raw_request)
    store, sid = _store(tmp_path, cap, via)
    with store:
        raw_request, messages, places = store.query(
            "SELECT raw_request, messages, raw_ids_at FROM samples WHERE sample_id = ?", [sid]
        )[0]
        assert LONG not in raw_request and LONG in messages  # once
        assert json.loads(raw_request)["body"]["messages"] is None
        assert json.loads(places)["raw_request"] == [[["body", "messages"], "messages"]]
        got = store.load_sample(sid).capture
    assert json.dumps(got.raw_request) == json.dumps(sent)  # key order too
    assert got.raw_request is not None and got.raw_request["body"]["messages"] == got.messages
    assert got.raw_request["body"]["messages"] is not got.messages  # a list of its own: changing one leaves the other
    assert cap.raw_request == sent  # the capture handed in was never changed


def test_a_secret_in_the_messages_is_masked_in_both_as_before(tmp_path: Path, make_capture: Any, monkeypatch) -> None:
    monkeypatch.setenv("TOKVIEW_API_KEY", "sk-test-0123456789abcdef")
    cap = _agent_capture(make_capture)
    cap.messages[-1]["content"] += " my key is sk-test-0123456789abcdef"
    store, sid = _store(tmp_path, cap, "put_sample")
    with store:
        raw = "".join(str(v) for v in store.query("SELECT * FROM samples")[0])
        got = store.load_sample(sid).capture
    assert "sk-test-0123456789abcdef" not in raw
    assert got.raw_request is not None and got.messages is not None
    assert got.raw_request["body"]["messages"] == got.messages
    assert got.messages[-1]["content"].endswith("my key is [redacted]")


def test_messages_equal_only_by_value_stay_in_the_body() -> None:
    """1 == 1.0 == True in Python, not in JSON: such a list is not the column's copy and is stored as it came."""
    messages = [{"role": "user", "content": "hi", "n": 1}]
    for held in ([{"role": "user", "content": "hi", "n": 1.0}], [{"role": "user", "content": "hi", "n": True}]):
        request = {"body": {"messages": held}}
        assert elide_messages(request, messages) == (request, [])
    request = {"body": {"messages": [{"content": "hi", "role": "user", "n": 1}]}}  # another key order
    assert elide_messages(request, messages)[1] == []


def test_an_equal_copy_and_both_halves_of_a_dual_request_are_taken_out_the_request_never_changed() -> None:
    messages = [{"role": "user", "content": "hi"}]
    request = {
        "url": "u",
        "body": {"prompt": [1, 2, 3]},
        "parsed": {"url": "c", "body": {"model": "m", "messages": copy.deepcopy(messages)}},
    }
    before = json.dumps(request)
    out, places = elide_messages(request, messages)
    assert places == [[["parsed", "body", "messages"], "messages"]]
    assert out["parsed"]["body"] == {"model": "m", "messages": None}
    assert json.dumps(request) == before
    both = {"body": {"messages": messages}, "parsed": {"body": {"messages": messages}}}
    assert [p[0] for p in elide_messages(both, messages)[1]] == [["body", "messages"], ["parsed", "body", "messages"]]


@pytest.mark.parametrize(
    ("request_", "messages"),
    [
        ({"body": {"messages": []}}, []),  # nothing to save
        ({"body": {"messages": [{"a": 1}]}}, None),  # recorded without its messages (the proxy's, with tools)
        ({"body": "not an object"}, [{"a": 1}]),
        ({"body": {"messages": [{"a": "\ud800"}]}}, [{"a": "\ud800"}]),  # what orjson cannot write: kept whole
        ("a string", [{"a": 1}]),
    ],
)
def test_what_cannot_be_taken_out_exactly_stays(request_: Any, messages: Any) -> None:
    assert elide_messages(request_, messages) == (request_, [])


def test_rows_written_before_schema_11_read_whole(tmp_path: Path, make_capture: Any) -> None:
    cap = _agent_capture(make_capture)
    store, sid = _store(tmp_path, cap, "put_sample")
    with store:
        store.execute(  # what an older row holds: the body whole, no place for the messages
            "UPDATE samples SET raw_ids_at = NULL, raw_request = ?", [json.dumps(cap.raw_request)]
        )
        assert store.load_sample(sid).capture.raw_request == cap.raw_request
