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


def test_a_break_at_the_models_stop_id_says_the_template_ends_the_turn_otherwise(kimi_tok, kimi_profile):
    """A model stopped with one end id and the history renders another there (as GLM's did): the break named
    `</think>` and reasoning dropped, none of which happened. A stop id inside the previous prompt is no such end."""
    from finding_family import Family

    from tokview.core.analysis import analyze

    question = [{"role": "user", "content": "What is 6 times 7?"}]
    prompt = kimi_tok.render(question, template_kwargs={"thinking": True})
    fam = Family(kimi_tok, kimi_profile, prompt, kimi_tok.encode("Six sevens."), kimi_tok.encode("42."), question)
    stop = fam.p.stop_ids[0]
    capture = _chain(fam, extends=False, break_at=8, previous_len=9, previous_id=stop)  # its last id: the stop
    [hit] = [f for f in analyze(capture, fam.profile, fam.tok).findings if f.code == "session_prefix_break"]
    assert "ends that turn otherwise than the model did" in hit.detail and "</think>" not in hit.detail
    inside = _chain(fam, extends=False, break_at=3, previous_len=9, previous_id=stop)  # a stop id of the prompt's
    [hit] = [f for f in analyze(inside, fam.profile, fam.tok).findings if f.code == "session_prefix_break"]
    assert "ends that turn otherwise" not in hit.detail
    plain = _chain(fam, extends=False, break_at=3, previous_len=9)
    [hit] = [f for f in analyze(plain, fam.profile, fam.tok).findings if f.code == "session_prefix_break"]
    assert "</think>" in hit.detail


def test_a_break_inside_the_previous_turns_prompt_names_the_history_not_the_answer(kimi_tok, kimi_profile):
    """Qwen3 with thinking off pre-fills an empty think block, and its template drops it from the history: every
    chained turn broke inside the previous turn's prompt, and the finding named re-renders of an answer."""
    from finding_family import Family

    from tokview.core.analysis import analyze

    question = [{"role": "user", "content": "What is 6 times 7?"}]
    prompt = kimi_tok.render(question, template_kwargs={"thinking": True})
    fam = Family(kimi_tok, kimi_profile, prompt, kimi_tok.encode("Six sevens."), kimi_tok.encode("42."), question)
    before = _chain(fam, extends=False, break_at=5, previous_len=9, previous_prompt_len=6)
    [hit] = [f for f in analyze(before, fam.profile, fam.tok).findings if f.code == "session_prefix_break"]
    assert "history before that turn's answer otherwise than in that turn's prompt" in hit.detail
    assert "</think>` the model never wrote" not in hit.detail
    after = _chain(fam, extends=False, break_at=6, previous_len=9, previous_prompt_len=6)  # in its answer
    [hit] = [f for f in analyze(after, fam.profile, fam.tok).findings if f.code == "session_prefix_break"]
    assert "</think>` the model never wrote" in hit.detail
