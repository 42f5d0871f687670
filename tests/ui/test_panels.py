"""Filters and sort, the generate panel against a real simulator socket (and cancel), doctor, stats."""

from __future__ import annotations

import re

import pytest
from textual.widgets import Input, Select, Static, TextArea
from ui.helpers import settle

from tokview.sim import SimConfig, start_simulator
from tokview.ui.screens.doctor import DoctorScreen
from tokview.ui.screens.generate import GenerateScreen
from tokview.ui.screens.samples import SamplesScreen
from tokview.ui.screens.stats import StatsScreen


@pytest.fixture(scope="module")
def sim():
    with start_simulator(SimConfig(kind="vllm")) as s:
        yield s


@pytest.fixture(scope="module")
def slow_sim():
    with start_simulator(SimConfig(kind="vllm", quirks={"latency": 0.3})) as s:
        yield s


async def test_filters_and_sort_query_the_store(make_app, store):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        screen = app.screen
        lst = screen.sample_list
        assert lst.count == 30
        assert lst.row(29).sample_id == "p029@demo_gen0"
        screen.query_one("#status", Select).value = "invalid"
        await settle(app, pilot)
        assert lst.count == store.count_samples(screen.filters) == 6  # the truncated ones
        assert {lst.row(i).finish_reason for i in range(lst.count)} == {"length"}
        screen.query_one("#status", Select).value = Select.NULL
        screen.query_one("#run", Select).value = "run-b"
        await settle(app, pilot)
        assert lst.count == 15
        assert all(lst.row(i).run_id == "run-b" for i in range(15))
        screen.query_one("#code", Select).value = "truncated"
        await settle(app, pilot)
        assert lst.count == 3
        await pilot.press("ctrl+r")  # a reload (also what a running generate does) keeps the filters it can
        await settle(app, pilot)
        assert screen.query_one("#code", Select).value == "truncated"
        assert screen.query_one("#run", Select).value == "run-b"
        assert lst.count == 3
        assert screen.filters.code == "truncated"
        assert screen.filters.run_id == "run-b"
        await pilot.press("slash", *"p02", "enter")
        await settle(app, pilot)
        assert sorted(lst.row(i).sample_id for i in range(lst.count)) == ["p020@demo_gen0", "p025@demo_gen0"]
        screen.query_one("#search", Input).value = ""
        screen.query_one("#code", Select).value = Select.NULL
        screen.query_one("#run", Select).value = Select.NULL
        await settle(app, pilot)
        await pilot.press("o")  # created_at → -output_len
        await settle(app, pilot)
        assert screen.order == "-output_len"
        lens = [lst.row(i).output_len for i in range(lst.count)]
        assert lens == sorted(lens, reverse=True)
        assert lens[0] == 560 + 27


async def test_generate_runs_against_the_simulator_and_rows_appear(make_app, store, sim):
    app = make_app(server_url=sim.url)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("g")
        screen = app.screen
        assert isinstance(screen, GenerateScreen)
        screen.query_one("#source", Select).value = "typed"
        screen.query_one("#typed", TextArea).text = "What is 2+2?\nName a prime."
        screen.query_one("#samples", Input).value = "2"
        screen.query_one("#max-tokens", Input).value = "48"
        screen.query_one("#mode").value = "dual"
        before = dict(sim.stats.requests)
        await pilot.press("ctrl+s")
        await settle(app, pilot)
        summary = screen.last_summary
        assert summary is not None
        assert summary.ok == 4
        assert summary.failed == 0
        assert store.count_samples() == 34
        sent = {path: n - before.get(path, 0) for path, n in sim.stats.requests.items()}
        # the requests really went over the socket: dual mode asks both paths for each of the 4 samples
        assert sent.get("/v1/chat/completions", 0) >= 4, sent
        assert sent.get("/v1/completions", 0) >= 4, sent
        await pilot.press("escape")
        await settle(app, pilot)
        assert app.screen.sample_list.count == 34


async def test_generate_captures_logprobs_when_the_form_asks(make_app, store, sim):
    """The logprobs box (empty: off) reaches the batch: each output token's logprob and top-K land in the store."""
    app = make_app(server_url=sim.url)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("g")
        screen = app.screen
        assert screen.build_config().logprobs is None  # empty box: no logprobs, sample ids as before
        screen.query_one("#source", Select).value = "typed"
        screen.query_one("#typed", TextArea).text = "Count to three."
        screen.query_one("#max-tokens", Input).value = "32"
        screen.query_one("#logprobs", Input).value = "2"
        await pilot.press("ctrl+s")
        await settle(app, pilot)
        summary = screen.last_summary
        assert summary is not None
        assert summary.ok == 1
        assert summary.failed == 0
    fresh = [row for row in store.samples_page(limit=1000) if row.run_id == summary.run_id]
    assert len(fresh) == 1
    cap = store.load_sample(fresh[0].sample_id).capture
    assert cap.settings["logprobs"] == 2
    assert len(cap.output_logprobs) == len(cap.output_ids) > 0
    assert all(len(top) == 2 for top in cap.output_top_ids)


async def test_generate_refuses_logprobs_out_of_range_in_the_form_words(make_app, store, sim):
    app = make_app(server_url=sim.url)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("g")
        screen = app.screen
        screen.query_one("#logprobs", Input).value = "99"
        await pilot.press("ctrl+s")
        await settle(app, pilot)
        line = str(screen.query_one("#progress-line", Static).render())
        assert "logprobs must be between 0 and 20" in line
        assert "--" not in line


async def test_generate_cancel_stops_the_batch(make_app, store, slow_sim):
    app = make_app(server_url=slow_sim.url)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("g")
        screen = app.screen
        screen.query_one("#source", Select).value = "typed"
        screen.query_one("#typed", TextArea).text = "\n".join(f"question {i}" for i in range(40))
        screen.query_one("#max-tokens", Input).value = "16"
        await pilot.press("ctrl+s")
        while screen.cancel_event is not None and store.count_samples() < 32:
            await pilot.pause(0.05)
        await pilot.press("ctrl+c")
        await settle(app, pilot)
        summary = screen.last_summary
        assert summary is not None
        assert summary.interrupted
        assert 0 < summary.ok < 40
        assert store.count_samples() == 30 + summary.ok
        assert "cancelled" in str(screen.query_one("#progress-line", Static).render())


async def test_generate_reports_an_unreachable_server(make_app):
    app = make_app(server_url="http://127.0.0.1:9")
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("g")
        screen = app.screen
        screen.query_one("#source", Select).value = "typed"
        await pilot.press("ctrl+s")
        await settle(app, pilot)
        assert "failed:" in str(screen.query_one("#progress-line", Static).render())
        assert screen.cancel_event is None
        assert not screen.query_one("#run").disabled


async def test_generate_refuses_a_bad_server_url_with_its_reason(make_app, store):
    app = make_app(server_url="http://127.0.0.1:8000")
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("g")
        screen = app.screen
        screen.query_one("#server", Input).value = "http://127.0.0.1:99999"
        screen.query_one("#source", Select).value = "typed"
        await pilot.press("ctrl+s")
        await settle(app, pilot)
        line = str(screen.query_one("#progress-line", Static).render())
        assert "bad server URL" in line
        assert "port 99999 is out of range" in line
        assert screen.cancel_event is None
        assert not screen.query_one("#run").disabled
        assert store.count_samples() == 30


async def test_doctor_panel_refuses_a_bad_server_url(make_app):
    app = make_app(server_url="http://")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("D")
        await settle(app, pilot)
        screen = app.screen
        assert isinstance(screen, DoctorScreen)
        assert screen.report is None
        assert "bad server URL" in str(screen.query_one("#doctor-report", Static).render())


async def test_doctor_panel_shows_the_report(make_app, sim):
    app = make_app(server_url=sim.url)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("D")
        await settle(app, pilot)
        screen = app.screen
        assert isinstance(screen, DoctorScreen)
        assert screen.report is not None
        assert screen.report.checks
        shown = str(screen.query_one("#doctor-report", Static).render())
        assert screen.report.checks[0].title in shown


async def test_stats_panel_counts_and_plots(make_app, store):
    store.record_verdict("p001@demo_gen0", "approved")
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("S")
        await settle(app, pilot)
        screen = app.screen
        assert isinstance(screen, StatsScreen)
        assert screen.data is not None
        assert len(screen.data.output_lens) == 30
        assert screen.data.finish == {"stop": 24, "length": 6}
        assert len(screen.data.reasoning_lens) == 30
        assert max(screen.data.reasoning_lens) > 500
        summary = str(screen.query_one("#stats-summary", Static).render())
        assert "30 samples" in summary
        assert "reviewed 1/30" in summary


async def test_panels_show_the_server_without_credentials_and_still_send_them(make_app, sim):
    """`tokview ui --server http://user:pw@…`: the URL boxes show no password; the session keeps it."""
    authed = sim.url.replace("http://", "http://tok:s3cret@")
    app = make_app(server_url=authed)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("D")
        await settle(app, pilot)
        doctor = app.screen
        assert doctor.query_one("#doctor-url", Input).value == sim.url
        assert doctor.report is not None
        assert "s3cret" not in str(doctor.query_one("#doctor-report", Static).render())
        await pilot.press("escape", "g")
        await settle(app, pilot)
        assert app.screen.query_one("#server", Input).value == sim.url
    session = app.session
    assert session.server_for(sim.url) == (authed, [])  # the shown URL gets its credentials back
    other = "http://127.0.0.1:8001"
    assert session.server_for(other) == (other, [])  # another server does not


async def test_doctor_panel_notes_a_dropped_v1(make_app, sim):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("D")
        await settle(app, pilot)
        screen = app.screen
        screen.query_one("#doctor-url", Input).value = sim.url + "/v1"
        screen.action_run()
        await settle(app, pilot)
        assert screen.report is not None
        assert screen.report.url == sim.url
        assert "note: dropped the trailing /v1" in str(screen.query_one("#doctor-report", Static).render())


async def test_doctor_panel_words_an_unreachable_server_as_the_cli_does(make_app):
    app = make_app(server_url="http://127.0.0.1:9")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("D")
        await settle(app, pilot)
        shown = str(app.screen.query_one("#doctor-report", Static).render())
        assert shown.startswith("doctor failed: server unreachable: ")
        assert app.screen.report is None


async def test_esc_during_a_run_says_how_to_stop_it_instead_of_ending_it_silently(make_app, store):
    """The run is the panel's worker: leaving the panel ended it without a word (4 of 120 stored)."""
    with start_simulator(SimConfig(kind="vllm", quirks={"latency": 0.3})) as slow:
        app = make_app(server_url=slow.url)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(app, pilot)
            await pilot.press("g")
            screen = app.screen
            assert isinstance(screen, GenerateScreen)
            screen.query_one("#source", Select).value = "typed"
            screen.query_one("#typed", TextArea).text = "\n".join(f"question {i}" for i in range(40))
            screen.query_one("#max-tokens", Input).value = "16"
            await pilot.press("ctrl+s")
            for _ in range(100):  # past the probe: samples are being made
                await pilot.pause(0.1)
                if screen.query_one("#bar").progress:
                    break
            await pilot.press("escape")
            await pilot.pause(0.2)
            assert app.screen is screen
            assert screen.cancel_event is not None
            assert any("a run is in progress" in n.message for n in app._notifications)
            await pilot.press("ctrl+c")
            for _ in range(100):  # the requests in flight are abandoned, what was written is kept
                await pilot.pause(0.1)
                if screen.cancel_event is None:
                    break
            assert screen.last_summary is not None
            assert screen.last_summary.interrupted
            await pilot.press("escape")
            await settle(app, pilot)
            assert isinstance(app.screen, SamplesScreen)


async def test_a_run_that_gives_up_reads_stopped_not_done(make_app, store, monkeypatch):
    """Every request refused (HTTP 503): the run stops after its consecutive failures, and the panel said "done:"."""
    from tokview.batch.config import PANEL_DEFAULTS

    monkeypatch.setitem(PANEL_DEFAULTS, "retries", 0)  # each failure at once: the same stop, without the backoff

    with start_simulator(SimConfig(kind="vllm", quirks={"http-503": True})) as sim:
        app = make_app(server_url=sim.url)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(app, pilot)
            await pilot.press("g")
            screen = app.screen
            screen.query_one("#source", Select).value = "typed"
            screen.query_one("#typed", TextArea).text = "\n".join(f"question {i}" for i in range(40))
            screen.query_one("#max-tokens", Input).value = "8"
            await pilot.press("ctrl+s")
            while screen.last_summary is None:
                await pilot.pause(0.05)
            await settle(app, pilot)
            summary = screen.last_summary
            line = str(screen.query_one("#progress-line", Static).render())
            said = [str(n.message) for n in app._notifications]
    assert summary.stopped and not summary.interrupted and summary.ok == 0
    assert line.startswith("stopped: ")
    assert any(m.startswith("the run stopped: stopped after") for m in said), said


async def test_the_form_refuses_an_empty_prompts_file_and_g_opens_no_second_panel(make_app, store):
    app = make_app(server_url="http://127.0.0.1:9")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("g")
        screen = app.screen
        screen.query_one("#prompts-file", Input).value = ""
        await pilot.press("ctrl+s")
        await settle(app, pilot)
        line = str(screen.query_one("#progress-line", Static).render())
        assert "prompts file: give the path" in line and "directory" not in line  # Path("") is the cwd
        screen.query_one("#run").focus()
        depth = len(app.screen_stack)
        await pilot.press("g")  # a button does not take "g": the app's binding opened another generate panel
        await settle(app, pilot)
        assert app.screen is screen and len(app.screen_stack) == depth


async def test_cancelling_while_the_server_is_probed_is_no_error(make_app, store):
    """ctrl+c before the probe answered: the panel said "cancelled", and the app notified it as an error too."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as silent:  # connects, never answers: the probe waits
        app = make_app(server_url=f"http://127.0.0.1:{silent.getsockname()[1]}")
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(app, pilot)
            await pilot.press("g")
            screen = app.screen
            screen.query_one("#source", Select).value = "typed"
            await pilot.press("ctrl+s")
            await pilot.pause(0.3)
            await pilot.press("ctrl+c")
            while screen.cancel_event is not None:
                await pilot.pause(0.05)
            await settle(app, pilot)
            line = str(screen.query_one("#progress-line", Static).render())
            errors = [str(n.message) for n in app._notifications if n.severity == "error"]
    assert line.startswith("cancelled: ")
    assert errors == []


async def test_doctor_panel_says_its_advice_as_the_app_takes_it(make_app, qwen_tok_dir):
    """Against a server whose vocabulary is not the app's tokenizer's, the panel said the CLI's advice, "give doctor
    (and batch) the served model's tokenizer folder (--tokenizer DIR)": the panel has no such field; the app takes its
    tokenizer when it starts."""
    from pathlib import Path

    import tokview.servers as servers
    from tokview.ui.screens.doctor import APP_DOCTOR_WORDS

    with start_simulator(SimConfig(kind="vllm", tokenizer_dir=qwen_tok_dir, profile="qwen3")) as qwen:
        app = make_app(server_url=qwen.url)  # the app holds the Kimi layout
        async with app.run_test(size=(120, 60)) as pilot:
            await settle(app, pilot)
            await pilot.press("D")
            await settle(app, pilot)
            screen = app.screen
            assert isinstance(screen, DoctorScreen) and screen.report is not None
            shown = str(screen.query_one("#doctor-report", Static).render())
    assert any(c.title == "Vocabulary" and c.status == "fail" for c in screen.report.checks)
    assert "start the app with the served model's tokenizer folder (`tokview ui --tokenizer DIR`)" in shown
    assert "(--tokenizer DIR)" not in shown
    source = "".join(p.read_text() for p in Path(servers.__file__).parent.glob("doctor*.py"))
    joined = re.sub(r'"\s*\n\s*f?"', "", source)  # adjacent string literals read as one
    stale = [cli for cli, _ in APP_DOCTOR_WORDS if cli not in joined]
    assert not stale, stale  # every phrase reworded is still one the report says


def test_doctor_report_advice_in_app_words():
    from tokview.ui.screens.doctor import in_app_words

    assert in_app_words("  → use --profile kimi-k2 (its template pre-fills the opener)") == (
        "  → start the app with `tokview ui --profile kimi-k2` (its template pre-fills the opener)"
    )
    assert in_app_words("  → capture with --mode chat (the endpoint that returns ids)") == (
        "  → capture with the generate panel's mode parsed chat (the endpoint that returns ids)"
    )
    assert "--reasoning-parser qwen3" in in_app_words("  → start the server with --reasoning-parser qwen3")
