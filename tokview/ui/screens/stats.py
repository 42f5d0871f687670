"""The stats panel: output and reasoning length histograms, finish reasons, findings by code, progress.

The numbers come from `Store.stats()` (the same dict `tokview stats` prints) plus one read of the
length columns for the histograms, in a thread worker; plotting is textual-plotext.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from textual import on, work
from textual.app import ComposeResult
from textual.containers import Grid
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Static
from textual_plotext import PlotextPlot

from tokview.ui.bindings import bindings
from tokview.ui.widgets.footer import KeysFooter

if TYPE_CHECKING:
    from tokview.ui.session import Session

MAX_ROWS = 200_000


@dataclass
class StatsData:
    stats: dict
    output_lens: list[int]
    reasoning_lens: list[int]
    finish: dict[str, int]


def read_stats(session: "Session") -> StatsData:
    """Everything the panel plots (worker thread). Reasoning length: ids before the profile's closer."""
    store = session.store
    output_lens, reasoning_lens = store.length_distribution(session.profile().think_close_id, MAX_ROWS)
    return StatsData(store.stats(), output_lens, reasoning_lens, store.finish_reasons())


class StatsScreen(Screen):
    BINDINGS = bindings("stats")

    class Loaded(Message):
        def __init__(self, data: StatsData) -> None:
            super().__init__()
            self.data = data

    def __init__(self, session: "Session") -> None:
        super().__init__()
        self.session = session
        self.data: StatsData | None = None

    def compose(self) -> ComposeResult:
        yield Static("loading…", id="stats-summary")
        with Grid(id="stats-grid"):
            yield PlotextPlot(id="plot-output")
            yield PlotextPlot(id="plot-reasoning")
            yield PlotextPlot(id="plot-finish")
            yield PlotextPlot(id="plot-findings")
            yield PlotextPlot(id="plot-review")
        yield KeysFooter()

    def on_mount(self) -> None:
        self.action_reload()

    def action_reload(self) -> None:
        self._load()

    def action_close(self) -> None:
        self.app.pop_screen()

    @work(thread=True, exclusive=True, group="stats", exit_on_error=False)
    def _load(self) -> None:
        try:
            data = read_stats(self.session)
        except Exception as exc:  # e.g. the run's tokenizer folder is gone: say so, keep the app
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            self.app.call_from_thread(self.query_one("#stats-summary", Static).update, f"cannot read stats: {first}")
            return
        self.post_message(self.Loaded(data))

    @on(Loaded)
    def _loaded(self, event: Loaded) -> None:
        self.data = d = event.data
        s = d.stats
        if not s["samples"]:
            self.query_one("#stats-summary", Static).update(
                "No samples yet, so nothing to plot. Press escape, then g to generate some from a server, "
                "or run `tokview demo` for a filled demo store.")
            return
        by_status = s["by_status"]
        reviewed = by_status.get("approved", 0) + by_status.get("rejected", 0)
        total = max(1, s["samples"])
        self.query_one("#stats-summary", Static).update(
            f"{s['samples']:,} samples · {s['prompts']:,} prompts · valid {s['valid']:,} · invalid {s['invalid']:,} · "
            f"reviewed {reviewed:,}/{s['samples']:,} ({100 * reviewed / total:.0f}%): approved "
            f"{by_status.get('approved', 0):,}, rejected {by_status.get('rejected', 0):,}, "
            f"pending {by_status.get('pending', 0):,}")
        self._hist("#plot-output", d.output_lens, "output length (ids)")
        self._hist("#plot-reasoning", d.reasoning_lens, "reasoning length (ids before the closer)")
        self._bars("#plot-finish", d.finish, "finish reasons")
        self._bars("#plot-findings", {c: v["samples"] for c, v in s["findings"].items()}, "samples by finding code")
        self._bars("#plot-review", {k: by_status.get(k, 0) for k in ("approved", "rejected", "pending")},
                   f"review progress: {reviewed:,} of {s['samples']:,} reviewed", orientation="vertical")

    def _hist(self, selector: str, values: list[int], title: str) -> None:
        widget = self.query_one(selector, PlotextPlot)
        plt = widget.plt
        plt.clear_data()
        plt.title(title)
        if values:
            plt.hist(values, bins=20)
        widget.refresh()

    def _bars(self, selector: str, counts: dict[str, int], title: str, orientation: str = "horizontal") -> None:
        widget = self.query_one(selector, PlotextPlot)
        plt = widget.plt
        plt.clear_data()
        plt.title(title)
        if counts:
            plt.bar(list(counts), list(counts.values()), orientation=orientation)
        widget.refresh()
