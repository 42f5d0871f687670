"""SVG snapshots: inspect at 40x12 (token rows and Quit kept) and the compare screen."""

from __future__ import annotations

from ui.helpers import add_sibling, run_before


def test_inspect_40x12(snap_compare, make_app):
    assert snap_compare(make_app(), terminal_size=(40, 12), run_before=run_before("down", "enter"))


def test_compare_first_divergence(snap_compare, make_app, store, tokenizer, profile):
    add_sibling(store, tokenizer, profile)
    assert snap_compare(make_app(), terminal_size=(120, 30), run_before=run_before("down", "enter", "d"))
