"""Help names every key (Textual's palette and dialogs' enter too) and the config file in use, scrolls with
Home/End and has its own footer; the theme chosen with T is remembered in that file, one key written."""

from __future__ import annotations

import tomllib

import pytest
from ui.helpers import settle

from tokview.ui.config import ConfigError, load_config, remember_theme

USER_CONFIG = """# my tokview settings
[ui]
reviewer = "alice"   # me
view_mode = "both"

[keymap]
"curate.approve" = "A"

[other_tool]
x = 1
"""


def test_remember_theme_writes_one_line_and_keeps_every_other_byte(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(USER_CONFIG)
    remember_theme("textual-light", path)
    written = path.read_text()
    assert written == USER_CONFIG.replace("[ui]\n", '[ui]\ntheme = "textual-light"\n')
    remember_theme("textual-dark", path)  # the line is replaced, not added twice
    assert path.read_text() == USER_CONFIG.replace("[ui]\n", '[ui]\ntheme = "textual-dark"\n')
    assert load_config(path).reviewer == "alice"
    assert load_config(path).keymap == {"curate.approve": "A"}


def test_remember_theme_creates_a_missing_file_and_appends_a_ui_table(tmp_path):
    path = tmp_path / "sub" / "config.toml"
    remember_theme("textual-light", path)
    assert tomllib.loads(path.read_text()) == {"ui": {"theme": "textual-light"}}
    other = tmp_path / "other.toml"
    other.write_text('[keymap]\n"curate.approve" = "A"')  # no newline at the end
    remember_theme("textual-light", other)
    assert tomllib.loads(other.read_text()) == {"keymap": {"curate.approve": "A"}, "ui": {"theme": "textual-light"}}


def test_remember_theme_refuses_rather_than_clobber(tmp_path):
    path = tmp_path / "config.toml"
    text = 'ui = { reviewer = "alice" }\n'
    path.write_text(text)
    with pytest.raises(ConfigError, match="by hand"):
        remember_theme("textual-light", path)
    assert path.read_text() == text
    assert list(tmp_path.iterdir()) == [path]  # no temporary left behind


def test_remember_theme_writes_through_a_symlinked_config_and_refuses_a_broken_one(tmp_path):
    """A dotfiles checkout links the config: the link was replaced by a plain file (the real dotfile never got the
    theme). A config no longer UTF-8 (edited while the app ran) or nested too deep raised past the app's handler."""
    real = tmp_path / "dotfiles" / "config.toml"
    real.parent.mkdir()
    real.write_text(USER_CONFIG)
    link = tmp_path / "config.toml"
    link.symlink_to("dotfiles/config.toml")
    remember_theme("textual-light", link)
    assert link.is_symlink() and 'theme = "textual-light"' in real.read_text()
    for broken in (b'[ui]\nreviewer = "\xe9"\n', ("a = " + "[" * 2000 + "]" * 2000 + "\n").encode()):
        real.write_bytes(broken)
        with pytest.raises(ConfigError, match="not valid TOML, so the theme was not written"):
            remember_theme("textual-dark", link)
        assert real.read_bytes() == broken
        with pytest.raises(ConfigError):
            load_config(link)


async def test_t_remembers_the_theme_in_the_config_in_use(make_app, tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(USER_CONFIG)
    app = make_app(load_config(path))
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("T")
        await settle(app, pilot)
    assert app.theme == "textual-light"
    assert load_config(path).theme == "textual-light"
    assert path.read_text() == USER_CONFIG.replace("[ui]\n", '[ui]\ntheme = "textual-light"\n')


async def test_help_names_the_config_lists_textual_keys_scrolls_and_shows_its_own_keys(make_app, tmp_path):
    from textual.widgets import DataTable, Label

    path = tmp_path / "mine.toml"
    path.write_text(USER_CONFIG)
    app = make_app(load_config(path))
    async with app.run_test(size=(100, 24)) as pilot:
        await settle(app, pilot)
        await pilot.press("question_mark")
        await settle(app, pilot)
        title = str(app.screen.query_one("#help-title", Label).render())
        assert str(path) in title
        assert "not there" not in title

        table = app.screen.query_one(DataTable)
        textual_keys = str(app.screen.query_one("#help-textual", Label).render())
        assert "^p command palette" in textual_keys
        assert "⏎ in a dialog" in textual_keys
        await pilot.press("end")
        assert table.cursor_row == table.row_count - 1
        assert table.scroll_y == table.max_scroll_y > 0
        await pilot.press("home")
        assert table.cursor_row == 0
        assert table.scroll_y == 0
        footer = {b.id for _, b, _, _ in app.screen.active_bindings.values() if b.show}
        assert "help.close" in footer
        assert "curate.approve" not in footer


async def test_under_help_the_screens_footer_is_hidden_and_back_after(make_app):
    from tokview.ui.widgets.footer import KeysFooter

    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        screen = app.screen
        footer = screen.query_one(KeysFooter)
        await pilot.press("question_mark")
        await settle(app, pilot)
        assert footer.styles.visibility == "hidden"
        assert app.screen.query_one(KeysFooter).styles.visibility == "visible"
        await pilot.press("escape")
        await settle(app, pilot)
        assert app.screen is screen
        assert footer.styles.visibility == "visible"


def test_help_without_a_config_file_names_where_it_would_be(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from tokview.ui.screens.help import config_in_use

    assert config_in_use(SimpleNamespace()) == "no config file ($TOKVIEW_CONFIG is not there: defaults)"
    monkeypatch.delenv("TOKVIEW_CONFIG")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert config_in_use(SimpleNamespace()) == "no config file (~/.config/tokview/config.toml is not there: defaults)"
