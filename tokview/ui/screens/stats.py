"""The stats panel: output and reasoning length histograms, finish reasons, findings by code, progress.

Counts are drawn as text bars (`BarChart`: every label listed, bars proportional); the two length
histograms are plotext with whole-number count ticks.

The numbers come from `Store.stats()` (the same dict `tokview stats` prints) plus one read of the
length columns for the histograms, in a thread worker; plotting is textual-plotext.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from textual import on, work
from textual.app import ComposeResult
from textual.containers import Grid
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Static
from textual.worker import Worker
from textual_plotext import PlotextPlot

from tokview.store.run_stats import run_stats
from tokview.store.side_stats import store_side_stats
from tokview.ui.bindings import bindings
from tokview.ui.display import capped, cell, plain
from tokview.ui.heat import acceptance_bars, nll_bars
from tokview.ui.widgets.bar_chart import BarChart
from tokview.ui.widgets.footer import KeysFooter
from tokview.ui.widgets.sized_table import Cell, SizedTable
from tokview.ui.worker_errors import ForwardsWorkerErrors, failure_text
from tokview.untrusted_text import clipped, printable_line
from tokview.wording import plural

if TYPE_CHECKING:
    from rich.text import Text

    from tokview.ui.session import Session

MAX_ROWS = 200_000


@dataclass
class StatsData:
    stats: dict[str, Any]
    output_lens: list[int]
    reasoning_lens: list[int]
    finish: dict[str, int]
    side: dict[str, Any] | None = None
    """`spec_decode`, `logprobs`, `target_logprobs` as `tokview stats --json` has them."""
    runs: list[dict[str, Any]] = field(default_factory=list)
    """Per run, as `tokview stats --by run --json` has them (store/run_stats.py)."""


def read_stats(session: Session) -> StatsData:
    """Everything the panel plots (worker thread).

    Reasoning length: ids before the closer of each sample's own profile (its run's, as inspect opens
    it), so a store holding Kimi and Qwen3 runs measures each at its model's closer.
    """
    store = session.store
    default = session.profile()
    close_ids = {(run, name): session.for_run(run, name)[1].think_close_id for run, name in store.profile_pairs()}
    output_lens, reasoning_lens = store.length_distribution(default.think_close_id, MAX_ROWS, close_ids)
    return StatsData(
        store.stats(),
        output_lens,
        reasoning_lens,
        store.finish_reasons(),
        store_side_stats(store, default),
        run_stats(store),
    )


RUN_COLUMNS = (
    "run",
    "samples",
    "approved",
    "rejected",
    "pending",
    "invalid",
    "truncated",
    "failures",
    "output p50",
    "output max",
    "acceptance",
    "target NLL",
    "top findings",
)


def run_row(r: dict[str, Any]) -> tuple[str | Text, ...]:
    """One run as the panel's table shows it (the numbers of `tokview stats --by run`)."""
    acc, nll = r["acceptance"]["mean_acceptance_length"], r["target_nll"]["mean"]
    top = sorted(r["findings"].items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    return (
        cell(capped(str(r["run"]))),
        str(r["samples"]),
        str(r["by_status"]["approved"]),
        str(r["by_status"]["rejected"]),
        str(r["by_status"]["pending"]),
        str(r["invalid"]),
        str(r["truncated"]),
        str(r["failures"]),
        "—" if r["output_len"]["p50"] is None else str(r["output_len"]["p50"]),
        "—" if r["output_len"]["max"] is None else str(r["output_len"]["max"]),
        "—" if acc is None else f"{acc:.2f}",
        "—" if nll is None else f"{nll:.3f}",
        ", ".join(f"{code} {n}" for code, n in top) or "none",
    )


class StatsScreen(ForwardsWorkerErrors, Screen[None]):
    BINDINGS = bindings("stats")
    DEFAULT_CSS = """
    #stats-runs { height: auto; max-height: 8; }
    """

    class Loaded(Message):
        def __init__(self, data: StatsData) -> None:
            super().__init__()
            self.data = data

    def __init__(self, session: Session) -> None:
        super().__init__()
        self.session = session
        self.data: StatsData | None = None

    def compose(self) -> ComposeResult:
        yield Static("loading…", id="stats-summary")
        with Grid(id="stats-grid"):
            yield PlotextPlot(id="plot-output")
            yield PlotextPlot(id="plot-reasoning")
            yield BarChart(id="plot-finish")
            yield BarChart(id="plot-findings")
            yield BarChart(id="plot-review")
        runs: DataTable[Cell] = SizedTable(id="stats-runs", cursor_type="row", zebra_stripes=True)
        runs.add_columns(*RUN_COLUMNS)
        yield runs
        yield KeysFooter()

    def on_mount(self) -> None:
        self.action_reload()

    def action_reload(self) -> None:
        self._load()

    def action_close(self) -> None:
        self.app.pop_screen()

    @work(thread=True, exclusive=True, group="stats", exit_on_error=False)
    def _load(self) -> None:
        self.post_message(self.Loaded(read_stats(self.session)))  # an error: worker_failed, and the app notifies

    def worker_failed(self, worker: Worker[object], error: BaseException) -> None:
        """E.g. the run's tokenizer folder is gone: said in place of the summary (the app notifies too)."""
        self.query_one("#stats-summary", Static).update(plain(f"cannot read stats: {failure_text(error)}"))

    @on(Loaded)
    def _loaded(self, event: Loaded) -> None:
        self.data = d = event.data
        s = d.stats
        if not s["samples"]:
            failed = s["failures"]["total"]
            reasons = sorted(s["failures"]["by_reason"].items(), key=lambda kv: -kv[1])[:3]
            why = "; ".join(f"{n} × {printable_line(clipped(r, 120))}" for r, n in reasons)
            self.query_one("#stats-summary", Static).update(
                plain(
                    f"No samples: {failed:,} requests failed ({why}). Fix the server or its settings, then press "
                    "escape and g to generate again."
                    if failed
                    else "No samples yet, so nothing to plot. Press escape, then g to generate some from a server, "
                    "or run `tokview demo` for a filled demo store."
                )
            )
            return
        by_status = s["by_status"]
        reviewed = by_status.get("approved", 0) + by_status.get("rejected", 0)
        total = max(1, s["samples"])
        self.query_one("#stats-summary", Static).update(
            f"{plural(s['samples'], 'sample')} · {plural(s['prompts'], 'prompt')} · valid {s['valid']:,} · "
            f"invalid {s['invalid']:,} · "
            f"reviewed {reviewed:,}/{s['samples']:,} ({100 * reviewed / total:.0f}%): approved "
            f"{by_status.get('approved', 0):,}, rejected {by_status.get('rejected', 0):,}, "
            f"pending {by_status.get('pending', 0):,}"
        )
        self._hist("#plot-output", d.output_lens, "output length (ids)")
        self._hist(
            "#plot-reasoning", d.reasoning_lens, "reasoning length (ids)"
        )  # a longer title was dropped at 80 columns
        self.query_one("#plot-finish", BarChart).set_data("finish reasons", d.finish)
        self.query_one("#plot-findings", BarChart).set_data(
            "samples by finding code", {c: v["samples"] for c, v in s["findings"].items()}
        )
        self.query_one("#plot-review", BarChart).set_data(
            f"review progress: {reviewed:,} of {s['samples']:,} reviewed",
            {k: by_status.get(k, 0) for k in ("approved", "rejected", "pending")},
        )
        self._side_plots(d.side)
        table = self.query_one("#stats-runs", DataTable)
        table.clear()
        table.add_rows(run_row(r) for r in d.runs)

    def _side_plots(self, side: dict[str, Any] | None) -> None:
        """Acceptance per segment and the target-NLL distribution: two more charts, only for a store that has them."""
        plots: list[tuple[str, str, Mapping[str, float]]] = [
            ("plot-acceptance", *acceptance_bars(side)),
            ("plot-nll", *nll_bars(side)),
        ]
        if not any(bars for _, _, bars in plots):
            return
        grid = self.query_one("#stats-grid", Grid)
        new = [BarChart(id=name) for name, _, _ in plots if not self.query(f"#{name}")]

        def draw() -> None:
            for name, title, bars in plots:
                self.query_one(f"#{name}", BarChart).set_data(title, bars)

        if new:
            grid.mount(*new)
            self.call_after_refresh(draw)
        else:
            draw()

    def _hist(self, selector: str, values: list[int], title: str) -> None:
        widget = self.query_one(selector, PlotextPlot)
        plt = widget.plt
        plt.clear_data()
        plt.title(title)
        if values:
            centers, counts, width = histogram(values, BINS)
            plt.bar(centers, counts, width=width)
            rows = widget.size.height - 5  # title, frame and x labels take the rest
            ticks = integer_ticks(max(counts), most=max(2, rows // 2) if rows > 0 else 5)
            plt.yticks([float(t) for t in ticks], [str(t) for t in ticks])
            plt.ylim(0, ticks[-1])
            shown = centers[:: max(1, len(centers) // 4)]
            plt.xticks(shown, [f"{round(c):,}" for c in shown])  # lengths are whole ids too
        widget.refresh()


BINS = 20


def histogram(values: list[int], bins: int) -> tuple[list[float], list[int], float]:
    """(bin centres, counts, bar width as a fraction) over equal-width bins from min to max."""
    lo, hi = min(values), max(values)
    step = max(1.0, (hi - lo) / bins)
    n = max(1, min(bins, int((hi - lo) / step) + 1))
    counts = [0] * n
    for v in values:
        counts[min(n - 1, int((v - lo) / step))] += 1
    return [lo + step * (i + 0.5) for i in range(n)], counts, 0.9


def integer_ticks(top: int, most: int = 5) -> list[int]:
    """0 … ≥top in whole steps of 1, 2, 5, 10, 20, 50 …, at most `most` steps: a count axis never shows 0.67."""
    top = max(1, top)
    step, scale = 1, 1
    while True:
        step = next((m * scale for m in (1, 2, 5) if top / (m * scale) <= most), 0)
        if step:
            break
        scale *= 10
    last = -(-top // step) * step
    return list(range(0, last + step, step))
