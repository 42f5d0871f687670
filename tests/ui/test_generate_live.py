"""Live generation: a sample generated from the app appears in the list as soon as it lands, while the rest of
the run is still out (a gate in front of the simulator holds every answer past the first)."""

from __future__ import annotations

import asyncio

from gated_sim import gated
from textual.widgets import Input, Select, TextArea
from ui.helpers import settle

from tokview.sim import SimConfig, start_simulator
from tokview.ui.screens.generate import GenerateScreen


async def test_a_sample_shows_in_the_list_while_the_rest_of_the_run_is_held(make_app, store):
    with start_simulator(SimConfig(kind="vllm")) as sim, gated(sim.url, free=1) as (url, gate):
        app = make_app(server_url=url)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(app, pilot)
            listed = app.samples_screen.sample_list
            assert listed.count == 30
            await pilot.press("g")
            screen = app.screen
            assert isinstance(screen, GenerateScreen)
            screen.query_one("#source", Select).value = "typed"
            screen.query_one("#typed", TextArea).text = "What is 2+2?\nName a prime.\nWhy is the sky blue?"
            screen.query_one("#samples", Input).value = "1"
            screen.query_one("#max-tokens", Input).value = "48"
            await pilot.press("ctrl+s")
            deadline = asyncio.get_running_loop().time() + 30
            while listed.count < 31:  # the landing's message reloads the list; nothing else would now
                assert asyncio.get_running_loop().time() < deadline, "the first sample never showed"
                await pilot.pause(0.01)
            assert gate.answered == 1
            assert screen.cancel_event is not None  # the run is still going
            gate.open()
            await settle(app, pilot)
            assert screen.last_summary is not None
            assert screen.last_summary.ok == 3
            assert store.count_samples() == 33
            assert listed.count == 33


async def test_rows_the_panel_skipped_are_said_with_why_and_what_to_do(make_app, tmp_path):
    """Agent traces run in the default mode ended "done: … 6 bad rows", with no line, no reason and no hint (the CLI
    lists them; the panel showed only the summary)."""
    from pathlib import Path

    traces = Path(__file__).resolve().parents[2] / "sample_data" / "agent_traces.jsonl"
    with start_simulator(SimConfig(kind="vllm")) as sim:
        app = make_app(server_url=sim.url)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(app, pilot)
            await pilot.press("g")
            screen = app.screen
            screen.query_one("#prompts-file", Input).value = str(traces)
            screen.query_one("#max-tokens", Input).value = "16"
            await pilot.press("ctrl+s")
            deadline = asyncio.get_running_loop().time() + 30
            while screen.last_summary is None:
                assert asyncio.get_running_loop().time() < deadline, "the run never ended"
                await pilot.pause(0.02)
            await settle(app, pilot)
            said = [str(n.message) for n in app._notifications if n.title == "bad rows skipped"]
            assert len(said) == 1, [n.message for n in app._notifications]
            assert "is an agent trace" in said[0] and "they run with mode parsed chat" in said[0], said[0]
            assert "line 1:" in said[0]
