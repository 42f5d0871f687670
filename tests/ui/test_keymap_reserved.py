"""A remap to a key Textual keeps for itself (tab moves the focus) is refused in one line, not accepted to
do nothing."""

from __future__ import annotations

import pytest

from tokview.ui.bindings import keymap_problem
from tokview.ui.config import ConfigError, load_config


@pytest.mark.parametrize(
    "binding,keys,why",
    [
        ("curate.next", "tab", "moves the focus to the next field in every screen first"),
        ("app.help", "question_mark,shift+tab", "moves the focus back"),
        ("inspect.swap", "ctrl+q", "quits before any screen sees it"),
        ("inspect.swap", "ctrl+p", "opens the command palette"),
    ],
)
def test_a_key_textual_takes_first_is_refused_naming_it(tmp_path, binding, keys, why):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[keymap]\n"{binding}" = "{keys}"\n')
    with pytest.raises(ConfigError) as raised:
        load_config(cfg)
    message = str(raised.value)
    assert "\n" not in message
    assert binding in message
    assert why in message


async def test_a_screen_binding_on_tab_and_an_app_binding_on_ctrl_q_work(make_app):
    """What Textual lets through stays allowed: a screen's own binding comes before its tab, and an app-wide
    binding replaces Textual's app-level ctrl+q (ctrl+c stays free of this check too)."""
    from ui.helpers import settle

    from tokview.ui.config import UIConfig
    from tokview.ui.screens.help import HelpScreen

    keymap = {"inspect.findings": "tab", "app.help": "ctrl+q"}
    assert keymap_problem(keymap) is None
    assert keymap_problem({"inspect.swap": "ctrl+c"}) is None
    app = make_app(UIConfig(keymap=keymap))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("down", "enter")
        await settle(app, pilot)
        await pilot.press("tab")
        assert app.screen.focused.id == "findings"  # focus_next would have gone to the other pane
        await pilot.press("ctrl+q")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        assert app.is_running
