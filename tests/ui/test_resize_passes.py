"""A resize costs the screen one layout, not one more for the scroll bars or for the footer's columns.

Why these are not timed: the speed is measured in benchmarks/bench_render.py. Here: the scroll bar never
asks for a layout of its own, a layout pass that changes nothing leaves it alone, the picture after a
resize is the one an app started at that size shows, and the footer's columns are right in the very
layout the resize runs (not on the Resize event, a frame later, with a second layout).
"""

from __future__ import annotations

import pytest
from textual.app import App, ComposeResult
from textual.scrollbar import ScrollBar
from textual.widget import Widget
from ui.helpers import settle

from tokview.store import Store
from tokview.ui import display as d
from tokview.ui.examples import long_capture
from tokview.ui.widgets.token_view import TokenView


class OneView(App):
    def __init__(self, seq: d.TokenSeq) -> None:
        super().__init__()
        self.seq = seq

    def compose(self) -> ComposeResult:
        yield TokenView(self.seq)


@pytest.fixture(scope="module")
def seq(tokenizer, profile):
    from tokview.core.analysis import analyze

    capture = long_capture(tokenizer, 4_000)
    return d.served_seq(capture, analyze(capture, profile, tokenizer), tokenizer)


@pytest.fixture
def bar_refreshes(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Every refresh a scroll bar asks for, as its `layout` flag."""
    seen: list[bool] = []
    original = Widget.refresh

    def spy(self, *regions, repaint=True, layout=False, recompose=False):
        if isinstance(self, ScrollBar):
            seen.append(layout)
        return original(self, *regions, repaint=repaint, layout=layout, recompose=recompose)

    monkeypatch.setattr(Widget, "refresh", spy)
    return seen


def bar_state(view: Widget) -> tuple:
    bar = view.vertical_scrollbar
    return bar.region, bar.window_virtual_size, bar.window_size, bar.position, view.show_vertical_scrollbar


async def test_a_resize_asks_no_layout_for_the_token_views_scroll_bar(seq, bar_refreshes):
    async with OneView(seq).run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        bar_refreshes.clear()
        await pilot.resize_terminal(100, 40)
        await pilot.pause()
        assert bar_refreshes, "the bar's geometry changed: it must repaint"
        assert not any(bar_refreshes), "the scroll bar asked the screen for a layout pass of its own"
        resized = pilot.app.query_one(TokenView)
        after = (bar_state(resized), resized.row_starts, resized.scroll_offset, pilot.app.export_screenshot())
    async with OneView(seq).run_test(size=(100, 40)) as pilot:  # the same picture as an app started at 100
        await pilot.pause()
        fresh = pilot.app.query_one(TokenView)
        assert after == (bar_state(fresh), fresh.row_starts, fresh.scroll_offset, pilot.app.export_screenshot())


async def test_a_layout_pass_that_changes_nothing_leaves_the_scroll_bar_alone(seq, bar_refreshes):
    async with OneView(seq).run_test(size=(120, 40)) as pilot:
        view = pilot.app.query_one(TokenView)
        await pilot.pause()
        before = bar_state(view)
        bar_refreshes.clear()
        view.refresh(layout=True)
        await pilot.pause()
        assert bar_refreshes == []
        assert bar_state(view) == before


async def test_a_resize_asks_no_layout_for_the_samples_lists_scroll_bar(tmp_path, tokenizer, profile, bar_refreshes):
    from tokview.ui.app import TokviewApp
    from tokview.ui.session import Session

    with Store(tmp_path / "s.duckdb") as store:
        store.execute(
            "INSERT INTO samples (sample_id, prompt_id, run_id, prompt_ids, output_ids, finish_reason, status, "
            "valid, n_errors, codes, prompt_len, output_len, supervised, created_at) "
            "SELECT printf('p%04d@r_gen0', i), printf('p%04d', i), 'r', [1, 2, 3], [4, 5, 6], 'stop', 'pending', "
            "true, 0, [], 3, 3, 3, TIMESTAMP '2026-01-01' + INTERVAL (i) SECOND FROM range(500) t(i)"
        )
        app = TokviewApp(Session(store, tokenizer=tokenizer, profile=profile))
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(app, pilot)
            lst = app.samples_screen.sample_list
            assert lst.show_vertical_scrollbar
            bar_refreshes.clear()
            await pilot.resize_terminal(100, 40)
            await settle(app, pilot)
            assert bar_refreshes
            assert not any(bar_refreshes)
            bar = lst.vertical_scrollbar
            assert bar.region.right == lst.region.right
            assert bar.window_virtual_size == lst.virtual_size.height


async def test_the_layout_a_resize_runs_already_gives_the_footer_its_new_columns(make_app):
    from textual.geometry import Size

    from tokview.ui.widgets.footer import CELL, KeysFooter

    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        footer = app.screen.query_one(KeysFooter)
        assert footer.styles.grid_size_columns == 120 // CELL
        app.screen._refresh_layout(Size(80, 40))  # the layout a resize runs, before the events it posts are handled
        assert footer.styles.grid_size_columns == 80 // CELL
        keys = list(footer.query("FooterKey"))
        assert {k.region.width for k in keys} == {CELL}, "keys placed with the old column count"
        assert max(k.region.right for k in keys) <= 80
        await pilot.resize_terminal(80, 40)
        await settle(app, pilot)
        assert footer.styles.grid_size_columns == 80 // CELL


async def test_the_layout_a_resize_runs_already_wraps_the_findings_for_the_new_width(tokenizer, profile):
    from pathlib import Path

    from textual.geometry import Size

    from tokview.core.analysis import analyze
    from tokview.ui.screens.inspect import InspectData, InspectScreen
    from tokview.ui.widgets.findings_list import FindingsList

    capture = long_capture(tokenizer, 2_000)
    capture.finish_reason = "length"  # one more finding, with a long explanation
    data = InspectData("s1", capture, analyze(capture, profile, tokenizer))

    class Inspect(App):
        CSS_PATH = Path(__file__).parents[2] / "tokview" / "ui" / "styles" / "app.tcss"

        def on_mount(self) -> None:
            self.push_screen(InspectScreen(data, tokenizer, profile))

    def shown(app: App) -> list[str]:
        findings = app.screen.query_one("#findings", FindingsList)
        return [findings.render_line(y).text for y in range(findings.size.height)]

    async with Inspect().run_test(size=(80, 40)) as pilot:  # what the findings look like at 80 columns
        await pilot.pause()
        wanted = shown(pilot.app)
    async with Inspect().run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        pilot.app.screen._refresh_layout(Size(80, 40))  # the layout a resize runs, before the events it posts
        assert shown(pilot.app) == wanted, "the first frame at 80 columns would show the findings wrapped for 120"
        await pilot.resize_terminal(80, 40)
        await pilot.pause()
        assert shown(pilot.app) == wanted
