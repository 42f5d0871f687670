"""Encode with a byte-level BPE tokenizer.json without loading it whole first.

Why. `tokenizers` builds a tokenizer.json's whole vocabulary and merge table before it encodes anything, and
holds the GIL throughout: Qwen3's (151,643 entries, 151,387 merges) took 0.3-0.5 s on this project's 2-core
machines, and a small batch's first prompt waited for it (the rest of such a run took ~0.4 s). Yet BPE encodes
each pre-tokenized word on its own, and a merge only ever joins two adjacent pieces of one word into a token that
is a substring of that word. So a tokenizer holding only the vocabulary entries that are substrings of a text's
words, with their merges in the same order, encodes that text to exactly the ids the whole one gives
(tests/test_vocab_slices.py holds the two to the same ids on random and rendered text).

`SlicedTokenizer` builds such a slice per call (a few ms for a prompt or a 2,000-token answer) from a
`VocabCache`: the tokens in id order and each token's merge rank and split point, read in ~30 ms. The words are
read off the current slice's own answer (every slice, the first holding only the 256 byte characters and the added
tokens, has the whole one's normalizer, pre-tokenizer and added tokens, so it splits a text into the same words),
and the answer is kept when the slice holds every entry inside them. `upgrade()` loads the whole tokenizer on a
thread, after which every call goes to it: a batch asks for it as soon as its plan is big (`batch.runner`), and
it happens anyway after `AUTO_UPGRADE_CHARS` characters, or once growing slices has cost about what loading the
whole one would (`GROWING_S_PER_ENTRY`: text whose words keep being new).

The cache is built by a child process (`python -m tokview.core.vocab_slices FILE`, at a low priority, one at a
time, only where the cache can be written) when a batch finds none, while the batch reads the file whole itself.
It is named by the file's sha256, so an edited file is read whole until its own cache exists, and it carries its
body's sha256, so a damaged one is read whole too. It is only made for what the argument above holds for: a BPE
model without dropout, subword prefix or suffix, byte fallback or ignore_merges; a pre-tokenizer that is ByteLevel
beside ones that only cut the text (a word is then made of byte characters, all in the vocabulary); ids 0..n-1,
each token made by at most one merge; added tokens numbered as `tokenizers` numbers them. Anything else is loaded
whole, as before.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from array import array
from itertools import groupby
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokview.core.file_digest import data_digest, file_digest
from tokview.core.json_cache import cache_path, write_cache_file
from tokview.core.tokenizer_folder import byte_alphabet
from tokview.errors import TokviewError

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from tokenizers import Encoding, Tokenizer

FORMAT = 2
AUTO_UPGRADE_CHARS = 1_000_000
"""Characters encoded through slices after which the whole tokenizer is loaded anyway (~1 s of slicing)."""
LOOKUP_BUDGET = 400_000
"""Substring lookups one call may make (~50 ms) before the whole tokenizer encodes it instead."""
GROWING_S_PER_ENTRY = 2.5e-6
"""Seconds of CPU a slice may spend growing, per vocabulary entry of the whole tokenizer, before the whole one is
loaded (Qwen3's 151,643 entries: ~0.38 s, about what its whole load takes). Rent or buy: text whose words keep
being new (code, many languages) grows the slice on every call, ~50-90 ms a 9,000-character answer once it holds
~10,000 entries, so the slices stop paying once they have cost what the whole load would; text that shares its
words (a run's answers mostly do) never gets there."""
GROWING_MIN_S = 0.1
"""The least growing allowed whatever the vocabulary's size (a small one's whole load is quick, but so is growing)."""
MEMO_WORDS = 200_000
"""Words whose vocabulary entries are remembered (then forgotten all at once)."""
NOT_SLICEABLE = b"not sliceable\n"
"""What a cache file holds for a tokenizer.json the argument does not cover (so no child is started again)."""


class TokenizerFileChanged(TokviewError):
    """tokenizer.json no longer holds the bytes the slices were read from, and the whole tokenizer was needed."""


def byte_characters() -> list[str]:
    """The 256 characters a ByteLevel pre-tokenizer maps bytes to (GPT-2's table), in byte order."""
    alphabet = byte_alphabet()
    return [alphabet[b] for b in range(256)]


def cache_key(digest: bytes) -> str:
    """The cache's name for a tokenizer.json of this sha256 (`file_digest`)."""
    return hashlib.sha256(f"vocab-slices {FORMAT}\0".encode() + digest).hexdigest()[:32]


def cache_file(key: str) -> Path | None:
    return cache_path(f"vocab-slices/{key}.bin")


SPLITTING_ONLY = frozenset({"Split", "Digits", "Punctuation", "Whitespace", "WhitespaceSplit", "CharDelimiterSplit"})
"""Pre-tokenizers that only cut text, adding no character (Metaspace's "▁" after ByteLevel would be a character the
splitter's 256-entry vocabulary lacks, and its words would miss the entries holding it)."""


def _byte_level_only(pre_tokenizer: object) -> bool:
    """A ByteLevel pre-tokenizer, alone or in a Sequence of it and pre-tokenizers that only cut the text."""
    if not isinstance(pre_tokenizer, dict):
        return False
    if pre_tokenizer.get("type") == "ByteLevel":
        return True
    inner = pre_tokenizer.get("pretokenizers")
    if pre_tokenizer.get("type") != "Sequence" or not isinstance(inner, list):
        return False
    kinds = [p.get("type") if isinstance(p, dict) else None for p in inner]
    return "ByteLevel" in kinds and all(k == "ByteLevel" or k in SPLITTING_ONLY for k in kinds)


def numbered_added_tokens(added_tokens: object, vocab: dict[str, int]) -> dict[str, int] | None:
    """content → id of a tokenizer.json's added tokens as `tokenizers` numbers them on loading (it ignores the ids
    the file declares: a content the model's vocabulary holds gets its id, any other the next id past the
    vocabulary, in order, a repeated content its first id, an empty one none); None when the file declares any
    other id (an edited file: slices would not number them as the whole tokenizer does)."""
    if not isinstance(added_tokens, list):
        return None if added_tokens is not None else {}
    numbered: dict[str, int] = {}
    next_id = len(vocab)
    for added in added_tokens:
        if not isinstance(added, dict) or not isinstance(added.get("content"), str) or type(added.get("id")) is not int:
            return None
        content = added["content"]
        if not content:
            return None  # unnumbered by tokenizers: too odd to slice
        want = vocab.get(content, numbered.get(content))
        if want is None:
            want, next_id = next_id, next_id + 1
        if added["id"] != want:
            return None
        numbered.setdefault(content, want)
    return numbered


class VocabCache:
    """What slices are built from: one tokenizer.json's pipeline without its vocabulary, and the vocabulary."""

    def __init__(self, skeleton: dict[str, Any], tokens: list[str], rank: array[int], split: array[int], max_len: int):
        self.skeleton = skeleton
        """The tokenizer.json, its model's vocab and merges left out."""
        self.tokens = tokens
        """Token text by id."""
        self.rank = rank
        """By id: the index of the merge that makes the token, -1 for none."""
        self.split = split
        """By id: where that merge splits the token's text."""
        self.max_len = max_len
        """The longest token, in characters: no longer substring can be one."""
        self.vocab = dict(zip(tokens, range(len(tokens))))
        numbered = numbered_added_tokens(skeleton.get("added_tokens"), self.vocab)
        if numbered is None:
            raise ValueError("added tokens numbered otherwise than tokenizers numbers them")
        self.added = {content: i for content, i in numbered.items() if content not in self.vocab}
        """Added tokens the model's vocabulary does not hold: in every slice's, or tokenizers would number them
        after the slice's last entry."""

    @classmethod
    def from_spec(cls, spec: object) -> VocabCache | None:
        """The cache of a parsed tokenizer.json, or None when slices would not encode as it does."""
        if not isinstance(spec, dict) or spec.get("truncation") is not None or spec.get("padding") is not None:
            return None
        model = spec.get("model")
        if not isinstance(model, dict) or model.get("type") != "BPE" or not _byte_level_only(spec.get("pre_tokenizer")):
            return None
        if any(
            model.get(k)
            for k in ("dropout", "continuing_subword_prefix", "end_of_word_suffix", "byte_fallback", "ignore_merges")
        ):
            return None  # ignore_merges: a word that is an added token's text would be encoded as that token
        vocab, merges = model.get("vocab"), model.get("merges")
        if not isinstance(vocab, dict) or not isinstance(merges, list):
            return None
        n = len(vocab)
        tokens: list[str | None] = [None] * n
        for token, i in vocab.items():
            if type(i) is not int or not 0 <= i < n or tokens[i] is not None or "\0" in token:
                return None
            tokens[i] = token
        if any(c not in vocab for c in byte_characters()):
            return None
        if numbered_added_tokens(spec.get("added_tokens"), vocab) is None:
            return None
        rank, split = array("i", [-1]) * n, array("i", [0]) * n
        for r, merge in enumerate(merges):
            pair = merge.split(" ") if isinstance(merge, str) else merge
            if not isinstance(pair, list) or len(pair) != 2 or not all(isinstance(p, str) and p for p in pair):
                return None
            left, right = pair
            made = vocab.get(left + right)
            if made is None or left not in vocab or right not in vocab or rank[made] != -1 or " " in left + right:
                return None  # a merge tokenizers refuses, or two merges making one token
            rank[made], split[made] = r, len(left)
        skeleton = {**spec, "model": {k: v for k, v in model.items() if k not in ("vocab", "merges")}}
        return cls(skeleton, tokens, rank, split, max(map(len, vocab), default=1))  # type: ignore[arg-type]

    def to_bytes(self) -> bytes:
        blob = "\0".join(self.tokens).encode("utf-8", "surrogatepass")
        header: dict[str, object] = {
            "format": FORMAT,
            "count": len(self.tokens),
            "max_len": self.max_len,
            "token_bytes": len(blob),
            "byteorder": sys.byteorder,
            "skeleton": self.skeleton,
        }
        body = blob + self.rank.tobytes() + self.split.tobytes()
        header["body_sha256"] = hashlib.sha256(body).hexdigest()
        return json.dumps(header).encode() + b"\n" + body

    @classmethod
    def from_bytes(cls, raw: bytes) -> VocabCache | None:
        """None for anything but a whole, undamaged cache of this format written on a machine of this byte order
        (its body's sha256 is in its header: a flipped byte would otherwise give other ids, silently)."""
        try:
            end = raw.index(b"\n")
            header = json.loads(raw[:end])
            count, size, max_len, skeleton = (
                header["count"],
                header["token_bytes"],
                header["max_len"],
                header["skeleton"],
            )
            if header["format"] != FORMAT or header["byteorder"] != sys.byteorder or not isinstance(skeleton, dict):
                return None
            if any(type(v) is not int or v < 1 for v in (count, size, max_len)):
                return None
            body = raw[end + 1 :]
            if hashlib.sha256(body).hexdigest() != header["body_sha256"]:
                return None
            tokens = body[:size].decode("utf-8", "surrogatepass").split("\0")
            rank, split = array("i"), array("i")
            width = rank.itemsize * count
            rank.frombytes(body[size : size + width])
            split.frombytes(body[size + width : size + 2 * width])
            if len(tokens) != count or len(rank) != count or len(split) != count or len(body) != size + 2 * width:
                return None
            return cls(skeleton, tokens, rank, split, max_len)
        except Exception:  # a damaged file of the right length and hash is not expected; any error: read it whole
            return None

    def tokenizer_of(self, ids: Iterable[int]) -> Tokenizer:
        """The tokenizer of this pipeline whose vocabulary is `ids`, with the merges among them in their order."""
        from tokenizers import Tokenizer

        tokens, rank, split = self.tokens, self.rank, self.split
        kept = sorted(set(ids))
        vocab = {tokens[i]: i for i in kept} | self.added
        merges = sorted(
            (rank[i], i)
            for i in kept
            if rank[i] >= 0 and tokens[i][: split[i]] in vocab and tokens[i][split[i] :] in vocab
        )
        model = {
            **self.skeleton["model"],
            "vocab": vocab,
            "merges": [f"{tokens[i][: split[i]]} {tokens[i][split[i] :]}" for _, i in merges],
        }
        return Tokenizer.from_str(json.dumps({**self.skeleton, "model": model}))


def build_cache(json_path: Path) -> Path | None:
    """Write the cache of a tokenizer.json (or that it is not sliceable); the cache file, None when none was made."""
    data = json_path.read_bytes()
    target = cache_file(cache_key(data_digest(data)))
    if target is None:
        return None
    try:
        spec = json.loads(data)
    except (ValueError, RecursionError):
        spec = None
    cache = VocabCache.from_spec(spec)
    try:
        written = write_cache_file(target, NOT_SLICEABLE if cache is None else cache.to_bytes())
    finally:
        _building_marker(target).unlink(missing_ok=True)
    return target if written and cache is not None else None  # not written: the whole tokenizer is loaded each time


BUILDING_STALE_S = 300.0
"""A "building" marker older than this is a builder that died: another may start."""


def _building_marker(target: Path) -> Path:
    return target.with_name(target.name + ".building")


def start_building(json_path: Path, target: Path) -> None:
    """Build the cache in a child process at a low priority (parsing the file here would hold the GIL the run
    needs; the child may outlive this process). Only where the cache can be written, and one builder at a time
    (a marker made with O_EXCL): a `--workers` run's processes, or a read-only home, do not start one each."""
    from tokview.core.json_cache import cache_writable

    if not cache_writable(target):
        return
    marker = _building_marker(target)
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        try:
            if time.time() - marker.stat().st_mtime < BUILDING_STALE_S:
                return
            marker.unlink(missing_ok=True)
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except OSError:
            return
    except OSError:
        return
    os.close(fd)
    from tokview.child_process import child_env, module_command

    try:
        proc = subprocess.Popen(
            [*module_command("tokview.core.vocab_slices"), str(json_path)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=child_env(),
            start_new_session=True,
            close_fds=True,
        )
    except OSError:
        marker.unlink(missing_ok=True)
        return  # no cache: the next run loads the whole tokenizer again
    threading.Thread(target=proc.wait, name="tokview-slices-builder", daemon=True).start()  # reaped, no zombie


def sliced_tokenizer(json_path: Path) -> SlicedTokenizer | None:
    """A sliced tokenizer of this tokenizer.json when its cache exists; otherwise None, and the cache is built
    (for the next run) unless it was found not sliceable."""
    try:
        digest = file_digest(json_path)  # remembered: the run identity and the equivalence verdict hash it too
    except OSError:
        return None
    target = cache_file(cache_key(digest))
    if target is None:
        return None
    try:
        raw = target.read_bytes()
    except OSError:
        start_building(json_path, target)
        return None
    cache = VocabCache.from_bytes(raw)
    if cache is None:
        if raw != NOT_SLICEABLE:
            start_building(json_path, target)  # a torn or damaged file: made again
        return None
    try:
        return SlicedTokenizer(cache, json_path, digest)
    except Exception:  # a skeleton tokenizers refuses: loaded whole, which says what is wrong
        return None


def _words(encoding: Encoding) -> Iterable[str]:
    """The words of one encoding by the byte-character tokenizer: its tokens joined by word."""
    for _, pieces in groupby(zip(encoding.word_ids, encoding.tokens), key=lambda pair: pair[0]):
        yield "".join(piece for _, piece in pieces)


class SlicedTokenizer:
    """The part of `tokenizers.Tokenizer`'s interface `TokenizerJson` uses, answered from a `VocabCache` and a
    slice per call until the whole tokenizer is loaded (`upgrade`), then by it."""

    def __init__(self, cache: VocabCache, path: Path, digest: bytes, *, literal: bool = False) -> None:
        self._cache = cache
        self._path, self._digest = path, digest
        """The tokenizer.json the cache was read for, and its sha256: the whole tokenizer is loaded only from the
        same bytes."""
        self._literal = literal
        vocab = cache.vocab
        self._base = {vocab[c] for c in byte_characters()}
        self._base.update(
            vocab[t["content"]] for t in cache.skeleton.get("added_tokens") or () if t["content"] in vocab
        )
        unk = cache.skeleton["model"].get("unk_token")
        if isinstance(unk, str) and unk in vocab:
            self._base.add(vocab[unk])
        self._splitter = self._slice(self._base)
        self._current: tuple[frozenset[int], Tokenizer, set[str]] = (frozenset(self._base), self._splitter, set())
        """The ids the last slice holds, the slice, and the words it is known to hold every vocabulary entry of
        (changed only under `_lock`; it only grows, then is forgotten all at once past `MEMO_WORDS`)."""
        self._word_ids: dict[str, tuple[int, ...]] = {}
        """The vocabulary entries inside each word seen."""
        self._added = {int(i): t.content for i, t in self._splitter.get_added_tokens_decoder().items()}
        self._added_ids = {content: i for i, content in self._added.items()}
        self._full: Tokenizer | None = None
        self._lock = threading.Lock()
        self._loading: threading.Event | None = None
        """Set when a load of the whole tokenizer has begun; the event is set when it has ended."""
        self._sliced_chars = 0
        self._growing_s = 0.0
        """CPU seconds spent growing slices (`_slice_for`): past `GROWING_S_PER_ENTRY` per entry, the whole one."""
        self._asked = False
        """Whether a caller asked for the whole tokenizer (`upgrade`), rather than this object loading it itself."""

    def __getstate__(self) -> dict[str, Any]:
        """A copy (`copy.deepcopy`, a pickle) is made from the same cache and file, sliced again."""
        return {"cache": self._cache, "path": self._path, "digest": self._digest, "literal": self._literal}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["cache"], state["path"], state["digest"], literal=state["literal"])  # type: ignore[misc]

    # -- the whole tokenizer ---------------------------------------------------------------------------------------
    def upgrade(self) -> None:
        """Load the whole tokenizer on a thread; calls go to it once it is loaded. A caller asked for it: so does
        every `literal_copy` made from now on (a load this object starts itself is its own business)."""
        self._asked = True
        self._start_whole()

    def _start_whole(self) -> None:
        with self._lock:
            if self._full is not None or self._loading is not None:
                return
            self._loading = loading = threading.Event()
        threading.Thread(target=self._load_whole, args=(loading,), name="tokview-tokenizer-whole", daemon=True).start()

    @property
    def upgrading(self) -> bool:
        """Whether the whole tokenizer is loaded or being loaded."""
        return self._full is not None or self._loading is not None

    def whole(self) -> Tokenizer:
        """The whole tokenizer, loaded here if it was not (a load begun by `upgrade` is waited for). Raises
        TokenizerError when tokenizer.json has changed since the slices were read."""
        with self._lock:
            loading = self._loading
            if loading is None and self._full is None:
                self._loading = loading = threading.Event()
                mine = True
            else:
                mine = False
        if mine:
            assert loading is not None
            self._load_whole(loading)
        elif loading is not None:
            loading.wait()
        if self._full is None:
            raise TokenizerFileChanged(f"{self._path} changed while it was in use: load the tokenizer again")
        return self._full

    def _load_whole(self, done: threading.Event) -> None:
        """Parse the file if it still holds the bytes the slices were read for; otherwise the slices go on
        answering (they are the tokenizer this process started with)."""
        from tokenizers import Tokenizer

        try:
            data = self._path.read_bytes()
            if data_digest(data) == self._digest:
                full = Tokenizer.from_buffer(data)
                if self._literal:
                    full.encode_special_tokens = True
                self._full = full
        except Exception:  # unreadable, or refused: the slices go on answering
            pass
        finally:
            done.set()

    def _slice(self, ids: Iterable[int]) -> Tokenizer:
        tokenizer = self._cache.tokenizer_of(ids)
        if self._literal:
            tokenizer.encode_special_tokens = True
        return tokenizer

    def _encoded(self, texts: Sequence[str], add_special_tokens: bool, *, fast: bool = False) -> list[Encoding]:
        """`texts` encoded as the whole tokenizer encodes them. They are encoded by the current slice first, and its
        answer kept when every word in it is one the slice is known to hold all the vocabulary entries of: the words
        are read off that answer (a word's tokens joined give the word, in any slice of this pipeline, since its
        normalizer, pre-tokenizer and added tokens are the whole one's), so a run whose answers share their words
        pays for one encode, not a split of the text into words and then an encode. Otherwise the slice grows
        (`_slice_for`) and the texts are encoded again."""
        texts = list(texts)  # `encode_batch`, not `encode_batch_fast`, below: only it gives the words (`word_ids`)
        with self._lock:
            _, tokenizer, covered = self._current
        encodings = tokenizer.encode_batch(texts, add_special_tokens=add_special_tokens)
        words: set[str] = set()
        for encoding in encodings:
            words.update(_words(encoding))
        self._sliced_chars += sum(map(len, texts))
        if self._sliced_chars > AUTO_UPGRADE_CHARS:
            self._start_whole()
        with self._lock:
            known = self._current[1] is tokenizer and words <= covered  # `covered` is the newest slice's
        if known:
            return encodings
        exact = self._slice_for(words)
        if exact is tokenizer:
            return encodings
        encode = getattr(exact, "encode_batch_fast", exact.encode_batch) if fast else exact.encode_batch
        return list(encode(texts, add_special_tokens=add_special_tokens))

    def _slice_for(self, words: set[str]) -> Tokenizer:
        """A tokenizer that encodes text of these words as the whole tokenizer does: a slice holding every
        vocabulary entry inside each word. The current slice when it holds them all (a bigger slice encodes as
        exactly), else it grows: a run's answers share most of their words, so after a few the slice rarely
        changes. Words that would take more than `LOOKUP_BUDGET` new lookups (a long run of one kind of character:
        minified code, base64) go to the whole tokenizer instead."""
        started = time.thread_time()
        try:
            return self._grown(words)
        finally:
            self._growing_s += time.thread_time() - started
            if self._growing_s > max(GROWING_MIN_S, GROWING_S_PER_ENTRY * len(self._cache.tokens)):
                self._start_whole()

    def _grown(self, words: set[str]) -> Tokenizer:
        memo = self._word_ids
        new = [w for w in words if w not in memo]
        max_len = self._cache.max_len
        if sum(len(w) * min(len(w), max_len) for w in new) > LOOKUP_BUDGET:
            try:
                return self.whole()
            except TokenizerFileChanged:
                pass  # the file is not the one this process started with: the slices still are, only slower
        found: set[int] = set()
        for word in words:
            ids = memo.get(word)
            if ids is None:
                ids = memo[word] = self._ids_in(word)
            found.update(ids)
        if len(memo) > MEMO_WORDS:
            memo.clear()
        with self._lock:
            held, tokenizer, covered = self._current
            if not found <= held:
                held = held | found
                tokenizer = self._slice(held)
                self._current = (held, tokenizer, covered)  # what the smaller slice held, this one holds too
            if len(covered) > MEMO_WORDS:
                covered.clear()
            covered.update(words)
            return tokenizer

    def _ids_in(self, word: str) -> tuple[int, ...]:
        vocab, n = self._cache.vocab, len(word)
        max_len = self._cache.max_len
        ids = (vocab.get(word[i:j]) for i in range(n) for j in range(i + 1, min(n, i + max_len) + 1))
        return tuple(i for i in ids if i is not None)

    # -- what TokenizerJson asks -----------------------------------------------------------------------------------
    @property
    def model(self) -> object:
        return (self._full or self._splitter).model

    @property
    def decoder(self) -> object:
        return (self._full or self._splitter).decoder

    @property
    def pre_tokenizer(self) -> Any:
        return (self._full or self._splitter).pre_tokenizer

    @property
    def normalizer(self) -> Any:
        return (self._full or self._splitter).normalizer

    @property
    def post_processor(self) -> Any:
        return (self._full or self._splitter).post_processor

    @property
    def encode_special_tokens(self) -> bool:
        return self._literal

    @encode_special_tokens.setter
    def encode_special_tokens(self, value: bool) -> None:
        self._literal = value
        for tokenizer in (self._full, self._splitter, self._current[1]):
            if tokenizer is not None:
                tokenizer.encode_special_tokens = value

    def literal_copy(self) -> SlicedTokenizer | Tokenizer:
        """A copy that encodes special-token text as text (`encode_special_tokens`)."""
        if self._full is not None and self._asked:
            from tokenizers import Tokenizer

            whole = Tokenizer.from_str(self._full.to_str())
            whole.encode_special_tokens = True
            return whole
        sliced = SlicedTokenizer(self._cache, self._path, self._digest, literal=True)
        if self._asked:  # asked for the whole one: so is the copy (a copy keeps its own count of what slices cost)
            sliced.upgrade()
        return sliced

    def get_added_tokens_decoder(self) -> Any:
        return (self._full or self._splitter).get_added_tokens_decoder()

    def get_vocab(self, with_added_tokens: bool = True) -> dict[str, int]:
        if self._full is not None:
            return dict(self._full.get_vocab(with_added_tokens=with_added_tokens))
        vocab = dict(self._cache.vocab)
        if with_added_tokens:
            vocab.update(self._added_ids)
        return vocab

    def get_vocab_size(self, with_added_tokens: bool = True) -> int:
        if self._full is not None:
            return int(self._full.get_vocab_size(with_added_tokens=with_added_tokens))
        return len(self.get_vocab(with_added_tokens)) if with_added_tokens else len(self._cache.tokens)

    def token_to_id(self, token: str) -> int | None:
        if self._full is not None:
            return self._full.token_to_id(token)
        found = self._added_ids.get(token)
        return self._cache.vocab.get(token) if found is None else found

    def id_to_token(self, id: int) -> str | None:
        if self._full is not None:
            return self._full.id_to_token(id)
        if not 0 <= id < 1 << 32:
            raise OverflowError("can't convert negative int to unsigned" if id < 0 else "int too big to convert")
        if id in self._added:  # as the whole one shows it (tokenizers 0.23 shows a normalized token normalized)
            return self._splitter.id_to_token(id)
        return self._cache.tokens[id] if id < len(self._cache.tokens) else None

    def encode(self, sequence: str, add_special_tokens: bool = True) -> Encoding:
        if self._full is not None:
            return self._full.encode(sequence, add_special_tokens=add_special_tokens)
        return self._encoded([sequence], add_special_tokens)[0]

    def encode_batch(self, input: Sequence[str], add_special_tokens: bool = True) -> list[Encoding]:
        if self._full is not None:
            return self._full.encode_batch(list(input), add_special_tokens=add_special_tokens)
        return self._encoded(input, add_special_tokens)

    def encode_batch_fast(self, input: Sequence[str], add_special_tokens: bool = True) -> list[Encoding]:
        if self._full is not None:
            fast = getattr(self._full, "encode_batch_fast", self._full.encode_batch)
            return list(fast(list(input), add_special_tokens=add_special_tokens))
        return self._encoded(input, add_special_tokens, fast=True)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        if self._full is not None:
            return str(self._full.decode(list(ids), skip_special_tokens=skip_special_tokens))
        ids = [int(i) for i in ids]
        for i in ids:
            self.id_to_token(i)  # the whole tokenizer's OverflowError for an id outside u32
        known = len(self._cache.tokens)
        return str(
            self._slice(self._base | {i for i in ids if i < known}).decode(ids, skip_special_tokens=skip_special_tokens)
        )

    def to_str(self) -> str:
        return str(self.whole().to_str())


def main(argv: list[str]) -> int:
    """`python -m tokview.core.vocab_slices FILE`: build FILE's cache (what `start_building` runs)."""
    try:
        os.nice(10)
    except OSError:
        pass
    try:
        build_cache(Path(argv[0]))
    except (OSError, IndexError):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
