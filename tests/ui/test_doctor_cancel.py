"""The doctor panel against a server that accepts connections and never answers can be cancelled
(its checks would wait about 4 minutes, with no way out but leaving the panel)."""

from __future__ import annotations

import asyncio

from loopback import serve_asgi
from textual.widgets import Static
from textual.worker import WorkerState
from ui.helpers import settle

from tokview.ui.screens.doctor import DoctorScreen
from tokview.ui.screens.samples import SamplesScreen


async def _stalled(scope, receive, send) -> None:
    """Takes every request and never answers."""
    if scope["type"] == "http":
        await asyncio.Event().wait()


async def _running(screen: DoctorScreen) -> None:
    for _ in range(500):
        if screen.running:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the doctor never started")


async def test_esc_and_ctrl_c_cancel_the_running_doctor_and_esc_then_goes_back(make_app):
    with serve_asgi(_stalled) as url:
        app = make_app(server_url=url)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(app, pilot)
            await pilot.press("D")
            screen = app.screen
            assert isinstance(screen, DoctorScreen)
            await _running(screen)
            worker = screen.running
            await pilot.press("escape")  # cancels; the panel stays
            await pilot.pause()
            assert worker.state is WorkerState.CANCELLED
            assert app.screen is screen
            assert "cancelled" in str(screen.query_one("#doctor-report", Static).render())
            await pilot.press("ctrl+s")  # again, and stopped with ctrl+c this time
            await _running(screen)
            worker = screen.running
            await pilot.press("ctrl+c")
            await pilot.pause()
            assert worker.state is WorkerState.CANCELLED
            assert app.screen is screen
            await pilot.press("escape")  # nothing runs: back to the list
            await pilot.pause()
            assert isinstance(app.screen, SamplesScreen)


async def test_the_report_takes_the_focus_from_the_url_so_the_apps_keys_act_again(make_app):
    """A user pass typed `g`, `S`, `?` after the checks ended: they went into the URL box, still focused
    (`http://127.0.0.1:18901gS?`), and the next ctrl+s said the URL was bad."""
    from ui.helpers import until

    from tokview.sim import SimConfig, start_simulator

    with start_simulator(SimConfig(kind="vllm")) as sim:
        app = make_app(server_url=sim.url)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(app, pilot)
            await pilot.press("D")
            screen = app.screen
            assert isinstance(screen, DoctorScreen)
            await until(pilot, lambda: screen.report is not None, "the doctor's report")
            await pilot.pause()
            assert screen.focused is not None and screen.focused.id == "doctor-body", screen.focused
            await pilot.press("S")
            await until(pilot, lambda: type(app.screen).__name__ == "StatsScreen", "the stats panel")
            assert screen.query_one("#doctor-url").value == sim.url
