"""A rendered prompt's ids, piece by piece, each piece between two added tokens remembered.

Why: an agent's prompt repeats its whole conversation so far. `tokview proxy` checks every request's prompt
against the template's render (`prompt_render_mismatch`), and a chained run renders every turn: a 40,000-token
render took 70-100 ms to encode each time (Qwen3, one core), though all but its newest messages had been encoded
for the turn before. The recorder then fell behind any harness with long contexts.

Why it is exact: a fast tokenizer cuts a text at its added tokens before anything else (`tokenizers`'
AddedVocabulary: the tokens matched in the raw text first, then each piece normalized on its own and cut at the
tokens matched in normalized text), and normalizes, pre-tokenizes and encodes every piece on its own. So a text's
ids are its pieces' ids with the cutting tokens' ids between them, in order, and a piece seen before need not be
encoded again. That holds only where a piece's ids cannot depend on its neighbours: `exact_markers` refuses an
added token that takes whitespace from its neighbours (`lstrip`, `rstrip`) or only matches whole words, and a
pre-tokenizer that treats a text's first piece apart (`Metaspace`'s "first" scheme) or that this module does not
know. A test holds the pieces' ids to the whole encoding on random texts for every tokenizer layout tokview ships.
"""

from __future__ import annotations

import json
import re
import threading
from array import array
from collections.abc import Callable, Iterable
from typing import Any

MIN_CHARS = 2_000
"""Shorter texts are encoded whole: cutting and looking up costs about what their encoding does."""
MAX_BYTES = 64 << 20
"""What the remembered pieces may hold: a piece's characters and 4 bytes per id (~30 agents' 40,000-token
conversations)."""

_PIECEWISE_PRE_TOKENIZERS = frozenset(
    {"ByteLevel", "Split", "Digits", "Punctuation", "Whitespace", "WhitespaceSplit", "BertPreTokenizer"}
)
"""Pre-tokenizers that treat every piece alike, wherever it sits in the text."""


def exact_markers(added: Iterable[Any], pre_tokenizer_state: bytes | None) -> dict[str, int] | None:
    """The added tokens a text is cut at before anything else ({content: id}), when encoding the pieces between
    them one by one gives the whole text's ids; None when it may not.

    `added`: (id, token) pairs as `tokenizers.Tokenizer.get_added_tokens_decoder().items()` gives them;
    `pre_tokenizer_state`: the pre-tokenizer's JSON (`__getstate__`), None for none."""
    markers: dict[str, int] = {}
    for token_id, token in added:
        if token.lstrip or token.rstrip or token.single_word:
            return None
        if not token.normalized:  # matched in normalized text, inside a piece, by the piece's own encoding
            markers[str(token.content)] = int(token_id)
    if pre_tokenizer_state is not None and not _piecewise(json.loads(pre_tokenizer_state)):
        return None
    return markers or None


def _piecewise(state: Any) -> bool:
    if state is None:
        return True
    if not isinstance(state, dict):
        return False
    if state.get("type") == "Sequence":
        return all(_piecewise(s) for s in state.get("pretokenizers") or [])
    return state.get("type") in _PIECEWISE_PRE_TOKENIZERS


class SegmentMemo:
    """Encodes texts cut at `markers`, remembering each piece's ids (least recently used forgotten first).

    `encode_many` encodes pieces with no added ids (one call for every piece not remembered: a fast tokenizer
    encodes them in parallel). Shared by a process's threads: one lock, held for dictionary operations only."""

    def __init__(
        self, markers: dict[str, int], encode_many: Callable[[list[str]], list[list[int]]], max_bytes: int = MAX_BYTES
    ) -> None:
        self.markers = markers
        self.max_bytes = max_bytes
        self._encode_many = encode_many
        alternatives = "|".join(re.escape(m) for m in sorted(markers, key=len, reverse=True))
        self._cut = re.compile(f"({alternatives})")  # longest first: the leftmost-longest match tokenizers takes
        self._pieces: dict[str, array[int]] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def encode(self, text: str) -> list[int]:
        parts = self._cut.split(text)  # pieces at even indexes, markers at odd ones
        pieces = parts[0::2]
        with self._lock:
            known = [self._touch(p) if p else None for p in pieces]
        missing = list(dict.fromkeys(p for p, ids in zip(pieces, known) if p and ids is None))
        fresh = dict(zip(missing, (array("i", ids) for ids in self._encode_many(missing)))) if missing else {}
        if fresh:
            with self._lock:
                for piece, ids in fresh.items():
                    self._remember(piece, ids)
        out: list[int] = []
        for k, piece in enumerate(pieces):
            if piece:
                got = known[k]
                out.extend(got if got is not None else fresh[piece])
            if 2 * k + 1 < len(parts):
                out.append(self.markers[parts[2 * k + 1]])
        return out

    def _touch(self, piece: str) -> array[int] | None:
        ids = self._pieces.pop(piece, None)
        if ids is not None:
            self._pieces[piece] = ids  # the most recently used last
        return ids

    def _remember(self, piece: str, ids: array[int]) -> None:
        cost = len(piece) + 4 * len(ids)
        if cost > self.max_bytes or piece in self._pieces:
            return
        self._pieces[piece] = ids
        self._bytes += cost
        while self._bytes > self.max_bytes:
            oldest = next(iter(self._pieces))  # dicts keep insertion order
            old = self._pieces.pop(oldest)
            self._bytes -= len(oldest) + 4 * len(old)
