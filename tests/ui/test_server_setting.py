"""One server setting for generate and doctor, defaulting to the server the
store's latest run recorded; generate asks for a run name, and the run is stored under it."""

from __future__ import annotations

from textual.widgets import Input, Select, TextArea
from ui.helpers import settle

from tokview.sim import SimConfig, start_simulator
from tokview.ui.screens.doctor import DoctorScreen
from tokview.ui.screens.generate import GenerateScreen


async def test_generate_and_doctor_share_the_recorded_server_and_a_run_has_the_name_asked(make_app, store):
    with start_simulator(SimConfig(kind="vllm")) as sim:
        store.put_run("run-a", server_info=[{"url": sim.url, "kind": "vllm"}])
        app = make_app()  # no --server: the store's recorded one
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(app, pilot)
            await pilot.press("D")
            assert isinstance(app.screen, DoctorScreen)
            assert app.screen.query_one("#doctor-url", Input).value == sim.url
            await pilot.press("escape")
            await pilot.press("g")
            screen = app.screen
            assert isinstance(screen, GenerateScreen)
            assert screen.query_one("#server", Input).value == sim.url
            assert screen.query_one("#run-name", Input).placeholder.startswith("automatic")
            screen.query_one("#run-name", Input).value = "nightly-1"
            screen.query_one("#source", Select).value = "typed"
            screen.query_one("#typed", TextArea).text = "What is 2+2?"
            screen.query_one("#samples", Input).value = "1"
            screen.query_one("#max-tokens", Input).value = "16"
            await pilot.press("ctrl+s")
            await settle(app, pilot)
            assert screen.last_summary is not None
            assert screen.last_summary.ok == 1
            assert store.query("SELECT count(*) FROM samples WHERE run_id = 'nightly-1'")[0][0] == 1
            await pilot.press("escape")


async def test_a_server_typed_in_one_panel_is_the_other_panels(make_app):
    app = make_app(server_url="http://127.0.0.1:30000")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("g")
        app.screen.query_one("#server", Input).value = "http://127.0.0.1:9"
        app.screen.query_one("#samples", Input).value = "x"  # refused before a run starts: the server still counts
        await pilot.press("ctrl+s")
        await pilot.press("escape")
        await settle(app, pilot)
        await pilot.press("D")
        assert app.screen.query_one("#doctor-url", Input).value == "http://127.0.0.1:9"


async def test_at_80x24_the_generate_panel_shows_every_control(make_app):
    from textual.widgets import Button, Switch

    app = make_app(server_url="http://127.0.0.1:30000")
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        await pilot.press("g")
        await settle(app, pilot)
        form = app.screen.query_one("#generate-form")
        assert form.virtual_size.height <= form.size.height  # nothing below the fold
        for control in app.screen.query_one("#generate-form").query("Input, Select, Switch, Button, TextArea"):
            region = control.region
            assert region.right <= 80, (control.id, region)
            assert region.bottom <= 22, (control.id, region)
            assert region.width > 0, (control.id, region)
            if not isinstance(control, (Button, Switch)):
                assert region.width >= 10, (control.id, region)
