"""Small modal screens for curation: a reject reason (picked or typed), a note, tags (added or removed), a
yes/no question, the bulk approval's question about invalid samples, and the list of actions to undo."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import Input, Label, OptionList
from textual.widgets.option_list import Option

from tokview.ui.bindings import bindings, key_hint
from tokview.ui.display import plain
from tokview.ui.widgets.footer import KeysFooter

if TYPE_CHECKING:
    from tokview.store.bulk_review import Action

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
            yield Label(plain(self.title_text), classes="modal-title")
            yield Input(self.value, placeholder=self.placeholder, id="modal-input")
        yield KeysFooter()

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
            yield OptionList(*[Option(plain(r), id=f"reason-{i}") for i, r in enumerate(self.reasons)], id="reasons")
            yield Input(placeholder="other reason…", id="reason-typed")
        yield KeysFooter()

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
            yield Label(plain(self.question), classes="modal-title")
            if self.detail:
                yield Label(plain(self.detail), id="confirm-detail")
            yield Label(
                plain(key_hint([("modal.confirm", "yes"), ("modal.decline", "no")], _keymap(self))),
                classes="modal-keys",
            )
        yield KeysFooter()

    def action_confirm(self) -> None:
        self.dismiss(True)

    def action_decline(self) -> None:
        self.dismiss(False)


@dataclass
class TagEdit:
    """What the tag dialog asks for: tags to add, or one tag to take off."""

    add: list[str] = field(default_factory=list)
    remove: str | None = None


class TagInputError(ValueError):
    """Typed tags the dialog cannot act on as one step (said under the input; the dialog stays open)."""


def parse_tags(text: str) -> TagEdit | None:
    """`math, long` adds both (once each, as the store compares them: without case); `-math` takes math off; nothing
    typed: None. Adds and a removal together, or two removals, are refused (TagInputError): one entry is one action,
    which `u` takes back whole, and the rest of such an entry was dropped without a word."""
    from tokview.store.queries import sql_lower

    parts = [t.strip() for t in text.split(",") if t.strip()]

    def once(tags: list[str]) -> list[str]:
        kept: list[str] = []
        for tag in tags:
            if tag and sql_lower(tag) not in {sql_lower(k) for k in kept}:
                kept.append(tag)
        return kept

    removed = once([t[1:].strip() for t in parts if t.startswith("-")])  # a lone "-" names nothing
    added = once([t for t in parts if not t.startswith("-")])
    if removed and added:
        raise TagInputError("add tags or take one off, not both in one entry")
    if len(removed) > 1:
        raise TagInputError("take off one tag at a time")
    if removed:
        return TagEdit(remove=removed[0])
    return TagEdit(add=added) if added else None


class TagDialog(ModalScreen[TagEdit | None]):
    """Type tags (Enter adds them; `-tag` removes one), or pick one the store already has: a tag the sample
    (or a marked one) carries is offered for removal, the others for adding. Escape cancels."""

    HORIZONTAL_BREAKPOINTS = NARROW_BREAKPOINTS
    BINDINGS: ClassVar[list[BindingType]] = [*bindings("note / tag prompt")]
    DEFAULT_CSS = """
    TagDialog { align: center middle; }
    TagDialog #tag-options { height: auto; max-height: 10; min-width: 8; }
    """

    def __init__(self, existing: Sequence[tuple[str, int]], carried: Sequence[str], title: str = "Tags") -> None:
        super().__init__()
        self.title_text = title
        self.carried = list(carried)
        from tokview.store.queries import sql_lower  # tags are one without case as the store compares them

        lower = {sql_lower(t) for t in carried}
        self.offered: list[tuple[str, str]] = [("remove", t) for t in carried]
        self.offered += [("add", t) for t, _n in existing if sql_lower(t) not in lower]
        self.counts = {t: n for t, n in existing}

    def compose(self) -> ComposeResult:
        with Vertical(classes="modal"):
            yield Label(plain(self.title_text), classes="modal-title")
            yield Input(placeholder="new tags, comma-separated (-tag removes one)", id="modal-input")
            if self.offered:
                options = [
                    Option(
                        plain(f"remove {t}" if op == "remove" else f"add {t} ({self.counts.get(t, 0)})"), id=f"tag-{i}"
                    )
                    for i, (op, t) in enumerate(self.offered)
                ]
                yield OptionList(*options, id="tag-options")
        yield KeysFooter()

    def on_mount(self) -> None:
        if self.offered:
            self.query_one("#tag-options", OptionList).highlighted = 0

    @on(Input.Submitted, "#modal-input")
    def _typed(self, event: Input.Submitted) -> None:
        try:
            edit = parse_tags(event.value)
        except TagInputError as exc:
            self.app.bell()
            self.notify(str(exc), severity="warning", timeout=3)
            return
        self.dismiss(edit)

    @on(OptionList.OptionSelected, "#tag-options")
    def _picked(self, event: OptionList.OptionSelected) -> None:
        op, tag = self.offered[event.option_index]
        self.dismiss(TagEdit(remove=tag) if op == "remove" else TagEdit(add=[tag]))

    def action_cancel(self) -> None:
        self.dismiss(None)


class BulkApprove(ModalScreen[str | None]):
    """Approving marked samples some of which have error findings, asked once for the group: y approves all
    (those as overrides), v only the valid ones, n or Escape none."""

    HORIZONTAL_BREAKPOINTS = NARROW_BREAKPOINTS
    BINDINGS: ClassVar[list[BindingType]] = [*bindings("bulk approve dialog")]
    DEFAULT_CSS = "BulkApprove { align: center middle; }"

    def __init__(self, question: str, detail: str, *, any_valid: bool = True) -> None:
        """`any_valid`: whether some marked sample has no error finding (else "only the valid" is not offered: it
        approved none and took every mark away)."""
        super().__init__()
        self.question, self.detail, self.any_valid = question, detail, any_valid

    def compose(self) -> ComposeResult:
        with Vertical(classes="modal"):
            yield Label(plain(self.question), classes="modal-title")
            yield Label(plain(self.detail), id="confirm-detail")
            hint = [("bulk.approve-all", "all"), ("bulk.approve-valid", "only the valid"), ("bulk.cancel", "none")]
            if not self.any_valid:
                hint.pop(1)
            yield Label(plain(key_hint(hint, _keymap(self))), classes="modal-keys")
        yield KeysFooter()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return self.any_valid or action != "approve_valid"

    def action_approve_all(self) -> None:
        self.dismiss("all")

    def action_approve_valid(self) -> None:
        self.dismiss("valid")

    def action_decline(self) -> None:
        self.dismiss(None)


class ActionsDialog(ModalScreen[int | None]):
    """The latest actions, newest first (the app's and `tokview review`'s); Enter takes the chosen one back as
    one step. Undone actions and undos are listed, not offered."""

    HORIZONTAL_BREAKPOINTS = NARROW_BREAKPOINTS
    BINDINGS: ClassVar[list[BindingType]] = [*bindings("undo list")]
    DEFAULT_CSS = """
    ActionsDialog { align: center middle; }
    ActionsDialog .modal { width: 100; }
    ActionsDialog #actions-list { height: auto; max-height: 16; min-width: 8; }
    """

    def __init__(self, actions: Sequence[Action]) -> None:
        super().__init__()
        self.actions = list(actions)

    def compose(self) -> ComposeResult:
        with Vertical(classes="modal"):
            yield Label("Undo which action? (enter takes it back)", classes="modal-title")
            if not self.actions:
                yield Label("nothing has been done in this store yet")
            else:
                yield OptionList(
                    *[
                        Option(
                            plain(a.line),
                            id=f"action-{a.action_id}",
                            disabled=a.undone_by is not None or a.kind == "undo",
                        )
                        for a in self.actions
                    ],
                    id="actions-list",
                )
        yield KeysFooter()

    def on_mount(self) -> None:
        live = [i for i, a in enumerate(self.actions) if a.undone_by is None and a.kind != "undo"]
        if live:
            self.query_one("#actions-list", OptionList).highlighted = live[0]

    @on(OptionList.OptionSelected, "#actions-list")
    def _picked(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self.actions[event.option_index].action_id)

    def action_cancel(self) -> None:
        self.dismiss(None)


def _keymap(screen: Screen[Any]) -> dict[str, str]:
    """The app's keymap (remapped keys), for a dialog's line of keys; none outside tokview's app."""
    config = getattr(screen.app, "config", None)
    keymap = getattr(config, "keymap", None)
    return keymap if isinstance(keymap, dict) else {}
