"""Does a live target read the stored samples' ids as the server that made them did? (`tokview score`, before it
scores anything.)

A target of another vocabulary takes the ids and scores them: every NLL and `off_policy` finding would be garbage,
and the only comparison a score makes (the ids its answer names against the ids sent) cannot tell. So the target's
own `/detokenize` of a few samples' output ids (their first `PROBE_IDS`) is compared with what the samples' server
said of them (text, reasoning, content, tool calls), by words: a server's text skips special tokens that a
`/detokenize` may keep, or the other way round (`</think>`, Harmony's channels, Kimi's call sections), and a decode may
clean up spaces; another vocabulary's text of the same ids holds next to none of the words.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from tokview.batch.answer_words import PROBE_IDS, TOLD, answer_ids, answer_text, reads_as
from tokview.batch.inputs import InputError
from tokview.store.export_rows import Selection, probe_candidates
from tokview.untrusted_text import printable_line

if TYPE_CHECKING:
    from tokview.servers import ServerPool
    from tokview.store import Store


async def check_vocabulary(store: Store, pool: ServerPool, selection: Selection, backend: str) -> str | None:
    """InputError when more of the samples told (up to `TOLD`) read as other text on the target than as their own;
    else why nothing was checked, or None when they agreed."""
    from tokview.servers import CaptureFailed
    from tokview.servers.score import detokenize_on

    candidates = probe_candidates(store, selection)
    if not candidates:
        return "no selected sample has an answer to read its ids back with"
    agreed = 0
    disagreed: list[tuple[str, str, str]] = []
    for sample_id in candidates:
        capture = store.load_sample(sample_id).capture
        ids, text = answer_ids(capture), answer_text(capture)
        if not ids:  # a dual capture without its chat path's ids: nothing its text speaks of
            continue
        try:
            decoded = await pool.call(partial(detokenize_on, backend=backend, ids=ids[:PROBE_IDS]))
        except CaptureFailed as exc:
            if agreed or disagreed:
                break
            return f"the target's /detokenize did not answer ({printable_line(exc.reason[:160])})"
        agrees = reads_as(text, decoded, whole=len(ids) <= PROBE_IDS)
        if agrees is not None:
            agreed += agrees
            if not agrees:
                disagreed.append((sample_id, text, decoded))
            if agreed + len(disagreed) >= TOLD:
                break
    if len(disagreed) <= agreed:  # by the samples told, not the first that agreed: an answer of digits reads alike
        return None if agreed else f"the {len(candidates)} sample(s) looked at have too few words to tell"
    sample_id, text, decoded = disagreed[0]
    told = agreed + len(disagreed)
    raise InputError(
        f"the target reads the samples' ids as other text (another vocabulary?): its /detokenize of {sample_id}'s "
        f"output gives {printable_line(decoded[:60])!r}, the sample's answer is {printable_line(text[:60])!r} "
        f"({len(disagreed)} of {told} sample{'s' if told != 1 else ''} told differ{'s' if told == 1 else ''}); "
        "nothing scored: score against the model that made them, or pass --any-vocabulary to score anyway"
    )
