"""Empty and first-run states say what to do: an empty store, a search with no hits, an empty stats panel."""

from __future__ import annotations

import pytest
from textual.widgets import Static
from ui.helpers import settle

from tokview.ui.screens.stats import StatsScreen


@pytest.fixture
def empty_app(tmp_path, tokenizer, profile):
    from tokview.store import Store
    from tokview.ui.app import TokviewApp
    from tokview.ui.session import Session

    with Store(tmp_path / "empty.duckdb") as store:
        yield TokviewApp(Session(store, tokenizer=tokenizer, profile=profile))


def list_text(lst, rows: int = 6) -> str:
    return "\n".join(lst.render_line(y).text for y in range(rows))


async def test_an_empty_store_says_press_g_or_run_the_demo(empty_app):
    app = empty_app
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(app, pilot)
        text = list_text(app.screen.sample_list)
        assert "no samples yet" in text
        assert "Press g" in text
        assert "tokview demo" in text


async def test_a_search_with_no_hits_says_clear_the_filter(make_app):
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(app, pilot)
        await pilot.press("slash", *"zzzz-no-such")
        await settle(app, pilot)
        text = list_text(app.screen.sample_list)
        assert app.screen.sample_list.count == 0
        assert "No sample matches this search" in text
        assert "Clear the search" in text


async def test_an_empty_stats_panel_says_what_to_do(empty_app):
    app = empty_app
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(app, pilot)
        await pilot.press("S")
        await settle(app, pilot)
        assert isinstance(app.screen, StatsScreen)
        summary = str(app.screen.query_one("#stats-summary", Static).render())
        assert "No samples yet" in summary
        assert "g to generate" in summary


async def test_a_store_of_failed_requests_says_they_failed_and_why(tmp_path, tokenizer, profile):
    """A batch whose every request failed (a server answering 500) left a store the app showed as new: "no samples
    yet, press g", and the stats panel "nothing to plot", while `tokview stats` counted the failures."""
    from tokview.store import Store
    from tokview.ui.app import TokviewApp
    from tokview.ui.session import Session

    with Store(tmp_path / "failed.duckdb") as store:
        for k in range(3):
            store.put_failure(f"p{k}", f"p{k}@x_gen0", "run1", "HTTP 500 from POST /v1/completions: boom")
        app = TokviewApp(Session(store, tokenizer=tokenizer, profile=profile))
        async with app.run_test(size=(160, 30)) as pilot:
            await settle(app, pilot)
            text = list_text(app.screen.sample_list)
            assert "no samples: 3 requests failed (3 × HTTP 500 from POST /v1/completions: boom)" in text
            assert "no samples yet" not in text
            await pilot.press("S")
            await settle(app, pilot)
            assert isinstance(app.screen, StatsScreen)
            summary = str(app.screen.query_one("#stats-summary", Static).render())
            assert "No samples: 3 requests failed (3 × HTTP 500" in summary
