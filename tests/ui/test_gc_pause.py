"""While token views are open, full collections skip what was alive when their screen opened; nothing stays
frozen after; one collection per screen, however many panes.

(How much that takes out of a resize: benchmarks/bench_render.py, its "GC in wall" column.)
"""

from __future__ import annotations

import gc
import weakref

import pytest
from textual.app import App, ComposeResult
from textual.screen import Screen

from tokview.ui import display as d
from tokview.ui import gc_pause
from tokview.ui.examples import short_capture
from tokview.ui.widgets.token_view import TokenView

REAL_COLLECT_AND_FREEZE = gc_pause.collect_and_freeze


@pytest.fixture(autouse=True)
def real_collections(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """These tests run the real collect-and-freeze (the UI conftest turns it off elsewhere); counts each run."""
    runs: list[int] = []

    def counted() -> None:
        runs.append(1)
        REAL_COLLECT_AND_FREEZE()

    monkeypatch.setattr(gc_pause, "collect_and_freeze", counted)
    return runs


class Node:
    """An object in a reference cycle: only the collector can free it."""

    def __init__(self) -> None:
        self.me = self


class Views(App):
    def __init__(self, seq: d.TokenSeq, n: int) -> None:
        super().__init__()
        self.seq, self.n = seq, n

    def compose(self) -> ComposeResult:
        for _ in range(self.n):
            yield TokenView(self.seq)


class NextSample(Screen):
    def __init__(self, seq: d.TokenSeq) -> None:
        super().__init__()
        self.seq = seq

    def compose(self) -> ComposeResult:
        yield TokenView(self.seq)


def served(tokenizer, profile) -> d.TokenSeq:
    from tokview.core.analysis import analyze

    capture = short_capture()
    return d.served_seq(capture, analyze(capture, profile, tokenizer), tokenizer)


async def test_an_open_view_freezes_what_was_alive_and_the_last_close_unfreezes(tokenizer, profile, real_collections):
    seq = served(tokenizer, profile)
    assert gc.get_freeze_count() == 0
    alive_before = Node()
    async with Views(seq, 2).run_test(size=(60, 10)) as pilot:  # two panes, as in inspect
        await pilot.pause()
        await pilot.pause()
        assert gc.get_freeze_count() > 0
        assert all(o is not alive_before for o in gc.get_objects()), "frozen objects are in no generation"
        assert len(real_collections) == 1, "one collection for the screen, not one per pane"
        first, second = pilot.app.query(TokenView)
        await first.remove()
        assert gc.get_freeze_count() > 0, "one pane still shows the sample"
        await second.remove()
        assert gc.get_freeze_count() == 0
    assert gc.get_freeze_count() == 0


async def test_a_cycle_that_dies_while_a_view_is_open_is_collected_after_it_closes(tokenizer, profile):
    seq = served(tokenizer, profile)
    dying = Node()
    ref = weakref.ref(dying)
    async with Views(seq, 1).run_test(size=(60, 10)) as pilot:
        await pilot.pause()
        await pilot.pause()
        del dying
        gc.collect()
        assert ref() is not None, "frozen with the view: the price, paid back below"
    gc.collect()
    assert ref() is None


async def test_the_next_screen_with_views_collects_what_died_since_the_first(tokenizer, profile, real_collections):
    seq = served(tokenizer, profile)
    async with Views(seq, 1).run_test(size=(60, 10)) as pilot:
        await pilot.pause()
        await pilot.pause()
        dying = Node()  # made after the freeze: an ordinary object
        gc.freeze()  # as if it had been alive when the view opened
        ref = weakref.ref(dying)
        del dying
        await pilot.app.push_screen(NextSample(seq))  # the next sample's screen opens its view
        await pilot.pause()
        await pilot.pause()
        assert len(real_collections) == 2
        assert ref() is None
