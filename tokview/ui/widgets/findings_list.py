"""The inspect screen's findings: an OptionList whose options re-wrap inside the layout that resizes it.

Why: Textual's OptionList re-wraps its options only when its Resize event arrives, after the frame at
the new size was painted, and the new line count then asks for another layout. So every resize of the
inspect screen painted the findings wrapped to the old width first (a frame showing text cut wrong and
a stale scroll bar), then laid the screen out again and painted twice more before it was right. Here
the options are wrapped for the new width while the layout runs, as the token view does with its rows,
so the first frame at a new size shows them right; the Resize event then has nothing left to do.
(Textual is pinned exactly: `_size_updated`, `_clear_caches` and `_update_lines` are OptionList's
private layout hook and line cache.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rich.style import Style
from rich.text import Text
from textual import events
from textual.geometry import Size
from textual.widgets import OptionList
from textual.widgets.option_list import Option


@dataclass(frozen=True)
class FindingRow:
    """One finding as the list shows it; `option_id` is "finding-<index in the analysis>"."""

    option_id: str
    severity: str
    code: str
    where: str
    detail: str
    why: str = ""


NO_FINDINGS = "no findings: the ids look like a clean training sample"


class FindingsList(OptionList):
    """Findings, coloured from component classes (so a theme change repaints them readable, in the light
    theme too: fixed Rich colours measured 1.2:1 for "warn" on the light surface and 1.7:1 for "info" on a
    highlighted finding); the highlight is a tint, so each colour reads on it as on the surface."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "findings--error",
        "findings--warn",
        "findings--info",
        "findings--muted",
        "findings--clean",
    }

    DEFAULT_CSS = """
    FindingsList > .findings--error { color: $text-error; text-style: bold; }
    FindingsList > .findings--warn { color: $text-warning; }
    FindingsList > .findings--info { color: #87d7ff; }
    FindingsList > .findings--muted { color: $text-muted; }
    FindingsList > .findings--clean { color: $text-success; }
    FindingsList:light > .findings--error { color: #870000; }
    FindingsList:light > .findings--warn { color: #5f005f; }
    FindingsList:light > .findings--info { color: #00005f; }
    FindingsList:light > .findings--muted { color: #3a3a3a; }
    FindingsList:light > .findings--clean { color: #005f00; }
    FindingsList > .option-list--option-highlighted { background: $primary 18%; color: $foreground; text-style: bold; }
    FindingsList:focus > .option-list--option-highlighted { background: $primary 30%; }
    FindingsList:light > .option-list--option-highlighted { background: $primary 10%; }
    FindingsList:light:focus > .option-list--option-highlighted { background: $primary 16%; }
    """

    _wrapped_for: int | None = None
    """The content width the cached option lines were wrapped for."""

    def __init__(self, rows: list[FindingRow], *, id: str | None = None) -> None:
        options = [Option(self._prompt(row, plain=True), id=row.option_id) for row in rows] or [
            Option(Text(NO_FINDINGS), id="finding-none", disabled=True)
        ]  # coloured once mounted: the component classes' colours are known then
        super().__init__(*options, id=id)
        self.rows = rows
        self._painted_with: tuple[Style, ...] | None = None

    def on_mount(self) -> None:
        self._repaint()

    def _role(self, name: str, plain: bool = False) -> Style:
        return Style() if plain else self.get_component_rich_style(f"findings--{name}", partial=True)

    def _roles(self) -> tuple[Style, ...]:
        return tuple(self._role(name) for name in ("error", "warn", "info", "muted", "clean"))

    def _prompt(self, row: FindingRow, plain: bool = False) -> Text:
        severity = self._role(row.severity, plain) if row.severity in ("error", "warn", "info") else Style()
        muted = self._role("muted", plain)
        text = Text.assemble((f"{row.severity:5} ", severity), (row.code, "bold"), (row.where, muted), "\n", row.detail)
        if row.why:
            text.append("\n" + row.why, muted + Style(italic=True))
        return text

    def notify_style_update(self) -> None:
        """A theme change: the prompts are re-coloured once the new component styles are in place."""
        super().notify_style_update()
        if self._painted_with is not None and self.is_attached:
            self.call_after_refresh(self._repaint)

    def _repaint(self) -> None:
        """Colour the prompts with the current theme's roles (only when one changed: focus restyles too). Scheduled
        after a refresh, it may run once its screen is gone (`esc` right after `f`): its styles are gone then too."""
        if not self.is_attached:
            return
        try:
            roles = self._roles()
        except KeyError:  # "No 'findings--error' key in COMPONENT_CLASSES": the widget is being removed
            return
        if roles == self._painted_with:
            return
        self._painted_with = roles
        for index, row in enumerate(self.rows):
            self.replace_option_prompt_at_index(index, self._prompt(row))
        if not self.rows:
            self.replace_option_prompt_at_index(0, Text(NO_FINDINGS, self._role("clean")))

    def _wrap_width(self) -> int:
        return self.scrollable_content_region.width - self._get_left_gutter_width()

    def _size_updated(self, size: Size, virtual_size: Size, container_size: Size, layout: bool = True) -> bool:
        resized = super()._size_updated(size, virtual_size, container_size, layout)
        width = self._wrap_width()
        if size.width and size.height and width != self._wrapped_for:
            self._wrapped_for = width
            self._clear_caches()
            self._update_lines()
        return resized

    def _on_resize(self, event: events.Resize) -> None:  # type: ignore[override]  # Textual passes the event if asked
        if self._wrap_width() == self._wrapped_for:
            event.prevent_default()  # OptionList's own handler would throw the fresh lines away and re-wrap
