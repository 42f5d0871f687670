"""Stored and typed text is shown as text: never read as Textual markup ("[/INST]" typed in the search box, a tag
"[/x]", a reject reason, a run name crashed the app: "auto closing tag ('[/]') has nothing to close"), and its
control characters never reach the terminal raw (a reviewer's window-title escape ran as the inspect screen drew it).
"""

from __future__ import annotations

from textual.widgets import DataTable, OptionList, Static
from ui.helpers import settle

from tokview.ui.screens.inspect import InspectScreen
from tokview.ui.screens.modals import ActionsDialog, TagDialog
from tokview.ui.screens.samples import SamplesScreen

ESC_TITLE = "\x1b]0;PWNED\x07"


def _hostile(store) -> str:
    first = store.samples_page(limit=1)[0].sample_id
    store.add_note(first, f"note {ESC_TITLE}", tags=["[/x]", f"t{ESC_TITLE}"], who=f"w{ESC_TITLE}")
    store.record_verdict(first, "rejected", reason=f"[/INST] {ESC_TITLE}", who=f"w{ESC_TITLE}")
    return first


def _text(widget) -> str:
    return str(widget.render())


async def test_markup_like_and_control_text_is_shown_as_text_everywhere(make_app, store):
    _hostile(store)
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("t")
        await settle(app, pilot)
        assert isinstance(app.screen, TagDialog)
        options = app.screen.query_one(OptionList)
        shown = [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]
        assert any("[/x]" in s for s in shown) and any("\\x1b]0;PWNED\\x07" in s for s in shown), shown
        assert not any("\x1b" in s for s in shown)
        await pilot.press("escape")
        await pilot.press("U")
        await settle(app, pilot)
        assert isinstance(app.screen, ActionsDialog)
        await pilot.press("escape")
        await settle(app, pilot)
        await pilot.press("enter")
        await settle(app, pilot)
        assert isinstance(app.screen, InspectScreen)
        title = _text(app.screen.query_one("#inspect-title", Static))
        review = _text(app.screen.query_one("#inspect-review", Static))
        for text in (title, review):
            assert "\x1b" not in text and "\x07" not in text
        assert "\\x1b]0;PWNED\\x07" in review and "[/INST]" in review
        await pilot.press("escape")
        await settle(app, pilot)
        await pilot.press("/")
        for key in "[/INST]":
            await pilot.press(key)
        await pilot.press("enter")
        await settle(app, pilot)
        assert isinstance(app.screen, SamplesScreen)
        assert "[/INST]" in _text(app.screen.query_one("#samples-title", Static))
        assert app._exception is None


async def test_a_run_named_like_markup_is_listed_in_the_stats_table(make_app, store):
    store.query("SELECT 1")
    store._file.write([("UPDATE samples SET run_id = '[/x]'", []), ("UPDATE runs SET run_id = '[/x]'", [])])
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("S")
        await settle(app, pilot)
        table = app.screen.query_one("#stats-runs", DataTable)
        assert [str(table.get_row_at(i)[0]) for i in range(table.row_count)] == ["[/x]"]
        assert app._exception is None


async def test_a_sibling_id_and_a_session_named_like_markup_open(make_app, store, tokenizer, profile):
    """The compare screen's titles and a session's turns screen read their sample ids and session names as markup
    (an audited dataset's own row ids, a client's `user` field): `[/x]` in one crashed the app."""
    from ui.helpers import add_sibling

    from tokview.ui.screens.compare import CompareScreen

    sibling, _ = add_sibling(store, tokenizer, profile)
    store._file.write([("UPDATE samples SET sample_id = sample_id || '[/x]' WHERE sample_id = ?", [sibling])])
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        for key in ("down", "enter", "d"):
            await pilot.press(key)
            await settle(app, pilot)
        assert app._exception is None
        assert isinstance(app.screen, CompareScreen)
        assert "[/x]" in _text(app.screen.query_one("#compare-title", Static))


async def test_a_servers_finish_reason_is_shown_escaped(make_app, store):
    """A server's `finish_reason` is stored as sent: with an escape in it, the samples list, the inspect title and the
    stats panel wrote it to the terminal raw (a window title; OSC 52 writes the clipboard)."""
    store.query("SELECT 1")
    store._file.write([("UPDATE samples SET finish_reason = ?", [f"s{ESC_TITLE}"])])
    app = make_app()
    async with app.run_test(size=(160, 40)) as pilot:
        await settle(app, pilot)
        listed = app.export_screenshot()
        await pilot.press("enter")
        await settle(app, pilot)
        assert isinstance(app.screen, InspectScreen)
        title = _text(app.screen.query_one("#inspect-title", Static))
        await pilot.press("escape")
        await settle(app, pilot)
        await pilot.press("S")
        await settle(app, pilot)
        stats = app.export_screenshot()
        assert app._exception is None
    assert "\x1b" not in title and "finish=s\\x1b]0;PWNED\\x07" in title
    for screen in (listed, stats):
        assert "\x1b" not in screen and "\x07" not in screen
    assert "s\\x1b" in listed.replace("&#160;", " ")  # the list's column shows its start, escaped
