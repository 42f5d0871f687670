"""The samples list loads pages as toolong loads lines: asked for once per frame, read by one reader, kept in an LRU."""

from __future__ import annotations

from collections import Counter

import pytest
from ui.helpers import settle

from tokview.store import SampleFilter, Store
from tokview.ui.screens.samples import PendingSearch
from tokview.ui.widgets.sample_list import PAGE, PageRequests

N = 10_000


def fill_light(store: Store, n: int) -> None:
    """n light sample rows in one statement (the list needs rows, not captures); ids sort by index."""
    store.execute(
        "INSERT INTO samples (sample_id, prompt_id, run_id, prompt_ids, output_ids, finish_reason, status, "
        "valid, n_errors, codes, prompt_len, output_len, supervised, created_at) "
        "SELECT printf('p%05d@big_gen0', i), printf('p%05d', i), 'big', [1, 2, 3], [4, 5, 6], 'stop', 'pending', "
        "true, 0, [], 3, 3, 3, TIMESTAMP '2026-01-01' + INTERVAL (i) SECOND FROM range(?) t(i)",
        [n],
    )


async def shown(app, pilot, index: int) -> None:
    """Wait (on workers and messages, never on a clock) until row `index` has been read."""
    lst = app.samples_screen.sample_list
    for _ in range(50):
        if lst.row(index) is not None:
            return
        await app.workers.wait_for_complete()
        await pilot.pause()
    raise AssertionError(f"row {index} never loaded")


@pytest.fixture
def big_app(tmp_path, tokenizer, profile):
    from tokview.ui.app import TokviewApp
    from tokview.ui.session import Session

    with Store(tmp_path / "big.duckdb") as store:
        fill_light(store, N)
        yield TokviewApp(Session(store, tokenizer=tokenizer, profile=profile)), store


async def test_scrolling_10k_samples_reads_each_page_once_and_keeps_at_most_max_pages(big_app):
    app, _store = big_app
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        lst = app.samples_screen.sample_list
        assert lst.count == N
        for y in range(0, N, PAGE):  # every page comes into view, frame after frame
            lst.scroll_to(y=y, animate=False)
            await shown(app, pilot, y)
            assert lst.loaded_pages <= lst.max_pages
        lst.action_last()
        await settle(app, pilot)
        assert lst.row(N - 1).sample_id == f"p{N - 1:05d}@big_gen0"
        assert sorted(lst.page_loads) == list(range(N // PAGE))
        assert set(lst.page_loads.values()) == {1}  # many frames asked; each page was read once
        assert lst.loaded_pages == lst.max_pages < N // PAGE
        lst.action_first()  # page 0 was dropped long ago: read again, and the bound still holds
        await settle(app, pilot)
        assert lst.row(0).sample_id == "p00000@big_gen0"
        assert lst.page_loads[0] == 2
        assert lst.loaded_pages <= lst.max_pages


async def test_next_pending_crosses_pages_of_a_10k_store(big_app):
    app, store = big_app
    store.execute("UPDATE samples SET status = 'approved' WHERE sample_id < 'p00450'")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("right_square_bracket")
        await settle(app, pilot)
        lst = app.samples_screen.sample_list
        assert lst.cursor == 450
        assert lst.row(450).sample_id == "p00450@big_gen0"  # scrolled there, and its page was read


def test_pending_search_is_a_plain_value_a_thread_can_use(tmp_path):
    with Store(tmp_path / "s.duckdb") as store:
        fill_light(store, 500)
        store.execute("UPDATE samples SET status = 'rejected' WHERE sample_id > 'p00003' AND sample_id < 'p00301'")
        search = PendingSearch(store, SampleFilter(), "created_at", 500)
        assert search.after(2) == (301, "p00301@big_gen0")
        assert search.after(499) is None


def test_next_pending_after_a_verdict_counts_from_where_the_judged_sample_went(tmp_path):
    """`]` after a verdict, from the row the judged sample was on. Sorted by status, a reject moves it below every
    pending sample and an approve above them; filtered to pending, it leaves. Counted from its row alone, the
    pending sample that took the row was skipped; anchored on where it went, the search says "none" for a reject
    in status order too. The next pending sample in the order the user saw is found each time."""
    with Store(tmp_path / "s.duckdb") as store:
        fill_light(store, 10)
        store.execute("UPDATE samples SET status = 'approved' WHERE sample_id < 'p00002'")
        ids = [f"p{i:05d}@big_gen0" for i in range(10)]

        def next_after(filters, order, index, anchor):
            return store.reads.first_pending_after(filters, order, index, anchor)

        # sorted by status: approved p0 p1, then pending p2..p9 (rows 2..9)
        store.record_verdict(ids[3], "rejected")  # row 3: now after every pending sample
        assert next_after(SampleFilter(), "status", 3, ids[3]) == (3, ids[4])
        store.record_verdict(ids[4], "approved")  # row 3 now: moved up among the approved
        assert next_after(SampleFilter(), "status", 3, ids[4]) == (4, ids[5])
        assert next_after(SampleFilter(), "status", 4, ids[5]) == (5, ids[6])  # no verdict: the row after
        pending = SampleFilter(status="pending")  # p2 p5 p6 p7 p8 p9
        store.record_verdict(ids[5], "rejected")  # row 1 of the pending list: gone from it
        assert next_after(pending, "created_at", 1, ids[5]) == (1, ids[6])
        assert next_after(pending, "created_at", 4, ids[9]) is None  # the last row
        assert next_after(SampleFilter(), "created_at", 0, "gone@nowhere") == (2, ids[2])


def test_page_requests_one_reader_newest_wishes_no_page_twice():
    def fetch_a(offset, limit):
        return []

    def fetch_b(offset, limit):
        return []

    requests = PageRequests()
    assert requests.want(1, [3, 4], fetch_a) is True  # nobody reads: start a reader
    assert requests.take() == (1, 3, fetch_a)
    assert requests.want(1, [3, 4, 5], fetch_a) is False  # the reader runs: no second one; page 3 is being read
    assert requests.want(1, [7, 8], fetch_a) is False  # scrolled on: 4 and 5 are no longer wanted
    assert requests.take() == (1, 7, fetch_a)
    assert requests.want(2, [0], fetch_b) is False  # a new filter while the reader runs: it reads on, with it
    assert requests.take() == (2, 0, fetch_b)
    assert requests.take() is None  # nothing left: the reader stops
    assert requests.want(1, [3], fetch_a) is False  # 3 is still landing (not `done`): not read twice
    requests.done((1, 3))
    assert requests.want(1, [3], fetch_a) is True
    assert requests.take() == (1, 3, fetch_a)
    requests.stopped(1)  # the reader failed on generation 1: leaves nothing behind, and
    assert requests.want(1, [3], fetch_a) is False  # does not start again on every frame for it
    assert requests.take() is None
    assert requests.want(2, [0], fetch_b) is True  # a reset (ctrl+r, a new filter) reads again


async def test_m_over_10k_rows_marks_their_ids_in_one_read_without_loading_pages(big_app):
    """`M` read every page of its range, rows and tags, on the UI thread (54 s over 169,000 rows)."""
    app, _store = big_app
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        lst = app.samples_screen.sample_list
        lst.cursor = 5
        await pilot.press("space")  # marks row 5, the cursor moves on
        lst.action_last()
        await settle(app, pilot)
        before = Counter(lst.page_loads)
        await pilot.press("M")
        await settle(app, pilot)
        marked = set(app.samples_screen.marks.ids())
        assert marked == {f"p{i:05d}@big_gen0" for i in range(5, N)}
        assert lst.page_loads == before, "no page of rows was read for the range"


async def test_a_tool_calling_turns_finish_reason_reads_whole_in_its_column(make_app, store, tokenizer, profile):
    """Six cells cut `tool_calls` to `tool_…` on every tool-calling turn, at any width."""
    from ui.helpers import settle

    from tokview.core.analysis import analyze
    from tokview.ui.examples import short_capture

    capture = short_capture()
    capture.finish_reason = "tool_calls"
    store.put_sample("calls@x", "calls", "x", capture, analyze(capture, profile, tokenizer))
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        lst = app.screen.sample_list
        lines = [lst.render_line(y).text for y in range(lst.size.height)]
        row = next(line for line in lines if "calls@x" in line)
        assert " tools " in row and "tool_…" not in row
