"""The bindings registry: one table every screen, the footer, help, palette and the keymap check read;
the config's keymap and theme refused in one line; the README's config example works as written."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
from ui.helpers import settle

from tokview.cli import main
from tokview.ui.bindings import BY_ID, KEYS, SCOPES, help_rows, keymap_problem
from tokview.ui.config import ConfigError, load_config

ROOT = Path(__file__).parents[2]


def ui_classes():
    """Every Screen and Widget class defined in tokview/ui."""
    import importlib

    from textual.dom import DOMNode

    found = []
    for path in sorted((ROOT / "tokview" / "ui").rglob("*.py")):
        module = importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, DOMNode) and value.__module__ == module.__name__:
                found.append(value)
    return found


def test_every_binding_of_every_screen_and_widget_comes_from_the_registry():
    seen = set()
    for cls in ui_classes():
        for b in cls.__dict__.get("BINDINGS", []):
            assert b.id in BY_ID, (cls.__name__, b)
            key = BY_ID[b.id]
            assert (b.key, b.action, b.description) == (key.keys, key.action, key.footer_label)
            seen.add(b.id)
    assert seen == set(BY_ID), f"registry entries no screen uses: {set(BY_ID) - seen}"
    assert len({k.id for k in KEYS}) == len(KEYS)
    assert {"help.close", "modal.cancel", "modal.cancel-reject", "modal.confirm"} <= set(BY_ID)


def test_help_lists_every_binding_with_its_id_and_remapped_keys():
    rows = {r[3]: r for r in help_rows({"curate.approve": "y", "modal.cancel": "ctrl+g"})}
    assert set(rows) == set(BY_ID)
    assert rows["curate.approve"][1] == "y"
    assert rows["modal.cancel"][1] == "^g"
    assert rows["curate.reject"][1] == "r"
    assert rows["samples.search"][1] == "/"
    assert rows["help.close"][1] == "esc ? q"
    assert rows["app.help"][1] == "? f1"


def test_modal_and_help_keys_can_be_remapped(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[keymap]\n"help.close" = "x"\n"modal.cancel" = "ctrl+g"\n"modal.cancel-reject" = "ctrl+g"\n')
    assert load_config(cfg).keymap["help.close"] == "x"


def test_a_key_bound_twice_is_one_line_naming_the_clash(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[keymap]\n"curate.approve" = "r"\n')
    with pytest.raises(ConfigError, match="binds 'r' to both curate.approve and curate.reject"):
        load_config(cfg)
    # the same key on two screens never live together is fine; '?' is the same key as question_mark
    assert keymap_problem({"inspect.mode": "o"}) is None
    assert "app.help" in (keymap_problem({"curate.tag": "?"}) or "")


def test_a_key_no_keyboard_sends_is_refused_in_one_line(tmp_path):
    """`"a b"` and `"ctrl+shift+frobnicate"` loaded, and Approve then had no key at all (the footer showed "a b"); a
    character's name (`section_sign`, even `banana`: 🍌) is a key Textual sends."""
    cfg = tmp_path / "c.toml"
    for keys, why in (("a b", "'a b' is no key name"), ("ctrl+shift+frobnicate", "'frobnicate' is no key name")):
        cfg.write_text(f'[keymap]\n"curate.approve" = "{keys}"\n')
        with pytest.raises(ConfigError, match=re.escape(f"binds '{keys}' to curate.approve: {why}")):
            load_config(cfg)
    cfg.write_text('[keymap]\n"curate.approve" = "hyper+x"\n"curate.reject" = "f13"\n"curate.note" = "ctrl+]"\n')
    assert load_config(cfg).keymap["curate.approve"] == "hyper+x"  # every name Textual sends is taken
    for sent in (
        "§",
        "section_sign",
        "plus_minus_sign",
        "pound_sign",
        "pause",
        "print_screen",
        "f30",
        "media_play_pause",
    ):
        assert keymap_problem({"curate.approve": sent}) is None, sent  # a UK keyboard's §, kitty's names
    assert keymap_problem({"curate.approve": "caps+a"}) == (
        "keymap binds 'caps+a' to curate.approve: 'caps' is no modifier (ctrl, shift, alt, meta, super, hyper)"
    )


def test_an_unknown_theme_lists_the_themes(tmp_path, capsys, monkeypatch):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[ui]\ntheme = "solarized-darkk"\n')
    with pytest.raises(ConfigError, match="unknown theme 'solarized-darkk' .themes: .*textual-light"):
        load_config(cfg)
    monkeypatch.setenv("TOKVIEW_CONFIG", str(cfg))
    assert main(["ui", "--db", str(tmp_path / "x.duckdb")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "textual-dark" in err


def readme_toml_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(r"```toml\n(.*?)```", text, flags=re.S)


def test_readme_config_examples_load_as_written(tmp_path):
    blocks = [b for b in readme_toml_blocks() if "[keymap]" in b or "[ui]" in b]
    assert blocks, "the README shows a config example"
    for block in blocks:
        cfg = tmp_path / "config.toml"
        cfg.write_text(block)
        load_config(cfg)  # raises on anything the app would refuse


async def test_readme_keymap_example_remaps_approve_in_the_app(tmp_path, make_app, store):
    block = next(b for b in readme_toml_blocks() if "[keymap]" in b)
    cfg = tmp_path / "config.toml"
    cfg.write_text(block)
    config = load_config(cfg)
    ((binding_id, keys),) = config.keymap.items()
    assert binding_id == "curate.approve"
    app = make_app(config)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        assert not app.current_theme.dark  # the example's [ui] theme
        await pilot.press("a")  # the default key no longer approves
        assert store.load_sample("p000@demo_gen0").status == "pending"
        await pilot.press("down", keys)  # p001: a valid sample, approved without a question
        assert store.load_sample("p001@demo_gen0").status == "approved"


def test_every_scope_names_known_groups():
    groups = {k.group for k in KEYS}
    assert {g for scope in SCOPES.values() for g in scope} == groups


def test_no_import_cycle_between_the_app_and_help():
    """help.py reads the registry, never the app or a screen; the registry imports no tokview.ui module."""
    for path, banned in (
        (ROOT / "tokview/ui/screens/help.py", ("tokview.ui.app", "tokview.ui.screens.")),
        (ROOT / "tokview/ui/bindings.py", ("tokview.ui",)),
    ):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
        imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        assert not [m for m in imported if m.startswith(banned)], (path, imported)
    done = subprocess.run(
        [sys.executable, "-c", "import tokview.ui.screens.help, sys; sys.exit('tokview.ui.app' in sys.modules)"],
        cwd=ROOT,
        capture_output=True,
    )
    assert done.returncode == 0
