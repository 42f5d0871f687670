"""A horizontal bar chart drawn as text: one row per label, bars proportional to the counts.

Why not plotext for counts: its bars autoscale from the smallest value (approved 4, rejected 1, pending 64
all drew full height at 80×24, and looked like zero at 200×50), its count axes show fractional ticks, and
it drops labels when rows run short. Here every label gets a row (the widget scrolls), the count is
printed as an integer, and a non-zero count always gets at least one cell.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from rich.cells import cell_len
from rich.text import Text
from textual.widgets import Static

from tokview.ui.display import pad_cells, shown


def bar_lines(counts: Mapping[str, float], width: int) -> list[tuple[str, int, float]]:
    """(label, bar cells, count) per label: cells proportional to count / max over the width left."""
    if not counts:
        return []
    label_w = max(cell_len(k) for k in counts)  # cells: a server's finish reason may be CJK
    count_w = max(len(f"{v:,}") for v in counts.values())
    room = max(1, width - label_w - count_w - 2)
    top = max(counts.values()) or 1
    return [(label, (max(1, round(room * count / top)) if count else 0), count) for label, count in counts.items()]


class BarChart(Static):
    DEFAULT_CSS = """
    BarChart { overflow-y: auto; padding: 0 1; }
    BarChart > .bar-chart--bar { color: $text-accent; }
    BarChart:light > .bar-chart--bar { color: #0b4f8a; }
    """
    COMPONENT_CLASSES: ClassVar[set[str]] = {"bar-chart--bar"}

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.title = ""
        self.counts: dict[str, float] = {}

    def set_data(self, title: str, counts: Mapping[str, float]) -> None:
        self.title, self.counts = title, {}
        for label, count in counts.items():  # a server's finish reason is a label: its controls escaped, not run
            key = shown(label)
            self.counts[key] = self.counts.get(key, 0) + count
        self.refresh(layout=True)

    def render(self) -> Text:
        width = max(10, self.content_size.width or self.size.width or 40)
        text = Text(self.title + "\n", style="bold")
        if not self.counts:
            text.append("nothing yet", style="italic")
            return text
        label_w = max(cell_len(k) for k in self.counts)
        count_w = max(len(f"{v:,}") for v in self.counts.values())
        bar_style = self.get_component_rich_style("bar-chart--bar", partial=True)
        for label, cells, count in bar_lines(self.counts, width):
            text.append(pad_cells(label, label_w) + " ")
            text.append("█" * cells, bar_style)
            text.append(" " * (width - label_w - count_w - 2 - cells) + f" {count:>{count_w},}\n")
        return text
