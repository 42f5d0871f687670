"""A new prompt is matched against the sessions it could continue, not against every session that shares its
first ids (issue 24 item 5: with every conversation opening on one system prompt, placing a request cost
~0.15 µs per open session, 0.3 ms at 2,000, a tenth of the proxy recorder's CPU per stream)."""

from __future__ import annotations

from tokview.proxy.sessions import SessionBook

SYSTEM = list(range(1000, 1040))
"""The ids every conversation opens with (a shared system prompt: one index key for all sessions)."""


def _book(sessions: int, output: int = 200) -> SessionBook:
    book = SessionBook("r")
    for i in range(sessions):
        prompt = [*SYSTEM, 5, i]
        turn = book.place(prompt, None)
        book.add(turn, f"s{i}", prompt_ids=prompt, output_ids=[7] * output, messages=None, answer=None)
    return book


def test_a_new_conversation_among_2000_sessions_sharing_its_start_is_a_new_session() -> None:
    """Placed by a bisection past every kept turn longer than it: what that costs against placing it among 20 is
    measured in `benchmarks/bench_recorder.py` (x1.1 there; a comparison per open session was ~100x)."""
    many = _book(2000)
    assert many.place([*SYSTEM, 6, 6], None).joined_by == "new"
    assert many.place([*SYSTEM, 5, 1999] + [7] * 200 + [3], None).parent_sample == "s1999"


def test_a_continuation_still_joins_the_longest_session_it_extends_and_the_first_of_equals() -> None:
    book = _book(300)
    short = [*SYSTEM, 5, 7]  # session s7's prompt alone: a session of its own whose sequence is shorter
    turn = book.place(short, None)
    book.add(turn, "short", prompt_ids=short, output_ids=[], messages=None, answer=None)
    longer = [*SYSTEM, 5, 7] + [7] * 200 + [9, 9]
    placed = book.place(longer, None)
    assert (placed.joined_by, placed.parent_sample, placed.turn) == ("prefix", "s7", 1)
    twin = book.place([*SYSTEM, 5, 8], None)  # the same prompt and answer as s8: a second session, same sequence
    book.add(twin, "twin", prompt_ids=[*SYSTEM, 5, 8], output_ids=[7] * 200, messages=None, answer=None)
    assert book.place([*SYSTEM, 5, 8] + [7] * 200 + [1], None).parent_sample == "s8"


def test_a_conversation_of_short_completions_goes_on_in_one_session() -> None:
    """A `/v1/completions` harness whose first prompt and answer hold fewer ids than a key: its next turn (the
    prompt, the answer, two new ids) continued nothing, and every turn after the first started a session."""
    book = SessionBook("r")
    prompt: list[int] = [11, 12, 13]
    sessions, turns = set(), []
    for k in range(4):
        turn = book.place(prompt, None)
        book.add(turn, f"t{k}", prompt_ids=prompt, output_ids=[20 + k, 30 + k], messages=None, answer=None)
        sessions.add(turn.session_id)
        turns.append(turn.turn)
        prompt = [*prompt, 20 + k, 30 + k, 40 + k, 41 + k]
    assert len(sessions) == 1 and turns == [0, 1, 2, 3]


def test_a_short_turn_forgotten_for_room_is_no_longer_looked_up() -> None:
    book = SessionBook("r", max_sessions=1)
    for k in range(3):
        prompt = [100 + k]
        turn = book.place(prompt, None)
        book.add(turn, f"s{k}", prompt_ids=prompt, output_ids=[7, 7], messages=None, answer=None)
    assert book.place([100, 7, 7, 8], None).joined_by == "new"  # s0 was forgotten: nothing to continue
    assert book.place([102, 7, 7, 8], None).parent_sample == "s2"
    assert sum(book._short_keys.values()) == 1


def test_a_one_id_answer_to_a_short_prompt_is_no_start_for_every_prompt_that_opens_alike() -> None:
    """A warm-up (`"Hello"` answered `","`) became turn 0 of every later, unrelated prompt that opened with
    "Hello,": a head that short is continued only past an answer of SHORT_MIN_OUTPUT ids."""
    from tokview.proxy.sessions import SHORT_MIN_OUTPUT

    book = SessionBook("r")
    warm = book.place([1, 9], None)
    book.add(warm, "warm", prompt_ids=[1, 9], output_ids=[5], messages=None, answer=None)
    assert SHORT_MIN_OUTPUT == 2 and not book._short_keys
    assert book.place([1, 9, 5, 70, 71, 72], None).joined_by == "new"
