"""Curation flows: every verdict, note and tag lands in DuckDB at the key press; undo; next pending."""

from __future__ import annotations

import pytest
from textual.notifications import Notify
from ui.helpers import open_first, settle

from tokview.ui.screens.inspect import InspectScreen
from tokview.ui.screens.modals import REJECT_REASONS, Confirm, RejectReason, TextPrompt
from tokview.ui.screens.samples import SamplesScreen


async def test_approve_reject_undo_land_in_duckdb(make_app, store):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        sid = await open_first(app, pilot)
        assert sid == "p000@demo_gen0"  # truncated: an error finding, so approving asks first
        await pilot.press("a")
        assert isinstance(app.screen, Confirm)
        assert "truncated" in str(app.screen.detail)
        await pilot.press("escape")
        await pilot.pause()
        assert store.load_sample(sid).status == "pending"
        await pilot.press("a", "y")
        await pilot.pause()
        stored = store.load_sample(sid)
        assert stored.status == "approved"
        assert stored.history[-1]["override"] is True
        assert stored.history[-1]["who"] == "tester"
        await pilot.press("r")
        assert isinstance(app.screen, RejectReason)
        await pilot.press("down", "enter")  # the second listed reason
        await pilot.pause()
        stored = store.load_sample(sid)
        assert stored.status == "rejected"
        assert stored.history[-1]["reason"] == REJECT_REASONS[1]
        assert app.screen.data.status == "rejected"  # the title follows the store
        await pilot.press("u")
        assert store.load_sample(sid).status == "approved"
        await pilot.press("u")
        assert store.load_sample(sid).status == "pending"


async def test_typed_reject_reason_note_and_tags(make_app, store):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        sid = await open_first(app, pilot)
        await pilot.press("r", "tab")
        await pilot.press(*"loops", "enter")
        await pilot.pause()
        stored = store.load_sample(sid)
        assert stored.status == "rejected"
        assert stored.history[-1]["reason"] == "loops"
        await pilot.press("n")
        assert isinstance(app.screen, TextPrompt)
        await pilot.press(*"closer", "enter")
        await pilot.press("t", *"math,long", "enter")
        await pilot.pause()
        stored = store.load_sample(sid)
        assert "closer" in stored.notes
        assert set(stored.tags) >= {"math", "long"}
        await pilot.press("n", "escape")  # a cancelled note writes nothing
        assert len(store.load_sample(sid).notes) == 1


async def test_verdict_on_the_list_updates_the_row(make_app, store):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("down", "a")
        screen = app.screen
        assert isinstance(screen, SamplesScreen)
        assert screen.sample_list.row(1).status == "approved"
        assert store.load_sample("p001@demo_gen0").status == "approved"


async def test_a_reviewed_row_repaints_when_the_list_has_a_scrollbar(make_app, store):
    """The row cache is keyed by the width inside the scrollbar: clearing it by the widget's full width left
    the old line on screen (a row just approved still read `pending`) whenever the list scrolled."""
    app = make_app()
    async with app.run_test(size=(120, 16)) as pilot:
        await settle(app, pilot)
        screen = app.screen
        assert isinstance(screen, SamplesScreen)
        lst = screen.sample_list
        assert lst.scrollable_content_region.width < lst.size.width  # a scrollbar takes a column
        await pilot.press("down")
        await settle(app, pilot)
        before = lst.render_line(2).text
        await pilot.press("a")
        await settle(app, pilot)
        after = lst.render_line(2).text
    assert lst.row(1).status == "approved"
    assert after != before
    assert "approved" in after


async def test_next_unreviewed_skips_reviewed_samples(make_app, store):
    store.record_verdict("p001@demo_gen0", "approved")
    store.record_verdict("p002@demo_gen0", "rejected", reason="duplicate")
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("right_square_bracket")
        await settle(app, pilot)
        assert app.screen.sample_list.cursor == 3
        await pilot.press("enter")
        await settle(app, pilot)
        await pilot.press("a", "right_square_bracket")  # from inspect: opens the next pending sample
        await settle(app, pilot)
        assert isinstance(app.screen, InspectScreen)
        assert app.screen.data.sample_id == "p004@demo_gen0"
        assert store.load_sample("p003@demo_gen0").status == "approved"


@pytest.mark.parametrize("status", [None, "pending"])
async def test_next_unreviewed_from_a_sample_opened_elsewhere_starts_at_that_samples_row(make_app, store, status):
    """A sample opened from a session's turns (or by w/W) has no row of the list: `]` and auto-advance counted from
    the list's cursor, so approving a session's third turn opened its first. Filtered to pending, its row was then
    looked up after the verdict, when the rejected sample had already left the list: the cursor again."""
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        screen = app.screen
        assert isinstance(screen, SamplesScreen) and screen.sample_list.cursor == 0
        if status is not None:
            screen.query_one("#status").value = status
            await settle(app, pilot)
        app.open_sample("p005@demo_gen0")  # as the sessions screen opens a turn: no list row
        await settle(app, pilot)
        assert isinstance(app.screen, InspectScreen)
        await pilot.press("r", "enter", "right_square_bracket")
        await settle(app, pilot)
        assert isinstance(app.screen, InspectScreen)
        assert app.screen.data.sample_id == "p006@demo_gen0"


async def test_next_unreviewed_in_a_list_filtered_to_pending_takes_the_next_row_not_the_one_after(make_app, store):
    """Filtered to pending, a verdict takes the judged sample out of the list: `]` counted from its old row and
    skipped the pending sample that took it (every other one), and the list's cursor drifted from the open
    sample. `]` starts after the sample the user is on, and the list is read again after the verdict."""
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        screen = app.screen
        assert isinstance(screen, SamplesScreen)
        screen.query_one("#status").value = "pending"
        await settle(app, pilot)
        order = [screen.sample_list.row(i).sample_id for i in range(3)]
        await pilot.press("enter")
        await settle(app, pilot)
        await pilot.press("r", "enter")  # rejected: out of the pending list
        await settle(app, pilot)
        await pilot.press("right_square_bracket")
        await settle(app, pilot)
        assert isinstance(app.screen, InspectScreen)
        assert app.screen.data.sample_id == order[1]
        await pilot.press("r", "enter", "right_square_bracket")
        await settle(app, pilot)
        assert app.screen.data.sample_id == order[2]
        assert screen.sample_list.cursor == 0  # the first row of the pending list now: the two judged left it
    assert [store.load_sample(s).status for s in order] == ["rejected", "rejected", "pending"]


async def test_a_verdict_on_a_sample_opened_from_its_chain_shows_in_the_list(make_app, store):
    """A sample opened without its list row (w/W along a chain, a session's turns) had its verdict stored but the
    list kept showing it pending: the list is read again."""
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        screen = app.screen
        assert isinstance(screen, SamplesScreen)
        app.open_sample("p001@demo_gen0")  # no row index: how w/W and the turns table open a sample
        await settle(app, pilot)
        await pilot.press("a")
        await settle(app, pilot)
        await pilot.press("escape")
        await settle(app, pilot)
        assert screen.sample_list.row(1).sample_id == "p001@demo_gen0"
        assert screen.sample_list.row(1).status == "approved"


async def test_a_sample_that_loads_while_a_dialog_is_open_waits_for_the_dialog(make_app, store):
    """`]` then `n` before the next sample loaded (a long sample, a busy machine): the sample was pushed over the
    note dialog and took its keys (the note's letters became tags on the new sample, no note saved). It is shown
    once the dialog closes; the note goes to the sample it was begun on."""
    import threading

    app = make_app()
    loads = threading.Event()
    slow_load = app.session.load

    def load(sample_id: str):  # the next sample takes a moment
        if sample_id != "p000@demo_gen0":
            loads.wait(10)
        return slow_load(sample_id)

    app.session.load = load
    async with app.run_test(size=(120, 40)) as pilot:
        sid = await open_first(app, pilot)
        await pilot.press("right_square_bracket", "n")
        assert isinstance(app.screen, TextPrompt)
        loads.set()
        await pilot.pause(0.3)
        assert isinstance(app.screen, TextPrompt)  # the loaded sample waits under no dialog
        await pilot.press(*"typed note", "enter")
        await settle(app, pilot)
        await pilot.pause(0.3)
        assert isinstance(app.screen, InspectScreen)
        assert app.screen.data.sample_id == "p001@demo_gen0"
    assert "typed note" in store.load_sample(sid).notes
    assert store.load_sample("p001@demo_gen0").tags == []


async def test_approving_a_valid_sample_asks_nothing_and_is_no_override(make_app, store):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("down", "a")  # p001: valid
        await pilot.pause()
        assert isinstance(app.screen, SamplesScreen)
        h = store.load_sample("p001@demo_gen0").history[-1]
        assert (h["status"], h["override"], h["who"]) == ("approved", False, "tester")


async def test_undo_after_a_tag_takes_back_the_tag_not_the_verdict(make_app, store):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("down", "a")
        await pilot.press("t", *"math", "enter")
        await pilot.pause()
        assert store.load_sample("p001@demo_gen0").tags == ["math"]
        await pilot.press("u")
        stored = store.load_sample("p001@demo_gen0")
        assert stored.tags == []
        assert stored.status == "approved"
        await pilot.press("u")
        assert store.load_sample("p001@demo_gen0").status == "pending"


async def test_taking_off_a_tag_the_sample_lacks_records_nothing_and_u_keeps_the_earlier_action(make_app, store):
    """`-nosuch` said "took off nosuch · (u undoes)" though nothing was written, and the next `u` took back the
    approval before it. Typed adds beside a removal (or two removals) were dropped unsaid: refused in the dialog."""
    from textual.notifications import Notify

    from tokview.ui.screens.modals import TagDialog, TagInputError, parse_tags

    app = make_app()
    said: list = []
    async with app.run_test(size=(120, 40), message_hook=said.append) as pilot:
        await settle(app, pilot)
        await pilot.press("down", "a", "down")
        await pilot.press("t", *"-nosuch", "enter")
        await pilot.pause()
        told = [str(m.notification.message) for m in said if isinstance(m, Notify)]
        assert any("has no tag nosuch · nothing recorded" in t for t in told), told
        await pilot.press("t", *"new,-keep", "enter")
        await pilot.pause()
        assert isinstance(app.screen, TagDialog)  # refused: the dialog stays for another entry
        await pilot.press("escape")
        assert store.load_sample("p002@demo_gen0").history == []
        assert store.load_sample("p001@demo_gen0").status == "approved"
        await pilot.press("u")
        await pilot.pause()
        assert store.load_sample("p001@demo_gen0").status == "pending"  # the approval, the latest action
    for typed, why in (("new,-keep", "not both"), ("-x,-y", "one tag at a time")):
        with pytest.raises(TagInputError, match=why):
            parse_tags(typed)
    assert parse_tags("Foo, foo,FOO ,bar").add == ["Foo", "bar"]
    assert parse_tags("-, a").add == ["a"] and parse_tags("-a, -A").remove == "a" and parse_tags(" - ") is None


async def test_curation_keys_with_no_sample_open_no_dialog(make_app, tmp_path, tokenizer, profile):
    """An empty list: n / t / r say there is no sample instead of asking for text that goes nowhere."""
    from tokview.store import Store
    from tokview.ui.app import TokviewApp
    from tokview.ui.session import Session

    with Store(tmp_path / "empty.duckdb") as empty:
        app = TokviewApp(Session(empty, tokenizer=tokenizer, profile=profile))
        said: list = []
        async with app.run_test(size=(120, 40), message_hook=said.append) as pilot:
            await settle(app, pilot)
            for key in ("n", "t", "r", "a"):
                await pilot.press(key)
                await pilot.pause()
                assert isinstance(app.screen, SamplesScreen), key
            assert any("no sample here" in str(m.notification.message) for m in said if isinstance(m, Notify))


async def test_inspect_shows_who_rejected_it_why_and_the_notes(make_app, store):
    store.record_verdict("p000@demo_gen0", "rejected", reason="duplicate", who="alice")
    store.add_note("p000@demo_gen0", "same as p007", who="bob")
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await open_first(app, pilot)
        review = str(app.screen.query_one("#inspect-review").render())
        assert "rejected by alice" in review
        assert "reason: duplicate" in review
        assert "note: same as p007" in review
        await pilot.press("u", "y")  # the note goes first, then the verdict (other reviewers': asked first)
        await pilot.press("u", "y")
        await pilot.pause()
        review = str(app.screen.query_one("#inspect-review").render())
        assert "no verdict yet" in review
        assert "same as p007" not in review


async def test_a_long_reject_reason_keeps_the_notes_in_view_at_80_columns(make_app, store):
    """The review line wrapped a long reason over its three rows at 80×24, and the notes below it were cut."""
    from textual.geometry import Region

    store.record_verdict("p000@demo_gen0", "rejected", reason="the answer repeats itself " * 8, who="alice")
    store.add_note("p000@demo_gen0", "same as p007", who="bob")
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await open_first(app, pilot)
        review = app.screen.query_one("#inspect-review")
        lines = [s.text for s in review.render_lines(Region(0, 0, review.size.width, review.size.height))]
        assert len(lines) == 2, lines
        assert lines[0].rstrip().endswith("…") and "rejected by alice" in lines[0]
        assert "note: same as p007" in lines[1]
        assert "the answer repeats itself " * 8 in str(review.tooltip)  # the whole reason, for the mouse
        await pilot.press("u", "y")  # bob's note taken back (asked first): the reason may wrap again
        await pilot.pause()
        lines = [s.text for s in review.render_lines(Region(0, 0, review.size.width, review.size.height))]
        assert len(lines) > 2 and "…" not in lines[0], lines


def test_reviewer_is_the_flag_else_the_config_else_the_login(monkeypatch):
    from tokview.commands.ui import reviewer_name

    monkeypatch.setenv("USER", "carol")
    assert reviewer_name("bob", "alice") == "bob"
    assert reviewer_name(None, "alice") == "alice"
    assert reviewer_name(None, None) == "carol"


def test_a_version_2_store_gains_the_override_column_and_keeps_its_verdicts(tmp_path):
    """Migration 3 on a file made before it: old verdicts read as no override; new ones record it."""
    import duckdb

    from tokview.store import Store
    from tokview.store.schema import MIGRATIONS

    path = tmp_path / "v2.duckdb"
    conn = duckdb.connect(str(path))
    conn.execute("CREATE TABLE schema_version (version INTEGER, name VARCHAR, applied_at TIMESTAMP)")
    for version, name, statements in MIGRATIONS:
        if version > 2:
            break
        for sql in statements:
            conn.execute(sql)
        conn.execute("INSERT INTO schema_version VALUES (?, ?, now())", [version, name])
    conn.execute(
        "INSERT INTO verdicts (sample_id, \"at\", who, kind, status) VALUES ('s', now(), 'al', 'verdict', 'approved')"
    )
    conn.close()
    with Store(path) as store:
        rows = store.query("SELECT who, status, override FROM verdicts")
        assert rows == [("al", "approved", False)]


async def test_a_store_held_too_long_is_a_notification_not_a_crash(make_app, store, monkeypatch):
    """Another process holding the file past the wait: the app once ended on the StoreError (exit 0)."""
    from tokview.store import StoreError

    def held(*_a, **_k):
        raise StoreError(f"the store {store.path} is in use by tokview batch (pid 1): gave up after 15s")

    monkeypatch.setattr(store, "record_verdict", held)
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("down", "a")
        await settle(app, pilot)
        assert app.is_running
        assert isinstance(app.screen, SamplesScreen)
        said = [n.message for n in app._notifications]
        assert any("gave up after 15s" in m for m in said)
    assert store.load_sample("p001@demo_gen0").status == "pending"


async def test_a_sample_s_token_panes_are_built_off_the_ui_thread(make_app, store, monkeypatch):
    """Both panes' token sequences were built as the inspect screen was made, on the UI thread: 0.3 s frozen for a
    30,000-id sample (an agent's long context is more). The load worker builds them."""
    import threading

    import tokview.ui.app as app_module

    threads: list[threading.Thread] = []
    for name in ("served_seq", "kept_seq"):
        build = getattr(app_module, name)

        def recorded(*args, _build=build):
            threads.append(threading.current_thread())
            return _build(*args)

        monkeypatch.setattr(app_module, name, recorded)
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await open_first(app, pilot)
    assert len(threads) == 2
    assert threading.main_thread() not in threads


async def test_a_verdict_the_sample_has_already_records_nothing_so_u_takes_back_the_real_one(make_app, store):
    """Approving an approved sample recorded a second action: `u` then took that one back and showed the sample
    still approved, as if it did nothing. The same reason again on a rejected sample is the same verdict too."""
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("down", "a", "a")
        await pilot.pause()
        sid = "p001@demo_gen0"
        assert [h["status"] for h in store.load_sample(sid).history] == ["approved"]
        assert any("approved already" in n.message for n in app._notifications)
        await pilot.press("u")
        await pilot.pause()
        assert store.load_sample(sid).status == "pending"
        for _ in range(2):
            await pilot.press("r", "down", "enter")
            await pilot.pause()
        await pilot.press("r", "enter")  # another reason: a verdict of its own
        await pilot.pause()
        live = [h for h in store.load_sample(sid).history if h["kind"] == "verdict" and not h["undone"]]
        assert [(h["status"], h["reason"]) for h in live] == [
            ("rejected", REJECT_REASONS[1]),
            ("rejected", REJECT_REASONS[0]),
        ]
