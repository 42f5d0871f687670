"""Failed workers reach the app's one handler: a TokviewError as its title and message, anything else as a bug;
panels show the CLI's own renderings (progress line, batch summary, doctor report)."""

from __future__ import annotations

import pytest
from textual.widgets import Input, Select, Static, TextArea
from ui.helpers import settle

from tokview.batch.config import BatchProgress
from tokview.batch.progress import progress_line
from tokview.sim import SimConfig, start_simulator
from tokview.store import StoreError
from tokview.ui.screens.doctor import DoctorScreen
from tokview.ui.screens.generate import GenerateScreen
from tokview.ui.screens.samples import SamplesScreen
from tokview.ui.screens.stats import StatsScreen
from tokview.ui.worker_errors import BUG_TITLE


@pytest.fixture(scope="module")
def sim():
    with start_simulator(SimConfig(kind="vllm")) as s:
        yield s


def errors_shown(app) -> list[tuple[str, str]]:
    return [(str(n.title), str(n.message)) for n in app._notifications if n.severity == "error"]


async def test_a_store_error_from_the_count_after_ctrl_r_is_notified(make_app, store, monkeypatch):
    """`count_samples` runs in a worker started with exit_on_error=False: its failure is notified, not lost."""
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        assert isinstance(app.screen, SamplesScreen)
        assert not errors_shown(app)

        def locked(filters=None):
            raise StoreError(f"the store {store.path} is in use by another program (pid 7): gave up after 10s")

        monkeypatch.setattr(store, "count_samples", locked)
        await pilot.press("ctrl+r")
        await settle(app, pilot)
        assert errors_shown(app) == [
            ("store", f"the store {store.path} is in use by another program (pid 7): gave up after 10s")
        ]


async def test_a_bug_in_a_worker_is_notified_as_one(make_app, monkeypatch):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)

        def broken(sample_id):
            return {}["capture"]  # a bug: not a TokviewError

        monkeypatch.setattr(app.session, "load", broken)
        await pilot.press("enter")
        await settle(app, pilot)
        [(title, message)] = errors_shown(app)
        assert title == BUG_TITLE
        assert message.startswith("KeyError: 'capture'")
        assert "bug" in message
        assert isinstance(app.screen, SamplesScreen)  # the app goes on


async def test_stats_panel_says_why_it_cannot_read_and_the_app_notifies(store, tmp_path):
    """A run whose recorded tokenizer folder is gone: the stats worker fails with a TokenizerError."""
    from tokview.ui.app import TokviewApp
    from tokview.ui.session import Session

    store.put_run("run-gone", profile="kimi-k2.5", tokenizer_dir=str(tmp_path / "gone-tokenizer"))
    app = TokviewApp(Session(store, who="tester"))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("S")
        await settle(app, pilot)
        screen = app.screen
        assert isinstance(screen, StatsScreen)
        assert screen.data is None
        summary = str(screen.query_one("#stats-summary", Static).render())
        assert summary.startswith("cannot read stats: tokenizer: the run's tokenizer folder")
        assert "gone" in summary
        [(title, message)] = errors_shown(app)
        assert title == "tokenizer"
        assert "gone-tokenizer is gone" in message


async def test_generate_panel_failure_is_notified_and_the_form_comes_back(make_app):
    app = make_app(server_url="http://127.0.0.1:9")
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("g")
        screen = app.screen
        screen.query_one("#source", Select).value = "typed"
        await pilot.press("ctrl+s")
        await settle(app, pilot)
        assert str(screen.query_one("#progress-line", Static).render()).startswith("failed: server unreachable: ")
        assert screen.cancel_event is None
        assert not screen.query_one("#run").disabled
        [(title, message)] = errors_shown(app)
        assert title == "server unreachable"
        assert "127.0.0.1:9" in message


async def test_generate_panel_shows_the_cli_progress_line_and_summary(make_app, sim):
    app = make_app(server_url=sim.url)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("g")
        screen = app.screen
        assert isinstance(screen, GenerateScreen)
        progress = BatchProgress(total=8, ok=3, failed=1, skipped=1, flagged=1, output_tokens=400, elapsed_s=2.0)
        screen.post_message(screen.Progress(progress))
        await pilot.pause()
        assert str(screen.query_one("#progress-line", Static).render()) == progress_line(progress)
        screen.query_one("#source", Select).value = "typed"
        screen.query_one("#typed", TextArea).text = "Name a colour."
        screen.query_one("#max-tokens", Input).value = "24"
        await pilot.press("ctrl+s")
        await settle(app, pilot)
        summary = screen.last_summary
        assert summary is not None
        assert summary.ok == 1
        assert str(screen.query_one("#progress-line", Static).render()) == f"done: {summary.render()}"


async def test_doctor_panel_shows_the_report_as_the_cli_prints_it(make_app, sim):
    app = make_app(server_url=sim.url)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("D")
        await settle(app, pilot)
        screen = app.screen
        assert isinstance(screen, DoctorScreen)
        assert screen.report is not None
        shown = str(screen.query_one("#doctor-report", Static).render())
        assert shown.rstrip("\n") == screen.report.render_text()
