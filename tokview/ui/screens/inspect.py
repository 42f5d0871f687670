"""The inspect screen: served ids beside what the text fields kept, a token cursor, the findings.

Left pane: prompt ids (dimmed) then output ids, exactly as served. Right pane: the same positions as
the returned text fields saw them, aligned id by id (`analysis.alignment`), with the ids the parser
hid shown as gaps. Both panes wrap to one width, so cursor and scroll stay in step row for row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from rich.style import Style
from rich.text import Text
from textual import events, on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Label, OptionList, Static

from tokview.core.findings import why
from tokview.ui import goto
from tokview.ui.bindings import bindings
from tokview.ui.config import UIConfig
from tokview.ui.display import (
    CLASS_INDEX,
    HEAT_CLASSES,
    VIEW_MODES,
    TokenSeq,
    capped_middle,
    kept_seq,
    served_seq,
    shown,
    visible,
)
from tokview.ui.heat import HEAT_LABELS, HEAT_MODES, heat_detail, heat_levels
from tokview.ui.heat import unavailable as heat_unavailable
from tokview.ui.screens.modals import TextPrompt
from tokview.ui.widgets.findings_list import FindingRow, FindingsList
from tokview.ui.widgets.footer import KeysFooter
from tokview.ui.widgets.token_detail import TokenDetail
from tokview.ui.widgets.token_view import TokenView
from tokview.wording import plural

if TYPE_CHECKING:
    from tokview.core.analysis import Analysis
    from tokview.core.findings import Finding
    from tokview.core.profiles import ModelProfile
    from tokview.core.record import Capture
    from tokview.core.tokenizer import TokenizerAdapter
    from tokview.store.conversation_turns import Turn
    from tokview.ui.session import Session


@dataclass
class InspectData:
    """One sample as the inspect screen shows it (from the store, or built in memory)."""

    sample_id: str
    capture: Capture
    analysis: Analysis
    status: str = "pending"
    notes: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    """The store's verdict history (who, when, status, reason, note, override), oldest first."""
    session_turn: tuple[str, int] | None = None
    """The proxied session and turn it is (`tokview proxy`'s sample: its prompt id and turn), for the title."""


SEVERITY_RANK = {"error": 0, "warn": 1, "info": 2}


SHORT_BREAKPOINTS = [(0, "-short"), (20, "-tall")]
NARROW_BREAKPOINTS = [(0, "-narrow"), (70, "-wide")]
"""Under 20 rows the review line goes, the bottom panel and the footer shrink (styles/app.tcss, KeysFooter), so a
40x12 terminal keeps token rows and Quit; under 70 columns detail and findings share the width."""


def live_verdicts(history: list[dict[str, Any]]) -> int:
    """How many verdicts of the history stand (not undone)."""
    return sum(1 for h in history if h.get("kind") == "verdict" and not h.get("undone"))


ROLES = ("approved", "rejected", "valid", "invalid")
"""Text roles the title and review line colour from the screen's component classes (theme-aware)."""


def review_text(
    status: str, history: list[dict[str, Any]], notes: list[str], roles: dict[str, Style] | None = None
) -> Text:
    """The latest live verdict (who, when, why, override) and the notes: what earlier reviewers said."""
    roles = roles or {}
    text = Text()
    live = [h for h in history if h.get("kind") == "verdict" and not h.get("undone")]
    if live:
        h = live[-1]
        at = h.get("at")
        text.append(f"{h['status']}", roles.get(h["status"], Style(bold=True)))
        text.append(f" by {shown(h.get('who') or 'unknown')}" + (f" at {at:%Y-%m-%d %H:%M}" if at else ""))
        if h.get("reason"):
            text.append(f" · reason: {shown(h['reason'])}", "bold")
        if h.get("override"):
            text.append(" · override: approved despite error findings", roles.get("invalid", Style(bold=True)))
    else:
        text.append(f"{status} · no verdict yet", "italic")
    for note in notes:
        text.append(f"\nnote: {shown(note)}", "italic")
    return text


def opening_finding(analysis: Analysis) -> int | None:
    """The index of the finding inspect opens at: the first error finding with positions, if any."""
    order = sorted(range(len(analysis.findings)), key=lambda i: SEVERITY_RANK.get(analysis.findings[i].severity, 3))
    return next((i for i in order if analysis.findings[i].severity == "error" and analysis.findings[i].positions), None)


def first_position(analysis: Analysis, n_prompt: int) -> int:
    """Where inspect opens: the first error finding's first position, else the start of the output."""
    index = opening_finding(analysis)
    return analysis.findings[index].positions[0] if index is not None else n_prompt


class InspectScreen(Screen[None]):
    """Two synchronised token panes, a detail panel and the findings of one sample."""

    BINDINGS = bindings("inspect")
    VERTICAL_BREAKPOINTS = SHORT_BREAKPOINTS
    HORIZONTAL_BREAKPOINTS = NARROW_BREAKPOINTS
    COMPONENT_CLASSES: ClassVar[set[str]] = {f"inspect--{role}" for role in ROLES}
    DEFAULT_CSS = """
    InspectScreen > .inspect--approved, InspectScreen > .inspect--valid { color: $text-success; text-style: bold; }
    InspectScreen > .inspect--rejected, InspectScreen > .inspect--invalid { color: $text-error; text-style: bold; }
    InspectScreen:light > .inspect--approved, InspectScreen:light > .inspect--valid { color: #005f00; }
    InspectScreen:light > .inspect--rejected, InspectScreen:light > .inspect--invalid { color: #5f0000; }
    """

    def __init__(
        self,
        data: InspectData,
        tokenizer: TokenizerAdapter,
        profile: ModelProfile,
        mode: str = "pieces",
        *,
        seqs: tuple[TokenSeq, TokenSeq] | None = None,
    ) -> None:
        """`seqs`: the served and kept panes' sequences, when a worker built them (else built here)."""
        super().__init__()
        self.data, self.tokenizer, self.profile = data, tokenizer, profile
        capture, analysis = data.capture, data.analysis
        served, kept = seqs or (served_seq(capture, analysis, tokenizer), kept_seq(capture, analysis, tokenizer))
        self.served = TokenView(served, mode=mode, id="served")
        self.kept = TokenView(kept, mode=mode, id="kept")
        self.mirrored = len(self.served.seq) == len(self.kept.seq)
        self.heat = HEAT_MODES[0]
        self._last_goto = ""
        """The last go-to query: the prompt offers it again, so enter repeats it (the next occurrence)."""
        self.chosen: tuple[int, int] | None = None
        """(finding index, position index) of the finding being stepped through, once one is chosen."""
        self._segment_classes = list(self.served.seq.classes)
        if self.mirrored:
            self.served.linked, self.kept.linked = self.kept, self.served
            self.served.share_cursor(self.kept)

    def compose(self) -> ComposeResult:
        yield Static(self._title(), id="inspect-title")
        with Vertical(id="inspect-review-box"):  # the padding (app.tcss: a padded nowrap line lost its "…")
            yield Static(id="inspect-review")
        with Horizontal(id="panes"):
            with Vertical(classes="pane"):
                yield Label(self._served_label(), classes="pane-label", id="served-label")
                yield self.served
            with Vertical(classes="pane", id="kept-pane"):
                yield Label(self._kept_label(), classes="pane-label")
                yield self.kept
        with Horizontal(id="inspect-bottom"):
            yield TokenDetail(id="detail")
            yield FindingsList(self._finding_rows(), id="findings")
        yield KeysFooter()

    def on_mount(self) -> None:
        self._paint_texts()
        self.served.focus()
        start = first_position(self.data.analysis, len(self.data.capture.prompt_ids))
        opened_at = opening_finding(self.data.analysis)
        self.chosen = (opened_at, 0) if opened_at is not None else None
        self.served.cursor = start
        if not self.mirrored:
            self.kept.cursor = min(start, len(self.kept.seq) - 1)
        self._show_detail(self.served, self.served.cursor)
        self.call_after_refresh(self.served.scroll_to_cursor)
        self.call_after_refresh(self.kept.scroll_to_cursor)

    # -- text --------------------------------------------------------------------------------
    def _roles(self) -> dict[str, Style]:
        return {role: self.get_component_rich_style(f"inspect--{role}", partial=True) for role in ROLES}

    def _paint_texts(self) -> None:
        """Title and review line, coloured for the current theme."""
        d = self.data
        self.query_one("#inspect-title", Static).update(self._title())
        review = self.query_one("#inspect-review", Static)
        review.update(review_text(d.status, d.history, d.notes, self._roles()))
        review.set_class(bool(d.notes), "-with-notes")  # a line each then: a long reason wrapped and hid the notes
        review.tooltip = review_text(d.status, d.history, d.notes) if d.notes else None

    def notify_style_update(self) -> None:
        super().notify_style_update()
        if self.is_mounted:  # a theme change: the title's colours come from the theme, once its styles are in
            self.call_after_refresh(self._paint_texts)

    def _title(self) -> Text:
        d, c = self.data, self.data.capture
        roles = self._roles()
        title = Text.assemble(
            (shown(d.sample_id), "bold"),
            "  ",
            (d.status, roles.get(d.status, Style(bold=True))),
            f"   finish={shown(c.finish_reason)}  prompt={len(c.prompt_ids)} output={len(c.output_ids)}",
            ("  valid", roles["valid"]) if d.analysis.valid else ("  INVALID", roles["invalid"]),
        )
        chain = (c.settings or {}).get("chain")
        if isinstance(chain, dict):  # a served chain's turn (w / W walk the conversation, which the id names)
            history = chain.get("history") or "served"  # short: on one line, "conversation NAME" left it all cut off
            title.append(shown(f"  #turn{chain.get('turn')} · {history} history"))
        if d.session_turn is not None:  # as a batch chain's turn says its turn: the session it is in, and where
            session, turn = d.session_turn
            title.append(shown(f"  {capped_middle(session, 28)} #turn{turn}"))
        if d.tags:
            title.append("  tags: " + ", ".join(map(shown, d.tags)), "italic")
        if d.notes:
            title.append(f"  notes: {len(d.notes)}", "italic")
        return title

    def _served_label(self) -> str:
        # short enough at 80 columns that the view's name is whole: "· view pi…" did not say pieces from both
        label = f"served ids ({len(self.data.capture.output_ids):,} out) · view {self.served.mode}"
        if self.heat != HEAT_MODES[0]:
            why = heat_unavailable(self.data.capture, self.heat)
            label += f" · heat {HEAT_LABELS[self.heat]}" + (f": {why}" if why else " (green likely/easy … red)")
        return label

    def _kept_label(self) -> str:
        c = self.data.capture
        fields = [
            name
            for name, v in (
                ("reasoning", c.reasoning),
                ("content", c.content),
                ("text", c.text),
                ("tool_calls", c.tool_calls),
            )
            if v  # a tool parser's calls keep their ids too (names, ids, arguments): the label left them out
        ]
        al = self.data.analysis.alignment
        extra = (
            f" · unmatched text {plural(len(al.unmatched_text), 'char')}"
            if al is not None and al.unmatched_text
            else ""
        )
        return f"kept by {'+'.join(fields) or 'no text field'} · ░ hidden{extra}"

    def _finding_rows(self) -> list[FindingRow]:
        rows = []
        findings = self.data.analysis.findings
        order = sorted(range(len(findings)), key=lambda i: (SEVERITY_RANK.get(findings[i].severity, 3), i))
        for i in order:  # errors first: they decide whether the sample is valid
            f = findings[i]
            count = len(f.positions)
            where = f" · {plural(count, 'position')}, enter steps" if count else " · no positions"
            rows.append(FindingRow(f"finding-{i}", f.severity, f.code, where, f.detail, why(f.code) or ""))
        return rows

    # -- sync --------------------------------------------------------------------------------
    def _other(self, view: TokenView) -> TokenView:
        return self.kept if view is self.served else self.served

    @on(TokenView.CursorMoved)
    def _cursor_moved(self, event: TokenView.CursorMoved) -> None:
        # mirrored panes share one cursor (TokenView.share_cursor): nothing to copy back and forth here
        self._show_detail(event.view, event.view.cursor)

    def on_descendant_focus(self, event: events.DescendantFocus) -> None:
        """The detail panel describes the focused pane's cursor (the panes differ in a diverged dual capture)."""
        if isinstance(event.widget, TokenView):
            self._show_detail(event.widget, event.widget.cursor)

    @on(TokenView.Scrolled)
    def _scrolled(self, event: TokenView.Scrolled) -> None:
        other = self._other(event.view)
        if self.mirrored:
            y = event.y
        else:
            src_h = max(1, event.view.virtual_size.height)
            y = round(event.y * other.virtual_size.height / src_h)
        if round(other.scroll_y) != y:
            other.scroll_to(y=y, animate=False)

    def _show_detail(self, view: TokenView, index: int) -> None:
        a, c = self.data.analysis, self.data.capture
        if view is self.kept and c.paths_diverge:
            # The parsed path's ids: their own kinds; the loss mask and logprobs belong to the raw ids.
            self.query_one(TokenDetail).show_token(
                view.seq, index, self.tokenizer, kinds=a.aligned_kinds, loss_mask=(), logprobs=None
            )
            return
        self.query_one(TokenDetail).show_token(
            view.seq,
            index,
            self.tokenizer,
            kinds=a.kinds,
            loss_mask=a.loss_mask,
            logprobs=c.output_logprobs,
            extra=heat_detail(c, index, self.tokenizer.piece_text),
        )

    @on(OptionList.OptionHighlighted, "#findings")
    def _finding_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        finding = self._finding(event.option_id)
        if finding is not None:
            self.served.set_marks(set(finding.positions))
            if self.mirrored:
                self.kept.set_marks(set(finding.positions))

    @on(OptionList.OptionSelected, "#findings")
    def _finding_selected(self, event: OptionList.OptionSelected) -> None:
        index = self._finding_index(event.option_id)
        if index is None:
            return
        finding = self.data.analysis.findings[index]
        if not finding.positions:
            self.notify(f"{finding.code} names no token positions: it is about the sample as a whole", timeout=3)
        elif self.chosen is not None and self.chosen[0] == index:
            self.action_finding_position(1)  # enter on the same finding again: its next position
        else:
            self._go_to_position(index, 0)

    def action_finding_position(self, step: int) -> None:
        """The chosen finding's next (or previous) position, round at the ends; without a chosen finding,
        the one highlighted in the list, else the first with positions."""
        findings = self.data.analysis.findings
        if self.chosen is None:
            highlighted = self.query_one("#findings", OptionList).highlighted_option
            index = self._finding_index(highlighted.id if highlighted is not None else None)
            if index is None or not findings[index].positions:
                index = next((i for i, f in enumerate(findings) if f.positions), None)
            if index is None:
                self.notify("no finding names token positions", timeout=3)
                return
            self._go_to_position(index, 0)
            return
        index, at = self.chosen
        self._go_to_position(index, (at + step) % len(findings[index].positions), stepped=True)

    def _go_to_position(self, index: int, at: int, stepped: bool = False) -> None:
        """Jump to one position of a finding; say which of how many (a first jump to a lone one says nothing)."""
        finding = self.data.analysis.findings[index]
        self.chosen = (index, at)
        self.jump_to(finding.positions[at])
        count = len(finding.positions)
        if count > 1 or stepped:
            self.app.clear_notifications()
            where = f"position {at + 1} of {count} (enter or N next, P previous)" if count > 1 else "its only position"
            self.notify(f"{finding.code}: {where}", timeout=3)

    def _finding_index(self, option_id: str | None) -> int | None:
        if not option_id or not option_id.startswith("finding-") or option_id == "finding-none":
            return None
        return int(option_id.split("-", 1)[1])

    def _finding(self, option_id: str | None) -> Finding | None:
        index = self._finding_index(option_id)
        return self.data.analysis.findings[index] if index is not None else None

    def jump_to(self, position: int) -> None:
        """Move the cursor (and the view) to an absolute position and focus the served pane."""
        self.served.cursor = position
        self.served.focus()

    # -- actions -----------------------------------------------------------------------------
    def action_cycle_mode(self) -> None:
        mode = VIEW_MODES[(VIEW_MODES.index(self.served.mode) + 1) % len(VIEW_MODES)]
        self.served.mode = mode
        self.kept.mode = mode
        self.query_one("#served-label", Label).update(self._served_label())
        config = self._config()
        if config is not None:
            config.view_mode = mode  # the next sample opens in the mode chosen here (not written to the file)

    def _config(self) -> UIConfig | None:
        """The app's settings, when this screen runs in the tokview app (tests also host it alone)."""
        config = getattr(self.app, "config", None)
        return config if isinstance(config, UIConfig) else None

    def _pane(self) -> TokenView:
        """The pane keys act on: the focused one, else the served ids."""
        return self.focused if isinstance(self.focused, TokenView) else self.served

    def action_goto(self) -> None:
        """Ask for a position, an id or a text (goto.py), and move the focused pane's cursor there."""

        def answered(query: str | None) -> None:
            target = goto.parse(query or "")
            if target is None:
                return
            self._last_goto = query or ""
            pane = self._pane()
            index = goto.find(pane.seq, target, pane.cursor)
            if index is None:
                where = f"0–{len(pane.seq) - 1}" if target.kind == "position" else "this pane"
                self.notify(f"{target.describe()} is not in {where}", severity="warning", timeout=3)
                return
            pane.cursor = index
            pane.focus()
            if target.kind == "position":
                self.notify(f"at position {index}", timeout=2)
            else:  # an id or a text may stand in more places: the next `:` with it goes on from here
                self.notify(f"{target.describe()}: position {index} (: again goes on to the next)", timeout=2)

        self.app.push_screen(
            TextPrompt("Go to: a position (120), an id (#163607) or a text", "120, #163607 or text", self._last_goto),
            answered,
        )

    def action_copy_sample_id(self) -> None:
        self.app.copy_to_clipboard(self.data.sample_id)
        self.notify(f"copied the sample id {self.data.sample_id}", timeout=2)

    def action_copy_token(self) -> None:
        """The text of the token under the focused pane's cursor (a special token's name, e.g. </think>)."""
        pane = self._pane()
        if not len(pane.seq):
            return
        token_id = pane.seq.ids[pane.cursor]
        text = self.tokenizer.piece_bytes(token_id).decode("utf-8", errors="replace") or pane.seq.pieces[pane.cursor]
        self.app.copy_to_clipboard(text)
        self.notify(f"copied token {token_id} {visible(text)!r} (position {pane.cursor})", timeout=2)

    def action_compare(self) -> None:
        """Open compare with this prompt's sample from another run (or another generation of this run)."""
        session = getattr(self.app, "session", None)
        if session is None:
            return
        self._find_sibling(session)

    @work(thread=True, exclusive=True, group="compare-sibling", exit_on_error=False)
    def _find_sibling(self, session: Session) -> None:
        from tokview.store.run_stats import siblings

        self.post_message(self.SiblingFound(session, siblings(session.store, self.data.sample_id)))

    class SiblingFound(Message):
        def __init__(self, session: Session, found: list[tuple[str, str | None]]) -> None:
            super().__init__()
            self.session, self.found = session, found

    @on(SiblingFound)
    def _sibling_found(self, event: SiblingFound) -> None:
        from tokview.ui.screens.compare import CompareScreen

        if not event.found:
            self.notify("no other sample of this prompt to compare with (another run's or generation's)", timeout=3)
            return
        other, run = event.found[0]
        more = f" (and {plural(len(event.found) - 1, 'other')})" if len(event.found) > 1 else ""
        self.notify(f"comparing with {other} from {run or 'no run'}{more}", timeout=2)
        self.app.push_screen(CompareScreen(event.session, self.data.sample_id, other, self.served.mode))

    def action_walk_turn(self, step: int) -> None:
        """Open the conversation's next (or previous) turn: the samples of this prompt and generation by turn."""
        session = getattr(self.app, "session", None)
        if session is not None:
            self._find_turns(session, step)

    @work(thread=True, exclusive=True, group="walk-turns", exit_on_error=False)
    def _find_turns(self, session: Session, step: int) -> None:
        from tokview.store.conversation_turns import conversation_turns

        self.post_message(self.TurnsFound(conversation_turns(session.store, self.data.sample_id), step))

    class TurnsFound(Message):
        def __init__(self, turns: list[Turn], step: int) -> None:
            super().__init__()
            self.turns, self.step = turns, step

    @on(TurnsFound)
    def _turns_found(self, event: TurnsFound) -> None:
        from tokview.store.conversation_turns import turn_place

        ids = [t.sample_id for t in event.turns]
        if self.data.sample_id not in ids or len(ids) < 2:
            self.notify("not a turn of a conversation (no other turn of this prompt and generation)", timeout=3)
            return
        at = ids.index(self.data.sample_id) + event.step
        if not 0 <= at < len(ids):
            self.app.bell()
            said = "the last turn of the conversation" if at >= len(ids) else "the first turn of the conversation"
            self.notify(said, timeout=2)  # at is -1 past the first turn
            return
        turn = event.turns[at]
        how = f"{turn_place(event.turns, turn)} · {turn.history} history"
        if turn.extends is True:
            how += " · extends the previous turn's ids"
        elif turn.extends is False:
            how += f" · breaks at {turn.break_at}" if turn.break_at is not None else " · does not extend"
        self.notify(how, timeout=3)
        self.app.open_sample(turn.sample_id)  # type: ignore[attr-defined]

    def action_toggle_auto_advance(self) -> None:
        config = self._config()
        if config is None:
            return
        config.auto_advance = not config.auto_advance
        said = "on: a verdict opens the next pending sample" if config.auto_advance else "off"
        self.notify(f"auto-advance {said} (> toggles; [ui] auto_advance in the config sets it)", timeout=3)

    def action_cycle_heat(self) -> None:
        """Next heat mode: the served pane's output tokens take heat classes (segments colours come back last)."""
        self.heat = HEAT_MODES[(HEAT_MODES.index(self.heat) + 1) % len(HEAT_MODES)]
        levels = heat_levels(self.data.capture, self.heat) if self.heat != HEAT_MODES[0] else None
        classes = list(self._segment_classes)
        if levels is not None:
            for i, level in enumerate(levels[: len(classes)]):
                if level is not None:
                    classes[i] = CLASS_INDEX[HEAT_CLASSES[level]]
        self.served.set_token_classes(classes)
        self.query_one("#served-label", Label).update(self._served_label())
        why = heat_unavailable(self.data.capture, self.heat) if levels is None else None
        if why is not None:  # the label alone, cut at 80 columns, said nothing
            self.notify(f"{HEAT_LABELS[self.heat]}: {why} (h again: the next)", timeout=2, markup=False)

    def action_focus_findings(self) -> None:
        self.query_one("#findings", OptionList).focus()

    def action_swap_pane(self) -> None:
        (self.kept if self.focused is self.served else self.served).focus()

    def action_close(self) -> None:
        if len(self.app.screen_stack) > 1:
            self.app.pop_screen()

    def refresh_verdict(self, status: str, notes: list[str], tags: list[str], history: list[dict[str, Any]]) -> None:
        """The store recorded a verdict: update the title and review lines (attributes down); with auto-advance
        on, a new verdict (not a note, a tag or an undo) moves on to the next pending sample."""
        before = live_verdicts(self.data.history)
        self.data.status, self.data.notes, self.data.tags, self.data.history = status, notes, tags, history
        self._paint_texts()
        config = self._config()
        if config is not None and config.auto_advance and live_verdicts(history) > before:
            self.call_later(self.app.run_action, "next_unreviewed")
