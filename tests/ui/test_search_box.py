"""`/` finds a prompt's words, a tag and a note, not only ids and the answer's text."""

from __future__ import annotations

from ui.helpers import settle

from tokview.ui import examples


async def test_slash_finds_prompt_text_a_tag_and_a_note(make_app, store, tokenizer, profile):
    from tokview.core.analysis import analyze

    capture = examples.short_capture()
    capture.messages = [{"role": "user", "content": "Why is the sky blue?"}]
    store.put_sample("colour@demo_gen0", "colour", "run-a", capture, analyze(capture, profile, tokenizer))
    store.add_note("p004@demo_gen0", "reasoning restarts", who="ann", tags=("loopy",))
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        lst = app.screen.sample_list
        for typed, wanted in (("sky", "colour@demo_gen0"), ("LOOPY", "p004@demo_gen0"), ("restarts", "p004@demo_gen0")):
            await pilot.press("slash", *typed)
            await settle(app, pilot)
            assert [lst.row(i).sample_id for i in range(lst.count)] == [wanted], typed
            await pilot.press("ctrl+a", "ctrl+k", "enter")  # clear the box, back to the list
            await settle(app, pilot)
        assert lst.count == 31
