"""An agent turn recorded by the proxy stores its prompt ids past an earlier turn's (`store.prompt_refs`), and every
reader gets the whole prompt back: the app's sample, exports (JSONL rows, Parquet, scoring ids), a merge, the
sessions a restarted proxy restores. A missing key turn is an error naming both samples, never a cut prompt."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

from tokview.proxy.recorder import Recorder
from tokview.proxy.sessions import KEY_MIN_IDS, RESTORED_TURNS, TURNS_KEPT, SessionBook, restore_sessions
from tokview.store import Store, StoreError, export_rows

LONG = "tell me about the tool results of this long file, line by line " * 400
"""An agent's long first message: several thousand ids on the Kimi layout."""


def _session(recorder: Recorder, make_capture: Any, turns: int, *, lost: int = 0) -> list[Any]:
    """One agent conversation: each request holds the whole history (its reasoning dropped by the template, so the
    prompt shares all but the end of the previous prompt + output). Each turn waits for the one before to land, as a
    harness's next request waits for its answer (a key turn is one seen landed); `lost`: turns recorded as failures
    (they never land)."""
    history: list[dict[str, Any]] = []
    captures = []
    for t in range(turns):
        capture = make_capture(LONG if t == 0 else f"and now step {t}", answer=f"done with step {t}", history=history)
        answer = {"role": "assistant", "content": capture.content}
        recorder.sample(capture, messages=capture.messages, named=None, user=None, answer_message=answer)
        captures.append(capture)
        history = [*capture.messages, answer]
        deadline = time.monotonic() + 30
        while recorder.store.count_samples() < t + 1 - lost or recorder._sink.written:
            assert time.monotonic() < deadline, "the turn never landed"
            time.sleep(0.01)
    return captures


def _land_until_key(recorder: Recorder, sample_id: str) -> None:
    """Land until `sample_id` is seen landed whole (its part written, landed, confirmed): a key turn from then on."""
    deadline = time.monotonic() + 30
    while sample_id not in recorder._sink.keys:  # seen landed, not only written (is_key takes those too)
        assert time.monotonic() < deadline, "the turn never landed"
        recorder.lander.flush()
        time.sleep(0.05)


@pytest.fixture
def recorded(tmp_path: Path, kimi_tok: Any, kimi_profile: Any, make_capture: Any) -> Iterator[tuple[Store, list[Any]]]:
    store = Store(tmp_path / "r.duckdb")
    store.put_run("r", settings={"mode": "proxy"})
    recorder = Recorder(store, profile=kimi_profile, tokenizer=kimi_tok, run_id="r", land_s=0.01)
    captures = _session(recorder, make_capture, 7)
    recorder.close()
    yield store, captures
    store.close()


def _ids(store: Store) -> list[str]:
    return [r[0] for r in store.query("SELECT sample_id FROM samples ORDER BY sample_id")]


def test_turns_past_the_first_store_only_the_ids_past_their_key_turn(recorded):
    store, captures = recorded
    rows = store.query(
        "SELECT prompt_from, prompt_from_len, len(prompt_ids), prompt_len FROM samples ORDER BY sample_id"
    )
    assert len(captures[0].prompt_ids) >= 2 * KEY_MIN_IDS
    assert rows[0][0] is None and rows[0][2] == rows[0][3]  # the first turn is whole: a key turn
    past = [r for r in rows if r[0] is not None]
    assert len(past) >= 4, rows
    for key_id, shared, stored, whole in past:
        assert shared + stored == whole and stored * 2 < whole
        key = store.query("SELECT prompt_from FROM samples WHERE sample_id = ?", [key_id])
        assert key == [(None,)]  # a key turn is stored whole: one join puts any prompt back


def test_every_reader_gets_the_whole_prompt_back(recorded, tmp_path):
    store, captures = recorded
    ids = _ids(store)
    for sample_id, capture in zip(ids, captures):
        assert store.load_sample(sample_id).capture.prompt_ids == capture.prompt_ids
    assert [r["prompt_ids"] for r in store.rows_for(ids)] == [c.prompt_ids for c in captures]
    assert [p for _, p, _ in export_rows.token_ids(store, ids)] == [c.prompt_ids for c in captures]
    target = tmp_path / "out.parquet"
    export_rows.write_parquet(store, ids, ids, target)
    got = duckdb.connect().execute(f"SELECT id, input_ids, loss_mask FROM '{target}' ORDER BY id").fetchall()
    assert [r[1] for r in got] == [c.prompt_ids + c.output_ids for c in captures]
    assert [r[2] for r in got] == [[0] * len(c.prompt_ids) + [1] * len(c.output_ids) for c in captures]
    with Store(tmp_path / "merged.duckdb") as merged:
        assert merged.merge(store.path)["samples"] == len(captures)
        assert [merged.load_sample(i).capture.prompt_ids for i in ids] == [c.prompt_ids for c in captures]


def test_a_restarted_proxy_restores_its_sessions_with_their_whole_prompts(recorded):
    """A request that extends the last turn's prompt + output continues its session only if the restored turn holds
    its whole prompt (its row holds the ids past its key turn's)."""
    store, captures = recorded
    last_id = _ids(store)[-1]
    assert store.query("SELECT prompt_from IS NOT NULL FROM samples WHERE sample_id = ?", [last_id]) == [(True,)]
    book = SessionBook("new")
    assert restore_sessions(book, store) == min(RESTORED_TURNS, len(captures))  # its newest requests, as kept live
    last = captures[-1]
    turn = book.place([*last.prompt_ids, *last.output_ids, 5, 6, 7], None)
    assert (turn.turn, turn.parent_sample, turn.joined_by) == (len(captures), last_id, "prefix")


def test_a_restarted_proxy_stores_the_next_turn_past_the_key_its_restored_turn_is_stored_past(recorded):
    """The restored turn is stored past a key turn: that key (read whole by `restore`) is a key turn to the restarted
    proxy too, so the session's next turn is stored past it instead of whole."""
    store, captures = recorded
    last_id = _ids(store)[-1]
    [(key_id, key_len)] = store.query("SELECT prompt_from, prompt_from_len FROM samples WHERE sample_id = ?", [last_id])
    assert key_id is not None
    book = SessionBook("new")
    assert restore_sessions(book, store) == min(RESTORED_TURNS, len(captures))  # its newest requests, as kept live
    keys = set(book.whole_rows())
    assert key_id in keys and last_id not in keys  # the restored turn itself is stored past the key
    last = captures[-1]
    prompt = [*last.prompt_ids, *last.output_ids, 5, 6, 7]
    turn = book.place(prompt, None)
    book.add(turn, "next", prompt_ids=prompt, output_ids=[8], messages=None, answer=None)
    assert book.stored_past(turn, "next", len(prompt), keys.__contains__) == (key_id, key_len)


def test_a_missing_key_turn_is_an_error_naming_both_samples_never_a_cut_prompt(recorded, tmp_path):
    store, _ = recorded
    key_id, child = store.query(
        "SELECT prompt_from, sample_id FROM samples WHERE prompt_from IS NOT NULL ORDER BY sample_id LIMIT 1"
    )[0]
    store.write([("DELETE FROM samples WHERE sample_id = ?", [key_id])])
    with pytest.raises(StoreError, match=f"{child}.*{key_id}"):
        store.load_sample(child)
    with pytest.raises(StoreError, match=f"{child}.*{key_id}"):
        export_rows.write_parquet(store, [child], [child], tmp_path / "x.parquet")


def test_turns_faster_than_the_landings_are_stored_past_a_key_that_lands_with_them(
    tmp_path, kimi_tok, kimi_profile, make_capture
):
    """An agent's turns often come faster than the landings (12 turns of a 40,000-id context in 0.3 s), and a turn
    was stored past a key only once that key was seen landed: every such turn was stored whole. A turn whose key is
    written but not landed now names it on its line (`prompt_refs.PAST_KEY`), and the landing stores it past the key
    once the key is in the store whole (tests/test_landing_past_keys.py holds the cases where it stays whole)."""
    with Store(tmp_path / "r.duckdb") as store:
        store.put_run("r", settings={"mode": "proxy"})
        recorder = Recorder(store, profile=kimi_profile, tokenizer=kimi_tok, run_id="r", land_s=3600)
        ids, captures = _burst(recorder, make_capture, LONG, 4)  # no landing until the close but the key's own
        recorder.close()
        rows = store.query("SELECT sample_id, prompt_from FROM samples ORDER BY sample_id")
        assert rows == sorted([(ids[0], None)] + [(i, ids[0]) for i in ids[1:]])
        assert [store.load_sample(i).capture.prompt_ids for i in ids] == [c.prompt_ids for c in captures]


def test_turns_that_come_faster_than_landings_stay_past_the_last_key_turn_seen_landed(
    tmp_path, kimi_tok, kimi_profile, make_capture
):
    """A recorder that gets an agent's turns faster than it lands them (a lower-priority child after a burst) sees the
    turn before unlanded every time: each turn is stored past the newest key turn seen landed, for as long as the
    session goes on, even once that key is no longer among the turns a next request may continue (it was made whole
    again every TURNS_KEPT turns). Every prompt reads back whole."""
    with Store(tmp_path / "r.duckdb") as store:
        store.put_run("r", settings={"mode": "proxy"})
        recorder = Recorder(store, profile=kimi_profile, tokenizer=kimi_tok, run_id="r", land_s=3600)
        history: list[dict[str, Any]] = []
        captures, ids = [], []
        for t in range(2 + 2 * TURNS_KEPT):  # one landing, after the first turn only
            capture = make_capture(LONG if t == 0 else f"and now step {t}", answer=f"step {t}", history=history)
            answer = {"role": "assistant", "content": capture.content}
            placed = recorder.sample(capture, messages=capture.messages, named=None, user=None, answer_message=answer)
            assert placed is not None
            ids.append(placed[0])
            captures.append(capture)
            history = [*capture.messages, answer]
            if t == 0:
                _land_until_key(recorder, ids[0])
        recorder.close()
        rows = store.query("SELECT sample_id, prompt_from FROM samples ORDER BY sample_id")
        assert rows == [(ids[0], None)] + [(i, ids[0]) for i in ids[1:]]
        assert [store.load_sample(i).capture.prompt_ids for i in ids] == [c.prompt_ids for c in captures]


def test_choices_of_one_request_and_the_turn_that_goes_on_from_the_second_are_stored_past_the_key(
    tmp_path, kimi_tok, kimi_profile, make_capture
):
    """`n` > 1: every choice of a request is stored past the landed turn it continues, and a next turn that goes on
    from the second choice (the one the harness kept) is stored past that key too. Every prompt reads back whole."""
    with Store(tmp_path / "r.duckdb") as store:
        store.put_run("r", settings={"mode": "proxy"})
        recorder = Recorder(store, profile=kimi_profile, tokenizer=kimi_tok, run_id="r", land_s=3600)
        first = make_capture(LONG, answer="step 0", history=[])
        answer = {"role": "assistant", "content": first.content}
        placed = recorder.sample(first, messages=first.messages, named=None, user=None, answer_message=answer)
        assert placed is not None
        key_id = placed[0]
        _land_until_key(recorder, key_id)
        history = [*first.messages, answer]
        choices = [make_capture("and now step 1", answer=a, history=history) for a in ("left", "right")]
        one = recorder.sample(
            choices[0], messages=choices[0].messages, named=None, user=None, answer_message=None, index=0
        )
        assert one is not None
        two = recorder.sample(
            choices[1],
            messages=choices[1].messages,
            named=None,
            user=None,
            answer_message=None,
            index=1,
            sibling_of=one[1],
        )
        assert two is not None
        kept = [*choices[1].messages, {"role": "assistant", "content": choices[1].content}]
        last = make_capture("and now step 2", answer="done", history=kept)
        three = recorder.sample(last, messages=last.messages, named=None, user=None, answer_message=None)
        assert three is not None and three[1].parent_sample == two[0]
        recorder.close()
        ids = [key_id, one[0], two[0], three[0]]
        rows = dict(store.query("SELECT sample_id, prompt_from FROM samples"))
        assert [rows[i] for i in ids] == [None, key_id, key_id, key_id]
        captures = [first, *choices, last]
        assert [store.load_sample(i).capture.prompt_ids for i in ids] == [c.prompt_ids for c in captures]


def test_a_key_turn_stored_past_another_is_refused_and_a_restart_skips_what_it_cannot_read(recorded):
    """One join puts a prompt back only from a key stored whole; a row naming a key that is a tail itself (never
    written so) is refused, not read with the wrong ids; and a restarted proxy skips a turn it cannot read."""
    store, _ = recorded
    key_id, child = store.query(
        "SELECT prompt_from, sample_id FROM samples WHERE prompt_from IS NOT NULL ORDER BY sample_id LIMIT 1"
    )[0]
    store.write([("UPDATE samples SET prompt_from = ? WHERE sample_id = ?", [child, key_id])])
    with pytest.raises(StoreError, match=f"{child}.*{key_id}.*not stored whole"):
        store.load_sample(child)
    last = _ids(store)[-1]
    store.write([("UPDATE samples SET prompt_from = 'gone' WHERE sample_id = ?", [last])])
    assert restore_sessions(SessionBook("new"), store) == 0  # skipped, no error


def test_a_landing_sees_its_key_turns_landed_without_opening_the_store_again(
    tmp_path, kimi_tok, kimi_profile, make_capture, monkeypatch
):
    """Which rows written whole are now key turns is asked of the store the landing still holds open: asked after
    it, each landing opened and closed the store twice (an attach and a detach: a few ms each time)."""
    from tokview.store import connection

    opened: list[str] = []
    attach = connection._attach

    def counted(real: str, *, read_only: bool) -> Any:
        opened.append(real)
        return attach(real, read_only=read_only)

    with Store(tmp_path / "r.duckdb", linger=0) as store:  # as the proxy opens it: closed after each use
        store.put_run("r", settings={"mode": "proxy"})
        recorder = Recorder(store, profile=kimi_profile, tokenizer=kimi_tok, run_id="r", land_s=3600)
        capture = make_capture(LONG, answer="step 0", history=[])
        placed = recorder.sample(capture, messages=capture.messages, named=None, user=None, answer_message=None)
        assert placed is not None
        deadline = time.monotonic() + 30
        while recorder.writer.pending:  # its part written
            assert time.monotonic() < deadline, "the turn was never written"
            time.sleep(0.01)
        monkeypatch.setattr(connection, "_attach", counted)
        landings = recorder.lander.landings
        recorder.lander.flush()
        while recorder.lander.landings == landings:  # counted once the landing has closed the store
            assert time.monotonic() < deadline, "the turn never landed"
            time.sleep(0.01)
        assert placed[0] in recorder._sink.keys
        assert len(opened) == 1, opened
        recorder.close()


def test_turns_become_keys_when_another_command_landed_the_proxys_parts(tmp_path, kimi_tok, kimi_profile, make_capture):
    """Any command opening the store (`tokview stats`, the app, a batch) lands the parts beside it, the proxy's
    among them; the proxy's next landing then lands nothing and must still see its turns landed whole: it did not,
    and from then on every turn of its sessions was stored whole."""
    path = tmp_path / "r.duckdb"
    with Store(path, linger=0) as store:
        store.put_run("r", settings={"mode": "proxy"})
        recorder = Recorder(store, profile=kimi_profile, tokenizer=kimi_tok, run_id="r", land_s=3600)
        history: list[dict[str, Any]] = []
        for t in range(4):
            capture = make_capture(LONG if t == 0 else f"and now step {t}", answer=f"step {t}", history=history)
            answer = {"role": "assistant", "content": capture.content}
            recorder.sample(capture, messages=capture.messages, named=None, user=None, answer_message=answer)
            history = [*capture.messages, answer]
            deadline = time.monotonic() + 30
            while recorder.writer.pending:  # its part written
                assert time.monotonic() < deadline, "the turn was never written"
                time.sleep(0.01)
            Store(path).close()  # another command: it lands the proxy's part as it opens the store
            landings = recorder.lander.landings
            recorder.lander.flush()  # the proxy's own landing finds nothing left to land
            while recorder.lander.landings == landings:
                assert time.monotonic() < deadline, "the proxy never landed"
                time.sleep(0.01)
        recorder.close()
        assert store.query("SELECT count(*), count(prompt_from) FROM samples") == [(4, 3)]


def test_a_replayed_turn_is_never_stored_past_itself(tmp_path, kimi_tok, kimi_profile, make_capture):
    """A restarted proxy replays the answers it had spooled: one may be a turn the store holds already, and a restored
    turn of its session may be stored past it. It is not stored past itself (its own id as its key: unreadable once
    anything replaced the row)."""
    captures, answers, history = [], [], []
    for t in range(3):
        capture = make_capture(LONG if t == 0 else f"and now step {t}", answer=f"done {t}", history=history)
        answers.append({"role": "assistant", "content": capture.content})
        captures.append(capture)
        history = [*capture.messages, answers[-1]]
    ids = [f"proxy:r:spool.{t:04d}" for t in range(3)]
    with Store(tmp_path / "r.duckdb") as store:
        store.put_run("r", settings={"mode": "proxy"})
        recorder = Recorder(store, profile=kimi_profile, tokenizer=kimi_tok, run_id="r", land_s=0.01)
        for t in range(3):
            recorder.sample(
                captures[t],
                messages=captures[t].messages,
                named="agent",
                user=None,
                answer_message=answers[t],
                sample_id=ids[t],
            )
            deadline = time.monotonic() + 30
            while store.count_samples() < t + 1 or recorder._sink.written:
                assert time.monotonic() < deadline, "the turn never landed"
                recorder.lander.flush()
                time.sleep(0.02)
        recorder.close()
        assert store.query("SELECT prompt_from FROM samples WHERE sample_id = ?", [ids[2]]) == [(ids[0],)]
        recorder = Recorder(store, profile=kimi_profile, tokenizer=kimi_tok, run_id="r", land_s=3600)
        restore_sessions(recorder.sessions, store)
        recorder.keys_landed(recorder.sessions.whole_rows())
        recorder.sample(
            captures[0],
            messages=captures[0].messages,
            named="agent",
            user=None,
            answer_message=answers[0],
            sample_id=ids[0],
        )
        assert recorder._sink.stored_past.get(ids[0]) is None
        recorder.close()
        assert store.load_sample(ids[0]).capture.prompt_ids == captures[0].prompt_ids


def test_a_row_stored_past_a_key_by_no_count_is_refused_and_a_restart_skips_it(recorded, tmp_path):
    """A row naming its key turn but not how many of its ids it begins with (a hand-edited store) is refused by every
    reader, never read as its tail alone, and a restarted proxy skips it instead of failing to start."""
    store, _ = recorded
    child = _ids(store)[-1]
    store.write([("UPDATE samples SET prompt_from_len = NULL WHERE prompt_from IS NOT NULL", [])])
    with pytest.raises(StoreError, match=f"{child}.*not a count"):
        store.load_sample(child)
    with pytest.raises(StoreError, match=child):
        export_rows.write_parquet(store, [child], [child], tmp_path / "x.parquet")
    assert restore_sessions(SessionBook("new"), store) == 0


def test_a_turn_whose_analysis_failed_is_never_the_key_of_the_turns_after_it(
    tmp_path, kimi_tok, kimi_profile, make_capture, monkeypatch
):
    """A turn queued to be written whole whose analysis then failed (written as a failure) stayed a possible key:
    every later turn of the session proposed it, none was ever stored past anything."""
    import tokview.batch.writer_thread as writer_thread

    real, calls = writer_thread.analyze, []

    def failing_first(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise ValueError("a broken analysis")
        return real(*args, **kwargs)

    monkeypatch.setattr(writer_thread, "analyze", failing_first)
    with Store(tmp_path / "r.duckdb") as store:
        store.put_run("r", settings={"mode": "proxy"})
        recorder = Recorder(store, profile=kimi_profile, tokenizer=kimi_tok, run_id="r", land_s=0.01)
        _session(recorder, make_capture, 5, lost=1)  # turn 0 is a failure
        recorder.close()
        rows = store.query("SELECT turn, prompt_from IS NOT NULL FROM samples ORDER BY turn")
        # the turn after the failed one may have proposed it before its failure was written (it stays whole then, as
        # the next may); from then on the turns are stored past a key again (before: every later turn whole)
        past = [p for _turn, p in rows]
        assert len(rows) == 4 and past[-2:] == [True, True] and past.count(False) <= 2, rows


def _burst(recorder: Recorder, make_capture: Any, first: str, turns: int) -> tuple[list[str], list[Any]]:
    """An agent's turns handed over back to back (a recorder behind its harness records a session in a burst)."""
    history: list[dict[str, Any]] = []
    ids, captures = [], []
    for t in range(turns):
        capture = make_capture(first if t == 0 else f"and now step {t}", answer=f"step {t}", history=history)
        answer = {"role": "assistant", "content": capture.content}
        placed = recorder.sample(capture, messages=capture.messages, named=None, user=None, answer_message=answer)
        assert placed is not None
        ids.append(placed[0])
        captures.append(capture)
        history = [*capture.messages, answer]
    return ids, captures


def _lines_written(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every sample line the recorder writes to a part, as written."""
    import orjson

    lines: list[dict[str, Any]] = []
    write_part = store.write_part

    def spy(samples: Any, failures: Any = ()) -> None:
        lines.extend(orjson.loads(line) for line in samples)
        write_part(samples, failures)

    monkeypatch.setattr(store, "write_part", spy)
    return lines


def test_a_long_key_turn_lands_at_once_and_the_turns_after_it_are_written_cut(
    tmp_path, kimi_tok, kimi_profile, make_capture, monkeypatch
):
    """A turn written whole with EARLY_KEY_IDS prompt ids or more (a long conversation's first turn) lands at once,
    ending its part, not at the next gap: the turns after it, even handed over in the same burst, are written cut past
    it instead of whole naming it (each carried its whole prompt through the part's JSON and the landing's cut: ~5 ms
    of the recorder's CPU a turn of a 40,000-id context). Every prompt reads back whole."""
    from tokview.proxy.recorder import EARLY_KEY_IDS
    from tokview.store.prompt_refs import PAST_KEY

    with Store(tmp_path / "r.duckdb") as store:
        store.put_run("r", settings={"mode": "proxy"})
        lines = _lines_written(store, monkeypatch)
        recorder = Recorder(store, profile=kimi_profile, tokenizer=kimi_tok, run_id="r", land_s=3600)
        ids, captures = _burst(recorder, make_capture, LONG, 5)
        assert len(captures[0].prompt_ids) >= EARLY_KEY_IDS
        deadline = time.monotonic() + 30
        while len(lines) < 5:
            assert time.monotonic() < deadline, "the turns were never written"
            time.sleep(0.01)
        assert recorder.lander.landings == 1  # the key's own, long before the gap of an hour
        recorder.close()
        assert [(line["sample_id"], line.get("prompt_from"), PAST_KEY in line) for line in lines] == [
            (ids[0], None, False)
        ] + [(i, ids[0], False) for i in ids[1:]]
        assert [len(line["prompt_ids"]) for line in lines[1:]] == [
            len(c.prompt_ids) - line["prompt_from_len"] for c, line in zip(captures[1:], lines[1:], strict=True)
        ]
        rows = store.query("SELECT sample_id, prompt_from FROM samples ORDER BY sample_id")
        assert rows == [(ids[0], None)] + [(i, ids[0]) for i in ids[1:]]
        assert [store.load_sample(i).capture.prompt_ids for i in ids] == [c.prompt_ids for c in captures]


def test_a_short_key_turn_or_a_costly_last_landing_waits_for_the_gap(
    tmp_path, kimi_tok, kimi_profile, make_capture, monkeypatch
):
    """A key turn under EARLY_KEY_IDS ids is not worth a landing of its own (the turns after it name it and the gap's
    landing cuts them); nor is one right after a landing that took long (early landings keep to LANDING_SHARE too).
    Either way the turns after it are stored past it."""
    from tokview.proxy.recorder import EARLY_KEY_IDS
    from tokview.store.prompt_refs import PAST_KEY

    for first, last_took in ((LONG[: len(LONG) // 3], 0.0), (LONG, 3600.0)):
        with Store(tmp_path / f"r{last_took}.duckdb") as store:
            store.put_run("r", settings={"mode": "proxy"})
            lines = _lines_written(store, monkeypatch)
            recorder = Recorder(store, profile=kimi_profile, tokenizer=kimi_tok, run_id="r", land_s=3600)
            recorder.lander.last_took, recorder.lander.ended_at = last_took, time.monotonic()
            ids, captures = _burst(recorder, make_capture, first, 4)
            assert (len(captures[0].prompt_ids) >= EARLY_KEY_IDS) == (last_took > 0)
            recorder.close()
            assert recorder.lander.landings == 1  # the close's
            assert [line.get(PAST_KEY) for line in lines] == [None] + [ids[0]] * 3
            rows = store.query("SELECT sample_id, prompt_from FROM samples ORDER BY sample_id")
            assert rows == [(ids[0], None)] + [(i, ids[0]) for i in ids[1:]]


HOLD = """
import duckdb, sys, time
while True:
    try:
        c = duckdb.connect(sys.argv[1])
        break
    except duckdb.Error:
        time.sleep(0.01)
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""
"""Another program holding the store (a notebook, the duckdb CLI) for argv[2] seconds."""


def test_a_held_store_never_holds_the_writer_past_the_early_wait(
    tmp_path, kimi_tok, kimi_profile, make_capture, monkeypatch
):
    """The early landing of a long key turn waits EARLY_WAIT_S at most: a store another program holds keeps the
    lander waiting (its whole lock wait, here 4 s), never the writer. It waited the lock wait for every new long
    session, and a Ctrl-C waited for each of them again. Once the holder lets go, every turn lands, readable whole."""
    import subprocess
    import sys

    from tokview.proxy.recorder import EARLY_WAIT_S

    db = tmp_path / "r.duckdb"
    with Store(db, lock_timeout=4.0) as store:
        store.put_run("r", settings={"mode": "proxy"})
        store.close()
        lines = _lines_written(store, monkeypatch)
        recorder = Recorder(store, profile=kimi_profile, tokenizer=kimi_tok, run_id="r", land_s=3600)
        holder = subprocess.Popen([sys.executable, "-c", HOLD, str(db), "3"], stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            began = time.monotonic()
            sessions = [_burst(recorder, make_capture, f"session {s}: {LONG}", 2) for s in range(3)]
            while len(lines) < 6:
                assert time.monotonic() - began < 3, "the writer waited for the held store"
                time.sleep(0.01)
            assert time.monotonic() - began < 3 * EARLY_WAIT_S + 1.5
        finally:
            holder.wait()
        recorder.close()
        for ids, captures in sessions:
            assert [store.load_sample(i).capture.prompt_ids for i in ids] == [c.prompt_ids for c in captures]


def test_a_key_turn_landed_early_is_not_landed_again_empty(tmp_path, kimi_tok, kimi_profile, make_capture):
    """The early landing takes the part's poke: the lander did not land once more, empty, a gap later (an attach, a
    look for keys and a detach for nothing)."""
    with Store(tmp_path / "r.duckdb") as store:
        store.put_run("r", settings={"mode": "proxy"})
        recorder = Recorder(store, profile=kimi_profile, tokenizer=kimi_tok, run_id="r", land_s=0.1)
        ids, _ = _burst(recorder, make_capture, LONG, 1)
        deadline = time.monotonic() + 30
        while ids[0] not in recorder._sink.keys:  # landed at once, confirmed a key
            assert time.monotonic() < deadline, "the turn never landed"
            time.sleep(0.01)
        time.sleep(0.6)  # six gaps
        assert recorder.lander.landings == 1
        assert recorder.lander._attempts_begun == 1
        recorder.close()
