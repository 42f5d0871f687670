"""Help from bindings, keymap remapping from the config file, themes, palette entries, the ui command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from ui.helpers import settle

from tokview.cli import main
from tokview.ui.bindings import help_rows
from tokview.ui.config import ConfigError, load_config, remember_theme
from tokview.ui.screens.help import HelpScreen

ROOT = Path(__file__).parents[2]


def test_config_is_strict(tmp_path):
    bad = tmp_path / "c.toml"
    bad.write_text('[ui]\nthem = "x"\n')
    with pytest.raises(ConfigError, match="unknown \\[ui\\] keys"):
        load_config(bad)
    bad.write_text('[ui]\nview_mode = "bytes"\n')
    with pytest.raises(ConfigError, match="view_mode"):
        load_config(bad)
    good = tmp_path / "g.toml"
    good.write_text(
        '[ui]\ntheme = "textual-light"\nview_mode = "both"\n[keymap]\n"curate.approve" = "y"\n'
        "[batch]\nconcurrency = 4\n"
    )
    config = load_config(good)
    assert (config.theme, config.view_mode, config.keymap) == ("textual-light", "both", {"curate.approve": "y"})
    with pytest.raises(ConfigError, match="is a folder: name the config.toml file in it"):
        load_config(tmp_path)  # TOKVIEW_CONFIG=<a folder> was silently ignored
    assert load_config(tmp_path / "missing.toml").path is None  # no file yet: the defaults
    bom = tmp_path / "bom.toml"  # as an editor on Windows saves it: refused as "Invalid statement (line 1, column 1)"
    bom.write_bytes(b"\xef\xbb\xbf" + good.read_bytes())
    assert load_config(bom).theme == "textual-light"
    remember_theme("nord", bom)  # written into it too, the BOM kept
    assert bom.read_bytes().startswith(b"\xef\xbb\xbf") and load_config(bom).theme == "nord"


async def test_help_theme_toggle_and_palette_commands(make_app):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        assert app.current_theme.dark
        await pilot.press("T")
        assert not app.current_theme.dark
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        table = app.screen.query_one("#help-table")
        assert table.row_count == len(help_rows({}))
        await pilot.press("escape")
        await pilot.pause()
        titles = {c.title for c in app.get_system_commands(app.screen)}
        assert {"Approve", "Reject", "Undo", "Sort", "Help"} <= titles
        await pilot.press("ctrl+p")  # asked from the palette, whose screen is then the active one
        await pilot.pause()
        under = app.screen_stack[-2]
        titles = {c.title for c in app.get_system_commands(under)}
        assert {"Approve", "Reject", "Note", "Tag", "Undo"} <= titles, titles
        await pilot.press("escape")


def test_ui_command_refuses_bad_input_in_one_line(tmp_path, capsys, monkeypatch):
    assert main(["ui", "--db", str(tmp_path / "x.duckdb"), "--profile", "nope"]) == 1
    assert capsys.readouterr().err.count("\n") == 1
    assert main(["ui", "--db", str(tmp_path / "x.duckdb"), "--tokenizer", str(tmp_path / "missing")]) == 1
    capsys.readouterr()
    for bad in ("http://127.0.0.1:99999", "http://", "ftp://127.0.0.1:8000", "http://u:s3cret@127.0.0.1:99999"):
        assert main(["ui", "--db", str(tmp_path / "x.duckdb"), "--server", bad]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        assert "bad server URL" in err
        assert "s3cret" not in err
    assert not (tmp_path / "x.duckdb").exists()  # refused before the store was created
    cfg = tmp_path / "c.toml"
    cfg.write_text('[keymap]\n"no.such.binding" = "x"\n')
    monkeypatch.setenv("TOKVIEW_CONFIG", str(cfg))
    assert main(["ui", "--db", str(tmp_path / "x.duckdb")]) == 1
    assert "no.such.binding" in capsys.readouterr().err


def test_ui_command_prints_what_it_changed_about_the_server_url(tmp_path, capsys):
    """The /v1 note is printed before the app would take the terminal (a bad --profile stops it here)."""
    assert (
        main(["ui", "--db", str(tmp_path / "x.duckdb"), "--server", "http://127.0.0.1:8000/v1", "--profile", "nope"])
        == 1
    )
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (
        "tokview: note: dropped the trailing /v1 from the server URL: tokview adds /v1/... and /generate itself"
    )
    assert len(err) == 2
    assert err[1].startswith("tokview: error:")


def test_textual_is_imported_only_by_the_ui():
    """Static: no module outside tokview/ui (and the ui/demo commands, lazily) imports textual."""
    allowed = {ROOT / "tokview" / "commands" / "ui.py", ROOT / "tokview" / "commands" / "demo.py"}
    for path in (ROOT / "tokview").rglob("*.py"):
        if "ui" in path.relative_to(ROOT / "tokview").parts[:1] or path in allowed:
            continue
        text = path.read_text(encoding="utf-8")
        assert "import textual" not in text, path
        assert "from textual" not in text, path


def test_headless_commands_never_load_textual():
    code = (
        "import sys; from tokview.cli import build_parser; build_parser(); "
        "import tokview.store, tokview.batch, tokview.servers, tokview.sim, tokview.commands.demo; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('textual', 'textual_plotext')]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_store_that_does_not_exist_is_not_created_without_asking(tmp_path, capsys, monkeypatch):
    from tokview.commands import ui as ui_command

    typo = tmp_path / "tpyo" / "x.duckdb"
    assert main(["ui", "--db", str(typo)]) == 1  # stdin is not a terminal here: no question, a clear refusal
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "database not found" in err
    assert "--create" in err
    assert not typo.parent.exists()
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True, raising=False)
    answers = iter(["n", "y"])
    monkeypatch.setattr("builtins.input", lambda prompt: next(answers))
    with pytest.raises(Exception, match="nothing created"):
        ui_command.confirm_new_store(str(typo), create=False)
    ui_command.confirm_new_store(str(typo), create=False)  # "y": the caller goes on and creates it
    ui_command.confirm_new_store(str(typo), create=True)  # --create: no question
    assert not typo.parent.exists()
