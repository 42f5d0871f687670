"""Small modal screens for curation: a reject reason (picked or typed), a note, tags, a yes/no question."""

from __future__ import annotations

from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, OptionList
from textual.widgets.option_list import Option

from tokview.ui.bindings import bindings

NARROW_BREAKPOINTS = [(0, "-narrow"), (30, "-roomy")]
"""A dialog under 30 columns wide drops its frame and padding (the `-narrow` class, styles/app.tcss)."""

REJECT_REASONS = (
    "truncated (no end of turn)",
    "think delimiters wrong",
    "parser hid or moved text",
    "wrong or empty answer",
    "repetition / degenerate output",
    "duplicate",
)


class TextPrompt(ModalScreen[str | None]):
    """One line of text; Enter keeps it, Escape cancels."""

    HORIZONTAL_BREAKPOINTS = NARROW_BREAKPOINTS
    BINDINGS: ClassVar[list[BindingType]] = [*bindings("note / tag prompt")]

    def __init__(self, title: str, placeholder: str = "", value: str = "") -> None:
        super().__init__()
        self.title_text, self.placeholder, self.value = title, placeholder, value

    def compose(self) -> ComposeResult:
        with Vertical(classes="modal"):
            yield Label(self.title_text, classes="modal-title")
            yield Input(self.value, placeholder=self.placeholder, id="modal-input")

    @on(Input.Submitted, "#modal-input")
    def _submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class RejectReason(ModalScreen[str | None]):
    """Pick a reason from the list (Enter), or type one and press Enter; Escape cancels."""

    HORIZONTAL_BREAKPOINTS = NARROW_BREAKPOINTS
    BINDINGS: ClassVar[list[BindingType]] = [*bindings("reject dialog")]

    def __init__(self, reasons: tuple[str, ...] = REJECT_REASONS) -> None:
        super().__init__()
        self.reasons = reasons

    def compose(self) -> ComposeResult:
        with Vertical(classes="modal"):
            yield Label("Reject: pick a reason, or type one below", classes="modal-title")
            yield OptionList(*[Option(r, id=f"reason-{i}") for i, r in enumerate(self.reasons)], id="reasons")
            yield Input(placeholder="other reason…", id="reason-typed")

    @on(OptionList.OptionSelected, "#reasons")
    def _picked(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self.reasons[event.option_index])

    @on(Input.Submitted, "#reason-typed")
    def _typed(self, event: Input.Submitted) -> None:
        if event.value.strip():
            self.dismiss(event.value.strip())

    def action_cancel(self) -> None:
        self.dismiss(None)


class Confirm(ModalScreen[bool]):
    """A yes/no question: y says yes, n or Escape says no (the safe answer)."""

    HORIZONTAL_BREAKPOINTS = NARROW_BREAKPOINTS
    BINDINGS: ClassVar[list[BindingType]] = [*bindings("confirm dialog")]

    def __init__(self, question: str, detail: str = "") -> None:
        super().__init__()
        self.question, self.detail = question, detail

    def compose(self) -> ComposeResult:
        with Vertical(classes="modal", id="confirm"):
            yield Label(self.question, classes="modal-title")
            if self.detail:
                yield Label(self.detail, id="confirm-detail")
            yield Label("y yes · n / esc no", classes="modal-keys")

    def action_confirm(self) -> None:
        self.dismiss(True)

    def action_decline(self) -> None:
        self.dismiss(False)
