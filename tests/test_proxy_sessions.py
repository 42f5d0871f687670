"""Session grouping of proxied requests, on ids and messages alone."""

from __future__ import annotations

from typing import Any

import pytest

from tokview.proxy.sessions import KEY_IDS, SHORT_MIN_OUTPUT, SessionBook, Turn, _pack

SYSTEM = list(range(100, 140))
USER_A = [{"role": "user", "content": "a"}]


def _turn(book: SessionBook, prompt: list[int], output: list[int], messages=None, **names):
    turn = book.place(prompt, messages, **names)
    book.add(
        turn,
        f"s{len(book._sessions)}-{turn.turn}",
        prompt_ids=prompt,
        output_ids=output,
        messages=messages,
        answer=None,
    )
    return turn


def test_a_prompt_that_extends_prompt_plus_output_continues_the_longest_such_session() -> None:
    book = SessionBook("r")
    first = _turn(book, SYSTEM + [1, 2], [3, 4])
    other = _turn(book, SYSTEM + [9], [8])
    second = _turn(book, SYSTEM + [1, 2, 3, 4, 5], [6])
    third = _turn(book, SYSTEM + [1, 2, 3, 4, 5, 6, 7], [8])
    assert first.joined_by == other.joined_by == "new"
    assert first.session_id != other.session_id
    assert (second.session_id, second.turn, second.joined_by) == (first.session_id, 1, "prefix")
    assert (third.session_id, third.turn) == (first.session_id, 2)
    assert book.place(SYSTEM + [1, 2, 3], None).joined_by == "new"  # a retry of turn 0 is no continuation


def test_messages_join_a_turn_whose_ids_break_the_prefix_and_say_where() -> None:
    book = SessionBook("r")
    first = book.place(SYSTEM + [1, 2], USER_A)
    book.add(
        first,
        "s1",
        prompt_ids=SYSTEM + [1, 2],
        output_ids=[3, 4, 5],
        messages=USER_A,
        answer={"role": "assistant", "content": "hi"},
    )
    history = [
        *USER_A,
        {"role": "assistant", "content": "hi", "reasoning_content": "dropped later"},
        {"role": "user", "content": "b"},
    ]
    second = book.place(SYSTEM + [1, 2, 3, 7, 7], history)
    assert (second.session_id, second.turn, second.joined_by) == (first.session_id, 1, "messages")
    assert second.break_at == len(SYSTEM) + 3
    assert second.previous_len == len(SYSTEM) + 5
    assert second.previous_id == 4  # the finding shows both sides of the break
    assert book.place(SYSTEM + [0], [{"role": "user", "content": "z"}]).joined_by == "new"


def test_named_sessions_count_turns_and_note_a_break() -> None:
    book = SessionBook("r")
    a = _turn(book, [1, 2], [3], named="agent")
    b = _turn(book, [1, 2, 3, 4], [5], named="agent")
    c = _turn(book, [9, 9], [5], named="agent")
    assert [t.turn for t in (a, b, c)] == [0, 1, 2]
    assert a.session_id == "session:agent"
    assert b.break_at is None
    assert (c.break_at, c.previous_id) == (0, 1)


def test_the_least_recently_used_sessions_are_forgotten_first() -> None:
    book = SessionBook("r", max_sessions=2)
    first = _turn(book, SYSTEM + [1], [2])
    _turn(book, SYSTEM + [3], [4])
    _turn(book, SYSTEM + [5], [6])
    assert book.place(SYSTEM + [1, 2, 9], None).joined_by == "new"  # the first was evicted
    assert first.session_id not in book._sessions


def test_new_sessions_are_numbered_past_those_the_run_already_stored() -> None:
    """A dead proxy's spooled answers are recorded under its run id at the next start: numbering from s1 again named
    a new conversation like a stored one (two conversations under one id, two turns 0)."""
    import duckdb

    from tokview.proxy.sessions import LAST_NUMBER_SQL

    db = duckdb.connect()
    db.execute("CREATE TABLE samples (prompt_id VARCHAR)")
    stored = ["proxy:dead:s1", "proxy:dead:s12", "proxy:dead:s3", "proxy:dead_x:s40", "proxy:other:s99", "session:a"]
    db.executemany("INSERT INTO samples VALUES (?)", [[s] for s in stored])
    (last,) = db.execute(LAST_NUMBER_SQL, ["proxy:dead:s"]).fetchall()[0]  # `_` is no wildcard here
    assert last == 12
    book = SessionBook("dead")
    book.number_after(last)
    assert book.place([1, 2, 3], None).session_id == "proxy:dead:s13"
    book = SessionBook("fresh")
    book.number_after(db.execute(LAST_NUMBER_SQL, ["proxy:fresh:s"]).fetchall()[0][0])  # nothing stored: None
    assert book.place([1, 2, 3], None).session_id == "proxy:fresh:s1"


def test_parallel_rollouts_differing_only_in_arguments_keep_their_own_sessions() -> None:
    """Two rollouts of one task call the same tool with other arguments; the harness drops the reasoning, so neither
    continues by prefix: keyed by the tool's name alone, the later one took the other's session (and split its own).
    Re-serialised arguments (spacing, key order, a whole number written as a float: `1` sent back as `1.0`) and
    renumbered call ids still join."""

    def call(args: str, call_id: str) -> dict:
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": call_id, "type": "function", "function": {"name": "bash", "arguments": args}}],
        }

    book = SessionBook("r")
    starts = {}
    for name, args, prompt in (("a", '{"cmd": "ls", "n": 1}', [1]), ("b", '{"cmd": "pwd"}', [2])):
        turn = book.place(SYSTEM + prompt, USER_A)
        book.add(turn, name, prompt_ids=SYSTEM + prompt, output_ids=[7, 7], messages=USER_A, answer=call(args, name))
        starts[name] = turn.session_id
    result = {"role": "tool", "tool_call_id": "x", "content": "out"}
    for name, args, prompt in (("a", '{"n":1.0,"cmd":"ls"}', [1, 5]), ("b", '{"cmd":"pwd"}', [2, 5])):
        again = book.place(SYSTEM + prompt, [*USER_A, call(args, "renumbered"), result])
        assert (again.session_id, again.turn, again.joined_by) == (starts[name], 1, "messages")


def test_a_named_session_s_retry_is_that_turn_again_and_the_session_goes_on_from_the_retry() -> None:
    """The same prompt again in a named session was turn k+1 with a false break at the prompt's end; unnamed, the same
    prompt may be a parallel rollout of one task, so it starts a session of its own (each goes on from its answer)."""
    book = SessionBook("r")
    first = _turn(book, [1, 2], [3], named="agent")
    second = _turn(book, [1, 2, 3, 4], [5], named="agent")
    retry = _turn(book, [1, 2, 3, 4], [6], named="agent")
    assert (retry.turn, retry.break_at, retry.parent_sample) == (1, None, second.parent_sample)
    assert second.parent_sample is not None and second.parent_sample.endswith("-0")  # turn 0's sample
    after = _turn(book, [1, 2, 3, 4, 6, 7], [8], named="agent")  # continues the retry's answer
    assert (after.turn, after.break_at) == (2, None)
    assert first.turn == 0
    one = _turn(book, SYSTEM + [1], [2])
    other = _turn(book, SYSTEM + [1], [3])
    assert other.joined_by == "new" and other.session_id != one.session_id
    assert _turn(book, SYSTEM + [1, 3, 4], [5]).session_id == other.session_id
    assert _turn(book, SYSTEM + [1, 2, 4], [5]).session_id == one.session_id


def test_identical_unnamed_rollouts_at_temperature_0_each_go_on_in_their_own_session() -> None:
    """Two rollouts of one task at temperature 0 send the same ids at every turn: each next turn took the first
    session of equals, so one session got both turn 1s (twice the same turn) and the other stopped at turn 0."""
    book = SessionBook("r")
    names = iter(range(100))

    def turn(prompt: list[int], output: list[int]):
        placed = book.place(prompt, None)
        book.add(placed, f"sample{next(names)}", prompt_ids=prompt, output_ids=output, messages=None, answer=None)
        return placed

    a0, b0 = turn(SYSTEM + [1], [2]), turn(SYSTEM + [1], [2])
    a1, b1 = turn(SYSTEM + [1, 2, 3], [4]), turn(SYSTEM + [1, 2, 3], [4])
    a2, b2 = turn(SYSTEM + [1, 2, 3, 4, 5], [6]), turn(SYSTEM + [1, 2, 3, 4, 5], [6])
    assert a0.session_id != b0.session_id
    assert [(t.session_id, t.turn) for t in (a1, a2)] == [(a0.session_id, 1), (a0.session_id, 2)]
    assert [(t.session_id, t.turn) for t in (b1, b2)] == [(b0.session_id, 1), (b0.session_id, 2)]
    assert turn(SYSTEM + [1, 2, 3, 4, 5, 6, 7], [8]).session_id == a0.session_id  # a third: the first of equals


def test_a_restarted_proxy_s_new_rollout_goes_on_in_its_own_session_not_an_earlier_run_s_of_the_same_task() -> None:
    """Rollout A of a task sent its first request only, and the proxy was restarted; rollout B of the same task at
    temperature 0 then sent two: B's second joined A's session of the earlier run (the first of equals), B's first
    left alone in this run, and `export --run` of this run showed B start at its turn 1."""
    book = SessionBook("new")
    a0 = Turn("proxy:old:s1", 0, "restored")
    book.add(a0, "a0", prompt_ids=SYSTEM + [1], output_ids=[2, 3], messages=None, answer=None)
    b0 = _turn(book, SYSTEM + [1], [2, 3])
    b1 = _turn(book, SYSTEM + [1, 2, 3, 4], [5])
    assert b0.session_id.startswith("proxy:new:")
    assert (b1.session_id, b1.turn, b1.joined_by) == (b0.session_id, 1, "prefix")
    c1 = _turn(book, SYSTEM + [1, 2, 3, 4], [5])  # another rollout's next turn: the earlier run's is still open
    assert (c1.session_id, c1.turn) == ("proxy:old:s1", 1)


def test_a_turn_whose_ids_extend_a_cut_rollout_joins_the_turn_its_messages_continue_and_says_where_it_breaks() -> None:
    """Rollout A was cut at its max_tokens (its 2 ids the start of every full answer); rollout B's harness renumbered
    its call ids, so B's next prompt extends only A's cut turn by ids: it joined A's session, unflagged (one rollout's
    cut turn spliced into another's trajectory). Its messages continue B's turn: it goes on there, with the break."""
    book = SessionBook("r")
    answer = {"role": "assistant", "content": "", "tool_calls": [{"id": "call_0", "function": {"name": "f"}}]}
    cut = {"role": "assistant", "content": "", "reasoning_content": "let"}
    a0 = book.place(SYSTEM + [1], USER_A)
    book.add(a0, "a0", prompt_ids=SYSTEM + [1], output_ids=[2, 3], messages=USER_A, answer=cut)
    b0 = book.place(SYSTEM + [1], USER_A)
    book.add(b0, "b0", prompt_ids=SYSTEM + [1], output_ids=[2, 3, 4, 5, 6], messages=USER_A, answer=answer)
    history = [*USER_A, answer, {"role": "tool", "tool_call_id": "call_0", "content": "42"}]
    b1 = book.place(SYSTEM + [1, 2, 3, 4, 9, 6, 7], history)  # B's call id renumbered: 9 for the served 5
    assert a0.session_id != b0.session_id
    assert (b1.session_id, b1.turn, b1.joined_by, b1.parent_sample) == (b0.session_id, 1, "messages", "b0")
    assert b1.break_at == len(SYSTEM) + 4


def test_the_kept_ids_are_bounded_by_bytes_the_least_recently_used_going_first() -> None:
    """Counted alone, 2,000 sessions of 128k-token agent traces held ~1 GB of ids."""
    book = SessionBook("r", max_bytes=4 * 250)  # 250 ids
    first = _turn(book, SYSTEM + [1], list(range(60)))  # 101 ids
    second = _turn(book, SYSTEM + [2], list(range(60)))
    assert book._bytes == 4 * 202
    third = _turn(book, SYSTEM + [3], list(range(60)))  # 303 ids: the oldest goes
    assert first.session_id not in book._sessions
    assert {second.session_id, third.session_id} <= set(book._sessions)
    assert book.place(SYSTEM + [2] + list(range(60)) + [7], None).session_id == second.session_id
    longer = _turn(book, SYSTEM + [2] + list(range(60)) + [7], list(range(200)))  # alone past the bound: kept
    assert list(book._sessions) == [longer.session_id]
    assert book._bytes == 4 * (40 + 62 + 200)


def test_a_restored_tool_call_turn_is_joined_by_the_next_request_s_messages() -> None:
    """After a proxy restart a session's newest turn is read back from the store; without its calls in the answer
    message, a next request that re-rendered the history (no prefix) matched no session and started a new one."""
    import duckdb
    import orjson

    from tokview.proxy.sessions import restore_sessions
    from tokview.store.packed_chunks import pack

    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
    stored_json = {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [call]}}]}
    opening = {"index": 0, "id": "c1", "type": "function", "function": {"name": "add", "arguments": ""}}
    pieces = [opening] + [{"index": 0, "function": {"arguments": c}} for c in '{"a": 1, "b": 2}']
    chunks = [{"choices": [{"index": 0, "delta": {"tool_calls": [piece]}}]} for piece in pieces]
    # as the store keeps a stream of 16 chunks or more: packed (`store.packed_chunks`)
    stored_stream = pack(
        {"stream": True, "n_chunks": len(chunks), "chunks": chunks}, lambda v: orjson.dumps(v).decode()
    )
    assert "chunks" not in stored_stream
    db = duckdb.connect()
    db.execute(
        "CREATE TABLE samples (prompt_id VARCHAR, turn INT, sample_id VARCHAR, prompt_ids INT[], output_ids INT[], "
        "raw_request VARCHAR, content VARCHAR, raw_response VARCHAR, created_at TIMESTAMP, gen_index INT, "
        "prompt_from VARCHAR, prompt_from_len INT, prompt_len INT, messages VARCHAR, reasoning VARCHAR)"
    )
    for n, response in enumerate((stored_json, stored_stream)):
        sent = [{"role": "user", "content": f"task {n}"}]
        # the second row as a chat row is stored now: its messages once, in the column (`store.elided_ids`)
        request = {"body": {"messages": sent if n == 0 else None}}
        db.execute(
            "INSERT INTO samples VALUES (?, 0, ?, ?, [7, 8], ?, NULL, ?, now(), 0, NULL, NULL, ?, ?, NULL)",
            [
                f"proxy:old:s{n}",
                f"proxy:old:{n}",
                [*SYSTEM, n],
                orjson.dumps(request).decode(),
                orjson.dumps(response).decode(),
                len(SYSTEM) + 1,
                None if n == 0 else orjson.dumps(sent).decode(),
            ],
        )
    book = SessionBook("new")
    assert restore_sessions(book, _Db(db)) == 2
    for n in range(2):
        renumbered = {**call, "id": "call_0", "function": {"name": "add", "arguments": '{"b":2,"a":1}'}}
        messages = [
            {"role": "user", "content": f"task {n}"},
            {"role": "assistant", "content": "", "tool_calls": [renumbered]},
            {"role": "tool", "tool_call_id": "call_0", "content": "3"},
        ]
        turn = book.place([*SYSTEM, n, 5, 5], messages)  # the history re-rendered: no prefix
        assert (turn.session_id, turn.turn, turn.joined_by) == (f"proxy:old:s{n}", 1, "messages")


def test_a_side_request_that_finished_first_leaves_the_main_loop_in_its_session() -> None:
    """A harness asks for a title or a summary on the conversation so far: that request extends turn 0 and finishes
    first. The main loop's next turn extends turn 0 too, not the side request: kept as the only turn, the side request
    left the main loop nothing to continue, and it started a session of its own (split from its own history)."""
    book = SessionBook("r")

    def turn(name: str, prompt: list[int], output: list[int]):
        placed = book.place(prompt, None)
        book.add(placed, name, prompt_ids=prompt, output_ids=output, messages=None, answer=None)
        return placed

    first = turn("t0", SYSTEM + [1], [2, 3])
    side = turn("side", SYSTEM + [1, 2, 3, 50, 51], [52])
    main = turn("t1", SYSTEM + [1, 2, 3, 60], [61])
    after = turn("t2", SYSTEM + [1, 2, 3, 60, 61, 62], [63])
    assert {side.session_id, main.session_id, after.session_id} == {first.session_id}
    assert (side.turn, main.turn, after.turn) == (1, 1, 2)
    assert side.parent_sample == main.parent_sample == "t0"
    assert (after.parent_sample, after.joined_by) == ("t1", "prefix")


def test_a_re_rendered_main_turn_joins_by_messages_past_a_side_request() -> None:
    book = SessionBook("r")
    history = [{"role": "user", "content": "fix the bug"}]
    answer = {"role": "assistant", "content": "ok", "tool_calls": None}
    first = book.place(SYSTEM + [1], history)
    book.add(first, "t0", prompt_ids=SYSTEM + [1], output_ids=[2, 3], messages=history, answer=answer)
    ask = [*history, answer, {"role": "user", "content": "title?"}]
    side = book.place(SYSTEM + [1, 2, 3, 9], ask)
    book.add(side, "side", prompt_ids=SYSTEM + [1, 2, 3, 9], output_ids=[4], messages=ask, answer=None)
    main = book.place(SYSTEM + [1, 2, 7, 8], [*history, answer, {"role": "tool", "content": "x"}])
    assert (main.session_id, main.turn, main.joined_by, main.parent_sample) == (first.session_id, 1, "messages", "t0")
    assert main.break_at == len(SYSTEM) + 2  # where its ids leave turn 0's prompt + output


def test_an_unnamed_retry_of_a_later_turn_stays_in_its_session_as_that_turn() -> None:
    """The same prompt as turn 1 again (a harness retrying after a tool error, unnamed): it extends turn 0, so it is
    turn 1 once more; only a first prompt sent twice may be two rollouts of one task, each a session of its own."""
    book = SessionBook("r")
    first = _turn(book, SYSTEM + [1], [2])
    second = _turn(book, SYSTEM + [1, 2, 3], [4])
    retry = _turn(book, SYSTEM + [1, 2, 3], [5])
    assert (retry.session_id, retry.turn, retry.parent_sample) == (first.session_id, 1, second.parent_sample)
    assert _turn(book, SYSTEM + [1, 2, 3, 5, 6], [7]).turn == 2  # goes on from the retry's answer


def test_a_harness_may_continue_any_choice_of_an_n_request() -> None:
    book = SessionBook("r")
    first = book.place(SYSTEM + [1], None)
    for k, output in enumerate(([2], [3], [4])):  # three choices of one request: one turn, three samples
        book.add(first, f"c{k}", prompt_ids=SYSTEM + [1], output_ids=output, messages=None, answer=None)
    kept = book.place(SYSTEM + [1, 3, 9], None)  # the harness kept the second choice
    assert (kept.session_id, kept.turn, kept.parent_sample, kept.joined_by) == (first.session_id, 1, "c1", "prefix")


def test_a_long_trace_s_kept_turns_hold_its_ids_about_once() -> None:
    """Each kept turn's ids are the next turn's first ids: held as views of the newest, not one copy a turn."""
    from tokview.proxy.sessions import TURNS_KEPT

    book = SessionBook("r")
    prompt = list(SYSTEM)
    for turn in range(TURNS_KEPT + 2):
        output = list(range(1000 * turn, 1000 * turn + 1000))
        _turn(book, prompt, output)
        prompt = prompt + output + [7]
    [session] = book._sessions.values()
    assert len(session.heads) == TURNS_KEPT
    assert book._bytes == 4 * (len(prompt) - 1) == _held(book)  # the newest turn's prompt + output, once
    assert book.place(prompt, None).turn == TURNS_KEPT + 2


def _held(book: SessionBook) -> int:
    """The bytes the kept heads really hold: each distinct buffer once, a view's being its newer head's."""
    buffers = {}
    for session in book._sessions.values():
        for head in session.heads:
            whole = head.sequence.obj if isinstance(head.sequence, memoryview) else head.sequence
            buffers[id(whole)] = len(bytes(whole))
    return sum(buffers.values())


def test_the_bytes_counted_are_the_bytes_held_whatever_the_turns() -> None:
    """Views of views kept three buffers alive where one was counted: the byte bound held ~3x what it said."""
    import random

    rng = random.Random(7)
    book = SessionBook("r", max_sessions=6, max_bytes=4 * 3000)
    prompts: list[list[int]] = []
    for step in range(600):
        kind = rng.random()
        if prompts and kind < 0.6:  # continue some conversation
            base = rng.choice(prompts)
            prompt = base + [rng.randrange(50)]
        elif prompts and kind < 0.7:  # a retry
            prompt = rng.choice(prompts)
        else:
            prompt = [*SYSTEM[:20], rng.randrange(5), step]
        placed = book.place(prompt, None)
        for k in range(rng.choice([1, 1, 1, 3, 6])):  # n choices, some of them the same
            output = [rng.randrange(3) for _ in range(rng.randrange(0, 60))]
            book.add(
                placed, f"x{step}.{k}", prompt_ids=prompt, output_ids=output, messages=None, answer=None, sibling=k > 0
            )
            prompts.append(prompt + output)
        prompts = prompts[-40:]
        assert book._bytes == _held(book) >= 0, step
        assert book._bytes <= book.max_bytes or len(book._sessions) == 1
        live = {id(h) for s in book._sessions.values() for h in s.heads}
        indexed = {id(h) for group in book._by_start.values() for h in [*group.turns, *group.odd] if h is not None}
        assert indexed == live  # every session here is unnamed: each kept turn is indexed, none forgotten there


def test_any_of_eight_choices_may_be_continued_and_the_turn_before_them_stays() -> None:
    """Five choices pushed out the first choice and the turn before them (four turns were kept, siblings counted)."""
    book = SessionBook("r")
    first = _turn(book, SYSTEM + [1], [2])
    placed = book.place(SYSTEM + [1, 2, 3], None)
    for k in range(10):
        book.add(
            placed,
            f"c{k}",
            prompt_ids=SYSTEM + [1, 2, 3],
            output_ids=[10 + k],
            messages=None,
            answer=None,
            sibling=k > 0,
        )
    for k in (0, 7):
        kept = book.place(SYSTEM + [1, 2, 3, 10 + k, 5], None)
        assert (kept.session_id, kept.turn, kept.parent_sample) == (first.session_id, 2, f"c{k}")
    unkept = book.place(SYSTEM + [1, 2, 3, 19, 5], None)  # a choice past the 8 kept: after the turn it extends
    assert (unkept.session_id, unkept.turn, unkept.parent_sample) == (first.session_id, 1, "s0-0")
    retry = book.place(SYSTEM + [1, 2, 3], None)  # turn 1 once more: turn 0 is still kept
    assert (retry.session_id, retry.turn) == (first.session_id, 1)


def test_a_retry_of_a_turn_whose_answer_was_empty_is_that_turn_again() -> None:
    for names in ({}, {"named": "a"}):
        book = SessionBook("r")
        first = _turn(book, SYSTEM + [1], [2], **names)
        empty = _turn(book, SYSTEM + [1, 2, 3], [], **names)
        retry = book.place(SYSTEM + [1, 2, 3], None, named=names.get("named"))
        assert (retry.session_id, retry.turn, retry.parent_sample) == (first.session_id, 1, empty.parent_sample)


def test_a_named_re_rendered_turn_breaks_against_the_turn_its_messages_continue() -> None:
    """After a side request in a named session, the main loop's re-rendered turn was said to break against the side
    request, and numbered past it."""
    book = SessionBook("r")
    history = [{"role": "user", "content": "fix the bug"}]
    answer = {"role": "assistant", "content": "ok", "tool_calls": None}
    first = book.place(SYSTEM + [1], history, named="a")
    book.add(first, "t0", prompt_ids=SYSTEM + [1], output_ids=[2, 3], messages=history, answer=answer)
    ask = [*history, answer, {"role": "user", "content": "title?"}]
    side = book.place(SYSTEM + [1, 2, 3, 9], ask, named="a")
    book.add(side, "side", prompt_ids=SYSTEM + [1, 2, 3, 9], output_ids=[4], messages=ask, answer=None)
    main = book.place(SYSTEM + [1, 2, 7, 8], [*history, answer, {"role": "tool", "content": "x"}], named="a")
    assert (main.turn, main.parent_sample, main.break_at) == (1, "t0", len(SYSTEM) + 2)


def test_a_named_session_forgotten_for_room_goes_on_numbering_its_turns() -> None:
    book = SessionBook("r", max_sessions=1)
    _turn(book, [1, 2], [3], named="a")
    _turn(book, [1, 2, 3, 4], [5], named="a")
    _turn(book, [9], [9], named="b")  # "a" is forgotten
    again = book.place([1, 2, 3, 4, 5, 6], None, named="a")
    assert (again.session_id, again.turn) == ("session:a", 2)  # not a second turn 0


def test_the_turn_a_prompt_continues_is_the_longest_kept_turn_it_begins_with() -> None:
    """The placement's shortcut (a kept turn's last ids compared first, looked up by its first KEY_IDS ids) finds
    what comparing every kept turn whole finds: short turns (fewer ids than a key, or than it compares), turns
    sharing a long start, equal lengths (continued ones after the others), views."""
    import random

    rng = random.Random(11)
    book = SessionBook("r", max_sessions=50)
    starts = [[], SYSTEM[:3], SYSTEM, SYSTEM * 3]
    prompts: list[list[int]] = []
    for step in range(800):
        if prompts and rng.random() < 0.5:
            base = rng.choice(prompts)
            prompt = base[: rng.randrange(len(base) + 1)] + [rng.randrange(4) for _ in range(rng.randrange(3))]
        else:
            prompt = rng.choice(starts) + [rng.randrange(4) for _ in range(rng.randrange(4))]
        packed, _ = _pack(prompt)
        live = [h for s in book._sessions.values() for h in s.heads]
        fits = [  # a turn shorter than a key too, past an answer of SHORT_MIN_OUTPUT ids (or the prompt's whole key)
            h
            for h in live
            if packed.startswith(h.sequence)
            and (
                len(h.sequence) >= 4 * KEY_IDS
                or len(h.sequence) == len(packed[: 4 * KEY_IDS])
                or len(h.sequence) // 4 - h.prompt_len >= SHORT_MIN_OUTPUT
            )
        ]
        fits = [h for h in fits if not (h.turn == 0 and len(h.sequence) == len(packed) == 4 * h.prompt_len)]
        # of equals the first indexed that no turn continues yet, else the first indexed (one run: no earlier run's)
        expected = min(fits, key=lambda h: (-len(h.sequence), h.continued, h.order)) if fits else None
        assert book._longest_prefix(packed) is expected, step
        placed = book.place(prompt, None)
        output = [rng.randrange(4) for _ in range(rng.randrange(5))]
        book.add(placed, f"x{step}", prompt_ids=prompt, output_ids=output, messages=None, answer=None)
        prompts = [*prompts[-30:], prompt + output]


def test_what_place_computed_for_a_request_is_what_add_would_compute_again() -> None:
    """`add` reuses the prompt's packing and the messages' digests `place` made for the same request: the turn it keeps
    (ids, messages key) is the one it keeps when called alone, ids past 32 bits and an answer or none included."""
    history = [*USER_A, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "b"}]
    answer = {"role": "assistant", "content": "there", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}
    cases = [
        (SYSTEM + [1, 2], [3, 4], history, answer),
        (SYSTEM + [1, 2], [3, 2**40], history, None),
        (SYSTEM + [2**40], [3], USER_A, answer),
        (SYSTEM, [5], None, None),
    ]
    for prompt, output, messages, said in cases:
        heads = []
        for reuse in (True, False):
            book = SessionBook("r")
            turn = book.place(prompt, messages)
            if not reuse:
                book._placed = None
            book.add(turn, "s", prompt_ids=prompt, output_ids=output, messages=messages, answer=said)
            (head,) = book._sessions[turn.session_id].heads
            heads.append((bytes(head.sequence), head.message_key))
        assert heads[0] == heads[1]
        assert heads[0][0] == _pack([*prompt, *output])[0]


def test_messages_holding_a_lone_surrogate_are_keyed_like_any_others() -> None:
    """A request's JSON may hold `"\\ud800"` (Python's json reads it, as the servers do), which orjson cannot write:
    its turn is kept under its messages' key, and the next turn continues it by them."""
    book = SessionBook("r")
    said = [{"role": "user", "content": "a \ud800 b"}]
    answer = {"role": "assistant", "content": "x", "tool_calls": [{"function": {"name": "f", "arguments": '{"k": 1}'}}]}
    first = _turn(book, SYSTEM + [1], [2], said)
    book.add(first, "s1", prompt_ids=SYSTEM + [1], output_ids=[2], messages=said, answer=answer)
    second = book.place(SYSTEM + [7], [*said, answer, {"role": "user", "content": "\udc00"}])
    assert (second.session_id, second.turn, second.joined_by) == (first.session_id, 1, "messages")


class _Db:
    """A DuckDB connection as `store.connection.Database` (reads only)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def query(self, sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
        return self.conn.execute(sql, list(params)).fetchall()

    def write(self, statements: Any) -> None:
        raise AssertionError("restoring sessions writes nothing")


def test_a_turn_is_stored_past_the_key_it_shares_most_with_among_the_kept_turns() -> None:
    """Each kept turn offers a key: itself when stored whole, else its own key for the ids up to where it is stored
    past it. The most shared is taken (so a newer key turn wins over an older one the parent is stored past), a turn
    not seen landed offers nothing, and nothing under KEY_MIN_IDS or half the prompt is taken."""
    from tokview.proxy.sessions import KEY_MIN_IDS

    book = SessionBook("r")
    base = list(range(1000, 1000 + 3 * KEY_MIN_IDS))
    landed: set[str] = set()

    def turn(prompt: list[int], output: list[int]) -> tuple[str, tuple[str, int] | None]:
        placed = book.place(prompt, None)
        sample_id = f"t{placed.turn}"
        book.add(placed, sample_id, prompt_ids=prompt, output_ids=output, messages=None, answer=None)
        return sample_id, book.stored_past(placed, sample_id, len(prompt), lambda s: s in landed)

    a, past_a = turn(base, [1, 2])
    assert past_a is None  # a new session: whole
    landed.add(a)
    b_prompt = [*base, 1, 2, 3]
    _b, past_b = turn(b_prompt, [4])
    assert past_b == (a, len(base) + 2)  # the whole of a's prompt + output
    c_prompt = [*b_prompt, 4, *range(5, 5 + KEY_MIN_IDS)]
    c, past_c = turn(c_prompt, [9])  # b offers a, for the ids up to where b is stored past it
    assert past_c == (a, len(base) + 2)
    book._sessions[next(iter(book._sessions))].heads[-1].stored_from = None  # as if c had been written whole
    landed.add(c)
    _d, past_d = turn([*c_prompt, 9, 10], [11])
    assert past_d == (c, len(c_prompt) + 1)  # c shares more than a: the newer key wins
    landed.discard(c)
    landed.discard(a)
    _e, past_e = turn([*c_prompt, 9, 10, 11, 12], [13])
    assert past_e is None  # no kept turn offers a key seen landed: whole
    landed.add(c)
    _h, past_h = turn([*c_prompt, 9, 10, 11, 12, 13, 14], [15])
    assert past_h == (c, len(c_prompt) + 1)  # its parent e is not seen landed: an older kept key is taken
    f, past_f = turn([*base[: KEY_MIN_IDS - 1], 7], [8])
    assert past_f is None  # a new session
    landed.add(f)
    _g, past_g = turn([*base[: KEY_MIN_IDS - 1], 7, 8, *range(50_000, 50_000 + 2 * KEY_MIN_IDS)], [9])
    assert past_g is None  # f, a key, shares 2,049 ids: under half this prompt


def test_turns_whose_ids_are_kept_as_json_share_no_key() -> None:
    """An id past 32 bits (a gateway's garbage) keeps a turn's ids as JSON (`_pack`): its bytes are no ids, so
    neither it nor a turn after it is stored past a key by comparing them."""
    from tokview.proxy.sessions import KEY_MIN_IDS

    book = SessionBook("r")
    base = list(range(1000, 1000 + 3 * KEY_MIN_IDS))
    first = book.place(base, None, named="agent")
    book.add(first, "a", prompt_ids=base, output_ids=[2**40], messages=None, answer=None)
    prompt = [*base, 2**40, 5]
    turn = book.place(prompt, None, named="agent")
    book.add(turn, "b", prompt_ids=prompt, output_ids=[6], messages=None, answer=None)
    assert turn.parent_sample == "a"
    assert book.stored_past(turn, "b", len(prompt)) is None


def test_a_turn_kept_as_json_is_known_so_by_how_it_was_packed_not_by_its_length() -> None:
    """A JSON list can be exactly 4 bytes an id long ([2147483648,1,2,3,4]: 20 bytes, 5 ids): read by its length, such
    a turn passed for one packed as 32-bit ids, and its bytes were compared as ids."""
    from tokview.proxy.sessions import _pack

    ids = [2**31, 1, 2, 3, 4]
    packed, int32 = _pack(ids)
    assert (len(packed), int32) == (4 * len(ids), False)
    book = SessionBook("r")
    turn = book.place(ids[:3], None, named="agent")
    book.add(turn, "a", prompt_ids=ids[:3], output_ids=ids[3:], messages=None, answer=None)
    [head] = book._sessions[turn.session_id].heads
    assert not head.int32


def test_twin_conversations_re_rendered_each_go_on_by_messages_in_their_own_session() -> None:
    """Two conversations with the same first turns (one task, one seed) whose next prompts are re-rendered (the ids
    break, the messages join): both second turns went to the newest twin's session, the other stopped at turn 0."""
    book = SessionBook("r")
    names = iter(range(100))
    answer = {"role": "assistant", "content": "hi"}

    def turn(prompt: list[int], output: list[int], messages: list[dict]):
        placed = book.place(prompt, messages)
        book.add(placed, f"t{next(names)}", prompt_ids=prompt, output_ids=output, messages=messages, answer=answer)
        return placed

    a0, b0 = turn(SYSTEM + [1], [2], USER_A), turn(SYSTEM + [1], [2], USER_A)
    follow = [*USER_A, answer]
    a1 = turn(SYSTEM + [1, 7, 7], [4], [*follow, {"role": "user", "content": "alpha"}])
    b1 = turn(SYSTEM + [1, 7, 8], [4], [*follow, {"role": "user", "content": "bravo"}])
    assert a0.session_id != b0.session_id
    assert {(a1.session_id, a1.turn, a1.joined_by), (b1.session_id, b1.turn, b1.joined_by)} == {
        (a0.session_id, 1, "messages"),
        (b0.session_id, 1, "messages"),
    }


def test_a_named_turn_that_continues_nothing_kept_says_so_not_that_its_messages_continue() -> None:
    """A session name reused for another conversation: its first request got a break finding saying it "continues
    its conversation by its messages", though it shares nothing with the session."""
    from tokview.proxy.recorder import prefix_break_finding

    book = SessionBook("r")
    _turn(book, SYSTEM + [1], [2], USER_A, named="shared")
    other = _turn(book, [9, 9, 9], [5], [{"role": "user", "content": "quantum?"}], named="shared")
    assert (other.turn, other.by_name_only) == (1, True)
    detail = prefix_break_finding(other, [9, 9, 9], None)["detail"]
    assert "neither its ids nor its messages continue a kept turn" in detail and "by its messages, but" not in detail
    retry = _turn(book, SYSTEM + [1], [2, 2], USER_A, named="shared")  # turn 0 again: the newest kept request
    compacted = _turn(book, [8, 8], [5], [{"role": "user", "content": "summary"}], named="shared")
    said = prefix_break_finding(compacted, [8, 8], None)["detail"]
    assert (retry.turn, compacted.previous_turn) == (0, 0) and "do not extend turn 0's prompt + output ids" in said
    again = _turn(book, SYSTEM + [1, 2, 3], [4], named="shared")  # the first conversation goes on by its ids
    assert (again.turn, again.by_name_only, again.break_at) == (1, False, None)  # after the turn it extends


def test_a_request_without_a_name_never_joins_a_session_a_harness_named() -> None:
    """Harness 1 names its session H; harness 2 sends the same first prompt unnamed, then its own next turn. That
    turn extends both turn 0s equally and went to H (two turns 1 from two clients; harness 2's session stopped at
    turn 0). A session the harness named holds only requests that carry the name."""
    book = SessionBook("r")
    named = _turn(book, SYSTEM + [1], [2], USER_A, named="H")
    unnamed = _turn(book, SYSTEM + [1], [2], USER_A)
    assert (named.session_id, unnamed.session_id) == ("session:H", "proxy:r:s1")
    history = [*USER_A, {"role": "assistant", "content": "x"}, {"role": "user", "content": "b"}]
    nxt = book.place(SYSTEM + [1, 2, 3], history)
    assert (nxt.session_id, nxt.turn, nxt.joined_by) == ("proxy:r:s1", 1, "prefix")
    by_messages = book.place(SYSTEM + [7, 7], history)  # re-rendered: joined by its messages, also not into H
    assert by_messages.session_id != "session:H"
    only_named = SessionBook("r")
    _turn(only_named, SYSTEM + [1], [2], USER_A, named="H")
    assert only_named.place(SYSTEM + [1, 2, 3], history).joined_by == "new"


def _stored(
    rows: list[tuple[str, int, str, list[int], list[int], int]],
    messages: dict[str, Any] | None = None,
    seconds: list[int] | None = None,
) -> Any:
    """A store holding proxied turns (session, turn, sample id, prompt ids, output ids, generation), recorded in that
    order, as `restore_sessions` reads them; `messages`: a sample id's request messages (else none), answered "x"."""
    import duckdb
    import orjson

    db = duckdb.connect()
    db.execute(
        "CREATE TABLE samples (prompt_id VARCHAR, turn INT, sample_id VARCHAR, prompt_ids INT[], output_ids INT[], "
        "raw_request VARCHAR, content VARCHAR, raw_response VARCHAR, created_at TIMESTAMP, gen_index INT, "
        "prompt_from VARCHAR, prompt_from_len INT, prompt_len INT, messages VARCHAR, reasoning VARCHAR)"
    )
    for k, (session, turn, sample_id, prompt, output, gen) in enumerate(rows):
        sent = (messages or {}).get(sample_id)
        request = orjson.dumps({"body": {"messages": sent}}).decode() if sent else "{}"
        db.execute(
            "INSERT INTO samples VALUES (?, ?, ?, ?, ?, ?, 'x', '{}', "
            "TIMESTAMP '2026-01-01' + to_seconds(?), ?, NULL, NULL, ?, NULL, NULL)",
            [session, turn, sample_id, prompt, output, request, seconds[k] if seconds else k, gen, len(prompt)],
        )
    return _Db(db)


def test_a_restart_gives_a_session_back_the_turns_its_next_request_may_continue() -> None:
    """Turn 0, turn 1, then a side request built on turn 1 (turn 2): after a restart only the side request came
    back, so the main loop's turn 2 (which extends turn 1) started a new session, or, named, joined "by name only"
    with a false prefix break. The restored session holds its newest requests' turns, as the live proxy kept them."""
    from tokview.proxy.sessions import restore_sessions

    t0, t1 = SYSTEM + [1], SYSTEM + [1, 2, 3]
    for session in ("proxy:old:s1", "session:H"):
        db = _stored(
            [
                (session, 0, "proxy:old:1", t0, [2], 0),
                (session, 1, "proxy:old:2", t1, [4], 0),
                (session, 2, "proxy:old:3", [*t1, 4, 90], [91], 0),  # the side request (a title)
            ]
        )
        book = SessionBook("new")
        assert restore_sessions(book, db) == 3
        named = {"named": "H"} if session == "session:H" else {}
        turn = book.place([*t1, 4, 5], None, named=named.get("named"))  # the main loop's turn 2
        assert (turn.session_id, turn.turn, turn.parent_sample, turn.by_name_only) == (session, 2, "proxy:old:2", False)


def test_a_restart_keeps_every_choice_of_an_n_request_and_only_its_newest_requests() -> None:
    from tokview.proxy.sessions import RESTORED_TURNS, restore_sessions

    prompts = [SYSTEM + list(range(1, 2 * k + 2)) for k in range(RESTORED_TURNS + 2)]
    rows = [("proxy:old:s1", k, f"proxy:old:{k}", p, [2 * k + 2], 0) for k, p in enumerate(prompts)]
    last = prompts[-1]
    rows.append(("proxy:old:s1", len(prompts) - 1, "proxy:old:choice1", last, [77], 1))  # choice 1 of the last request
    book = SessionBook("new")
    assert (
        restore_sessions(book, _stored(rows)) == RESTORED_TURNS + 1
    )  # the newest 4 requests, the last one's 2 choices
    kept = book.place([*last, 2 * len(prompts), 9], None)  # goes on from choice 0, not the newer choice 1
    assert (kept.turn, kept.parent_sample, kept.joined_by) == (len(prompts), f"proxy:old:{len(prompts) - 1}", "prefix")
    other = book.place([*last, 77, 9], None)
    assert (other.turn, other.parent_sample) == (len(prompts), "proxy:old:choice1")
    assert book.place(prompts[0] + [2, 9], None).joined_by == "new"  # turn 0's request was not among the newest


def test_twin_rollouts_restored_each_go_on_in_their_own_session() -> None:
    """Two unnamed rollouts with the same ids, three turns each: restored, each next turn goes on in its own session
    (the turns a restored turn continues are marked continued, as they were live)."""
    from tokview.proxy.sessions import restore_sessions

    t0, t1 = SYSTEM + [1], SYSTEM + [1, 2, 3]
    rows = []
    for s in ("s1", "s2"):
        rows += [
            (f"proxy:old:{s}", 0, f"proxy:old:{s}0", t0, [2], 0),
            (f"proxy:old:{s}", 1, f"proxy:old:{s}1", t1, [4], 0),
        ]
    book = SessionBook("new")
    assert restore_sessions(book, _stored(rows)) == 4
    placed = []
    for _ in range(2):
        turn = book.place([*t1, 4, 5], None)
        book.add(turn, f"next-{turn.session_id}", prompt_ids=[*t1, 4, 5], output_ids=[6], messages=None, answer=None)
        placed.append((turn.session_id, turn.turn))
    assert sorted(placed) == [("proxy:old:s1", 2), ("proxy:old:s2", 2)]
    # s2's rollout had only its turn 0 when the proxy stopped: its turn 1 goes on there, not from s1's turn 0,
    # which s1's turn 1 continued already
    rows = [rows[0], rows[1], ("proxy:old:s2", 0, "proxy:old:s20", t0, [2], 0)]
    book = SessionBook("new")
    assert restore_sessions(book, _stored(rows)) == 3
    assert book.place([*t0, 2, 3], None).session_id == "proxy:old:s2"


def test_twin_rollouts_restored_go_on_in_their_own_session_when_one_re_rendered_its_history() -> None:
    """Rollouts B (s1) and A (s2) share turn 0; A's turn 1 re-rendered its history (joined by messages). Restored,
    A's turn 0 was not marked continued (only a turn whose ids extend it was), so B's own turn 1 went into A's session
    as a second turn 1; live it goes to B's."""
    from tokview.proxy.sessions import assistant_message, restore_sessions

    first = [{"role": "user", "content": "task"}]
    second = [*first, assistant_message("x", None), {"role": "user", "content": "next"}]
    t0, t1 = SYSTEM + [1], SYSTEM + [1, 7, 7, 3]  # turn 1's ids do not extend turn 0's prompt + output
    rows = [
        ("proxy:old:s1", 0, "proxy:old:B0", t0, [2], 0),
        ("proxy:old:s2", 0, "proxy:old:A0", t0, [2], 0),
        ("proxy:old:s2", 1, "proxy:old:A1", t1, [4], 0),
    ]
    book = SessionBook("new")
    assert (
        restore_sessions(book, _stored(rows, {"proxy:old:B0": first, "proxy:old:A0": first, "proxy:old:A1": second}))
        == 3
    )
    turn = book.place(t1, second)
    assert (turn.session_id, turn.turn, turn.joined_by, turn.parent_sample) == (
        "proxy:old:s1",
        1,
        "messages",
        "proxy:old:B0",
    )


def test_a_list_s_prompts_beside_each_other_keep_their_own_break_whatever_their_order() -> None:
    """A /v1/completions list in a named session: a prompt that extends no kept turn sits beside the first prompt,
    and is flagged where its ids leave the parent it is placed after, as it is when it comes first (placed beside
    the first prompt without a look at its ids, it lost its finding by being second)."""
    first, out, other = [1, 2, 3, 4], [5], [7, 7, 7]
    extends = [*first, *out, 400]
    for prompts in ([other, extends], [extends, other]):
        book = SessionBook("r")
        turn0 = book.place(first, None, named="s")
        book.add(turn0, "s0", prompt_ids=first, output_ids=out, messages=None, answer=None)
        placed: dict[str, Turn] = {}
        beside: Turn | None = None
        for k, prompt in enumerate(prompts):
            turn = book.place(prompt, None, named="s", parallel_to=beside)
            book.add(turn, f"x{k}", prompt_ids=prompt, output_ids=out, messages=None, answer=None)
            beside = beside or turn
            placed["other" if prompt == other else "extends"] = turn
        assert (placed["extends"].turn, placed["extends"].break_at) == (1, None)
        assert (placed["other"].turn, placed["other"].parent_sample, placed["other"].break_at) == (1, "s0", 0)
        assert placed["other"].previous_id == 1


def test_unnamed_rollouts_of_a_first_prompt_whose_first_answer_was_empty_are_sessions_of_their_own() -> None:
    """The README's "the same first prompt sent twice without a name starts two sessions" held, except after an empty
    answer: every later rollout of that prompt was taken for a retry of it and filed into its session, turn 0."""
    book = SessionBook("r")
    empty = _turn(book, SYSTEM + [1, 2, 3], [])
    rollouts = [_turn(book, SYSTEM + [1, 2, 3], [4 + k]) for k in range(3)]
    assert len({empty.session_id, *(t.session_id for t in rollouts)}) == 4
    assert {t.turn for t in rollouts} == {0}
    named = _turn(book, SYSTEM + [1, 2, 3], [], named="a")  # a session the harness names: a retry is that turn
    again = book.place(SYSTEM + [1, 2, 3], None, named="a")
    assert (again.session_id, again.turn) == (named.session_id, 0)


def test_a_later_turn_retried_past_the_kept_requests_stays_that_turn_of_its_session() -> None:
    """Seven empty answers to turn 1 (a harness retrying): each kept request evicts an older one, and once turn 0 was
    gone the retries and the rest of the conversation started new sessions."""
    book = SessionBook("r")
    first = _turn(book, SYSTEM + [1, 2], [3, 4])
    retries = [_turn(book, SYSTEM + [1, 2, 3, 4, 5], []) for _ in range(7)]
    answered = _turn(book, SYSTEM + [1, 2, 3, 4, 5], [6, 7])
    after = _turn(book, SYSTEM + [1, 2, 3, 4, 5, 6, 7, 8], [9])
    assert {(t.session_id, t.turn) for t in [*retries, answered]} == {(first.session_id, 1)}
    assert (after.session_id, after.turn) == (first.session_id, 2)


@pytest.mark.parametrize("named", [None, "job-1"])
def test_the_main_loops_turn_outlives_the_sub_agents_forked_from_it(named) -> None:
    """Five sub-agents, each forked from the main loop's turn 1 (its conversation plus an instruction) and running four
    turns: with four requests kept per session, the main loop's turn was gone when it came back, and its next turn
    started a session of its own (unnamed) or was flagged as a rewritten history against a sub-agent's turn."""
    book = SessionBook("r")
    names = {"named": named} if named else {}
    main0 = _turn(book, SYSTEM + [1], [2], **names)
    main1 = _turn(book, SYSTEM + [1, 2, 3], [4], **names)
    forks = {k: SYSTEM + [1, 2, 3, 4, 100 + k] for k in range(5)}
    for step in range(4):
        for k in range(5):  # interleaved, as parallel sub-agents' requests come
            out = [200 + 10 * k + step]
            turn = _turn(book, forks[k], out, **names)
            assert turn.session_id == main0.session_id and turn.break_at is None
            forks[k] = forks[k] + out + [300 + step]
    back = book.place(SYSTEM + [1, 2, 3, 4, 5], None, named=named)
    assert (back.session_id, back.turn, back.break_at, back.by_name_only) == (main1.session_id, 2, None, False)


def test_a_restart_goes_on_from_the_highest_turn_whatever_the_clock_said() -> None:
    """The times are local wall-clock times: turns recorded after a daylight-saving fall-back (or a clock stepped back,
    or a restart under another TZ) were stamped an hour before the turns they followed, the restart took the older
    turns for the newest, and the next request was numbered as a turn the session already had."""
    from tokview.proxy.sessions import restore_sessions

    prompts = [SYSTEM + list(range(1, 2 * k + 2)) for k in range(8)]
    rows = [("proxy:old:s1", k, f"proxy:old:{k}", p, [2 * k + 2], 0) for k, p in enumerate(prompts)]
    seconds = [3600 + k for k in range(6)] + [k for k in range(6, 8)]  # turns 6-7 an hour "before" turns 0-5
    book = SessionBook("new")
    restore_sessions(book, _stored(rows, seconds=seconds))
    turn = book.place([*prompts[-1], 16, 9], None)
    assert (turn.session_id, turn.turn, turn.parent_sample) == ("proxy:old:s1", 8, "proxy:old:7")


@pytest.mark.parametrize("session", ["proxy:old:s1", "session:H"])
def test_a_restart_keeps_the_main_loops_newest_turn_when_a_sub_agents_turns_are_numbered_past_it(session) -> None:
    """A sub-agent forked from turn 1 runs turns 2-7; the main loop's next turn is turn 2 again. Restoring by highest
    turn alone read back the sub-agent's last four: the main loop's turn 3 started a session of its own (unnamed) or
    was flagged as a rewritten history against the sub-agent (named)."""
    from tokview.proxy.sessions import restore_sessions

    main = [SYSTEM + [1], SYSTEM + [1, 2, 3]]
    rows = [(session, 0, "proxy:old:m0", main[0], [2], 0), (session, 1, "proxy:old:m1", main[1], [4], 0)]
    sub = SYSTEM + [1, 2, 3, 4, 50]
    for k in range(6):
        rows.append((session, 2 + k, f"proxy:old:sub{k}", sub, [60 + k], 0))
        sub = sub + [60 + k, 70 + k]
    main2 = SYSTEM + [1, 2, 3, 4, 5]
    rows.append((session, 2, "proxy:old:m2", main2, [6], 0))
    book = SessionBook("new")
    restore_sessions(book, _stored(rows))
    named = session.removeprefix("session:") if session.startswith("session:") else None
    turn = book.place([*main2, 6, 7], None, named=named)
    assert (turn.session_id, turn.turn, turn.parent_sample, turn.break_at) == (session, 3, "proxy:old:m2", None)


def test_a_named_session_s_retry_of_a_turn_that_broke_the_prefix_breaks_it_too() -> None:
    """A harness that reruns a task under the same session name: the second run's turn 1 is the first run's turn 1
    again (a retry), and its ids leave the turn before where the first run's did. Its break went unflagged: the
    same turn flagged in one run and not in the other."""
    book = SessionBook("r")
    history = [{"role": "user", "content": "a"}]
    answer = [*history, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
    for run in range(2):
        first = _turn(book, SYSTEM + [1], [2, 3], history, named="agent")
        second = _turn(book, SYSTEM + [1, 2, 9, 4], [5], answer, named="agent")  # the answer re-rendered: 3 is 9
        assert (first.turn, second.turn) == (0, 1), run
        assert (second.break_at, second.previous_id, second.joined_by) == (len(SYSTEM) + 2, 3, "header"), run


def test_a_retry_of_a_restored_turn_that_broke_the_prefix_breaks_it_too() -> None:
    """A restarted proxy restores its turns without how they were placed: the retry of one that broke the prefix
    went unflagged again. It is compared with the turn before it."""
    book = SessionBook("r")
    for turn, prompt, output in ((0, SYSTEM + [1], [2, 3]), (1, SYSTEM + [1, 2, 9, 4], [5])):
        book.add(
            Turn("session:agent", turn, "restored"),
            f"old-{turn}",
            prompt_ids=prompt,
            output_ids=output,
            messages=None,
            answer=None,
        )
    retry = book.place(SYSTEM + [1, 2, 9, 4], None, named="agent")
    assert (retry.turn, retry.break_at, retry.previous_id) == (1, len(SYSTEM) + 2, 3)


@pytest.mark.parametrize("named", [None, "agent-1"])
def test_a_break_inside_the_previous_turns_output_is_the_next_turn_with_the_break(named) -> None:
    """SGLang numbers a Kimi call id from 0 again each turn: the first tool round's history matches, the second's
    differs inside turn 1's output, so turn 2's ids extend turn 0's prompt + output and no further. It was placed
    after turn 0 (a second "turn 1", a branch) without `session_prefix_break`; its messages continue turn 1."""
    book = SessionBook("r")
    names = {"named": named} if named else {}
    call = {"role": "assistant", "content": "", "tool_calls": [{"id": "functions.f:0", "type": "function"}]}
    m0 = [{"role": "user", "content": "add 2 and 3, then double it"}]
    p0, o0 = SYSTEM + [1, 2], [3, 4, 5]
    first = book.place(p0, m0, **names)
    book.add(first, "t0", prompt_ids=p0, output_ids=o0, messages=m0, answer=call)
    m1 = [*m0, call, {"role": "tool", "tool_call_id": "functions.f:0", "content": "5"}]
    p1, o1 = [*p0, *o0, 6, 7], [8, 9, 10]
    second = book.place(p1, m1, **names)
    assert (second.turn, second.break_at) == (1, None)
    book.add(second, "t1", prompt_ids=p1, output_ids=o1, messages=m1, answer=call)
    m2 = [*m1, call, {"role": "tool", "tool_call_id": "functions.f:0", "content": "10"}]
    p2 = [*p1, 8, 99, 10, 11]  # the history renders turn 1's call id otherwise: ids differ inside its output
    third = book.place(p2, m2, **names)
    assert (third.session_id, third.turn, third.parent_sample) == (first.session_id, 2, "t1")
    assert third.break_at == len(p1) + 1 and third.previous_id == 9
    branch = [*p0, *o0, 60]  # a harness that really branches from turn 0 (its messages continue turn 0): a branch
    beside = book.place(
        branch, [*m0, call, {"role": "tool", "tool_call_id": "functions.f:0", "content": "other"}], **names
    )
    assert (beside.turn, beside.parent_sample, beside.break_at) == (1, "t0", None)


@pytest.mark.parametrize("named", [None, "agent"])
def test_twin_lines_each_go_on_from_their_own_turn_across_a_break_in_its_output(named) -> None:
    """Two lines with the same visible answers (one task run twice, or two choices continued): their messages match,
    their ids do not. A re-rendered turn 2 of line A went after line B's turn 1 (its messages' newest match), its
    break put inside turn 0's output; unnamed, in another session, it fell back to a branch without the break."""
    book = SessionBook("r")
    names = {"named": named} if named else {}
    call = {"role": "assistant", "content": "", "tool_calls": [{"id": "functions.f:0", "type": "function"}]}
    m0 = [{"role": "user", "content": "add 2 and 3, then double it"}]
    m1 = [*m0, call, {"role": "tool", "tool_call_id": "functions.f:0", "content": "5"}]
    m2 = [*m1, call, {"role": "tool", "tool_call_id": "functions.f:0", "content": "10"}]
    p0 = SYSTEM + [1, 2]
    lines = {"A": [3, 4, 5], "B": [3, 44, 5]}
    first = {}
    for name, out in lines.items():
        turn = book.place(p0, m0, **names)
        first[name] = turn
        book.add(turn, f"{name}0", prompt_ids=p0, output_ids=out, messages=m0, answer=call)
    for name, out in lines.items():
        p1 = [*p0, *out, 6, 7]
        turn = book.place(p1, m1, **names)
        assert (turn.turn, turn.parent_sample) == (1, f"{name}0")
        book.add(turn, f"{name}1", prompt_ids=p1, output_ids=[8, 9, 10], messages=m1, answer=call)
    for name, out in lines.items():
        p1 = [*p0, *out, 6, 7]
        third = book.place([*p1, 8, 99, 10, 11], m2, **names)
        assert (third.session_id, third.turn, third.parent_sample) == (first[name].session_id, 2, f"{name}1")
        assert third.break_at == len(p1) + 1 and third.previous_id == 9


@pytest.mark.parametrize("parts", [False, True])
@pytest.mark.parametrize("names", [{}, {"named": "agent"}])
def test_a_harness_that_strips_the_answer_goes_on_from_that_answer_with_the_break(names, parts) -> None:
    """Harnesses `.strip()` the answer before it goes back in the history (some as text parts): its messages matched no
    turn's messages plus answer, so the next request went after an older turn (two turns 2) or, unnamed, started a conversation of its own
    with no break said."""
    book = SessionBook("r")
    history: list[dict[str, Any]] = [{"role": "user", "content": "task"}]
    prompt, turns = SYSTEM + [1], []
    for k in range(3):
        turn = book.place(prompt, history, **names)
        output = [50 + k, 60 + k]
        answer = {"role": "assistant", "content": f"\n\nstep {k}\n"}
        book.add(turn, f"t{k}", prompt_ids=prompt, output_ids=output, messages=history, answer=answer)
        turns.append(turn)
        sent_back: Any = [{"type": "text", "text": f"step {k}"}] if parts else f"step {k}"  # or as text parts
        history = [*history, {"role": "assistant", "content": sent_back}, {"role": "user", "content": f"go {k}"}]
        prompt = prompt + [7, 8, 9, 10 + k]  # the stripped answer renders as other ids than the output
    assert len({t.session_id for t in turns}) == 1
    assert [t.turn for t in turns] == [0, 1, 2]
    assert [t.break_at for t in turns[1:]] == [len(SYSTEM) + 1, len(SYSTEM) + 5], "the break said where"


def test_arguments_sent_as_an_object_are_compared_as_their_json_is() -> None:
    """A harness that sends a call's arguments as an object (off the spec, and taken) with `1.0` for the served `1`
    started a new session; as text it joined."""
    from tokview.proxy.sessions import _message_text

    served = {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": '{"n": 1, "cmd": "ls"}'}}]}
    sent = {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {"cmd": "ls", "n": 1.0}}}]}
    assert _message_text(sent) == _message_text(served)


def test_a_users_unrelated_conversation_starts_a_session_of_its_own_and_each_goes_on_in_its_own() -> None:
    """`user` is the end user: one value for each of that user's conversations. A second task joined the first as its
    turn 3, with a prefix break that said the harness had re-rendered the history."""
    book = SessionBook("r")
    task_1 = [{"role": "user", "content": "first task"}]
    task_2 = [{"role": "user", "content": "second, unrelated task"}]
    a0 = _turn(book, SYSTEM + [1], [2], task_1, user="carol")
    b0 = _turn(book, SYSTEM + [9], [8], task_2, user="carol")
    a1 = _turn(book, SYSTEM + [1, 2, 3], [4], task_1, user="carol")
    b1 = _turn(book, SYSTEM + [9, 8, 7], [6], task_2, user="carol")
    c0 = _turn(book, SYSTEM + [5], [5], [{"role": "user", "content": "third"}], user="carol")
    assert (a0.session_id, a0.turn, a0.break_at) == ("user:carol", 0, None)
    assert (b0.session_id, b0.turn, b0.break_at) == ("user:carol/2", 0, None)
    assert (a1.session_id, a1.turn, a1.break_at) == ("user:carol", 1, None)
    assert (b1.session_id, b1.turn, b1.break_at) == ("user:carol/2", 1, None)
    assert (c0.session_id, c0.turn) == ("user:carol/3", 0)
    assert _turn(book, SYSTEM + [1], [2], task_1, user="dave").session_id == "user:dave"  # users apart as before
    named = [_turn(book, SYSTEM + p, [2], None, named="agent") for p in ([1], [9])]
    assert [t.session_id for t in named] == ["session:agent"] * 2  # a header names one session, whatever comes
    assert named[1].break_at is not None


def test_a_users_conversations_number_on_past_one_a_restart_did_not_restore() -> None:
    """Only `user:alice/3` restored: its next turn went to `user:alice` as a second turn 0, and a new conversation of
    alice's would have taken that id too."""
    book = SessionBook("r")
    tasks = [[{"role": "user", "content": f"task {k}"}] for k in range(4)]
    for k in range(3):
        _turn(book, SYSTEM + [k + 1], [50 + k], tasks[k], user="alice")
    del book._sessions["user:alice"], book._sessions["user:alice/2"]  # not restored
    again = _turn(book, SYSTEM + [3, 52, 9], [1], tasks[2], user="alice")
    fresh = _turn(book, SYSTEM + [7], [1], tasks[3], user="alice")
    assert (again.session_id, again.turn) == ("user:alice/3", 1)
    assert (fresh.session_id, fresh.turn) == ("user:alice/4", 0)


def test_a_user_name_that_looks_numbered_never_breaks_or_stalls_another_users_placement() -> None:
    """`alice/²` made every request of alice raise (`"²".isdigit()`, then `int`), and `alice/3000000` built a list of
    three million candidate conversations at her next request."""
    import time

    book = SessionBook("r")
    _turn(book, SYSTEM + [1], [2], [{"role": "user", "content": "x"}], user="alice/²")
    _turn(book, SYSTEM + [3], [4], [{"role": "user", "content": "y"}], user="alice/3000000")
    began = time.monotonic()
    first = _turn(book, SYSTEM + [5], [6], [{"role": "user", "content": "z"}], user="alice")
    assert time.monotonic() - began < 0.5
    assert first.session_id == "user:alice/3000001"  # numbered past the highest seen: never a name another has


def test_a_next_turn_whose_ids_extend_its_turn_stays_there_whatever_its_messages_say() -> None:
    """A harness that sends the reasoning back inside the content (the template splits it out again: the same ids)
    holds no message key of the turn it continues: the turn before it matched by messages, and the request was filed
    as a branch of that one, with a break where the ids do not differ."""
    book = SessionBook("r")
    m0 = [{"role": "user", "content": "task"}]
    call = {"id": "c0", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    a0 = {"role": "assistant", "content": "", "tool_calls": [call]}
    t0 = book.place(SYSTEM + [1], m0)
    book.add(t0, "x0", prompt_ids=SYSTEM + [1], output_ids=[2, 3], messages=m0, answer=a0)
    m1 = [*m0, a0, {"role": "tool", "tool_call_id": "c0", "content": "f"}]
    a1 = {"role": "assistant", "content": "done", "reasoning_content": "think"}
    t1 = book.place(SYSTEM + [1, 2, 3, 4], m1)
    book.add(t1, "x1", prompt_ids=SYSTEM + [1, 2, 3, 4], output_ids=[5, 6, 7], messages=m1, answer=a1)
    m2 = [*m1, {"role": "assistant", "content": "<think>think</think>done"}, {"role": "user", "content": "more"}]
    t2 = book.place(SYSTEM + [1, 2, 3, 4, 5, 6, 7, 8], m2)
    assert (t2.session_id, t2.turn, t2.joined_by, t2.parent_sample, t2.break_at) == (
        t0.session_id,
        2,
        "prefix",
        "x1",
        None,
    )


def test_a_users_conversation_the_proxy_forgot_is_not_where_the_users_next_task_goes() -> None:
    """Past MAX_SESSIONS the proxy forgets the least recent sessions: an unrelated task of a user whose newest
    conversation was forgotten went on "by its name" as that conversation's next turns (`user:bob/3` turns 2, 3),
    where a request that continues none of the user's kept turns starts a conversation of its own."""
    book = SessionBook("r", max_sessions=3)
    first = _turn(book, SYSTEM + [1], [2], [{"role": "user", "content": "task one"}], user="bob")
    for k in range(4):  # other sessions push bob's out
        _turn(book, SYSTEM + [60 + k], [2])
    assert "user:bob" not in book._sessions
    task = [{"role": "user", "content": "task four"}]
    four = _turn(book, SYSTEM + [7], [8], task, user="bob")
    nxt = _turn(book, SYSTEM + [7, 8, 9], [1], task, user="bob")
    assert first.session_id == "user:bob"
    assert (four.session_id, four.turn, four.break_at) == ("user:bob/2", 0, None)
    assert (nxt.session_id, nxt.turn, nxt.break_at) == ("user:bob/2", 1, None)


def test_a_users_stored_conversation_a_restart_did_not_restore_is_never_numbered_again() -> None:
    """A store of more sessions than a proxy restores: `user:alice` was not among them, so alice's next, unrelated
    conversation became `user:alice` turn 0 again (two turns 0 of two tasks under one session id)."""
    from tokview.proxy.sessions import restore_sessions

    db = _stored(
        [("user:alice", 0, "proxy:old:1", SYSTEM + [1], [2], 0)]
        + [(f"proxy:old:s{k}", 0, f"proxy:old:{k + 2}", SYSTEM + [50 + k], [2], 0) for k in range(3)]
    )
    book = SessionBook("new", max_sessions=2)  # restores the two most recent sessions only
    restore_sessions(book, db)
    assert "user:alice" not in book._sessions
    fresh = _turn(book, SYSTEM + [9], [3], [{"role": "user", "content": "another task"}], user="alice")
    carol = _turn(book, SYSTEM + [9], [3], [{"role": "user", "content": "another task"}], user="carol")
    assert (fresh.session_id, fresh.turn) == ("user:alice/2", 0)
    assert (carol.session_id, carol.turn) == ("user:carol", 0)  # a user the store never saw: her first


def test_a_user_whose_name_ends_in_a_number_goes_on_in_their_conversation() -> None:
    """`user: "team/3"` is the session `user:team/3`, read as `user:team`'s third conversation: the user was never
    noted as one seen, so each of their requests began their first conversation again (turn 0, three times)."""
    book = SessionBook("r")
    task = [{"role": "user", "content": "task"}]
    turns = [
        _turn(book, SYSTEM + [1], [3], task, user="team/3"),
        _turn(book, SYSTEM + [1, 3, 5], [6], task, user="team/3"),
    ]
    assert [(t.session_id, t.turn) for t in turns] == [("user:team/3", 0), ("user:team/3", 1)]
