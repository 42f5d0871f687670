"""Compare: two samples side by side (the same prompt from two runs), their ids diffed, the first divergence marked.

The two samples load in a worker (each with its own run's tokenizer and profile, as inspect loads one); the
diff is `ui/id_diff.py`, computed there too. The screen renders: two token panes whose differing ids are
underlined, cursors that follow each other position for position, and one line naming the token under each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Label, Static
from textual.worker import Worker

from tokview.ui.bindings import bindings
from tokview.ui.display import TokenSeq, plain, served_seq, shown, visible
from tokview.ui.id_diff import IdDiff, diff_ids
from tokview.ui.widgets.footer import KeysFooter
from tokview.ui.widgets.token_view import TokenView
from tokview.ui.worker_errors import ForwardsWorkerErrors, failure_text
from tokview.wording import plural

if TYPE_CHECKING:
    from tokview.ui.session import Session


@dataclass
class Side:
    """One sample as a compare pane shows it."""

    sample_id: str
    run: str | None
    status: str
    finish_reason: str | None
    n_prompt: int
    seq: TokenSeq


@dataclass
class Compared:
    left: Side
    right: Side
    diff: IdDiff


def load_pair(session: Session, left_id: str, right_id: str, mode: str = "pieces") -> Compared:
    """Both samples and their diff (worker thread): the served ids, prompt and output, diffed as one sequence,
    so a prompt rendered differently by two runs' templates shows as a divergence inside the prompt."""
    sides = []
    for sample_id in (left_id, right_id):
        stored, analysis, tokenizer, _profile = session.load(sample_id)
        capture = stored.capture
        sides.append(
            Side(
                stored.sample_id,
                stored.run_id,
                stored.status,
                capture.finish_reason,
                len(capture.prompt_ids),
                served_seq(capture, analysis, tokenizer),
            )
        )
    left, right = sides
    return Compared(left, right, diff_ids(left.seq.ids, right.seq.ids))


def summary(c: Compared) -> Text:
    """The title: both samples, and where they part."""
    text = Text()
    for name, side in (("A", c.left), ("B", c.right)):
        text.append(f"{name} ", "bold")
        text.append(shown(side.sample_id), "bold")
        text.append(
            f" ({shown(side.run or 'no run')}, {side.status}, {plural(len(side.seq) - side.n_prompt, 'output id')})  "
        )
    first = c.diff.first
    if first is None:
        text.append("· identical ids", "bold")
    else:
        n_prompt = c.left.n_prompt
        where = f"prompt[{first}]" if first < n_prompt else f"output[{first - n_prompt}]"
        text.append(f"· first divergence at position {first} ({where})", "bold")
        text.append(f" · {plural(len(c.diff.left), 'id')} of A and {plural(len(c.diff.right), 'id')} of B differ")
    return text


def token_line(name: str, side: Side, index: int) -> str:
    if index >= len(side.seq):
        return f"{name}[{index}]: past its end ({len(side.seq)} ids)"
    return f"{name}[{index}]: {side.seq.ids[index]} {visible(side.seq.pieces[index])}"


class CompareScreen(ForwardsWorkerErrors, Screen[None]):
    """Two samples' ids side by side; x goes to the first divergence."""

    BINDINGS = bindings("compare")
    DEFAULT_CSS = """
    #compare-title { height: auto; max-height: 3; padding: 0 1; background: $panel; }
    #compare-panes { height: 1fr; }
    #compare-right-pane { border-left: vkey $primary 40%; }
    #compare-detail { height: 1; padding: 0 1; background: $boost; text-wrap: nowrap; text-overflow: ellipsis; }
    """

    class Loaded(Message):
        def __init__(self, compared: Compared) -> None:
            super().__init__()
            self.compared = compared

    def __init__(self, session: Session, left_id: str, right_id: str, mode: str = "pieces") -> None:
        super().__init__()
        self.session, self.ids, self.mode = session, (left_id, right_id), mode
        self.compared: Compared | None = None
        self.left = TokenView(mode=mode, id="compare-left")
        self.right = TokenView(mode=mode, id="compare-right")

    def compose(self) -> ComposeResult:
        yield Static(plain(f"loading {self.ids[0]} and {self.ids[1]}…"), id="compare-title")
        with Horizontal(id="compare-panes"):
            with Vertical(classes="pane", id="compare-left-pane"):
                yield Label(plain(f"A {self.ids[0]}"), classes="pane-label", id="compare-left-label")
                yield self.left
            with Vertical(classes="pane", id="compare-right-pane"):
                yield Label(plain(f"B {self.ids[1]}"), classes="pane-label", id="compare-right-label")
                yield self.right
        yield Static("", id="compare-detail")
        yield KeysFooter()

    def on_mount(self) -> None:
        self.left.focus()
        self._load()

    def on_resize(self) -> None:
        """Both sides exactly as wide: two `1fr` panes left the right one a cell narrower (its divider), and the
        same ids wrapped at other places on each side, so their rows no longer lined up."""
        side = (self.size.width - 1) // 2  # the divider's cell, then what is left over (0 or 1) goes unused
        self.query_one("#compare-left-pane").styles.width = side
        self.query_one("#compare-right-pane").styles.width = side + 1

    @work(thread=True, exclusive=True, group="compare", exit_on_error=False)
    def _load(self) -> None:
        self.post_message(self.Loaded(load_pair(self.session, *self.ids, self.mode)))

    def worker_failed(self, worker: Worker[object], error: BaseException) -> None:
        self.query_one("#compare-title", Static).update(plain(f"cannot compare: {failure_text(error)}"))

    @on(Loaded)
    def _loaded(self, event: Loaded) -> None:
        self.compared = c = event.compared
        self.query_one("#compare-title", Static).update(summary(c))
        for view, side, marks, name in (
            (self.left, c.left, c.diff.left, "A"),
            (self.right, c.right, c.diff.right, "B"),
        ):
            view.set_seq(side.seq)
            view.set_marks(set(marks))
            label = f"{name} {side.sample_id} · {side.run or 'no run'} · finish={side.finish_reason}"
            self.query_one(f"#compare-{view.id.split('-')[1]}-label", Label).update(plain(label))  # type: ignore[union-attr]
        self.action_first_divergence()

    _jump: tuple[int, int, int] | None = None
    """(the first divergence, where it put the left and the right cursor): its own moves of both panes, handled after
    it, are no move to follow; the shorter pane, clamped to its end, pulled the other back a position with it (the
    title said 52, the line below 51). Any other move leaves a cursor elsewhere, and is followed."""

    @on(TokenView.CursorMoved)
    def _cursor_moved(self, event: TokenView.CursorMoved) -> None:
        """The other pane follows to the same position, so the line below names both tokens there."""
        jump = self._jump
        if jump is not None and (self.left.cursor, self.right.cursor) == jump[1:]:
            self._show_detail(jump[0])
            return
        self._jump = None
        other = self.right if event.view is self.left else self.left
        if event.index < len(other.seq):
            other.cursor = event.index
        self._show_detail(event.index)

    def _show_detail(self, index: int) -> None:
        if self.compared is None:
            return
        c = self.compared
        same = index < min(len(c.left.seq), len(c.right.seq)) and c.left.seq.ids[index] == c.right.seq.ids[index]
        line = f"{token_line('A', c.left, index)}   {token_line('B', c.right, index)}   " + (
            "same id" if same else "differ"
        )
        self.query_one("#compare-detail", Static).update(plain(line))

    def action_first_divergence(self) -> None:
        if self.compared is None:
            return
        first = self.compared.diff.first
        if first is None:
            self.notify("the two samples have the same ids", timeout=2)
            return
        for view in (self.left, self.right):
            view.cursor = min(first, max(0, len(view.seq) - 1))
        self._jump = (first, self.left.cursor, self.right.cursor)
        self._show_detail(first)

    def action_swap_pane(self) -> None:
        (self.right if self.focused is self.left else self.left).focus()

    def action_close(self) -> None:
        if len(self.app.screen_stack) > 1:
            self.app.pop_screen()
