"""What a curator met in the generate panel and the export dialog (a user pass): typed prompts that never ran, the
footer's one-letter keys typed into the server URL, a run of failures that said "done", the last run's full bar over
the next, a quit that left a run without a word, and the export dialog's summary cut at 8 lines and worded in the
CLI's flags."""

from __future__ import annotations

import asyncio

from textual.widgets import Button, Input, ProgressBar, Select, Static, TextArea
from textual.widgets._footer import FooterKey
from ui.helpers import settle, until

from tokview.sim import SimConfig, start_simulator
from tokview.ui.screens.generate import GenerateScreen


def _footer_keys(screen) -> set[str]:
    return {key.key_display for key in screen.query(FooterKey)}


async def test_typing_prompts_chooses_them_and_editing_the_file_path_chooses_the_file(make_app):
    """Typed with the source left at `file`, the prompts were ignored and the default file's 30 prompts ran."""
    app = make_app(server_url="http://127.0.0.1:9")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("g")
        screen = app.screen
        assert isinstance(screen, GenerateScreen)
        source = screen.query_one("#source", Select)
        assert source.value == "file"
        screen.query_one("#typed", TextArea).focus()
        await pilot.press("end", "x")
        await pilot.pause()
        assert source.value == "typed"
        screen.query_one("#prompts-file", Input).focus()
        await pilot.press("end", "backspace")
        await pilot.pause()
        assert source.value == "file"


async def test_one_letter_keys_leave_the_footer_while_a_text_box_takes_them(make_app):
    """The URL box has the focus when the panel opens: `? D S E T` typed `?DSET` into it while the footer offered
    them as keys."""
    app = make_app(server_url="http://127.0.0.1:9")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        assert "?" in _footer_keys(app.screen)
        await pilot.press("g")
        screen = app.screen
        assert isinstance(screen.focused, Input)
        await pilot.pause()
        shown = _footer_keys(screen)
        assert "?" not in shown and "q" not in shown, shown
        assert "esc" in shown and "^c" in shown, shown  # what still acts from a text box
        screen.query_one("#run", Button).focus()
        await pilot.pause()
        assert "?" in _footer_keys(screen)


async def test_a_run_whose_every_request_failed_says_so_and_a_new_run_starts_its_bar_at_zero(make_app):
    with start_simulator(SimConfig(kind="vllm", quirks={"http-500": True})) as failing:
        app = make_app(server_url=failing.url)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(app, pilot)
            await pilot.press("g")
            screen = app.screen
            screen.query_one("#source", Select).value = "typed"
            screen.query_one("#typed", TextArea).text = "What is 2+2?"
            screen.query_one("#max-tokens", Input).value = "16"
            await pilot.press("ctrl+s")
            await until(pilot, lambda: screen.last_summary is not None, "the run's end")
            await settle(app, pilot)
            line = str(screen.query_one("#progress-line", Static).render())
            assert line.startswith("failed: "), line
            errors = [str(n.message) for n in app._notifications if n.severity == "error"]
            assert any(m.startswith("1 of 1 requests failed") for m in errors), errors
            bar = screen.query_one("#bar", ProgressBar)
            assert bar.progress == bar.total == 1
            screen.last_summary = None
            screen.query_one("#server", Input).value = "http://127.0.0.1:9"  # nothing listens: the next run fails
            await pilot.press("ctrl+s")
            await pilot.pause()
            assert bar.progress == 0, "the last run's 100% stood over this one"
            await until(pilot, lambda: screen.cancel_event is None, "the failed start")


async def test_ctrl_c_on_an_idle_panel_says_nothing_runs_and_quit_during_a_run_asks_again(make_app):
    app = make_app(server_url="http://127.0.0.1:9")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("g")
        screen = app.screen
        await pilot.press("ctrl+c")
        await pilot.pause()
        assert any(str(n.message) == "no run is in progress" for n in app._notifications)
        screen.cancel_event = asyncio.Event()  # as while a run goes on
        await pilot.press("ctrl+q")
        await pilot.pause()
        assert app.is_running, "ctrl+q left a running run at once"
        assert any("quit again to leave now" in str(n.message) for n in app._notifications)
        screen.cancel_event = None
        await pilot.press("ctrl+q")
        await pilot.pause()
    assert app.return_code is not None


async def test_the_export_dialog_speaks_its_own_labels_scrolls_its_summary_and_refuses_a_stream(make_app, tmp_path):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("E")
        dialog = app.screen
        path = dialog.query_one("#export-path", Input)
        path.value = "-"
        await pilot.press("ctrl+s")
        await settle(app, pilot)
        said = str(dialog.query_one("#export-summary").render())
        assert said.startswith("the dialog writes a file: give its path"), said  # was "[Errno 9] Bad file descriptor"
        path.value = str(tmp_path / "out.jsonl")
        dialog.query_one("#export-run", Input).value = "no-such-run"
        await pilot.press("ctrl+s")
        await settle(app, pilot)
        said = str(dialog.query_one("#export-summary").render())
        assert "selection valid" in said and "run no-such-run" in said, said
        assert "--" not in said, said
        dialog.query_one("#export-run", Input).value = ""
        dialog.query_one("#export-select", Select).value = "all"
        dialog.query_one("#export-format", Select).value = "sharegpt"  # its summary ends with each trainer's path
        await pilot.pause()
        await pilot.press("ctrl+s")
        await settle(app, pilot)
        summary = dialog.query_one("#export-summary", Static)
        text = str(summary.render())
        assert text.startswith("exported "), text
        assert "--select" not in text and "--include-invalid" not in text, text
        assert "exact" in text.splitlines()[-1], text  # the last line: how exact each trainer's re-render is
        box = dialog.query_one("#export-summary-box")
        assert summary.size.height > 8, "cut at 8 rows, the last lines were never seen"
        box.scroll_end(animate=False)
        await pilot.pause()
        assert box.scroll_y == box.max_scroll_y and box.scroll_y + box.size.height >= summary.size.height


async def test_a_retry_reason_with_brackets_is_shown_as_text(make_app):
    """The progress line quotes the server's retry reason: `[/x] overloaded` was read as markup and the app exited."""
    from tokview.batch import BatchProgress

    app = make_app(server_url="http://127.0.0.1:9")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("g")
        screen = app.screen
        for reason in ("[/x] overloaded", "[@click=app.quit]x[/]", "[link=http://e]y"):
            screen.post_message(GenerateScreen.Progress(BatchProgress(total=3, retried=2, last_retry=reason)))
            await pilot.pause()
            assert reason in str(screen.query_one("#progress-line", Static).render())
        assert app.is_running


def test_flags_are_said_in_the_forms_words_but_no_name_path_or_url_is_touched():
    from tokview.ui.form_words import in_words
    from tokview.ui.screens.export_dialog import DIALOG_NAMES
    from tokview.ui.screens.generate import in_form_words

    assert in_form_words("--temperature must be 0 or more") == "temp must be 0 or more"
    for kept in (
        "prompts file not found: /data/temperature/--run/x.jsonl",
        "run sweep.temperature: max_new_tokens (40000) exceeds the limit; temperature=-1",
        "GET http://10.0.0.2:8000/--db/v1?x=--run&samples_per_prompt=2",
        "run sweep--run-2 stopped",
    ):
        assert in_form_words(kept) == kept
    assert (
        in_words("no samples match --select valid --run r1", DIALOG_NAMES) == "no samples match selection valid run r1"
    )


async def test_a_run_stopped_for_another_vocabulary_says_what_the_app_can_do(make_app, qwen_tok_dir):
    """The app's Kimi tokenizer in front of a Qwen3 server: the stop said "--tokenizer DIR … or pass --any-vocabulary",
    neither of which the form has, and its notification read the server's words as markup."""
    with start_simulator(SimConfig(kind="vllm", tokenizer_dir=qwen_tok_dir, profile="qwen3")) as qwen:
        app = make_app(server_url=qwen.url)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(app, pilot)
            await pilot.press("g")
            screen = app.screen
            screen.query_one("#source", Select).value = "typed"
            screen.query_one("#typed", TextArea).text = "\n".join(f"Say something about rivers, {k}" for k in range(8))
            screen.query_one("#mode", Select).value = "chat"
            await pilot.press("ctrl+s")
            await until(pilot, lambda: screen.last_summary is not None, "the run's end")
            await settle(app, pilot)
            line = str(screen.query_one("#progress-line", Static).render())
            assert line.startswith("stopped: "), line
            assert "the server's answers read as other text" in line
            assert "`tokview ui --tokenizer DIR`" in line and "--any-vocabulary" not in line, line
            warned = [str(n.message) for n in app._notifications if n.severity == "warning"]
            assert any("the run stopped: the server's answers read as other text" in m for m in warned), warned
