"""The generate panel's form: an absolute default prompts path, empty fields mean the defaults they show,
and errors name the form's fields, not the CLI's flags."""

from __future__ import annotations

import os

from textual.widgets import Input, Static
from ui.helpers import settle

from tokview.ui.screens.generate import GenerateScreen, in_form_words


async def test_the_form_defaults_are_what_runs(make_app, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # started from another folder: the default prompts still exist
    app = make_app(server_url="http://127.0.0.1:9")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("g")
        screen = app.screen
        assert isinstance(screen, GenerateScreen)
        prompts = screen.query_one("#prompts-file", Input).value
        assert os.path.isabs(prompts)
        assert os.path.isfile(prompts)
        for name in ("temperature", "samples", "max-tokens"):
            box = screen.query_one(f"#{name}", Input)
            box.value = ""
        config = screen.build_config()
        assert (config.temperature, config.samples_per_prompt, config.max_new_tokens) == (0.6, 1, 256)
        assert screen.query_one("#temperature", Input).placeholder == "0.6"


async def test_panel_errors_name_the_form_fields(make_app):
    app = make_app(server_url="http://127.0.0.1:9")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("g")
        screen = app.screen
        screen.query_one("#max-tokens", Input).value = "0"
        await pilot.press("ctrl+s")
        await settle(app, pilot)
        line = str(screen.query_one("#progress-line", Static).render())
        assert "max tok must be at least 1" in line
        assert "--" not in line
        from tokview.errors import UserError

        refused = UserError("run x was made with other max_new_tokens (…): choose another --run name")
        assert screen.worker_failed(None, refused) is False  # the app notifies it: in the form's words too
        assert refused.message.endswith("choose another run name") and str(refused) == refused.message
    assert in_form_words("--temperature must be 0 or more") == "temp must be 0 or more"
    assert in_form_words("run sweep--run-2 stopped; re-run the same command") == (
        "run sweep--run-2 stopped; run the same form again"  # a flag is a word of its own
    )
    said = "--server failed (`tokview doctor --server URL` says why)"
    assert in_form_words(said) == "server failed (`tokview doctor --server URL` says why)"  # a command stays one
    assert in_form_words("run x was made with other max_new_tokens (…): choose another --run name").endswith(
        "choose another run name"
    )


async def test_the_first_key_in_a_panel_does_not_replace_the_server_url(make_app):
    """The URL box took the focus with its text selected: `?` (help, in the footer) or any first letter replaced
    the server's URL, and the doctor then said "bad server URL '?'"."""
    app = make_app(server_url="http://127.0.0.1:9")
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        for key, box in (("g", "#server"), ("D", "#doctor-url")):
            await pilot.press(key)
            await settle(app, pilot)
            await pilot.press("x")
            assert app.screen.query_one(box, Input).value.startswith("http://127.0.0.1:9"), key
            await pilot.press("escape")
            await settle(app, pilot)
