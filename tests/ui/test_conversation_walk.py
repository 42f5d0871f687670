"""A conversation is visible from inspect as a chain: w / W walk its turns (the samples of one prompt and
generation across `turn`, in order), saying which turn of how many and whether its history was served or the
file's."""

from __future__ import annotations

from builders import make_capture, put
from ui.helpers import settle

from tokview.store.conversation_turns import Turn, conversation_turns, turn_place


def _conversation(store, prompt_id: str, served: bool) -> list[str]:
    """Three turns of one conversation; a served chain records `settings.chain` (turn 2's prompt breaks)."""
    ids: list[str] = []
    for turn in range(3):
        capture = make_capture(f"question {turn}")
        if served:
            capture.settings["chain"] = {
                "conversation": prompt_id,
                "turn": turn,
                "history": "served",
                "parent": ids[-1] if ids else None,
                "extends": None if turn == 0 else turn == 1,
                "break_at": 17 if turn == 2 else None,
            }
        ids.append(put(store, prompt_id, capture, run_id="chains", turn=turn))
    put(store, prompt_id, make_capture("another generation"), run_id="chains", index=1, turn=1)
    return ids


def test_the_turns_of_a_conversation_in_order(store):
    served = _conversation(store, "conv-s", served=True)
    file = _conversation(store, "conv-f", served=False)
    turns = conversation_turns(store, served[1])
    assert [t.sample_id for t in turns] == served  # not the other generation's turn, not conv-f
    assert [t.history for t in turns] == ["served"] * 3
    assert [(t.extends, t.break_at) for t in turns] == [(None, None), (True, None), (False, 17)]
    assert [t.history for t in conversation_turns(store, file[0])] == ["file"] * 3
    assert conversation_turns(store, "p001@demo_gen0") == []  # a sample with no turns


def test_the_walk_counts_turns_not_samples():
    """A proxy session's `n` = 2 request at turn 1 is two samples at one turn: the third turn is "turn 3 of 3"."""
    turns = [Turn("a", 0, "served"), Turn("b0", 1, "served"), Turn("b1", 1, "served"), Turn("c", 2, "served")]
    assert turn_place(turns, turns[0]) == "turn 1 of 3 (#turn0)"  # and the turn the ids carry (`x#turn0_gen0`)
    assert turn_place(turns, turns[2]) == "turn 2 of 3 (#turn1) (sample 2 of 2 at this turn)"
    assert turn_place(turns, turns[3]) == "turn 3 of 3 (#turn2)"


async def test_w_and_shift_w_walk_the_turns_from_inspect(make_app, store):
    served = _conversation(store, "conv-s", served=True)
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        app.open_sample(served[0])
        await settle(app, pilot)
        assert app.screen.data.sample_id == served[0]
        for expected in (served[1], served[2], served[2]):  # the last turn stays
            await pilot.press("w")
            await settle(app, pilot)
            assert app.screen.data.sample_id == expected
        messages = [str(n.message) for n in app._notifications]
        assert any("turn 3 of 3 (#turn2)" in m and "served history" in m and "breaks at 17" in m for m in messages), (
            messages
        )
        assert any("last turn" in m for m in messages), messages
        assert "#turn2 · served history" in str(app.screen.query_one("#inspect-title").render())
        await pilot.press("W")
        await settle(app, pilot)
        assert app.screen.data.sample_id == served[1]
        for _ in range(2):  # back to the first turn, and once more: said to be the first (it said "the last")
            await pilot.press("W")
            await settle(app, pilot)
        assert app.screen.data.sample_id == served[0]
        said = [str(n.message) for n in app._notifications]
        assert "the first turn of the conversation" in said, said


async def test_w_on_a_file_history_turn_and_on_a_single_sample(make_app, store):
    file = _conversation(store, "conv-f", served=False)
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        app.open_sample(file[1])
        await settle(app, pilot)
        await pilot.press("w")
        await settle(app, pilot)
        assert app.screen.data.sample_id == file[2]
        assert any("turn 3 of 3" in str(n.message) and "file history" in str(n.message) for n in app._notifications)
        app.open_sample("p001@demo_gen0")
        await settle(app, pilot)
        await pilot.press("w")
        await settle(app, pilot)
        assert app.screen.data.sample_id == "p001@demo_gen0"
        assert any("not a turn of a conversation" in str(n.message) for n in app._notifications)
