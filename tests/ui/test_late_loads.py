"""A sample load that ends after the user went on: it took over the generate panel (each `a` typed there approved the
sample), and of two samples opened one after the other the first could end on top. Only the latest sample asked for
is shown, and only over the screen it was asked from."""

from __future__ import annotations

import threading

from helpers import settle

from tokview.ui.screens.generate import GenerateScreen
from tokview.ui.screens.inspect import InspectScreen


def _hold_loads_of(app, sample_id: str) -> threading.Event:
    """Make loads of `sample_id` wait until the returned event is set (a long sample's load, made to last)."""
    release, load = threading.Event(), app.session.load

    def held(sid: str):
        if sid == sample_id:
            release.wait(10)
        return load(sid)

    app.session.load = held
    return release


async def test_a_load_that_ends_after_the_user_went_to_a_panel_is_dropped(make_app, store):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        release = _hold_loads_of(app, "p000@demo_gen0")
        app.open_sample("p000@demo_gen0")
        await pilot.press("g")
        await pilot.pause()
        assert isinstance(app.screen, GenerateScreen)
        release.set()
        await settle(app, pilot)
        assert isinstance(app.screen, GenerateScreen)
        assert not any(isinstance(s, InspectScreen) for s in app.screen_stack)


async def test_of_two_samples_opened_the_latest_is_shown(make_app, store):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        release = _hold_loads_of(app, "p000@demo_gen0")
        app.open_sample("p000@demo_gen0")
        await pilot.pause()
        app.open_sample("p001@demo_gen0")
        await settle(app, pilot)
        assert isinstance(app.screen, InspectScreen) and app.screen.data.sample_id == "p001@demo_gen0"
        release.set()
        await settle(app, pilot)
        assert isinstance(app.screen, InspectScreen) and app.screen.data.sample_id == "p001@demo_gen0"
        assert app.current_sample()[0] == "p001@demo_gen0"
        assert sum(isinstance(s, InspectScreen) for s in app.screen_stack) == 1


async def test_the_export_dialog_stays_until_its_export_has_ended(make_app, store, tmp_path, monkeypatch):
    """Esc while an export wrote closed the dialog: the export went on unseen (its summary, or its failure, never
    shown). The dialog now says it is still writing, and closes once it has ended."""
    from textual.widgets import Input

    import tokview.export
    from tokview.ui.screens.export_dialog import ExportDialog

    release, real = threading.Event(), tokview.export.export

    def held(*args, **kwargs):
        release.wait(10)
        return real(*args, **kwargs)

    monkeypatch.setattr(tokview.export, "export", held)
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("E")
        dialog = app.screen
        assert isinstance(dialog, ExportDialog)
        dialog.query_one("#export-path", Input).value = str(tmp_path / "out.jsonl")
        await pilot.press("ctrl+s")
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is dialog
        assert "still writing" in str(dialog.query_one("#export-summary").render())
        release.set()
        await settle(app, pilot)
        assert "exported" in str(dialog.query_one("#export-summary").render())
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is not dialog
