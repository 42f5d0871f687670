"""Compare two samples of one prompt (ids diffed, first divergence marked) and per-run stats, in the app and
from `tokview stats --by run`."""

from __future__ import annotations

import json
import time

from ui.helpers import add_sibling, settle

from tokview.store.run_stats import run_stats, siblings
from tokview.ui.id_diff import IdDiff, diff_ids, first_divergence


def test_first_divergence_and_marks():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    diff = diff_ids([1, 2, 3, 4, 5], [1, 2, 9, 3, 4, 5])  # one id inserted: only it differs, not all after
    assert diff.first == 2
    assert diff.left == frozenset()
    assert diff.right == frozenset({2})
    assert diff_ids([1, 1], [1, 1, 1]) == IdDiff(2, frozenset(), frozenset({2}))  # the suffix never takes the prefix


def test_two_long_answers_that_differ_throughout_are_marked_at_once():
    """difflib on two 19,000-id answers that differ throughout took 100 s in a worker quitting the app waited for.
    Past DIFF_WORK the middle (after the common prefix, before the common suffix) is marked whole; an answer with
    one id inserted is still diffed exactly, however long."""
    n = 19_000
    a = [(i * 7919) % 5000 for i in range(n)]
    b = a[:100] + [a[(i * 7) % n] for i in range(100, n - 50)] + a[n - 50 :]
    started = time.perf_counter()
    diff = diff_ids(a, b)
    assert time.perf_counter() - started < 5  # a hang guard, not a benchmark: it takes milliseconds
    assert diff.left == frozenset(range(100, n - 50)) and diff.right == frozenset(range(100, len(b) - 50))
    inserted = diff_ids(a, a[:9000] + [1] + a[9000:])
    assert (inserted.first, inserted.left, inserted.right) == (9000, frozenset(), frozenset({9000}))


def test_siblings_are_the_same_prompt_other_runs_first(store, tokenizer, profile):
    add_sibling(store, tokenizer, profile)
    assert siblings(store, "p001@demo_gen0") == [("p001@run-c", "run-c")]
    assert siblings(store, "p002@demo_gen0") == []


def test_a_turns_siblings_are_the_same_turn_never_another_turn_of_its_conversation(store, tokenizer, profile):
    """Every turn of a chain (or a proxied session) shares its prompt id: `d` compared turn 1 with turn 0."""
    from tokview.core.analysis import analyze
    from tokview.ui.examples import short_capture

    capture = short_capture()
    for sid, run, turn in (("c#0@a", "a", 0), ("c#1@a", "a", 1), ("c#1@b", "b", 1), ("c#2@b", "b", 2)):
        store.put_sample(sid, "chain-c", run, capture, analyze(capture, profile, tokenizer), turn=turn)
    assert siblings(store, "c#1@a") == [("c#1@b", "b")]
    assert siblings(store, "c#0@a") == []
    assert siblings(store, "c#2@b") == []


def test_run_stats_count_each_run(store, tokenizer, profile):
    add_sibling(store, tokenizer, profile)
    store.record_verdict("p001@demo_gen0", "approved")
    store.record_verdict("p020@demo_gen0", "rejected", reason="duplicate")
    runs = {r["run"]: r for r in run_stats(store)}
    assert sorted(runs) == ["run-a", "run-b", "run-c"]
    assert runs["run-a"]["samples"] == 15
    assert runs["run-a"]["by_status"]["approved"] == 1
    assert runs["run-b"]["by_status"]["rejected"] == 1
    assert runs["run-c"]["samples"] == 1
    assert runs["run-a"]["truncated"] == 3  # every fifth of p000..p014
    assert runs["run-a"]["output_len"]["max"] >= 560
    assert runs["run-c"]["findings"] == {code: 1 for code in {f.code for f in store.load_sample("p001@run-c").findings}}


async def compare_second_sample(app, pilot):
    """Open the list's second sample and compare it with its prompt's sample from another run (`d`)."""
    from tokview.ui.screens.compare import CompareScreen

    await settle(app, pilot)
    await pilot.press("down", "enter")
    await settle(app, pilot)
    await pilot.press("d")
    await settle(app, pilot)
    assert isinstance(app.screen, CompareScreen)
    return app.screen


async def test_d_in_inspect_compares_with_the_other_run_at_the_first_divergence(make_app, store, tokenizer, profile):

    other, position = add_sibling(store, tokenizer, profile)
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await compare_second_sample(app, pilot)
        assert screen.compared is not None
        assert screen.compared.right.sample_id == other
        assert screen.compared.diff.first == position
        assert screen.left.cursor == screen.right.cursor == position
        assert position in screen.left._marks
        assert position in screen.right._marks
        assert f"first divergence at position {position}" in str(screen.query_one("#compare-title").render())
        await pilot.press("right")
        assert screen.right.cursor == position + 1  # the other pane follows
        await pilot.press("escape")
        assert app.screen.__class__.__name__ == "InspectScreen"


async def test_a_divergence_past_the_shorter_samples_end_is_where_both_the_title_and_the_line_say(
    make_app, store, tokenizer, profile
):
    """A sibling cut short (its ids a prefix of the other's): the shorter pane's cursor, clamped to its end, pulled
    the other back a position, and the line below named position 51 under a title saying 52."""
    from tokview.core.analysis import analyze
    from tokview.ui.examples import short_capture

    capture = short_capture()
    cut = short_capture()
    cut.output_ids = list(capture.output_ids[:-3])
    cut.finish_reason = "length"
    store.put_sample("p001@run-c", "p001", "run-c", cut, analyze(cut, profile, tokenizer))
    first = len(cut.prompt_ids) + len(cut.output_ids)
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await compare_second_sample(app, pilot)
        await settle(app, pilot)
        assert screen.compared is not None and screen.compared.diff.first == first
        longer = screen.left if len(screen.left.seq) > len(screen.right.seq) else screen.right
        assert longer.cursor == first
        detail = str(screen.query_one("#compare-detail").render())
        assert f"[{first}]" in detail and "differ" in detail, detail


async def test_d_without_a_sibling_says_so(make_app):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("down", "enter")
        await settle(app, pilot)
        await pilot.press("d")
        await settle(app, pilot)
        assert app.screen.__class__.__name__ == "InspectScreen"
        assert any("no other sample of this prompt" in n.message for n in app._notifications)


def test_stats_by_run_prints_one_block_per_run(store, tokenizer, profile, capsys):
    from tokview.cli import main

    add_sibling(store, tokenizer, profile)
    path = store.path
    store.close()
    assert main(["stats", "--db", str(path), "--by", "run"]) == 0
    out = capsys.readouterr().out
    assert "run-a" in out
    assert "run-c" in out
    assert "1 sample " in out
    assert main(["stats", "--db", str(path), "--by", "run", "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert [r["run"] for r in runs] == ["run-a", "run-b", "run-c"]


async def test_the_stats_panel_lists_each_run(make_app, store):
    from textual.widgets import DataTable

    store.record_verdict("p001@demo_gen0", "approved")
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("S")
        await settle(app, pilot)
        table = app.screen.query_one("#stats-runs", DataTable)
        rows = [table.get_row_at(i) for i in range(table.row_count)]
        assert [str(r[0]) for r in rows] == ["run-a", "run-b"]  # a Text: a run name is never read as markup
        assert rows[0][1] == "15"
        assert rows[0][2] == "1"  # samples, approved


async def test_both_sides_of_a_compare_are_exactly_as_wide_at_any_width(make_app, store, tokenizer, profile):
    """Two `1fr` panes left the right side a cell narrower (its divider): the same ids wrapped at other places."""

    add_sibling(store, tokenizer, profile)
    for width in (80, 81, 120):
        app = make_app()
        async with app.run_test(size=(width, 24)) as pilot:
            screen = await compare_second_sample(app, pilot)
            assert screen.left.content_region.width == screen.right.content_region.width, width
            assert screen.left.content_region.width == (width - 1) // 2
