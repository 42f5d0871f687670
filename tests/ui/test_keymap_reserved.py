"""Issue 25: a remap to a key Textual keeps for itself (tab moves the focus) is refused in one line; it was
accepted and then did nothing."""

from __future__ import annotations

import pytest

from tokview.ui.bindings import keymap_problem
from tokview.ui.config import ConfigError, load_config


@pytest.mark.parametrize(
    "keys,why",
    [("tab", "moves the focus to the next field"), ("s,shift+tab", "moves the focus back"), ("ctrl+q", "quits")],
)
def test_a_key_textual_keeps_is_refused_naming_it(tmp_path, keys, why):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[keymap]\n"inspect.swap" = "{keys}"\n')
    with pytest.raises(ConfigError) as raised:
        load_config(cfg)
    message = str(raised.value)
    assert "\n" not in message and "inspect.swap" in message and why in message


def test_ctrl_c_is_refused_except_for_a_binding_that_takes_it_first():
    assert "ctrl+c" in (keymap_problem({"inspect.swap": "ctrl+c"}) or "")
    assert keymap_problem({"generate.cancel": "ctrl+c,ctrl+x"}) is None  # its default, a priority binding
    assert keymap_problem({"inspect.swap": "s,w"}) is None
