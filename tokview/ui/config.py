"""The UI's settings file: theme, view mode, reject reasons and a keymap by binding id.

Read from `$TOKVIEW_CONFIG` or `~/.config/tokview/config.toml` with `tomllib`. Only the `[ui]` and
`[keymap]` tables belong to the app (other tables are other commands'); unknown keys in them are refused
with a one-line error, so a typo never silently does nothing: an unknown theme names the themes there are,
a keymap id must be one of the bindings registry's, and a key bound twice where both are live names the clash.

    [ui]
    theme = "textual-light"
    view_mode = "both"
    reject_reasons = ["truncated", "bad answer"]
    reviewer = "alice"          # who verdicts are recorded as (default: $USER)
    auto_advance = true         # a verdict in inspect opens the next pending sample (> toggles it)

    [keymap]
    "curate.approve" = "y"
    "curate.reject" = "x,delete"
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from tokview.core.json_cache import home_expanded
from tokview.errors import TokviewError
from tokview.ui.bindings import keymap_problem, split_keys
from tokview.ui.display import VIEW_MODES
from tokview.ui.screens.modals import REJECT_REASONS


class ConfigError(TokviewError):
    """The config file cannot be read or has keys the app does not know."""

    title = "config"


@dataclass
class UIConfig:
    theme: str = "textual-dark"
    view_mode: str = "pieces"
    reject_reasons: tuple[str, ...] = REJECT_REASONS
    keymap: dict[str, str] = field(default_factory=dict)
    reviewer: str | None = None
    auto_advance: bool = False
    path: Path | None = None


def theme_names() -> list[str]:
    from textual.theme import BUILTIN_THEMES

    return sorted(BUILTIN_THEMES)


def config_path() -> Path:
    env = os.environ.get("TOKVIEW_CONFIG")
    return home_expanded(env, "TOKVIEW_CONFIG") if env else Path.home() / ".config" / "tokview" / "config.toml"


def load_config(path: Path | None = None) -> UIConfig:
    path = path or config_path()
    if path.is_dir():  # TOKVIEW_CONFIG naming a folder was silently ignored
        raise ConfigError(f"config {path} is a folder: name the config.toml file in it")
    if not path.is_file():
        return UIConfig()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8-sig"))  # a BOM, as an editor on Windows writes
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config {path} is not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"config {path} nests its values too deep to read") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror or exc}") from None
    ui = data.get("ui", {})
    keymap = data.get("keymap", {})
    if not isinstance(ui, dict) or not isinstance(keymap, dict):
        raise ConfigError(f"config {path}: [ui] and [keymap] must be tables")
    unknown = set(ui) - {"theme", "view_mode", "reject_reasons", "reviewer", "auto_advance"}
    if unknown:
        raise ConfigError(f"config {path}: unknown [ui] keys {sorted(unknown)}")
    config = UIConfig(path=path)
    if "theme" in ui:
        if ui["theme"] not in theme_names():
            raise ConfigError(f"config {path}: unknown theme {ui['theme']!r} (themes: {', '.join(theme_names())})")
        config.theme = ui["theme"]
    if "reviewer" in ui:
        if not isinstance(ui["reviewer"], str) or not ui["reviewer"].strip():
            raise ConfigError(f"config {path}: reviewer must be a non-empty string")
        config.reviewer = ui["reviewer"].strip()
    if "auto_advance" in ui:
        if not isinstance(ui["auto_advance"], bool):
            raise ConfigError(f"config {path}: auto_advance must be true or false")
        config.auto_advance = ui["auto_advance"]
    if "view_mode" in ui:
        if ui["view_mode"] not in VIEW_MODES:
            raise ConfigError(f"config {path}: view_mode must be one of {', '.join(VIEW_MODES)}")
        config.view_mode = ui["view_mode"]
    if "reject_reasons" in ui:
        reasons = ui["reject_reasons"]
        if not isinstance(reasons, list) or not all(isinstance(r, str) for r in reasons):
            raise ConfigError(f"config {path}: reject_reasons must be a list of strings")
        config.reject_reasons = tuple(reasons)
    for binding_id, keys in keymap.items():
        if not isinstance(keys, str) or not keys.strip():
            raise ConfigError(f'config {path}: keymap {binding_id!r} must be a key string like "ctrl+a"')
    config.keymap = {str(k): ",".join(split_keys(v)) for k, v in keymap.items()}
    problem = keymap_problem(config.keymap)
    if problem:
        raise ConfigError(f"config {path}: {problem}")
    return config


_HEADER = re.compile(r"^\s*\[\s*([^\]]*?)\s*\]\s*(#.*)?$")
_THEME_LINE = re.compile(r"^(\s*)theme\s*=")


def remember_theme(theme: str, path: Path | None = None) -> Path:
    """Write `[ui] theme` into the config file in use, touching nothing else: one line replaced or added,
    every other byte as it was (comments, other tables, the keymap). Checked by reading the result back: when
    the edit would change anything else (e.g. `ui` written as an inline table), nothing is written and a
    ConfigError says why. Written to a temporary file and renamed, so a crash leaves the old file whole; a config that
    is a symlink (a dotfiles checkout) has the file it points to written, the link kept."""
    path = path or config_path()
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    try:
        old = path.read_text(encoding="utf-8") if path.is_file() else ""
        bom = "\ufeff" if old.startswith("\ufeff") else ""  # kept as it was, before the TOML the edit reads
        old = old.removeprefix(bom)
        before = tomllib.loads(old)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError) as exc:
        why = f": {exc}" if not isinstance(exc, RecursionError) else " (its values nest too deep)"
        raise ConfigError(f"config {path} is not valid TOML, so the theme was not written{why}") from None
    new = _with_ui_theme(old, theme)
    expected = {**before, "ui": {**before.get("ui", {}), "theme": theme}}
    try:
        after = tomllib.loads(new)
    except tomllib.TOMLDecodeError:
        after = None
    if after != expected:
        raise ConfigError(
            f"config {path}: cannot add the theme without changing other settings; set [ui] theme by hand"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tokview-tmp")
    temporary.write_text(bom + new, encoding="utf-8")
    if path.exists():
        os.chmod(temporary, path.stat().st_mode & 0o7777)
    os.replace(temporary, path)
    return path


def _with_ui_theme(text: str, theme: str) -> str:
    """`text` with the `[ui]` table's theme line replaced, or added under `[ui]`, or a `[ui]` table appended."""
    value = f"theme = {json.dumps(theme)}"  # a theme name is a TOML basic string written as JSON writes it
    lines = text.splitlines(keepends=True)
    headers = [(i, m.group(1)) for i, line in enumerate(lines) if (m := _HEADER.match(line))]
    ui = next((i for i, name in headers if name == "ui"), None)
    if ui is None:
        separator = "" if not text or text.endswith("\n\n") else ("\n" if text.endswith("\n") else "\n\n")
        return text + separator + "[ui]\n" + value + "\n"
    end = next((i for i, _ in headers if i > ui), len(lines))
    for i in range(ui + 1, end):
        match = _THEME_LINE.match(lines[i])
        if match:
            lines[i] = match.group(1) + value + ("\n" if lines[i].endswith("\n") else "")
            return "".join(lines)
    if not lines[ui].endswith("\n"):
        lines[ui] += "\n"
    lines.insert(ui + 1, value + "\n")
    return "".join(lines)
