"""Stored raw bodies keep no copy of the id lists their row holds, and every reader gets them back as served.

The bodies are real: vLLM 0.32's and SGLang 0.5.23's recorded answers, captured by the real clients
over a socket (tests/replay.py), then stored both ways a sample reaches the file (`put_sample` and a
part that `ingest` lands)."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

import orjson
import pytest
from replay import fast_pool, request, serve, sglang_routes, vllm_routes

from tokview.core.record import Capture
from tokview.store import PartSink, SampleIdentity, Store
from tokview.store.elided_ids import MIN_IDS, elide, restore

IDS = list(range(100, 140))


async def _recorded_captures() -> list[Capture]:
    from replay import Replay

    captures = []
    with serve(Replay(sglang_routes())) as url:
        async with fast_pool(url) as pool:
            captures += [await pool.capture(request(mode)) for mode in ("raw", "chat", "dual")]
    with serve(Replay(vllm_routes())) as url:
        async with fast_pool(url) as pool:
            captures += [await pool.capture(request(mode)) for mode in ("raw", "chat")]
    return captures


def _stored_bodies(store: Store, sample_id: str) -> tuple[str, ...]:
    return tuple(
        store.query(
            "SELECT raw_request, raw_response, parsed_raw_response, raw_ids_at FROM samples WHERE sample_id = ?",
            [sample_id],
        )[0]
    )


def _id_run(ids: list[int]) -> str:
    return json.dumps(ids, separators=(",", ":"))


@pytest.mark.parametrize("via", ["put_sample", "part"])
async def test_recorded_bodies_are_stored_without_their_ids_and_read_back_as_served(
    tmp_path: Path, put: Any, via: str
) -> None:
    import builders

    captures = await _recorded_captures()
    served = [
        (copy.deepcopy(c.raw_request), copy.deepcopy(c.raw_response), copy.deepcopy(c.parsed_raw_response))
        for c in captures
    ]
    with Store(tmp_path / "s.duckdb") as store:
        ids = []
        for n, cap in enumerate(captures):
            if via == "put_sample":
                ids.append(put(store, f"p{n}", cap))
            else:
                sink = PartSink(store.path)
                sid = f"p{n}@part"
                record = sink.sample_record(
                    SampleIdentity(sid, f"p{n}", "run1"),
                    cap,
                    builders.analyze(cap, builders.profile(), builders.kimi()),
                )
                sink.write_part([record])
                ids.append(sid)
        if via == "part":
            assert store.ingest()[0] == len(captures)
        for sid, cap, (req, resp, parsed) in zip(ids, captures, served):
            raw_request, raw_response, parsed_raw, places = _stored_bodies(store, sid)
            # the stored text holds the ids once: in their columns, not again in the bodies
            for text in (raw_request, raw_response, parsed_raw):
                assert text is None or _id_run(cap.output_ids) not in text.replace(" ", "")
            assert _id_run(cap.prompt_ids) not in (raw_request or "").replace(" ", "")
            assert places is not None
            assert "output_ids" in places
            sent = req or {}
            parsed_body = (sent.get("parsed") or {}).get("body") or {}
            if cap.messages and ((sent.get("body") or {}).get("messages") or parsed_body.get("messages")):
                # a chat request's messages: stored once, in the messages column
                assert '"messages"]' in places
                assert orjson.dumps(cap.messages).decode() not in (raw_request or "")
            got = store.load_sample(sid).capture
            assert got.raw_request == req
            assert got.raw_response == resp
            assert got.parsed_raw_response == parsed
            assert json.dumps(got.raw_response) == json.dumps(resp)  # key order too
    # the capture handed in was never changed
    assert [(c.raw_request, c.raw_response, c.parsed_raw_response) for c in captures] == served


def test_a_list_equal_only_by_value_stays_in_the_body() -> None:
    """1.0 == 1 and True == 1 in Python: such a list is not the ids' copy and is stored as it came."""
    body: dict[str, Any] = {
        "floats": [float(i) for i in IDS],
        "flags": [True] + [1] * (len(IDS) - 1),
        "tuple": tuple(IDS),
        "choices": [{"token_ids": list(IDS)}],
    }
    out, places = elide(body, {"output_ids": IDS, "prompt_ids": [1] * len(IDS)})
    assert places == [[["choices", 0, "token_ids"], "output_ids"]]
    assert out["floats"] is body["floats"]
    assert out["flags"] is body["flags"]
    assert out["tuple"] is body["tuple"]
    assert out["choices"][0]["token_ids"] is None
    assert body["choices"][0]["token_ids"] == IDS


@pytest.mark.parametrize("kind", [float, bool])
def test_a_capture_whose_own_ids_are_not_ints_keeps_its_body(tmp_path: Path, make_capture: Any, kind: type) -> None:
    """The body may hold the capture's own id list (the servers layer hands it over): when a hand-made
    capture holds floats or bools there, the INTEGER[] column would give them back as ints."""
    import builders

    cap = make_capture()
    analysis = builders.analyze(cap, builders.profile(), builders.kimi())
    cap.output_ids = [kind(i) for i in cap.output_ids]
    cap.raw_response = {"choices": [{"token_ids": cap.output_ids}]}  # the same list object
    served = json.dumps(cap.raw_response)
    with Store(tmp_path / "s.duckdb") as store:
        store.put_sample("s1", "p1", "run1", cap, analysis)
        assert json.dumps(store.load_sample("s1").capture.raw_response) == served


def test_short_deep_and_per_token_lists_are_left_alone() -> None:
    short = IDS[: MIN_IDS - 1]
    deep = {"a": {"b": {"c": {"d": {"e": list(IDS)}}}}}
    per_token = {"logprobs": [{"ids": list(IDS)} for _ in range(20)]}
    assert elide({"x": list(short)}, {"output_ids": short}) == ({"x": short}, [])
    assert elide(deep, {"output_ids": IDS})[1] == []
    assert elide(per_token, {"output_ids": IDS})[1] == []
    assert elide({"x": list(IDS)}, {"output_ids": None, "prompt_ids": IDS})[1] == [[["x"], "prompt_ids"]]


def test_random_bodies_round_trip_exactly() -> None:
    rng = random.Random(7)
    lists = {"output_ids": IDS, "prompt_ids": list(range(5, 25)), "parsed_output_ids": list(IDS)}

    def value(depth: int) -> Any:
        roll = rng.random()
        if depth > 4 or roll < 0.3:
            return rng.choice([None, 1, 1.5, "x", True, list(rng.choice(list(lists.values())))])
        if roll < 0.65:
            return {f"k{i}": value(depth + 1) for i in range(rng.randint(0, 4))}
        return [value(depth + 1) for _ in range(rng.randint(0, 10))]

    for _ in range(500):
        body = value(0)
        before = json.dumps(body)
        out, places = elide(body, lists)
        assert json.dumps(body) == before  # never changed in place
        back = restore(json.loads(json.dumps(out)), json.loads(json.dumps(places)), lists)
        assert json.dumps(back) == before


def test_rows_written_before_the_column_existed_read_whole(tmp_path: Path, put: Any, make_capture: Any) -> None:
    cap = make_capture()
    cap.raw_response = {"choices": [{"token_ids": list(cap.output_ids)}]}
    with Store(tmp_path / "s.duckdb") as store:
        sid = put(store, "p1", cap)
        assert store.query("SELECT raw_ids_at FROM samples")[0][0] is not None
        store.execute(  # what a version-5 row holds: the body whole, no places
            "UPDATE samples SET raw_ids_at = NULL, raw_response = ?", [json.dumps(cap.raw_response)]
        )
        assert store.load_sample(sid).capture.raw_response == cap.raw_response


def test_merged_samples_keep_their_bodies(tmp_path: Path, put: Any, make_capture: Any) -> None:
    cap = make_capture()
    cap.raw_response = {"choices": [{"token_ids": list(cap.output_ids), "prompt_token_ids": list(cap.prompt_ids)}]}
    with Store(tmp_path / "a.duckdb") as a:
        sid = put(a, "p1", cap)
        a.put_run("run1", settings={"temperature": 0.0}, profile="kimi-k2.5")
    with Store(tmp_path / "b.duckdb") as b:
        assert b.merge(tmp_path / "a.duckdb")["samples"] == 1
        assert b.load_sample(sid).capture.raw_response == cap.raw_response


def test_a_masked_place_stays_masked_and_odd_keys_stay_whole(tmp_path: Path, put: Any, make_capture: Any) -> None:
    """A list under a secret-named key is stored as "[redacted]", and is read back so, not as the ids;
    a dict with a non-string key (JSON writes it as a string) keeps its list."""
    cap = make_capture()
    cap.raw_response = {"authorization": list(cap.output_ids), "odd": {1: list(cap.output_ids)}}
    with Store(tmp_path / "s.duckdb") as store:
        sid = put(store, "p1", cap)
        got = store.load_sample(sid).capture.raw_response
    assert got["authorization"] == "[redacted]"
    assert got["odd"] == {"1": cap.output_ids}


def test_merge_refuses_a_store_of_a_newer_schema(tmp_path: Path, put: Any, make_capture: Any) -> None:
    """A newer store's rows may hold what this tokview cannot read back (as schema 6's `raw_ids_at` is to
    schema 5): merging it would keep them half, so it is refused in one line, nothing added."""
    from tokview.store import LATEST_VERSION, StoreError
    from tokview.store.merge import MergeRefused

    with Store(tmp_path / "new.duckdb") as new:
        put(new, "p1", make_capture())
        new.put_run("run1", settings={"temperature": 0.0}, profile="kimi-k2.5")
        new.execute("INSERT INTO schema_version VALUES (?, 'from the future', now())", [LATEST_VERSION + 1])
    with Store(tmp_path / "old.duckdb") as old:
        with pytest.raises((MergeRefused, StoreError), match="newer tokview"):
            old.merge(tmp_path / "new.duckdb")
        assert old.query("SELECT count(*) FROM samples")[0][0] == 0


def test_messages_equal_only_by_value_stay_in_the_request() -> None:
    """`1.0 == 1` and `True == 1`: messages the column holds with other types are no copy, and were put back with the
    column's types (the request as sent had 1.0)."""
    from tokview.store.elided_ids import elide_messages

    sent = [{"role": "user", "content": "hi", "n": 1.0}]
    request = {"body": {"messages": sent}}
    assert elide_messages(request, [{"role": "user", "content": "hi", "n": 1}]) == (request, [])
    assert elide_messages(request, [{"role": "user", "content": "hi", "n": True}]) == (request, [])
    same, places = elide_messages(request, [{"role": "user", "content": "hi", "n": 1.0}])
    assert same == {"body": {"messages": None}} and places == [[["body", "messages"], "messages"]]
    assert request == {"body": {"messages": sent}}  # the request handed in is never changed
