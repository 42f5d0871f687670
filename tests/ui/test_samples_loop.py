"""The samples list sorts and filters by acceptance length and by the target's mean NLL."""

from __future__ import annotations

import json

from textual.widgets import Input
from ui.helpers import settle

from tokview.core.spec_decode import SpecDecode
from tokview.store.token_data import put_target_score
from tokview.ui.search_terms import parse_search


def test_search_terms():
    assert parse_search("acc<=2.5 p02 nll <= 1") == ("p02", 2.5, 1.0)
    assert parse_search("p02") == ("p02", None, None)
    assert parse_search("ACC<=.5") == (None, 0.5, None)
    assert parse_search("nll<2") == (None, None, 2.0)  # `<` as `<=`: measured values select alike
    assert parse_search("nll<=1e-3 p1") == ("p1", None, 0.001)  # was `nll<=1` and a search for "e-3"


def test_a_threshold_the_search_cannot_read_is_named():
    from tokview.ui.search_terms import unread_threshold

    assert [unread_threshold(t) for t in ("nll>2", "p1 nll >= 2", "acc<=abc", "nll==1")] == [
        "nll>2",
        "nll >= 2",
        "acc<=abc",
        "nll==1",
    ]
    assert unread_threshold("acc<=2.5x") == "acc<=2.5x"
    assert unread_threshold("nll<=2 acc<3 rivers") is None and unread_threshold("null > x") is None


def _side_data(store, ids):
    """Acceptance lengths 1.0, 1.5, … on every other sample; mean NLL 0.1·k on the first ten."""
    for k, sid in enumerate(ids):
        cap = store.load_sample(sid).capture
        if k % 2 == 0:
            spec = SpecDecode("vllm", 2, 6, k // 2)
            store.execute(
                "UPDATE samples SET acceptance_length = ? WHERE sample_id = ?", [spec.mean_acceptance_length, sid]
            )
        if k < 10:
            cap.target_logprobs, cap.target_score = [-0.1 * k], {"mean_nll": 0.1 * k, "model": "m"}
            put_target_score(store, sid, cap, None)


async def test_sort_and_filter_by_acceptance_and_nll(make_app, store):
    ids = [r.sample_id for r in store.samples_page(limit=100)]
    _side_data(store, ids)
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        screen = app.screen
        lst = screen.sample_list
        while screen.order != "acceptance_length":
            await pilot.press("o")
        await settle(app, pilot)
        accs = [lst.row(i).acceptance_length for i in range(lst.count)]
        assert accs[:15] == sorted(accs[:15])
        assert accs[0] == 1.0
        assert accs[15:] == [None] * 15
        await pilot.press("o")
        await settle(app, pilot)
        assert screen.order == "-mean_nll"
        assert lst.row(0).mean_nll == 0.9
        screen.query_one("#search", Input).value = "acc<=2 nll<=0.45"
        await settle(app, pilot)
        got = sorted(lst.row(i).sample_id for i in range(lst.count))
        assert got == sorted(ids[k] for k in range(0, 5, 2))  # acc 1.0, 1.5, 2.0 and nll ≤ 0.45
        assert "acc<=2.0" in str(screen.query_one("#samples-title").render())
        strip = lst.render_line(1).text
        assert "acc " in strip
        assert "nll " in strip


async def test_stats_panel_plots_acceptance_per_segment_and_nll(make_app, store):
    from tokview.ui.screens.stats import StatsScreen
    from tokview.ui.widgets.bar_chart import BarChart

    ids = [r.sample_id for r in store.samples_page(limit=100)]
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:  # no side data: no extra plots
        await settle(app, pilot)
        await pilot.press("S")
        await settle(app, pilot)
        assert not app.screen.query("#plot-acceptance")
    _side_data(store, ids)
    for sid in ids[:4]:  # placed steps on four samples: per-segment acceptance exists
        cap = store.load_sample(sid).capture
        n = len(cap.output_ids)
        accepted = [0] * (n - 1)  # every step drafts 1, accepts none: 1 + Σ(0+1) = n
        spec = SpecDecode(
            "vllm", n - 1, n - 1, 0, per_step_accepted=accepted, per_step_drafted=[1] * (n - 1), num_spec_tokens=1
        ).to_dict()
        store.execute(
            "UPDATE samples SET spec_decode = ?, acceptance_length = 1.0 WHERE sample_id = ?", [json.dumps(spec), sid]
        )
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("S")
        await settle(app, pilot)
        screen = app.screen
        assert isinstance(screen, StatsScreen)
        acceptance, nll = screen.query_one("#plot-acceptance", BarChart), screen.query_one("#plot-nll", BarChart)
        assert set(acceptance.counts) == {"all", "reasoning", "answer"}
        assert "4 of 4 samples placed" in acceptance.title
        assert sum(nll.counts.values()) == 10
        assert "10 scored" in nll.title
        spec = screen.data.side["spec_decode"]
        assert spec["placed_samples"] == 4
        assert set(spec["segments"]) == {"reasoning", "answer"}
        assert screen.data.side["target_logprobs"]["samples"] == 10
