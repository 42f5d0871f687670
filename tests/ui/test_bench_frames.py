"""bench_render's clock reads the right frame: its terminal model shows what the app drew, and the frame it
picks is the first that shows the settled screen, never an intermediate one. (No timing here.)"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from textual.app import App, ComposeResult

from tokview.ui import display as d
from tokview.ui.examples import long_capture
from tokview.ui.widgets.token_view import TokenView


@pytest.fixture(scope="module")
def bench():
    path = Path(__file__).parents[2] / "benchmarks" / "bench_render.py"
    spec = importlib.util.spec_from_file_location("bench_render_under_test", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def frame(bench, data: str):
    return bench.Frame(0.0, 0.0, data)


def test_the_first_frame_showing_the_settled_screen_is_picked_not_an_intermediate_one(bench):
    size = {0: bench.Size(4, 1)}
    before, wrong, right = frame(bench, "\x1b[1;1Hold "), frame(bench, "\x1b[1;1Hhalf"), frame(bench, "\x1b[1;1Hdone")
    again = frame(bench, "\x1b[1;1H\x1b[1mdo\x1b[0mne")  # same characters, other colours: a different screen
    assert bench.first_showing([before, wrong, right], 1, size) is right
    assert bench.first_showing([before, right, frame(bench, "\x1b[1;1Hdone")], 1, size) is right
    assert bench.first_showing([before, right, again], 1, size) is again
    assert bench.first_showing([before], 1, size) is None


async def test_the_terminal_model_shows_what_the_token_view_drew(bench, tokenizer, profile):
    from tokview.core.analysis import analyze

    capture = long_capture(tokenizer, 2_000)
    seq = d.served_seq(capture, analyze(capture, profile, tokenizer), tokenizer)

    class One(App):
        def __init__(self) -> None:
            super().__init__(driver_class=bench.FrameDriver)

        def compose(self) -> ComposeResult:
            yield TokenView(seq)

    app = One()
    async with app.run_test(headless=False, size=(60, 12)) as pilot:
        await pilot.pause()
        view = app.query_one(TokenView)
        width = view.scrollable_content_region.width
        drawn = [view.render_line(y).text[:width] for y in range(12)]
        model = bench.TerminalModel(60, 12)
        for written in app._driver.frames:
            model.feed(written.data)
    assert ["".join(ch for ch, _ in row[:width]) for row in model.screen()] == drawn
