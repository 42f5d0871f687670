"""The footer is made again only when the keys it shows change: every focus change in inspect (`s`, `f`) made it
twice for the same keys, ~0.1 s each, a third of a key press."""

from __future__ import annotations

from ui.helpers import settle

from tokview.ui.widgets.footer import KeysFooter


async def test_a_focus_change_with_the_same_keys_keeps_the_footer(make_app, monkeypatch):
    made: list[str] = []
    compose = KeysFooter.compose

    def counted(self):
        made.append(type(self.screen).__name__)
        return compose(self)

    monkeypatch.setattr(KeysFooter, "compose", counted)
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("enter")
        await settle(app, pilot)
        assert type(app.screen).__name__ == "InspectScreen"
        footer = app.screen.query_one(KeysFooter)
        shown = footer._shown_keys()
        made.clear()
        await pilot.press("s")  # the other pane: the same keys
        await settle(app, pilot)
        assert footer._shown_keys() == shown and made == []
        await pilot.press("escape")  # back to the list
        await settle(app, pilot)
        await pilot.press("S")  # another screen: its own keys, made for it
        await settle(app, pilot)
        assert "StatsScreen" in made
        keys = {child.action for child in app.screen.query_one(KeysFooter).children if hasattr(child, "action")}
        assert "back" in keys or "dismiss" in keys or "close" in keys, keys
