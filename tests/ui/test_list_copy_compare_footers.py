"""The samples list copies an id (c) and compares two samples (d); every dialog shows its own keys in a
footer."""

from __future__ import annotations

import pytest
from ui.helpers import settle

from tokview.core.analysis import analyze
from tokview.ui.bindings import KEYS
from tokview.ui.examples import short_capture


async def _list(app, pilot):
    await settle(app, pilot)
    return app.screen.query_one("SampleList")


async def test_c_on_the_list_copies_the_sample_id_under_the_cursor(make_app):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        sample_list = await _list(app, pilot)
        await pilot.press("down", "c")
        assert app.clipboard == sample_list.row(1).sample_id


async def test_d_on_the_list_compares_the_two_marked_samples(make_app):
    from tokview.ui.screens.compare import CompareScreen

    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        sample_list = await _list(app, pilot)
        first, third = sample_list.row(0).sample_id, sample_list.row(2).sample_id
        await pilot.press("space", "down", "space", "d")  # marks rows 0 and 2
        await settle(app, pilot)
        assert isinstance(app.screen, CompareScreen)
        assert app.screen.ids == (first, third)
        await pilot.press("escape")
        assert app.screen.__class__.__name__ == "SamplesScreen"


async def test_d_on_the_list_without_two_marks_compares_with_the_prompts_other_run(make_app, store, profile, tokenizer):
    from tokview.ui.screens.compare import CompareScreen

    capture = short_capture()
    store.put_sample("p000@run-c", "p000", "run-c", capture, analyze(capture, profile, tokenizer))
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        sample_list = await _list(app, pilot)
        here = sample_list.row(0).sample_id
        assert here == "p000@demo_gen0"
        await pilot.press("d")
        await settle(app, pilot)
        assert isinstance(app.screen, CompareScreen)
        assert app.screen.ids == (here, "p000@run-c")


async def test_d_on_the_list_without_a_sibling_says_so(make_app):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await _list(app, pilot)
        await pilot.press("d")
        await settle(app, pilot)
        assert app.screen.__class__.__name__ == "SamplesScreen"
        assert any("no other sample" in str(n.message) for n in app._notifications)


DIALOGS = {
    "r": "reject dialog",
    "n": "note / tag prompt",
    "t": "note / tag prompt",
    "U": "undo list",
    "E": "export dialog",
}


@pytest.mark.parametrize("key", sorted(DIALOGS))
async def test_every_dialog_shows_its_own_keys_in_its_footer(key, make_app, store):
    from textual.widgets._footer import FooterKey

    store.record_verdict("p001@demo_gen0", "approved")  # something for the undo list
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await _list(app, pilot)
        await pilot.press(key)
        await settle(app, pilot)
        dialog = app.screen
        assert dialog.is_modal, key
        shown = {footer_key.action for footer_key in dialog.query(FooterKey)}
        wanted = {k.action for k in KEYS if k.group == DIALOGS[key] and k.footer}
        assert shown == wanted, key


async def test_the_confirm_and_bulk_approve_dialogs_show_their_keys(make_app):
    from textual.widgets._footer import FooterKey

    from tokview.ui.screens.modals import BulkApprove, Confirm

    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await _list(app, pilot)
        for dialog, group in (
            (Confirm("sure?"), "confirm dialog"),
            (BulkApprove("approve?", "2 invalid"), "bulk approve dialog"),
        ):
            app.push_screen(dialog)
            await settle(app, pilot)
            shown = {footer_key.action for footer_key in dialog.query(FooterKey)}
            assert shown == {k.action for k in KEYS if k.group == group and k.footer}, group
            app.pop_screen()
            await settle(app, pilot)
