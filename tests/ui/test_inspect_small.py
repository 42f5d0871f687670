"""Inspect in a small terminal keeps some token rows and Quit on screen, down to 40x12."""

from __future__ import annotations

import pytest
from ui.helpers import settle


def _visible_footer_keys(app) -> set[str]:
    from textual.widgets._footer import FooterKey

    screen_region = app.screen.region
    shown = set()
    for key in app.screen.query(FooterKey):
        region = key.region
        if region.height and region.width and screen_region.contains_region(region):
            shown.add(key.action)
    return shown


@pytest.mark.parametrize("size", [(40, 12), (50, 15), (60, 18)], ids=["40x12", "50x15", "60x18"])
async def test_inspect_keeps_token_rows_and_quit_when_small(make_app, size):
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        await pilot.press("down", "enter")
        await settle(app, pilot)
        screen = app.screen
        assert screen.__class__.__name__ == "InspectScreen"
        for pane in (screen.served, screen.kept):
            assert pane.region.height >= 3, (pane.id, pane.region)  # some token rows, not only a label
        shown = _visible_footer_keys(app)
        assert {"app.quit", "app.help"} <= {f"app.{a}" for a in shown}, shown


@pytest.mark.parametrize("size", [(80, 24), (60, 18)], ids=["80x24", "60x18"])
async def test_inspect_opens_with_its_cursor_in_view_of_a_pane_the_layout_shrinks(tmp_path, tokenizer, profile, size):
    """Inspect scrolls to its cursor (where the output starts) while its panes are still being laid out; the layout
    then made them shorter and left the cursor below the last row shown (a long prompt's sample at 80x24)."""
    from builders import make_capture, put

    from tokview.store import Store
    from tokview.ui.app import TokviewApp
    from tokview.ui.session import Session

    history = []
    for k in range(6):
        history += [{"role": "user", "content": f"question {k} " * 12}, {"role": "assistant", "content": "fine " * 12}]
    with Store(tmp_path / "long.duckdb") as store:
        put(store, "long", make_capture(history=history))
        app = TokviewApp(Session(store, tokenizer=tokenizer, profile=profile, who="tester"))
        async with app.run_test(size=size) as pilot:
            await settle(app, pilot)
            await pilot.press("enter")
            await settle(app, pilot)
            await pilot.pause(0.1)
            view = app.screen.served
            row = view._rows_of_token(view.cursor) * view.rows_per_line
            top, height = int(view.scroll_offset.y), view.scrollable_content_region.height
            assert row >= height  # the cursor is past the first screenful: opening had to scroll
            assert top <= row < top + height, (row, top, height)


async def test_a_reader_who_scrolled_away_stays_there_when_a_note_shortens_the_pane(make_app):
    """Keeping the cursor in view on a height change pulled a reader who had scrolled elsewhere back to it when a note
    added a review line: only a cursor that was in view is followed."""
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("enter")
        await settle(app, pilot)
        await pilot.pause(0.1)
        view = app.screen.served
        row = view._rows_of_token(view.cursor) * view.rows_per_line
        height = view.scrollable_content_region.height
        elsewhere = 0 if row > height else max(0, view.virtual_size.height - height)
        assert elsewhere != view.scroll_offset.y  # the cursor is out of a view scrolled there
        view.scroll_to(y=elsewhere, animate=False)  # as a mouse wheel does
        await pilot.pause(0.1)
        await pilot.press("n", *"looked", "enter")
        await settle(app, pilot)
        await pilot.pause(0.1)
        assert view.scroll_offset.y == elsewhere


@pytest.mark.parametrize("size", [(80, 8), (20, 6)], ids=["80x8", "20x6"])
async def test_a_pane_lower_than_a_line_of_tokens_sits_still(make_app, monkeypatch, size):
    """ "pieces over ids" in a terminal 8 rows high: a token line is two rows, the pane one, and keeping the cursor in
    view scrolled to the line's first row, then its last, forever (a core busy while idle, each key ~5 s)."""
    from tokview.ui.widgets.token_view import TokenView

    scrolls: list[float] = []
    real = TokenView.scroll_to

    def counted(self, *args, **kwargs):
        scrolls.append(kwargs.get("y", -1))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(TokenView, "scroll_to", counted)
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        await pilot.press("enter")
        await settle(app, pilot)
        await pilot.press("v", "v")
        await pilot.pause(0.3)
        scrolls.clear()
        await pilot.pause(0.5)  # idle
        assert len(scrolls) <= 2, scrolls[:10]
