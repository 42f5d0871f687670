"""The detail panel for the token under the cursor: id, piece, bytes, position, segment, loss mask, logprob."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.table import Table
from textual.widgets import Static

from tokview.ui.display import TokenSeq, detail_lines

if TYPE_CHECKING:
    from tokview.core.tokenizer import TokenizerAdapter


class TokenDetail(Static):
    """A small two-column table; rebuilt on each cursor move (a dozen cells, not the token pane)."""

    DEFAULT_CSS = """
    TokenDetail { padding: 0 1; height: auto; }
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.rows: dict[str, str] = {}
        """What the panel shows now (label → value)."""

    def show_token(
        self,
        seq: TokenSeq,
        index: int,
        tokenizer: TokenizerAdapter | None,
        *,
        kinds: Sequence[str],
        loss_mask: Sequence[int],
        logprobs: Sequence[float] | None,
        extra: Sequence[tuple[str, str]] = (),
    ) -> None:
        if not len(seq):
            self.update("no tokens")
            return
        table = Table.grid(padding=(0, 1))
        table.add_column(style="bold", no_wrap=True)
        table.add_column(overflow="fold")
        self.rows = dict(detail_lines(seq, index, tokenizer, kinds=kinds, loss_mask=loss_mask, logprobs=logprobs))
        self.rows.update(extra)  # the heat view's values: acceptance run, sampled / target logprob, top-K
        for label, value in self.rows.items():
            table.add_row(label, value)
        self.update(table)
