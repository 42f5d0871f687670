"""What dialogs and panels say, as a curator reads it: an approve-anyway warning wraps instead of stopping at the
dialog's edge, a dialog's line of keys follows the keymap, the help title shows `[keymap]` (it was read as markup),
and a panel's own key is not offered on that panel's footer (`S` on stats did nothing)."""

from __future__ import annotations

from textual.widgets import Label
from ui.helpers import settle

from tokview.ui.config import UIConfig
from tokview.ui.screens.modals import BulkApprove, Confirm


def _text(widget: Label) -> str:
    return str(widget.render())


async def test_a_long_warning_wraps_inside_the_dialog(make_app):
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        detail = "error findings: think_close_missing, truncated. " + "A trainer would learn from it. " * 3
        app.push_screen(Confirm("Approve it although it is invalid?", detail))
        await pilot.pause()
        label = app.screen.query_one("#confirm-detail", Label)
        assert label.region.height >= 2  # wrapped, not one line cut at the edge
        assert label.region.width <= app.screen.query_one("#confirm").region.width


async def test_a_dialogs_keys_follow_the_keymap(make_app, store):
    app = make_app(UIConfig(keymap={"modal.confirm": "Y", "bulk.approve-valid": "V"}))
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(app, pilot)
        app.push_screen(Confirm("Approve it?", "why"))
        await pilot.pause()
        assert _text(app.screen.query_one(".modal-keys", Label)).startswith("Y yes")
        app.pop_screen()
        app.push_screen(BulkApprove("Approve 3?", "2 of them have error findings"))
        await pilot.pause()
        assert "V only the valid" in _text(app.screen.query_one(".modal-keys", Label))


async def test_the_help_title_names_the_keymap_table(make_app):
    app = make_app()
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("question_mark")
        await settle(app, pilot)
        assert "remap any of them by id in [keymap]" in _text(app.screen.query_one("#help-title", Label))


async def test_a_panels_own_key_is_not_on_its_footer(make_app):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("S")
        await settle(app, pilot)
        assert type(app.screen).__name__ == "StatsScreen"
        assert app.check_action("stats", ()) is False
        assert app.check_action("doctor", ()) is True
        await pilot.press("escape")
        await settle(app, pilot)
        assert app.check_action("stats", ()) is True


async def test_only_the_valid_is_not_offered_when_none_is_valid(make_app):
    """Offered with every marked sample invalid, "only the valid" approved none and took every mark away."""
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(app, pilot)
        answers: list[str | None] = []
        app.push_screen(BulkApprove("Approve 3?", "3 of them have error findings", any_valid=False), answers.append)
        await pilot.pause()
        assert "only the valid" not in _text(app.screen.query_one(".modal-keys", Label))
        await pilot.press("v")
        await pilot.pause()
        assert isinstance(app.screen, BulkApprove) and answers == []
        await pilot.press("escape")
        await pilot.pause()
        assert answers == [None]
