"""SVG snapshots of every screen at fixed terminal sizes: layout and colour regressions.

Data is deterministic (example captures, a fixed store file name, no clocks on screen). Review the
HTML report before `--snapshot-update`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from ui.helpers import NARROW, WIDE, run_before

from tokview.core.analysis import analyze
from tokview.ui.examples import short_capture


@pytest.mark.parametrize("size", [WIDE, NARROW], ids=["120x40", "80x24"])
def test_samples_screen(snap_compare, make_app, size):
    assert snap_compare(make_app(), terminal_size=size, run_before=run_before("down", "down"))


@pytest.mark.parametrize("size", [WIDE, NARROW], ids=["120x40", "80x24"])
def test_inspect_pieces(snap_compare, make_app, size):
    assert snap_compare(make_app(), terminal_size=size, run_before=run_before("down", "enter", "right", "right"))


def test_inspect_both_mode(snap_compare, make_app):
    assert snap_compare(make_app(), terminal_size=WIDE, run_before=run_before("down", "enter", "v", "v"))


def test_inspect_ids_mode_narrow(snap_compare, make_app):
    assert snap_compare(make_app(), terminal_size=NARROW, run_before=run_before("down", "enter", "v"))


def test_inspect_long_sample_at_the_end(snap_compare, make_app):
    assert snap_compare(make_app(), terminal_size=WIDE, run_before=run_before("enter", "end"))


def test_inspect_finding_selected(snap_compare, make_app):
    assert snap_compare(make_app(), terminal_size=WIDE, run_before=run_before("down", "enter", "f", "down", "enter"))


def test_inspect_light_theme(snap_compare, make_app):
    assert snap_compare(make_app(), terminal_size=WIDE, run_before=run_before("T", "down", "enter"))


def test_inspect_drift_and_partial(snap_compare, make_app, store, tokenizer, profile):
    capture = short_capture()
    capture.content = "The answer is EXTRA forty-two!"
    capture.reasoning = "Okay, let me think about this carefully. "  # trailing text the ids do not have
    store.put_sample("a-drift@demo_gen0", "a-drift", "run-a", capture, analyze(capture, profile, tokenizer))
    assert snap_compare(make_app(), terminal_size=WIDE, run_before=run_before("o", "o", "o", "o", "o", "enter", "end"))


def test_reject_modal(snap_compare, make_app):
    assert snap_compare(make_app(), terminal_size=WIDE, run_before=run_before("down", "enter", "r"))


def test_help_screen(snap_compare, make_app):
    assert snap_compare(make_app(), terminal_size=WIDE, run_before=run_before("question_mark"))


def test_samples_invalid_filter_after_verdicts(snap_compare, make_app, store):
    store.record_verdict("p005@demo_gen0", "approved")
    store.record_verdict("p010@demo_gen0", "rejected", reason="duplicate")

    def only_invalid(app):
        app.screen.query_one("#status").value = "invalid"

    assert snap_compare(make_app(), terminal_size=WIDE, run_before=run_before(then=only_invalid))


def test_stats_panel(snap_compare, make_app, store):
    store.record_verdict("p005@demo_gen0", "approved")
    assert snap_compare(make_app(), terminal_size=WIDE, run_before=run_before("S"))


def test_generate_panel(snap_compare, make_app, monkeypatch):
    monkeypatch.chdir(Path(__file__).parents[2])  # the default prompts path shows relative to the checkout
    assert snap_compare(make_app(server_url="http://127.0.0.1:30000"), terminal_size=WIDE, run_before=run_before("g"))
