"""Curation at scale, in the app: marks (one, a range, everything the filter shows), bulk verdicts,
tags and notes confirmed with the count, `u` undoing the latest action wherever it was made, an earlier one
from the undo list, the tag dialog, the tag filter and column, and the export dialog."""

from __future__ import annotations

import pytest
from bulk_store import FINDING, fill_500
from textual.widgets import Input, Select
from ui.helpers import settle

from tokview.store import SampleFilter, Store
from tokview.store import bulk_review as bulk
from tokview.ui.screens.export_dialog import ExportDialog
from tokview.ui.screens.modals import ActionsDialog, BulkApprove, Confirm, RejectReason, TagDialog
from tokview.ui.screens.samples import SamplesScreen


@pytest.fixture
def store500(tmp_path):
    with Store(tmp_path / "500.duckdb") as store:
        fill_500(store)
        yield store


def app_on(store, tokenizer, profile):
    from tokview.ui.app import TokviewApp
    from tokview.ui.session import Session

    return TokviewApp(Session(store, tokenizer=tokenizer, profile=profile, who="tester"))


def counts(store) -> dict[str, int]:
    return dict(store.query("SELECT status, count(*) FROM samples GROUP BY 1"))


async def mark_rows(app, pilot, first: int, last: int) -> None:
    """Mark rows first..last as a person does: space on the first, move, M on the last."""
    screen = app.screen
    screen.sample_list.cursor = first
    await pilot.press("space")
    screen.sample_list.cursor = last
    await pilot.press("M")
    await pilot.pause()


async def test_done_when_in_the_app(store500, tokenizer, profile, tmp_path):
    """Curation at scale end to end: filter by finding, bulk-reject 200 with a reason, tag 50, approve the rest
    (the invalid ones asked about once), undo the bulk reject, export --tag with the right counts."""
    app = app_on(store500, tokenizer, profile)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        screen = app.screen
        assert isinstance(screen, SamplesScreen)
        screen.query_one("#code", Select).value = FINDING
        await settle(app, pilot)
        assert screen.sample_list.count == 400

        await mark_rows(app, pilot, 0, 199)
        assert len(screen.marks) == 200
        assert "200 marked" in str(screen.query_one("#samples-title").render())
        await pilot.press("r")
        assert isinstance(app.screen, RejectReason)
        await pilot.press("tab", *"loops", "enter")
        assert isinstance(app.screen, Confirm)
        assert "200" in app.screen.question
        await pilot.press("y")
        await settle(app, pilot)
        assert counts(store500) == {"rejected": 200, "pending": 300}
        assert len(screen.marks) == 0  # done: the marks go

        await mark_rows(app, pilot, 200, 249)
        await pilot.press("t")
        assert isinstance(app.screen, TagDialog)
        await pilot.press(*"hard", "enter")
        assert isinstance(app.screen, Confirm)
        assert "50" in app.screen.question
        await pilot.press("y")
        await settle(app, pilot)
        assert store500.count_samples() == 500
        assert len(bulk.select(store500, SampleFilter(), ["hard"])) == 50

        screen.query_one("#status", Select).value = "pending"
        await settle(app, pilot)
        assert screen.sample_list.count == 200
        await pilot.press("asterisk")  # everything the filter shows
        assert len(screen.marks) == 200
        await pilot.press("a")
        assert isinstance(app.screen, BulkApprove)  # asked once for the 50 invalid ones
        assert "50 of them have error findings" in app.screen.detail
        await pilot.press("y")
        await settle(app, pilot)
        assert counts(store500) == {"rejected": 200, "approved": 200, "pending": 100}
        overrides = store500.query("SELECT count(*) FROM verdicts WHERE override AND NOT undone")[0][0]
        assert overrides == 50

        await pilot.press("U")  # the undo list: the bulk reject is third, after the approve and the tag
        assert isinstance(app.screen, ActionsDialog)
        await pilot.press("down", "down", "enter")
        await settle(app, pilot)
        assert counts(store500) == {"approved": 200, "pending": 300}
        said = [n.message for n in app._notifications]
        assert any("undid" in m and "rejected 200 samples (loops)" in m and "a-000" in m for m in said), said

        await pilot.press("E")
        dialog = app.screen
        assert isinstance(dialog, ExportDialog)
        out = tmp_path / "hard.jsonl"
        dialog.query_one("#export-tags", Input).value = "hard"
        dialog.query_one("#export-path", Input).value = str(out)
        await pilot.press("ctrl+s")
        await settle(app, pilot)
        summary = str(dialog.query_one("#export-summary").render())
        assert "exported 50 of 50 selected samples" in summary
        assert "by tag: 50 hard" in summary
        assert len(out.read_text().splitlines()) == 50


async def test_u_undoes_the_latest_action_from_tokview_review_and_names_its_samples(make_app, store):
    ids = bulk.select(store, SampleFilter(run_id="run-b"))
    store.record_verdict(ids[0], "approved", who="ann")
    bulk.set_status(store, ids, "rejected", who="carol", reason="loops", source="review")
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("u")  # the cursor is on a run-a sample: u still undoes carol's bulk reject
        await settle(app, pilot)
        assert app.screen.question == "Undo carol's action?"  # not the reviewer's own: asked first
        await pilot.press("y")
        await settle(app, pilot)
        assert store.count_samples(SampleFilter(status="rejected")) == 0
        assert store.load_sample(ids[0]).status == "approved"
        message = [n.message for n in app._notifications][-1]
        assert f"rejected {len(ids)} samples (loops) by carol" in message
        assert ids[0] in message
        assert app.screen.sample_list.row(0).status == "pending"


async def test_the_tag_dialog_offers_the_stores_tags_and_removes_one(make_app, store):
    sid = "p000@demo_gen0"
    store.add_note("p001@demo_gen0", "", tags=["Math", "easy"], who="ann")
    store.add_note(sid, "", tags=["long", "math"], who="ann")
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("t")
        dialog = app.screen
        assert isinstance(dialog, TagDialog)
        options = dialog.query_one("#tag-options")
        offered = [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]
        assert offered == ["remove long", "remove math", "add easy (1)"]  # Math is math: not offered twice
        await pilot.press("tab", "down", "enter")  # the second offered: take math off
        await settle(app, pilot)
        assert store.load_sample(sid).tags == ["long"]
        assert store.load_sample("p001@demo_gen0").tags == ["easy", "Math"]  # only the sample under the cursor
        await pilot.press("t", *"-LONG", "enter")  # typed: -tag takes one off, any case
        await settle(app, pilot)
        assert store.load_sample(sid).tags == []
        await pilot.press("u")  # the untag is one action: u puts long back
        await settle(app, pilot)
        assert store.load_sample(sid).tags == ["long"]


async def test_tags_column_and_tag_filter(make_app, store):
    store.add_note("p002@demo_gen0", "", tags=["Hard"], who="ann")
    store.add_note("p004@demo_gen0", "", tags=["hard", "x"], who="ann")
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        screen = app.screen
        lst = screen.sample_list
        assert "tags" in lst.render_line(0).text
        assert "Hard" in lst.render_line(3).text
        assert "hard" not in lst.render_line(2).text.lower()
        tag_select = screen.query_one("#tag", Select)
        assert [str(o[0]) for o in tag_select._options[1:]] == ["Hard (2)", "x (1)"]
        tag_select.value = "Hard"  # the tag as the store spells it first; the SQL lowers both sides
        await settle(app, pilot)
        assert lst.count == 2
        assert "tag=Hard" in str(screen.query_one("#samples-title").render())


def test_ids_of_turns_and_of_mixed_prompts_keep_what_tells_them_apart_not_the_run_hash():
    """A mixed store shares no prefix: the cut kept the end of each id, the settings hash every row of a run has, so
    the turns of `agent-two-user-turns` (and `agent-parallel-2` beside `-3`) read alike at 80 and 100 columns."""
    from tokview.ui.widgets.sample_list import fit_distinct, shared_affixes

    ids = [f"agent-two-user-turns#turn{k}@4b8746eb17e0_gen0" for k in range(3)]
    ids += [
        "agent-parallel-2#turn0@4b8746eb17e0_gen0",
        "agent-parallel-3#turn0@4b8746eb17e0_gen0",
        "p001@1a2b3c4d5e6f_gen0",
    ]
    prefix, suffix = shared_affixes(ids)
    for width in (18, 24, 30):
        shown = [fit_distinct(i, width, prefix, suffix) for i in ids]
        assert len(set(shown)) == len(ids), shown
        assert all(len(s) == width for s in shown)


async def test_at_80x24_rows_keep_the_part_of_the_id_that_differs(store, tokenizer, profile):
    from tokview.ui.app import TokviewApp
    from tokview.ui.session import Session

    store.execute(
        "UPDATE samples SET sample_id = 'typed-conversation-' || prompt_id || '-of-0030@qwen3-8b-nightly-run_gen0', "
        "run_id = 'nightly-2026-12-01-' || run_id"
    )
    app = TokviewApp(Session(store, tokenizer=tokenizer, profile=profile, who="tester"))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        lst = app.screen.sample_list
        lines = [lst.render_line(y).text for y in range(1, 11)]
        assert len(set(lines)) == 10
        assert all(f"p{i:03d}" in line for i, line in enumerate(lines)), lines
        assert all("run-a" in line for line in lines[:10])  # the run's differing end too
        assert "sample" in lst.render_line(0).text
        for widget_id in ("#search", "#status", "#code", "#run", "#tag"):  # every filter keeps a usable width
            assert app.screen.query_one(widget_id).size.width >= 10, widget_id


async def test_bulk_approve_of_only_the_valid_ones_untag_and_note_on_marks(make_app, store):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        screen = app.screen
        await mark_rows(app, pilot, 0, 5)  # p000 and p005 are truncated: invalid
        await pilot.press("a")
        assert isinstance(app.screen, BulkApprove)
        assert "2 of them have error findings" in app.screen.detail
        await pilot.press("v")
        await settle(app, pilot)
        assert [r.status for r in store.samples_page(SampleFilter(), "sample_id", 0, 6)] == [
            "pending",
            "approved",
            "approved",
            "approved",
            "approved",
            "pending",
        ]
        assert len(screen.marks) == 0
        await mark_rows(app, pilot, 1, 3)
        await pilot.press("t", *"Math, long", "enter", "y")
        await settle(app, pilot)
        assert len(bulk.select(store, SampleFilter(), ["math"])) == 3
        await mark_rows(app, pilot, 2, 3)
        await pilot.press("t")
        assert [str(o.prompt) for o in app.screen.query_one("#tag-options").options] == ["remove long", "remove Math"]
        await pilot.press("tab", "down", "enter")
        assert isinstance(app.screen, Confirm)
        assert app.screen.question == "Take tag Math off 2 marked samples?"
        await pilot.press("y")
        await settle(app, pilot)
        assert bulk.select(store, SampleFilter(), ["MATH"]) == ["p001@demo_gen0"]
        await pilot.press("asterisk", "n", *"seen twice", "enter", "y")  # every sample the list shows
        await settle(app, pilot)
        assert store.count_samples(SampleFilter(text="seen twice")) == 30
        await pilot.press("u")  # the note on 30, as one step
        await settle(app, pilot)
        assert store.count_samples(SampleFilter(text="seen twice")) == 0
        await pilot.press("u")  # then the untag: Math is back on both
        await settle(app, pilot)
        assert len(bulk.select(store, SampleFilter(), ["math"])) == 3


async def test_the_palette_offers_export_and_the_undo_list(make_app):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert "Export" in titles
        assert "Undo an earlier action" in titles


async def test_the_export_dialog_says_a_bad_path_in_one_line(make_app, tmp_path):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("E")
        dialog = app.screen
        dialog.query_one("#export-path", Input).value = str(tmp_path / "out.parquet")  # the default format: JSONL
        await pilot.press("ctrl+s")
        await settle(app, pilot)
        said = str(dialog.query_one("#export-summary").render())
        assert "names a .parquet file" in said
        assert "\n" not in said.strip()
        assert not (tmp_path / "out.parquet").exists()
        dialog.query_one("#export-format", Select).value = "parquet"
        await pilot.pause()
        assert dialog.query_one("#export-path", Input).value.endswith("out.parquet")  # a typed path is kept
        await pilot.press("ctrl+s")
        await settle(app, pilot)
        assert str(dialog.query_one("#export-summary").render()).startswith("exported 24 of 24 selected samples")
        assert (tmp_path / "out.parquet").exists()
        await pilot.press("escape")
        assert isinstance(app.screen, SamplesScreen)


@pytest.mark.parametrize("size", [(20, 8), (80, 24)])
async def test_a_page_key_in_the_export_format_list_on_a_tiny_terminal_is_no_crash(make_app, size):
    """At 20x8 the format list opened with no room for its lines, and pagedown crashed the app in Textual's
    `OptionList._move_page` (KeyError: 0)."""
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        await pilot.press("E")
        await settle(app, pilot)
        assert isinstance(app.screen, ExportDialog)
        for key in ("down", "pagedown", "pageup", "pagedown", "escape"):
            await pilot.press(key)
            await pilot.pause(0.05)
        assert app._exception is None and isinstance(app.screen, ExportDialog)


async def test_bulk_approve_of_samples_approved_already_asks_no_override(make_app, store):
    """Marked samples approved already (their error findings overridden then) asked again for an override, though
    approving them changes nothing."""
    ids = [r.sample_id for r in store.samples_page(SampleFilter(), "sample_id", 0, 6)]
    for sample_id in ids:
        store.record_verdict(sample_id, "approved", override=True)
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await mark_rows(app, pilot, 0, 5)  # p000 and p005 are truncated: invalid, approved as overrides
        await pilot.press("a")
        assert isinstance(app.screen, Confirm), type(app.screen).__name__


async def test_a_range_runs_from_where_the_last_marked_sample_is_now(store500, tokenizer, profile):
    """`M` ran from the row number of the last mark: after a new filter or order it marked rows nobody chose. It runs
    from where that sample is now, and from the cursor alone when the filter left it out."""
    from tokview.ui.screens.samples import ORDERS

    order = ORDERS[0]  # the list's own
    every = store500.reads.sample_ids_page(SampleFilter(), order, 0, 500)
    narrowed = store500.reads.sample_ids_page(SampleFilter(run_id="r3"), order, 0, 500)
    moved = next(s for k, s in enumerate(narrowed) if every.index(s) != k)  # on another row once narrowed
    left_out = next(s for s in every if s not in narrowed)
    app = app_on(store500, tokenizer, profile)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        screen = app.screen
        for marked, expected in ((moved, None), (left_out, 1)):
            screen.marks.clear()
            screen.query_one("#run", Select).value = Select.NULL
            await settle(app, pilot)
            screen.sample_list.cursor = every.index(marked)
            await settle(app, pilot)  # its page loaded
            await pilot.press("space")
            assert marked in screen.marks
            screen.query_one("#run", Select).value = "r3"
            await settle(app, pilot)
            screen.sample_list.cursor = 3
            await pilot.press("M")
            await pilot.pause()
            if expected is None:  # from the marked sample's row now to the cursor
                low, high = sorted((narrowed.index(marked), 3))
                assert set(screen.marks.ids()) == set(narrowed[low : high + 1])
            else:  # the marked sample is not listed: the cursor's row alone joins it
                assert set(screen.marks.ids()) == {marked, narrowed[3]}


async def test_the_export_dialog_writes_beside_the_store_and_asks_before_replacing_a_file(make_app, tmp_path):
    """Its default was a bare `export.jsonl` (the folder the app was started from), and ctrl+s replaced an earlier
    export there without a word."""
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("E")
        dialog = app.screen
        path = dialog.query_one("#export-path", Input)
        assert path.value == str((tmp_path / "export.jsonl").resolve())  # the store is tmp_path/ui.duckdb
        dialog.query_one("#export-format", Select).value = "parquet"
        await pilot.pause()
        assert path.value == str((tmp_path / "export.parquet").resolve())
        dialog.query_one("#export-format", Select).value = "speculators"
        await pilot.pause()
        (tmp_path / "export.jsonl").write_text("an earlier export\n")
        await pilot.press("ctrl+s")
        await settle(app, pilot)
        said = str(dialog.query_one("#export-summary").render())
        assert "exists: ctrl+s again replaces it" in said
        assert (tmp_path / "export.jsonl").read_text() == "an earlier export\n"
        from textual.widgets import Switch

        dialog.query_one(
            "#export-invalid", Switch
        ).value = True  # a refused ctrl+s between: the question is asked again
        await pilot.press("ctrl+s")
        await settle(app, pilot)
        dialog.query_one("#export-invalid", Switch).value = False
        await pilot.press("ctrl+s")
        await settle(app, pilot)
        assert "exists: ctrl+s again replaces it" in str(dialog.query_one("#export-summary").render())
        assert (tmp_path / "export.jsonl").read_text() == "an earlier export\n"
        await pilot.press("ctrl+s")
        await settle(app, pilot)
        assert str(dialog.query_one("#export-summary").render()).startswith("exported 24 of 24 selected samples")
        assert (tmp_path / "export.jsonl").read_text() != "an earlier export\n"
        said = [n.message for n in app._notifications]  # seen at 80x24 too, where the summary is below the fold
        assert any(str(m).startswith("exported 24 of 24 selected samples") for m in said), said
        assert any("exists: ctrl+s again replaces it" in str(m) for m in said), said  # the warning too
        assert any("+invalid goes with the approved selection" in str(m) for m in said), said


async def test_the_export_dialogs_default_is_a_folder_it_can_write(make_app, tmp_path, monkeypatch):
    """A store on a read-only mount (opened read-only: export works) offered `export.jsonl` beside it, which ctrl+s
    could not write. The folder is denied through the dialog's check (the tests may run as root, whom no mode stops)."""
    from pathlib import Path

    import tokview.ui.screens.export_dialog as export_dialog

    store_folder, cwd = tmp_path.resolve(), tmp_path / "work"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(export_dialog, "writable", lambda p: Path(p).resolve() != store_folder)
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("E")
        assert app.screen.query_one("#export-path", Input).value == str(cwd.resolve() / "export.jsonl")


async def test_the_export_dialog_writes_the_file_it_checked_under_a_home_path(make_app, tmp_path, monkeypatch):
    """`~/e.jsonl` was checked as $HOME/e.jsonl and written to a `~` folder under the working directory."""
    monkeypatch.setenv("HOME", str(tmp_path))
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("E")
        dialog = app.screen
        dialog.query_one("#export-path", Input).value = "~/e.jsonl"
        assert dialog.request().out == str(tmp_path / "e.jsonl")


async def test_a_read_only_store_says_so_at_the_key_before_any_dialog(
    read_only_mount, filled_store_file, tokenizer, profile
):
    """On a read-only mount each verdict, tag and undo went through its dialogs (the reason, the count) and then
    failed as "cannot read STORE: … SELECT … read-only mode" (its action number is drawn by a query)."""
    import shutil

    from tokview.ui.app import TokviewApp
    from tokview.ui.session import Session

    where, make_read_only = read_only_mount
    shutil.copyfile(filled_store_file, where / "ui.duckdb")
    make_read_only()
    with Store(where / "ui.duckdb") as store:
        app = TokviewApp(Session(store, tokenizer=tokenizer, profile=profile, who="tester"))
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(app, pilot)
            assert store.read_only
            for key in ("a", "r", "t", "n", "u", "space", "a", "g"):
                await pilot.press(key)
                await pilot.pause()
                if key != "space":
                    assert isinstance(app.screen, SamplesScreen), key  # no dialog asked anything first
            said = [n.message for n in app._notifications]
            assert len(said) == 7 and all("is read-only: verdicts, notes, tags, undo and generation" in m for m in said)
            assert store.query("SELECT count(*) FROM verdicts") == [(0,)]


async def test_the_export_dialog_refuses_what_export_refuses_before_asking_to_replace(make_app, store, tmp_path):
    """`+invalid` with `valid` or `all` was ignored without a word (the CLI refuses it); a path at a store was first
    offered to be replaced ("exists: ctrl+s again replaces it") and only then refused."""
    from textual.widgets import Switch

    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("E")
        dialog = app.screen
        dialog.query_one("#export-path", Input).value = str(tmp_path / "out.jsonl")
        dialog.query_one("#export-invalid", Switch).value = True
        await pilot.press("ctrl+s")
        await settle(app, pilot)
        said = str(dialog.query_one("#export-summary").render())
        assert said == "+invalid goes with the approved selection (valid leaves every invalid sample out)", said
        assert not (tmp_path / "out.jsonl").exists()
        dialog.query_one("#export-invalid", Switch).value = False
        dialog.query_one("#export-path", Input).value = store.path
        for _ in range(2):
            await pilot.press("ctrl+s")
            await settle(app, pilot)
            said = str(dialog.query_one("#export-summary").render())
            assert said == f"{store.path} is a DuckDB database (a store?): choose another file", said
        assert store.count_samples() == 30


async def test_a_bulk_verdict_says_how_many_marked_samples_it_overturns(make_app, store):
    """A bulk approve over rejected samples overturned them behind "Approve 6 marked samples?": the question says so
    (`tokview review` asks for a --status instead)."""
    ids = [r.sample_id for r in store.samples_page(SampleFilter(), "sample_id", 0, 6)]
    for sample_id in ids[1:3]:
        store.record_verdict(sample_id, "rejected", reason="dull")
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await mark_rows(app, pilot, 0, 5)
        await pilot.press("a")
        assert "2 of them are rejected: this overturns their verdict" in app.screen.detail, app.screen.detail
