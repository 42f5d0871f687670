"""The samples list while another program writes into the store: it says how many samples came since it read."""

from __future__ import annotations

from ui.helpers import add_sibling, refused_connects, settle


async def test_the_list_says_when_the_store_grew_since_it_was_read(make_app, store, tokenizer, profile, monkeypatch):
    """A batch or proxy writing into the store while the app was open left the list's title at the count it read
    last, without a word (and `*` marks from the store, rows the list never showed)."""
    from tokview.ui.screens.samples import SamplesScreen

    monkeypatch.setattr(SamplesScreen, "poll_s", 0.1)
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        title = app.screen.query_one("#samples-title")
        assert "in the store since" not in str(title.render())
        add_sibling(store, tokenizer, profile)
        for _ in range(50):
            await pilot.pause(0.1)
            if "+1 in the store since: ctrl+r" in str(title.render()):
                break
        assert "+1 in the store since: ctrl+r" in str(title.render())
        await pilot.press("ctrl+r")
        await settle(app, pilot)
        assert "in the store since" not in str(title.render())


async def test_an_idle_list_never_takes_the_store_from_other_programs(make_app, store, monkeypatch):
    """A poll that read the count every tick opened the store each time: another program's `duckdb.connect` was
    refused 38 times in 300 while the app sat idle. The poll now looks at the files, and reads only on a change."""
    from tokview.ui.screens.samples import SamplesScreen

    monkeypatch.setattr(SamplesScreen, "poll_s", 0.02)
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.pause(0.5)  # the list's own reads are done and the file closed (its linger)
        assert await refused_connects(pilot, str(store.path)) == 0


async def test_a_verdict_made_elsewhere_shows_on_its_row_and_approving_it_asks_first(make_app, store, monkeypatch):
    """`tokview review` (or another reviewer's app) rejected samples while the list was open: the rows kept saying
    pending until ctrl+r, and `a` approved over the rejection without a word. The rows now show it at the next poll,
    where they are, and approving a sample someone rejected asks first, naming who and why."""
    from tokview.store import bulk_review
    from tokview.ui.screens.modals import Confirm
    from tokview.ui.screens.samples import SamplesScreen

    monkeypatch.setattr(SamplesScreen, "poll_s", 0.1)
    app = make_app()
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(app, pilot)
        sample_list = app.screen.query_one("#samples")
        first = sample_list.row(0)
        assert first is not None and first.status == "pending"
        bulk_review.set_status(store, [first.sample_id], "rejected", who="bob", reason="cli-cut")
        for _ in range(50):
            await pilot.pause(0.1)
            if sample_list.row(0).status == "rejected":
                break
        assert sample_list.row(0).status == "rejected"
        assert sample_list.row(0).sample_id == first.sample_id  # where it was
        app.screen.query_one("#samples").cursor = 0
        await pilot.press("a")
        await settle(app, pilot)
        assert isinstance(app.screen, Confirm)
        assert "rejected by bob (cli-cut): this overturns that verdict" in app.screen.detail
        await pilot.press("n")
        await settle(app, pilot)
        assert store.load_sample(first.sample_id).status == "rejected"


async def test_undo_names_another_reviewers_action_and_asks_first(make_app, store):
    """`u` takes back the latest action wherever it was made: pressed to take back one's own verdict, it took back
    a colleague's `tokview review` run that had come in since, at once and unseen."""
    from tokview.store import bulk_review
    from tokview.ui.screens.modals import Confirm

    app = make_app()
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(app, pilot)
        ids = [app.screen.query_one("#samples").row(k).sample_id for k in range(3)]
        bulk_review.set_status(store, ids, "rejected", who="bob", reason="cli-cut")
        await pilot.press("u")
        await settle(app, pilot)
        assert isinstance(app.screen, Confirm)
        assert app.screen.question == "Undo bob's action?"
        assert "rejected 3 samples (cli-cut)" in app.screen.detail, app.screen.detail
        await pilot.press("n")
        await settle(app, pilot)
        assert {store.load_sample(i).status for i in ids} == {"rejected"}
        await pilot.press("u")
        await settle(app, pilot)
        await pilot.press("y")
        await settle(app, pilot)
        assert {store.load_sample(i).status for i in ids} == {"pending"}
