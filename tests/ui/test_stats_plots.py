"""Plots that do not mislead: whole-number count ticks, bars proportional to counts, every finding code."""

from __future__ import annotations

import itertools
import re

import pytest
from textual_plotext import PlotextPlot
from ui.helpers import settle

from tokview.ui.screens.stats import StatsScreen, integer_ticks
from tokview.ui.widgets.bar_chart import BarChart, bar_lines


def test_integer_ticks_cover_the_top_in_whole_steps():
    for top in (1, 2, 3, 6, 7, 64, 99, 1234):
        ticks = integer_ticks(top)
        assert ticks[0] == 0
        assert ticks[-1] >= top
        assert len(ticks) <= 7
        assert all(isinstance(t, int) for t in ticks)
        assert len({b - a for a, b in itertools.pairwise(ticks)}) == 1


def test_bars_are_proportional_and_a_small_count_stays_visible():
    lines = {label: cells for label, cells, _ in bar_lines({"approved": 4, "rejected": 1, "pending": 64}, 80)}
    assert lines["pending"] > lines["approved"] >= lines["rejected"] >= 1
    assert lines["approved"] == pytest.approx(lines["pending"] * 4 / 64, abs=1)
    wide = {label: cells for label, cells, _ in bar_lines({"approved": 4, "rejected": 1, "pending": 64}, 200)}
    assert wide["approved"] >= 10
    assert wide["pending"] > lines["pending"]
    assert bar_lines({"a": 0, "b": 3}, 40)[0][1] == 0


@pytest.mark.parametrize("size", [(80, 24), (200, 50)])
async def test_stats_panel_lists_every_code_with_integer_ticks(size, make_app, store):
    store.record_verdict("p001@demo_gen0", "approved")
    store.record_verdict("p002@demo_gen0", "rejected", reason="duplicate")
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        await pilot.press("S")
        await settle(app, pilot)
        screen = app.screen
        assert isinstance(screen, StatsScreen)
        codes = set(screen.data.stats["findings"])
        findings = screen.query_one("#plot-findings", BarChart)
        listed = {line.split()[0] for line in str(findings.render()).splitlines()[1:] if line.strip()}
        assert codes
        assert listed == codes
        review = {
            label: cells for label, cells, _ in bar_lines(screen.query_one("#plot-review", BarChart).counts, size[0])
        }
        assert review["pending"] > review["approved"] >= 1
        assert review["rejected"] >= 1
        for plot in screen.query(PlotextPlot):
            axis = [line.split("┤")[0] for line in str(plot.render()).splitlines() if "┤" in line]
            labels = [label.strip() for label in axis if label.strip()]
            assert labels, labels
            assert all(re.fullmatch(r"[0-9,]+", label) for label in labels), labels


def test_reasoning_length_uses_each_runs_own_closer(tmp_path, tokenizer):
    """A store holding a Kimi run and a Qwen3 run: each sample's reasoning ends at its own model's closer.

    Both outputs hold both closers (Kimi's 163607 and Qwen3's 151668) at different places, so one
    profile's closer applied to every sample gives the wrong length for the other run's sample.
    """
    from tokview.core.profiles import get_profile
    from tokview.store import Store
    from tokview.ui.screens.stats import read_stats
    from tokview.ui.session import Session

    kimi, qwen = get_profile("kimi-k2.5").think_close_id, get_profile("qwen3").think_close_id
    with Store(tmp_path / "two.duckdb") as store:
        store.put_run("kimi-run", profile="kimi-k2.5")
        store.put_run("qwen-run", profile="qwen3")  # the latest run: the session's default profile
        for sid, run, output in (
            ("k@kimi", "kimi-run", [5, 6, 7, kimi, 8, qwen, 9]),  # Kimi: 3 reasoning ids
            ("q@qwen", "qwen-run", [5, kimi, 6, 7, 8, 9, qwen, 10]),  # Qwen3: 6 reasoning ids
            ("i@import", None, [5, 6, 7, 8, kimi, qwen]),  # no run: as inspect opens it (detected: Kimi): 4
        ):
            store.execute(
                "INSERT INTO samples (sample_id, prompt_id, run_id, prompt_ids, output_ids, finish_reason, status, "
                "valid, n_errors, codes, prompt_len, output_len, supervised, created_at) "
                "VALUES (?, ?, ?, [1, 2], ?, 'stop', 'pending', true, 0, [], 2, ?, 1, now())",
                [sid, sid, run, output, len(output)],
            )
        data = read_stats(Session(store, tokenizer=tokenizer))  # no profile named: each run's recorded one
        assert sorted(data.reasoning_lens) == [3, 4, 6]
        assert sorted(data.output_lens) == [6, 7, 8]
        assert sorted(store.length_distribution(qwen)[1]) == [5, 5, 6]  # one closer for all: two samples wrong


async def test_a_cjk_label_gets_its_cells_and_the_bars_stay_inside_the_width():
    """A server's finish reason is a label: measured by len(), a CJK one shifted its bar off the others' column and
    drew the bar and the count past the chart's width."""
    from rich.cells import cell_len
    from textual.app import App

    counts = {"中文理由": 4, "stop": 4}
    for label, cells, _ in bar_lines(counts, 40):
        assert cell_len("中文理由") + 1 + cells + 1 + 1 <= 40, (label, cells)
    app = App()
    async with app.run_test(size=(42, 10)) as pilot:
        chart = BarChart()
        await app.screen.mount(chart)
        chart.set_data("finish reasons", counts)
        await pilot.pause()
        lines = chart.render().plain.splitlines()[1:]
        assert len({cell_len(line[: line.index("█")]) for line in lines}) == 1
        assert all(cell_len(line) <= chart.content_size.width for line in lines), lines
