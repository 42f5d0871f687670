"""The Line-API token view: wrapping, cursor, one-row repaints, modes, mouse, and the inspect panes in step."""

from __future__ import annotations

import pytest
from facts import IM_USER, THINK_CLOSE
from rich.cells import cell_len
from textual.app import App, ComposeResult
from ui.helpers import InspectApp

from tokview.core.analysis import analyze
from tokview.ui import display as d
from tokview.ui.examples import long_capture
from tokview.ui.screens.inspect import InspectData
from tokview.ui.widgets.token_detail import TokenDetail
from tokview.ui.widgets.token_view import TokenView


class OneView(App):
    def __init__(self, seq: d.TokenSeq) -> None:
        super().__init__()
        self.seq = seq

    def compose(self) -> ComposeResult:
        yield TokenView(self.seq)


@pytest.fixture(scope="module")
def long(tokenizer, profile):
    capture = long_capture(tokenizer, 32_000)
    return capture, analyze(capture, profile, tokenizer)


async def test_wraps_to_width_and_resizes(short, tokenizer):
    seq = d.served_seq(*short, tokenizer)
    app = OneView(seq)
    async with app.run_test(size=(40, 10)) as pilot:
        view = app.query_one(TokenView)
        await pilot.pause()
        width = view.scrollable_content_region.width
        assert view.row_starts == d.wrap([len(p) for p in seq.pieces], width, seq.breaks_after)
        assert view.virtual_size.height == len(view.row_starts)
        rows_narrow = len(view.row_starts)
        await pilot.resize_terminal(100, 10)
        await pilot.pause()
        assert len(view.row_starts) < rows_narrow
        view.mode = "both"
        await pilot.pause()
        assert view.virtual_size.height == 2 * len(view.row_starts)
        assert str(IM_USER) in view.render_line(1).text


async def test_cursor_keys_move_and_repaint_only_touched_rows(short, tokenizer):
    seq = d.served_seq(*short, tokenizer)
    app = OneView(seq)
    async with app.run_test(size=(40, 12)) as pilot:
        view = app.query_one(TokenView)
        view.focus()
        await pilot.pause()
        refreshed: list[tuple[int, int]] = []
        original = view.refresh_lines
        view.refresh_lines = lambda y, n=1: (refreshed.append((y, n)), original(y, n))[1]
        await pilot.press("right", "right")
        assert view.cursor == 2
        assert refreshed
        assert all(n == 1 for _, n in refreshed)
        assert {y for y, _ in refreshed} == {0}
        await pilot.press("down")
        assert d.row_of(view.row_starts, view.cursor) == 1
        await pilot.press("end")
        assert view.cursor == len(seq) - 1
        await pilot.press("home", "left")
        assert view.cursor == 0
        strip = view.render_line(0)
        cursor_style = view.get_component_rich_style("token-view--cursor", partial=True)
        assert next(iter(strip)).style.bgcolor == cursor_style.bgcolor


async def test_recolour_one_token_repaints_one_row(short, tokenizer):
    seq = d.served_seq(*short, tokenizer)
    app = OneView(seq)
    async with app.run_test(size=(40, 12)) as pilot:
        view = app.query_one(TokenView)
        await pilot.pause()
        last = len(seq) - 1
        before = view.render_line(len(view.row_starts) - 1)
        refreshed = []
        original = view.refresh_lines
        view.refresh_lines = lambda y, n=1: (refreshed.append((y, n)), original(y, n))[1]
        view.recolour(last, d.CLASS_INDEX["drift"])
        assert refreshed == [(len(view.row_starts) - 1, 1)]
        after = view.render_line(len(view.row_starts) - 1)

        def style_of(strip):  # one segment per token, from the row's first token
            return list(strip)[last - view.row_starts[-1]].style

        assert not style_of(before).underline  # stop: bold, no underline
        assert style_of(after).underline  # drift: underlined; the cached row was dropped and rebuilt


async def test_click_moves_cursor_to_the_token_under_the_mouse(short, tokenizer):
    seq = d.served_seq(*short, tokenizer)
    app = OneView(seq)
    async with app.run_test(size=(60, 10)) as pilot:
        view = app.query_one(TokenView)
        await pilot.pause()
        x = sum(len(p) for p in seq.pieces[:5])  # first cell of token 5
        await pilot.click(TokenView, offset=(x, 0))
        assert view.cursor == 5
        await pilot.click(TokenView, offset=(x + len(seq.pieces[5]) - 1, 0))  # its last cell
        assert view.cursor == 5
        second = view.row_starts[1]
        await pilot.click(TokenView, offset=(0, 1))  # the first token of the second row
        assert view.cursor == second
        row_width = sum(len(p) for p in seq.pieces[: view.row_starts[1]])
        if row_width < view.scrollable_content_region.width:  # past the end of a short row: nothing there
            await pilot.click(TokenView, offset=(row_width, 0))
            assert view.cursor == second


async def test_a_rewrap_keeps_the_cursor_in_view(long, tokenizer):
    capture, analysis = long
    app = OneView(d.served_seq(capture, analysis, tokenizer))
    async with app.run_test(size=(120, 40)) as pilot:
        view = app.query_one(TokenView)
        view.focus()
        await pilot.pause()
        await pilot.press("end")
        await pilot.pause()
        for width in (80, 119, 60):  # each width moves the last token to another row
            await pilot.resize_terminal(width, 40)
            await pilot.pause()
            row = d.row_of(view.row_starts, view.cursor)
            widths = [cell_len(p) for p in view.seq.pieces]
            assert view.row_starts == d.wrap(widths, view.scrollable_content_region.width, view.seq.breaks_after)
            assert view.virtual_size.height == len(view.row_starts)
            assert view.scroll_y <= row < view.scroll_y + view.scrollable_content_region.height


async def test_inspect_panes_move_together_and_detail_follows(short, tokenizer, profile):
    capture, analysis = short
    app = InspectApp(InspectData("s1", capture, analysis), tokenizer, profile)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        screen = app.screen
        close = len(capture.prompt_ids) + capture.output_ids.index(THINK_CLOSE)
        screen.served.cursor = close
        await pilot.pause()
        assert screen.kept.cursor == close
        rows = app.screen.query_one(TokenDetail).rows
        assert rows["id"] == str(THINK_CLOSE)
        assert rows["text field"] == "hidden by the parser"
        await pilot.press("s", "left")
        await pilot.pause()
        assert screen.served.cursor == close - 1


async def test_selecting_a_finding_jumps_to_its_first_position(short, tokenizer, profile):
    capture, analysis = short
    app = InspectApp(InspectData("s1", capture, analysis), tokenizer, profile)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        listed = [o.id for o in app.screen.query_one("#findings").options]  # errors first, then warn, info
        hidden = next(i for i, f in enumerate(analysis.findings) if f.code == "parser_hidden_ids")
        await pilot.press("f")
        for _ in range(listed.index(f"finding-{hidden}")):
            await pilot.press("down")
        await pilot.press("enter")
        await pilot.pause()
        assert app.screen.served.cursor == analysis.findings[hidden].positions[0]
        assert app.screen.focused is app.screen.served


async def test_long_sample_scrolls_both_panes_in_step(long, tokenizer, profile):
    capture, analysis = long
    app = InspectApp(InspectData("long", capture, analysis), tokenizer, profile)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        screen = app.screen
        assert len(screen.served.row_starts) > 500
        assert screen.served.row_starts == screen.kept.row_starts
        await pilot.press("end")
        await pilot.pause()
        assert screen.served.cursor == len(capture.prompt_ids) + len(capture.output_ids) - 1
        assert screen.served.scroll_y > 500
        assert screen.kept.scroll_y == screen.served.scroll_y
        await pilot.press("v")
        await pilot.pause()
        assert screen.kept.mode == "ids"
        assert screen.kept.scroll_y == screen.served.scroll_y


async def test_diverged_dual_capture_detail_names_the_parsed_paths_segments(tokenizer, profile):
    """The kept pane shows the parsed path's ids: their segments, no loss mask (that is the raw ids')."""
    from tokview.ui.examples import KIMI_OUTPUT_IDS, short_capture

    capture = short_capture()
    capture.endpoint = "dual"
    capture.parsed_output_ids = [t for t in KIMI_OUTPUT_IDS if t != THINK_CLOSE]  # never closed reasoning
    analysis = analyze(capture, profile, tokenizer)
    app = InspectApp(InspectData("dual", capture, analysis), tokenizer, profile)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        screen = app.screen
        assert not screen.mirrored
        assert len(screen.kept.seq) == len(screen.served.seq) - 1
        answer = len(capture.prompt_ids) + capture.output_ids.index(THINK_CLOSE)  # 'The' in the parsed path
        screen.kept.focus()
        screen.kept.cursor = answer
        await pilot.pause()
        rows = app.screen.query_one(TokenDetail).rows
        assert rows["segment"] == "reasoning"
        assert rows["loss mask"] == "—"
        assert "logprob" not in rows
        screen.served.focus()
        screen.served.cursor = answer
        await pilot.pause()
        rows = app.screen.query_one(TokenDetail).rows
        assert rows["segment"] == "closer"
        assert rows["loss mask"] == "1"


async def test_a_burst_of_keys_lands_where_it_should_and_the_app_goes_idle(short, tokenizer, profile):
    """Keys that arrive together (a held arrow) move one shared cursor; nothing echoes back and forth after."""
    from textual import events

    capture, analysis = short
    moved: list[int] = []

    def hook(message) -> None:
        if isinstance(message, TokenView.CursorMoved):
            moved.append(message.index)

    app = InspectApp(InspectData("s1", capture, analysis), tokenizer, profile)
    async with app.run_test(size=(120, 40), message_hook=hook) as pilot:
        await pilot.pause()
        screen = app.screen
        start = screen.served.cursor
        for key in ("right", "right", "right", "left", "right", "right"):  # one burst: no wait in between
            app.post_message(events.Key(key, None))
        for _ in range(5):
            await pilot.pause()
        assert screen.served.cursor == screen.kept.cursor == start + 4
        assert app.screen.query_one(TokenDetail).rows["position"].startswith(f"{start + 4} ")
        settled = len(moved)
        for _ in range(10):
            await pilot.pause()
        assert len(moved) == settled  # idle: no cursor message keeps circulating
        assert screen.served.cursor == screen.kept.cursor == start + 4


async def test_a_burst_on_a_long_sample_goes_idle_in_step(long, tokenizer, profile):
    """The same on a 32,000-token sample: rows down in one burst, both panes end on one row, scrolled alike."""
    from textual import events

    from tokview.ui.display import row_of

    capture, analysis = long
    app = InspectApp(InspectData("long", capture, analysis), tokenizer, profile)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        screen = app.screen
        screen.served.cursor = 0
        await pilot.pause()
        for _ in range(60):
            app.post_message(events.Key("down", None))
        for _ in range(5):
            await pilot.pause()
        row = row_of(screen.served.row_starts, screen.served.cursor)
        assert row == 60
        assert screen.kept.cursor == screen.served.cursor
        assert screen.kept.scroll_y == screen.served.scroll_y > 0
