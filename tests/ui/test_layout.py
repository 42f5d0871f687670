"""Discoverability and layout at 80 columns: the footer shows every key, help keeps its id column, the list
says what its columns are, inspect opens where the problem is and gives the findings room."""

from __future__ import annotations

from rich.cells import cell_len
from textual.notifications import Notify
from textual.widgets import DataTable, Input
from ui.helpers import open_first, settle

from tokview.ui.bindings import KEYS
from tokview.ui.screens.help import HelpScreen
from tokview.ui.widgets.sample_list import badge_order, fit_distinct, fit_middle


def footer_keys(app) -> dict[str, object]:
    return {k.key_display: k.region for k in app.screen.query("FooterKey")}


async def test_at_80_columns_the_footer_shows_every_key_of_the_screen(make_app):
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        shown = footer_keys(app)
        assert {"g", "D", "S", "n", "t", "T", "?", "a", "r", "u", "]", "/", "o", "q"} <= set(shown)
        for key, region in shown.items():
            assert region.right <= 80, (key, region)
            assert region.y < 24, (key, region)
            assert region.width >= len(key) + 2, (key, region)
        await pilot.press("enter")
        await settle(app, pilot)
        shown = footer_keys(app)
        assert {"v", "f", "s", "esc", "?"} <= set(shown)
        assert all(r.right <= 80 and r.y < 24 for r in shown.values())


async def test_help_at_80_columns_shows_the_binding_ids(make_app):
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        table = app.screen.query_one(DataTable)
        labels = [str(c.label) for c in table.columns.values()]
        assert labels[:2] == ["keys", "id"]
        id_end = sum(c.get_render_width(table) for c in list(table.columns.values())[:2])
        assert id_end <= table.size.width
        assert table.row_count == len(KEYS)


async def test_generate_focuses_its_first_field(make_app):
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        await pilot.press("g")
        await settle(app, pilot)
        assert isinstance(app.focused, Input)
        assert app.focused.id == "server"


async def test_the_list_names_its_columns_and_shows_the_run_and_id_ends(make_app):
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        lst = app.screen.sample_list
        header = lst.render_line(0).text  # 80 columns: verdict and validity as glyphs, no finish or prompt column
        assert header.startswith("  v ok output run")
        assert " sample " in header
        assert " tags " in header
        first = lst.render_line(1).text
        assert first.startswith("  · ✗  ")
        assert "run-a" in first
        assert "gen0" in first
    wide = make_app()
    async with wide.run_test(size=(120, 24)) as pilot:
        await settle(wide, pilot)
        header = wide.screen.sample_list.render_line(0).text
        assert header.startswith("  verdict    valid finish prompt output run")
        assert "pending" in wide.screen.sample_list.render_line(1).text
    cut = fit_middle("typed-3f2a9c1b77@demo-chat_gen12", 16)
    assert len(cut) == 16
    assert cut.startswith("typed")
    assert cut.endswith("_gen12")


async def test_inspect_opens_at_the_first_error_and_lists_errors_first(make_app, store):
    app = make_app()
    async with app.run_test(size=(120, 80)) as pilot:
        sid = await open_first(app, pilot)  # p000: truncated, with a long output
        screen = app.screen
        findings = screen.data.analysis.findings
        first_error = next(f for f in findings if f.severity == "error" and f.positions)
        assert screen.served.cursor == first_error.positions[0] != 0
        listed = [findings[int(o.id.split("-")[1])].severity for o in screen.query_one("#findings").options]
        assert listed == sorted(listed, key=["error", "warn", "info"].index)
        assert screen.query_one("#inspect-bottom").size.height >= 20  # a third of 80 rows, not a fixed 8
        await pilot.press("escape", "down")
        await settle(app, pilot)
        await pilot.press("enter")
        await settle(app, pilot)
        assert app.screen.data.sample_id == "p001@demo_gen0"
        assert app.screen.data.analysis.valid
        assert app.screen.served.cursor == len(app.screen.data.capture.prompt_ids)  # the output start
        assert sid != app.screen.data.sample_id


async def test_approve_reject_and_undo_say_what_they_did(make_app):
    app = make_app()
    notes: list = []
    async with app.run_test(size=(100, 30), message_hook=notes.append) as pilot:
        await settle(app, pilot)
        await pilot.press("down", "a")
        await pilot.press("u")
        await pilot.pause()
        said = [str(m.notification.message) for m in notes if isinstance(m, Notify)]
        assert any("p001@demo_gen0: approved" in m and "u undoes" in m for m in said)
        assert any(
            "undid #" in m and "approved 1 sample by tester" in m and "(p001@demo_gen0) back to pending" in m
            for m in said
        )


async def test_the_finding_filter_dropdown_fits_the_longest_code(make_app):
    from textual.widgets import Select
    from textual.widgets._select import SelectOverlay

    from tokview.core.findings import FINDING_CODES

    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        select = app.screen.query_one("#code", Select)
        select.set_options([(c, c) for c in FINDING_CODES])
        select.focus()
        await pilot.press("enter")
        await pilot.pause()
        overlay = select.query_one(SelectOverlay)
        longest = max(len(c) for c in FINDING_CODES)
        assert overlay.scrollable_content_region.width >= longest
        assert overlay.region.right <= 80


async def test_enter_on_a_finding_without_positions_says_so(short, tokenizer, profile):
    from dataclasses import replace

    from ui.helpers import InspectApp

    from tokview.core.findings import Finding
    from tokview.ui.screens.inspect import InspectData

    capture, analysis = short
    analysis = replace(analysis, findings=[Finding("completion_count_mismatch", "error", "usage says 9", ())])
    app = InspectApp(InspectData("s1", capture, analysis), tokenizer, profile)
    notes: list = []
    async with app.run_test(size=(120, 40), message_hook=notes.append) as pilot:
        await pilot.pause()
        before = app.screen.served.cursor
        await pilot.press("f", "enter")
        await pilot.pause()
        assert app.screen.served.cursor == before
        said = [str(m.notification.message) for m in notes if isinstance(m, Notify)]
        assert any("names no token positions" in m for m in said)


async def test_the_palette_lists_each_command_once(make_app):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        for screen_keys in ((), ("enter",)):
            await pilot.press(*screen_keys)
            await settle(app, pilot)
            titles = [c.title for c in app.get_system_commands(app.screen)]
            assert len(titles) == len(set(titles)), titles
            assert "Quit" in titles
            assert "Light / dark" in titles
            assert "List" not in titles


def _from_cell(line: str, cells: int) -> str:
    """`line` from terminal cell `cells` on."""
    k = 0
    while cell_len(line[:k]) < cells:
        k += 1
    return line[k:]


async def test_a_row_whose_id_and_run_are_cjk_keeps_its_later_columns_where_an_ascii_row_has_them(make_app, store):
    """A CJK character or an emoji takes two terminal cells: an id and a run cut and padded by len() pushed that
    row's tags and findings right of every other row's (and off its end)."""
    store.execute("UPDATE samples SET sample_id = '会話サンプル一二三' || sample_id WHERE prompt_id = 'p001'")
    store.execute("UPDATE samples SET run_id = '実行🙂' || run_id WHERE prompt_id = 'p001'")
    app = make_app()
    async with app.run_test(size=(120, 24)) as pilot:
        await settle(app, pilot)
        lst = app.screen.sample_list
        rows = [lst.row(i) for i in range(lst.count)]
        wide = next(i for i, r in enumerate(rows) if r.sample_id.startswith("会話"))
        plain = next(i for i, r in enumerate(rows) if r.codes == rows[wide].codes and i != wide)
        lines = {i: lst.render_line(i + 1).text for i in (wide, plain)}
        assert "会話" in lines[wide] and "実行" in lines[wide]
        first = badge_order(rows[wide].codes)[0]
        at = cell_len(lines[plain][: lines[plain].index(first)])
        assert _from_cell(lines[wide], at).startswith(first), lines[wide]
        assert cell_len(lines[wide]) == cell_len(lines[plain]) == lst.scrollable_content_region.width


def test_fit_middle_and_fit_distinct_fill_their_cells_exactly_with_cjk_and_emoji():
    """The id column's cuts count cells: a cut that split a double-width character leaves it out, never overflows."""
    for text in (
        "会話サンプル一二三四五六七八九十@run_gen12",
        "👍🏽👨‍👩‍👧-sample-🙂🙂🙂🙂🙂_gen0",
        "a中b中c中d中e中f中g中h中",
    ):
        for width in range(1, 24):
            assert cell_len(fit_middle(text, width)) == width, (text, width)
            assert cell_len(fit_distinct(text, width, 2, 3)) == width, (text, width)
    cut = fit_middle("会話サンプル一二三四五六七八九十@run_gen12", 16)
    assert "…" in cut and cut.rstrip().endswith("_gen12")
