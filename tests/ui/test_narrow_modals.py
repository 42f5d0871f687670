"""The curation dialogs open at any terminal width (the reject dialog at widths 10–12 too)."""

from __future__ import annotations

import pytest
from ui.helpers import settle

from tokview.ui.screens.modals import RejectReason, TextPrompt


@pytest.mark.parametrize("width", [5, 10, 11, 12])
async def test_the_reject_and_note_dialogs_open_at_every_narrow_width(make_app, width):
    app = make_app()
    async with app.run_test(size=(width, 12)) as pilot:
        await settle(app, pilot)
        await pilot.press("r")
        await settle(app, pilot)
        assert isinstance(app.screen, RejectReason)
        await pilot.press("escape", "n")
        await settle(app, pilot)
        assert isinstance(app.screen, TextPrompt)
        await pilot.press("escape")
