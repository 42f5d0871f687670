"""The two chain findings (`session_prefix_break`, `chain_stopped`) read a capture's `chain` entry, which a
batch chain records in the settings (`batch/chains.py`). `CHAIN_CASES` has the shape of test_findings.CASES
(positive, negative, exact positions), so the registry's own positive and negative tests run them too."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from tokview.batch.chains import first_difference


def _chain(f: Any, **entry: Any) -> Any:
    base = {"conversation": "c@k_gen0", "turn": 1, "history": "served", "parent": "c#turn0@k_gen0"}
    return f.capture(settings={"thinking": True, "max_new_tokens": 256, "chain": {**base, **entry}})


@dataclasses.dataclass
class ChainCase:
    positive: Callable[[Any], Any]
    negative: Callable[[Any], Any]
    positions: Callable[[Any, Any], tuple[int, ...]]


CHAIN_CASES = {
    "session_prefix_break": ChainCase(
        lambda f: _chain(f, extends=False, break_at=3, previous_len=9),
        lambda f: _chain(f, extends=True, break_at=None, previous_len=9),
        lambda f, c: (3,),
    ),
    "chain_stopped": ChainCase(
        lambda f: _chain(f, extends=True, stopped="turn 1 called 2 tool(s) where the file has 1 result(s)"),
        lambda f: _chain(f, extends=True),
        lambda f, c: (),
    ),
}


def test_first_difference_names_where_a_prompt_leaves_the_previous_ids():
    assert first_difference([1, 2, 3], [1, 2, 3, 4]) is None
    assert first_difference([1, 2, 3], [1, 9, 3, 4]) == 1
    assert first_difference([1, 2, 3], [1, 2]) == 2, "a prompt shorter than the previous ids ends there"
