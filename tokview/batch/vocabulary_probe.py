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

import json
import re
from functools import partial
from typing import TYPE_CHECKING

from tokview.batch.inputs import InputError
from tokview.store.export_rows import Selection, probe_candidates
from tokview.untrusted_text import printable_line

if TYPE_CHECKING:
    from tokview.core.record import Capture
    from tokview.servers import ServerPool
    from tokview.store import Store

PROBE_IDS = 1024
"""Output ids of a sample read back: a 14,000-id reasoning trace is probed by its start, not left out."""
TOLD = 3
"""Samples told (enough words to judge) that decide, by majority; up to `probe_candidates`' count are looked at."""
MIN_WORDS = 3
"""Distinct words of three letters or more a probe needs to tell anything: a blank or one-word answer is in any text."""
SHARE = 0.7
"""Of the probe's words, the share the other side must hold."""
_MARKUP = re.compile(r"<[^<>\s]{1,48}>")
"""A special token's text (`<|im_end|>`, `</think>`, `<tool_call>`): on one side only when a side skipped it."""
_WORD = re.compile(r"\w{3,}")


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
        ids, text = list(capture.output_ids), answer_text(capture)
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


def answer_text(capture: Capture) -> str:
    """Everything its server said of a sample's output ids: the raw text, the reasoning and content, and each tool
    call's name and arguments (a tool parser takes them out of the text: a long call's ids read as none of it)."""
    calls = [f"{c.get('name') or ''} {_as_written(c.get('arguments'))}" for c in capture.tool_calls or ()]
    return " ".join(t for t in (capture.text, capture.reasoning, capture.content, *calls) if t)


def _as_written(arguments: object) -> str:
    """A call's arguments as the server gave them and with every non-ASCII character escaped: a parser returns the
    arguments re-dumped, so `"\\u5317"` on the ids comes back as `北`; either is what the ids may spell."""
    if not isinstance(arguments, str):
        return ""
    try:
        escaped = json.dumps(json.loads(arguments), ensure_ascii=True)
    except (ValueError, RecursionError):
        return arguments
    return arguments if escaped == arguments else f"{arguments} {escaped}"


def reads_as(text: str, decoded: str, *, whole: bool = True) -> bool | None:
    """Whether the target's `decoded` text of a sample's output ids is that sample's `text`: when the probe read all
    the ids, the answer's words must be found in the decoded text; when it read their start, the decoded words in the
    answer. A word is found anywhere in the other side with its whitespace taken out, and with its markup taken out or
    kept: a side that skipped special tokens glues the words around them (Harmony's `analysis` and the reasoning's
    first word), the other keeps them apart. None when the side looked for has fewer than `MIN_WORDS` words."""
    wanted = set(_WORD.findall(_MARKUP.sub("", text if whole else decoded)))
    other = decoded if whole else text
    # and with its markup kept: a tag may spell the words a parser returned (Qwen3-Coder's `<function=get_weather>`
    # is the `get_weather` of its tool call)
    within = "".join(_MARKUP.sub("", other).split()) + "\n" + "".join(other.split())
    if len(wanted) < MIN_WORDS:
        return None
    return sum(word in within for word in wanted) >= SHARE * len(wanted)
