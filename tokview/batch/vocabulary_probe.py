"""Does a live target read the stored samples' ids as the server that made them did? (`tokview score`, before it
scores anything.)

A target of another vocabulary takes the ids and scores them: every NLL and `off_policy` finding would be garbage,
and the only comparison a score makes (the ids its answer names against the ids sent) cannot tell. So the target's
own `/detokenize` of a few samples' output ids (their first `PROBE_IDS`) is compared with the text the samples'
server gave for them, by words: a server's text skips special tokens that a `/detokenize` may keep (or the other way
round), (`</think>`, Harmony's channels, Kimi's call sections), and a decode may clean up spaces; another vocabulary's text of the same ids holds next to none of the words.
"""

from __future__ import annotations

import re
from functools import partial
from typing import TYPE_CHECKING

from tokview.batch.inputs import InputError
from tokview.store.export_rows import Selection, texts_to_probe
from tokview.untrusted_text import printable_line

if TYPE_CHECKING:
    from tokview.servers import ServerPool
    from tokview.store import Store

PROBE_IDS = 1024
"""Output ids of a sample read back: a 14,000-id reasoning trace is probed by its start, not left out."""
MIN_WORDS = 4
"""Distinct words a probe needs to tell anything: a blank or one-word answer is in any text."""
SHARE = 0.7
"""Of the probe's words, the share the other side must hold."""
_MARKUP = re.compile(r"<[^<>\s]{1,48}>")
"""A special token's text (`<|im_end|>`, `</think>`, `<tool_call>`): on one side only when a side skipped it. Taken out
of both sides with nothing in its place, as a side that skipped it has it (`analysis<|message|>User` is
`analysisUser` there)."""
_WORD = re.compile(r"\w{2,}")


async def check_vocabulary(store: Store, pool: ServerPool, selection: Selection, backend: str) -> str | None:
    """InputError when no probed sample reads as its text on the target and at least one was told; else why nothing
    was checked, or None when a sample agreed."""
    from tokview.servers import CaptureFailed
    from tokview.servers.score import detokenize_on

    probes = texts_to_probe(store, selection)
    if not probes:
        return "no selected sample has an answer's text to read its ids back with"
    disagreed: list[tuple[str, str, str]] = []
    for sample_id, ids, text in probes:
        try:
            decoded = await pool.call(partial(detokenize_on, backend=backend, ids=ids[:PROBE_IDS]))
        except CaptureFailed as exc:
            if disagreed:
                break
            return f"the target's /detokenize did not answer ({printable_line(exc.reason[:160])})"
        agrees = reads_as(text, decoded, whole=len(ids) <= PROBE_IDS)
        if agrees:
            return None
        if agrees is False:
            disagreed.append((sample_id, text, decoded))
    if not disagreed:
        return f"the {len(probes)} sample(s) probed have too few words to tell"
    sample_id, text, decoded = disagreed[0]
    n = len(disagreed)
    raise InputError(
        f"the target reads the samples' ids as other text (another vocabulary?): its /detokenize of {sample_id}'s "
        f"output gives {printable_line(decoded[:60])!r}, the sample's answer is {printable_line(text[:60])!r} "
        f"({'the one sample' if n == 1 else f'all {n} samples'} told differ{'s' if n == 1 else ''}); nothing "
        "scored: score against the model that made them, or pass --any-vocabulary to score anyway"
    )


def reads_as(text: str, decoded: str, *, whole: bool = True) -> bool | None:
    """Whether the target's `decoded` text of a sample's output ids is that sample's `text` (its server's text
    fields): when the probe read all the ids, the answer's words must be in the decoded text; when it read their
    start, the decoded words in the answer. None when the side looked for has fewer than `MIN_WORDS` words."""
    answer, read = _words(text), _words(decoded)
    wanted, within = (answer, read) if whole else (read, answer)
    if len(wanted) < MIN_WORDS:
        return None
    return len(wanted & within) >= SHARE * len(wanted)


def _words(text: str) -> set[str]:
    return set(_WORD.findall(_MARKUP.sub("", text)))
