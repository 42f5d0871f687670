"""What the UI tests share besides fixtures (a helper module, no tests): waiting for workers, the snapshot sizes
and key sequences, a sibling sample for the compare screen, and an app that shows one inspect screen.

Fixtures stay in tests/ui/conftest.py; test modules import these from here, never from each other.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from textual.app import App
from textual.widgets import DataTable

from tokview.core.analysis import analyze
from tokview.ui.examples import short_capture
from tokview.ui.screens.inspect import InspectData, InspectScreen

CSS = Path(__file__).parents[2] / "tokview" / "ui" / "styles" / "app.tcss"
WIDE, NARROW = (120, 40), (80, 24)
"""The snapshot tests' terminal sizes."""


async def until(pilot: Any, done: Callable[[], Any], what: str, timeout: float = 30.0) -> None:
    """Wait (in the app's own time) until `done()` holds; fails naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await pilot.pause(0.02)


async def settle(app: Any, pilot: Any) -> None:
    """Wait for workers, the messages they posted and the tables they filled (never for wall-clock time)."""
    for _ in range(3):
        # a failed worker is normal (the app notifies it): wait for every worker, whatever its end
        await asyncio.gather(*(w.wait() for w in list(app.workers)), return_exceptions=True)
        await pilot.pause()
    for _ in range(20):  # a refilled DataTable sizes its columns on its own idle: a snapshot must not beat it
        if not any(_table_pending(table) for table in app.screen.query(DataTable)):
            return
        await pilot.pause()


def _table_pending(table: DataTable[Any]) -> bool:
    """Whether the table still owes a resize for rows or cells it was given: Textual's own flags (read only), and
    a column narrower than a cell it holds. The flags alone let a loaded box snapshot a table whose rows were in
    but whose widths were still its headers' (a run id cut to "run"): the rows came after the flags were read."""
    if getattr(table, "_require_update_dimensions", False) or getattr(table, "_updated_cells", None):
        return True
    for column in table.ordered_columns:
        if column.auto_width and any(len(str(cell)) > column.content_width for cell in table.get_column(column.key)):
            return True
    return False


def run_before(*keys: str, then: Callable[[Any], None] | None = None) -> Callable[[Any], Awaitable[None]]:
    """A snapshot's `run_before`: press `keys` one at a time, settled, then call `then(app)` if given."""

    async def before(pilot: Any) -> None:
        app = pilot.app
        await settle(app, pilot)
        for key in keys:  # one at a time, settled: a key pressed while a sample still loads in its worker
            await pilot.press(key)  # would land on the list instead of the inspect screen
            await settle(app, pilot)
        if then is not None:
            then(app)
            await settle(app, pilot)
        await steady(app, pilot)

    return before


STEADY_PAUSE_S = 0.05
"""Between two renders `steady` compares: longer than a refresh (~1/60 s), so a change waiting for one is drawn."""


async def steady(app: Any, pilot: Any, tries: int = 20) -> None:
    """Pause until two renders of the screen in a row are the same: a chart mounted after a load draws on the next
    refresh (`call_after_refresh`) and the grid lays it out after that, so on a loaded machine a snapshot taken
    when the workers were done caught the grid mid-layout (a title cut short, a column another width). The renders
    are a refresh apart: with no wait between them, a table whose rows were added but whose column widths wait for
    the next refresh gave the same stale render twice (a run id cut to its header's width)."""
    await pilot.pause()
    before = app.export_screenshot()
    for _ in range(tries):
        await pilot.pause(STEADY_PAUSE_S)
        await pilot.pause()  # and the app idle: a sleep alone, on a busy box, may pass with its refresh still queued
        now = app.export_screenshot()
        if now == before:
            return
        before = now


async def open_first(app: Any, pilot: Any, *, past: int = 0) -> str:
    """Open the list's first sample (or the one `past` rows below it) in the inspect screen; its sample id."""
    await settle(app, pilot)
    await pilot.press(*["down"] * past, "enter")
    await settle(app, pilot)
    assert isinstance(app.screen, InspectScreen)
    return app.screen.data.sample_id


def add_sibling(store: Any, tokenizer: Any, profile: Any, changed_at: int = 3) -> tuple[str, int]:
    """p001's prompt again, in run-c, its output differing from output[changed_at] on: (its sample id, the
    position of the first differing id)."""
    capture = short_capture()
    capture.output_ids = list(capture.output_ids)
    capture.output_ids[changed_at] = tokenizer.encode(" banana")[0]
    store.put_sample("p001@run-c", "p001", "run-c", capture, analyze(capture, profile, tokenizer))
    return "p001@run-c", len(capture.prompt_ids) + changed_at


async def refused_connects(pilot: Any, path: str, tries: int = 150) -> int:
    """How many of `tries` plain `duckdb.connect`s to `path` another process had refused while the app ran on
    (what a batch, the proxy's landing or a notebook meets when an open screen holds the store)."""
    import subprocess
    import sys

    script = (
        "import duckdb, sys\n"
        "refused = 0\n"
        f"for _ in range({tries}):\n"
        "    try:\n"
        "        duckdb.connect(sys.argv[1]).close()\n"
        "    except duckdb.Error:\n"
        "        refused += 1\n"
        "print(refused)\n"
    )
    other = subprocess.Popen([sys.executable, "-c", script, path], stdout=subprocess.PIPE, text=True)
    while other.poll() is None:
        await pilot.pause(0.05)
    assert other.stdout is not None
    return int(other.stdout.read().strip())


class InspectApp(App[None]):
    """An app showing only the inspect screen of `data`, with the real stylesheet."""

    CSS_PATH = CSS

    def __init__(self, data: InspectData, tokenizer: Any, profile: Any) -> None:
        super().__init__()
        self.args = (data, tokenizer, profile)

    def on_mount(self) -> None:
        self.push_screen(InspectScreen(*self.args))
