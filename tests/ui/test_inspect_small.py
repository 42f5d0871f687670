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
