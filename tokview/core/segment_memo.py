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
import sys
import threading
from array import array
from collections.abc import Callable, Iterable, Sequence
from typing import Any

MIN_CHARS = 2_000
"""Shorter texts are encoded whole: cutting and looking up costs about what their encoding does."""
MAX_BYTES = 64 << 20
"""What the remembered pieces may take in memory (their strings, id arrays and dict entries, as Python counts
them): ~30 agents' 40,000-token conversations."""
MIN_PIECE_CHARS = 32
"""Shorter pieces ("user\n", a newline between two tokens) are encoded again each time, with the new ones: one
call for all of them costs little, and remembering thousands of distinct short pieces would cost more memory than
their characters say."""
ENTRY_BYTES = 100
"""A remembered piece's dict entry and bookkeeping, beyond its string's and array's own size."""
HOT_MIN_IDS = 1_024
"""Pieces of at least this many ids are also kept as tuples of ints, the most recently used (`HOT_MAX_IDS`): a
list extends from a tuple by copying pointers (0.08 ms for 40,000 ids) but from an array by making each int again
(1.0 ms). An agent's system prompt and early history are such pieces, in every turn's render."""
HOT_MAX_IDS = 262_144
"""Ids the tuples hold together, at most (~36 bytes each: ~9 MB)."""

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
        if not token.normalized and token.content:  # normalized: matched inside a piece, by its own encoding
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
        self._cut = re.compile(f"({longest_first(markers)})")
        self._pieces: dict[str, array[int]] = {}
        self._bytes = 0
        self._hot: dict[str, tuple[int, ...]] = {}
        self._hot_ids = 0
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        """A copy (`copy.deepcopy` of a tokenizer) starts empty: the pieces are a cache, the lock is this one's."""
        return {"markers": self.markers, "encode_many": self._encode_many, "max_bytes": self.max_bytes}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["markers"], state["encode_many"], state["max_bytes"])  # type: ignore[misc]

    def encode(self, text: str) -> list[int]:
        parts = self._cut.split(text)  # pieces at even indexes, markers at odd ones
        pieces = parts[0::2]
        with self._lock:
            known: list[Sequence[int] | None] = [
                self._hot_or_touch(p) if len(p) >= MIN_PIECE_CHARS else None for p in pieces
            ]
        missing = list(dict.fromkeys(p for p, ids in zip(pieces, known) if p and ids is None))
        fresh = dict(zip(missing, (array("i", ids) for ids in self._encode_many(missing)))) if missing else {}
        if fresh:
            with self._lock:
                for piece, fresh_ids in fresh.items():
                    if len(piece) >= MIN_PIECE_CHARS:
                        self._remember(piece, fresh_ids)
        heat: dict[str, tuple[int, ...]] = {  # none past HOT_MAX_IDS: made only to be dropped, every render
            p: tuple(ids) for p, ids in zip(pieces, known) if isinstance(ids, array) and _heats(ids)
        }
        heat.update((p, tuple(ids)) for p, ids in fresh.items() if _heats(ids))
        if heat:  # made outside the lock; the next render extends from them
            with self._lock:
                for piece, hot in heat.items():
                    self._keep_hot(piece, hot)
        out: list[int] = []
        for k, piece in enumerate(pieces):
            if piece:
                got = known[k]
                out.extend(got if got is not None else fresh[piece])
            if 2 * k + 1 < len(parts):
                out.append(self.markers[parts[2 * k + 1]])
        return out

    def _hot_or_touch(self, piece: str) -> Sequence[int] | None:
        hot = self._hot.pop(piece, None)
        if hot is None:
            return self._touch(piece)
        self._hot[piece] = hot  # the most recently used last
        return hot

    def _keep_hot(self, piece: str, ids: tuple[int, ...]) -> None:
        if len(ids) > HOT_MAX_IDS or piece in self._hot:
            return
        self._hot[piece] = ids
        self._hot_ids += len(ids)
        while self._hot_ids > HOT_MAX_IDS:
            oldest = next(iter(self._hot))
            self._hot_ids -= len(self._hot.pop(oldest))

    def _touch(self, piece: str) -> array[int] | None:
        ids = self._pieces.pop(piece, None)
        if ids is not None:
            self._pieces[piece] = ids  # the most recently used last
        return ids

    def _remember(self, piece: str, ids: array[int]) -> None:
        cost = _cost(piece, ids)
        if cost > self.max_bytes or piece in self._pieces:
            return
        self._pieces[piece] = ids
        self._bytes += cost
        while self._bytes > self.max_bytes:
            oldest = next(iter(self._pieces))  # dicts keep insertion order
            self._bytes -= _cost(oldest, self._pieces.pop(oldest))


def _heats(ids: array[int]) -> bool:
    return HOT_MIN_IDS <= len(ids) <= HOT_MAX_IDS


def _cost(piece: str, ids: array[int]) -> int:
    return sys.getsizeof(piece) + sys.getsizeof(ids) + ENTRY_BYTES


def longest_first(markers: Iterable[str]) -> str:
    """A regular expression matching the longest of `markers` that starts where it matches: the leftmost-longest
    match `tokenizers` takes (its Aho-Corasick automaton). As a trie, so each position costs one step per character
    matched: an alternation of 258 markers that all begin with `<|` (Kimi's) tried every one of them at each `<|`
    of a text, and cutting could cost more than encoding the whole text. A marker that is a prefix of another is
    an optional, greedy tail: the longer is tried first, the shorter taken when it fails."""
    trie: dict[str, Any] = {}
    for marker in markers:
        node = trie
        for ch in marker:
            node = node.setdefault(ch, {})
        node[""] = {}  # a marker ends here

    def emit(node: dict[str, Any]) -> str:
        branches = []
        for ch, child in sorted(node.items()):
            if not ch:
                continue
            chain = re.escape(ch)
            while len(child) == 1 and "" not in child:  # a run of single characters: no recursion for it
                ((ch, child),) = child.items()
                chain += re.escape(ch)
            branches.append(chain + emit(child))
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        return f"(?:{body})?" if "" in node else body

    if not trie:
        return "(?!)"  # no marker: never matches
    try:
        pattern = emit(trie)
        re.compile(pattern)  # the regex parser recurses about twice per nested group: it gives up well before emit
        return pattern
    except RecursionError:  # thousands of nested markers: the plain alternation, longest first
        return "|".join(re.escape(m) for m in sorted(trie_words(trie), key=len, reverse=True))


def trie_words(trie: dict[str, Any]) -> list[str]:
    """The markers a trie holds (for the fallback of `longest_first`), without recursion."""
    out, stack = [], [("", trie)]
    while stack:
        prefix, node = stack.pop()
        for ch, child in node.items():
            if ch:
                stack.append((prefix + ch, child))
            else:
                out.append(prefix)
    return out
