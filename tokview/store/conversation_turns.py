"""The turns of a sample's conversation, in order: what inspect walks with w / W (issue 23 item 6).

Why by prompt id, generation index and run: a multi-turn row's turns are stored as samples of one prompt id,
one per `turn`, and each generation index is its own conversation (a chain regenerated twice is two chains).
Whether a turn's history was the served one is read from the `chain` entry a served chain records in the
turn's settings (`tokview/batch/chains.py`); `--history file` turns record none.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokview.store.connection import Database


@dataclass(frozen=True)
class Turn:
    sample_id: str
    turn: int
    history: str
    """"served" (each turn's history is the served output before it) or "file" (the prompts file's turns)."""
    extends: bool | None = None
    """A served turn's prompt extends the previous turn's prompt + output ids (None: the first turn, or file)."""
    break_at: int | None = None
    """Where the prompt first differs from the previous turn's ids, when it does not extend them."""


def _turn(sample_id: str, turn: int, settings: str | None) -> Turn:
    chain: Any = (json.loads(settings) if settings else {}).get("chain")
    if not isinstance(chain, dict):
        return Turn(sample_id, turn, "file")
    return Turn(sample_id, turn, str(chain.get("history") or "served"), chain.get("extends"), chain.get("break_at"))


def conversation_turns(store: Database, sample_id: str) -> list[Turn]:
    """Every turn of this sample's conversation, first turn first; [] when the sample is not a turn."""
    rows = store.query(
        "SELECT o.sample_id, o.turn, o.settings FROM samples s JOIN samples o ON o.prompt_id = s.prompt_id "
        "AND o.gen_index IS NOT DISTINCT FROM s.gen_index AND o.run_id IS NOT DISTINCT FROM s.run_id "
        "WHERE s.sample_id = ? AND s.turn IS NOT NULL AND o.turn IS NOT NULL ORDER BY o.turn, o.sample_id",
        [sample_id],
    )
    return [_turn(sid, turn, settings) for sid, turn, settings in rows]
