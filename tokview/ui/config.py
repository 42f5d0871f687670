"""The UI's settings file: theme, view mode, reject reasons and a keymap by binding id.

Read from `$TOKVIEW_CONFIG` or `~/.config/tokview/config.toml` with `tomllib`. Only the `[ui]` and
`[keymap]` tables belong to the app (other tables are other commands'); unknown keys in them are refused
with a one-line error, so a typo never silently does nothing.

    [ui]
    theme = "textual-light"
    view_mode = "both"
    reject_reasons = ["truncated", "bad answer"]

    [keymap]
    "curate.approve" = "y"
    "curate.reject" = "x,delete"
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from tokview.ui.display import VIEW_MODES
from tokview.ui.screens.modals import REJECT_REASONS


class ConfigError(ValueError):
    """The config file cannot be read or has keys the app does not know."""


@dataclass
class UIConfig:
    theme: str = "textual-dark"
    view_mode: str = "pieces"
    reject_reasons: tuple[str, ...] = REJECT_REASONS
    keymap: dict[str, str] = field(default_factory=dict)
    path: Path | None = None


def config_path() -> Path:
    env = os.environ.get("TOKVIEW_CONFIG")
    return Path(env).expanduser() if env else Path.home() / ".config" / "tokview" / "config.toml"


def load_config(path: Path | None = None) -> UIConfig:
    path = path or config_path()
    if not path.is_file():
        return UIConfig()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config {path} is not valid TOML: {exc}") from None
    ui = data.get("ui", {})
    keymap = data.get("keymap", {})
    if not isinstance(ui, dict) or not isinstance(keymap, dict):
        raise ConfigError(f"config {path}: [ui] and [keymap] must be tables")
    unknown = set(ui) - {"theme", "view_mode", "reject_reasons"}
    if unknown:
        raise ConfigError(f"config {path}: unknown [ui] keys {sorted(unknown)}")
    config = UIConfig(path=path)
    if "theme" in ui:
        config.theme = str(ui["theme"])
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
            raise ConfigError(f"config {path}: keymap {binding_id!r} must be a key string like \"ctrl+a\"")
    config.keymap = {str(k): str(v) for k, v in keymap.items()}
    return config
