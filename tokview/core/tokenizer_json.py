"""A folder's `tokenizer.json`, read with the `tokenizers` library alone: no transformers import.

Why: importing transformers costs ~1–2 s, which was most of `tokview batch`'s start-up, and its
Python wrapper around every `encode`/`decode` (argument handling, `to_py_obj` over each id) cost more
per 2,000-token sample than the Rust work itself. For a folder whose `tokenizer_class` is the generic
fast class (`PreTrainedTokenizerFast`, or transformers 5's `TokenizersBackend`), transformers adds
nothing to the ids: every rule lives in `tokenizer.json` (normalizer, pre-tokenizer, model, added
tokens, post-processor, decoder), and the config only names the special-token roles, the length
limit and the chat template. This module reads exactly that, and renders templates with
`core.chat_template` (transformers' own Jinja set-up).

`read_natively` says whether a folder qualifies (a model-specific class qualifies once transformers has been
shown to build the same tokenizer: `tokenizer_equivalence.py`). It refuses (so transformers loads it, as before)
whenever transformers would change the tokenizer while loading it: a config that names tokens
tokenizer.json lacks (transformers adds them), `add_bos_token`/`add_eos_token`/`add_prefix_space`,
`split_special_tokens`, truncation or padding saved in the file, a clean-up of decoded spaces, or
named extra tokens. tests/test_tokenizer_json.py checks ids, texts, special ids, vocabulary and
rendered prompts against transformers on the same folders, on both transformers lines CI runs.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from itertools import compress
from typing import Any, Protocol, overload

from tokview.core.kimi_tiktoken import AddedToken
from tokview.core.segment_memo import MIN_CHARS, SegmentMemo, exact_markers
from tokview.core.tokenizer_folder import TokenizerFolder, byte_of_character, token_text

GENERIC_CLASSES = frozenset({"PreTrainedTokenizerFast", "TokenizersBackend"})
"""Classes that are tokenizer.json and nothing more (a model-specific class may rebuild parts in code)."""
ROLES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")
"""transformers' named special-token attributes, in its order (`SPECIAL_TOKENS_ATTRIBUTES`)."""
CHANGING_KEYS = ("add_bos_token", "add_eos_token", "add_prefix_space", "split_special_tokens")
"""Config keys with which transformers edits the tokenizer it loads (a true value sends the folder there)."""
VERY_LARGE_INTEGER = int(1e30)
"""transformers' `model_max_length` when the config names none."""


class _Encoding(Protocol):
    @property
    def ids(self) -> list[int]: ...


class _AddedTokenView(Protocol):
    @property
    def content(self) -> str: ...

    @property
    def special(self) -> bool: ...

    @property
    def normalized(self) -> bool: ...

    @property
    def lstrip(self) -> bool: ...

    @property
    def rstrip(self) -> bool: ...

    @property
    def single_word(self) -> bool: ...


class _EncodeBatch(Protocol):
    def __call__(self, input: Sequence[str], *, add_special_tokens: bool) -> list[_Encoding]: ...


class RustTokenizer(Protocol):
    """What `TokenizerJson` uses of a `tokenizers.Tokenizer` (the Rust library's Python class)."""

    encode_special_tokens: bool

    @property
    def model(self) -> object: ...

    @property
    def decoder(self) -> object: ...

    @property
    def pre_tokenizer(self) -> Any: ...

    def get_added_tokens_decoder(self) -> Mapping[int, _AddedTokenView]: ...

    def get_vocab_size(self, with_added_tokens: bool = ...) -> int: ...

    def get_vocab(self, with_added_tokens: bool = ...) -> dict[str, int]: ...

    def token_to_id(self, token: str) -> int | None: ...

    def id_to_token(self, id: int) -> str | None: ...

    def encode(self, sequence: str, *, add_special_tokens: bool = ...) -> _Encoding: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...

    def to_str(self) -> str: ...


def _ids_of(tokenizer: RustTokenizer, texts: list[str], add_special_tokens: bool) -> list[list[int]]:
    """The ids of each text only: `encode_batch_fast` (tokenizers >= 0.21) skips the character offsets `encode`
    computes (~20% of a 2,000-token encode) and lets other threads run meanwhile; transformers' own path is
    `encode_batch`."""
    batch: _EncodeBatch | None = getattr(tokenizer, "encode_batch_fast", None)
    if batch is not None:
        return [e.ids for e in batch(texts, add_special_tokens=add_special_tokens)]
    return [tokenizer.encode(t, add_special_tokens=add_special_tokens).ids for t in texts]


def read_natively(folder: TokenizerFolder, trust_remote_code: bool = False) -> bool:
    """Whether `TokenizerJson.from_folder` gives the same tokenizer transformers would (see the docstring)."""
    return folder.tokenizer_class in GENERIC_CLASSES and plain_folder(folder, trust_remote_code)


def plain_folder(folder: TokenizerFolder, trust_remote_code: bool = False) -> bool:
    """Everything `read_natively` asks but a generic class: for a model-specific class, whether the native
    reading equals transformers' is decided by comparing them (`tokenizer_equivalence`)."""
    config = folder.config
    if trust_remote_code or folder.auto_map_class or not folder.has("tokenizer.json") or folder.has_named_templates:
        return False
    if any(config.get(key) for key in CHANGING_KEYS) or config.get("clean_up_tokenization_spaces"):
        return False
    extra, additional = config.get("extra_special_tokens"), config.get("additional_special_tokens")
    for value in (extra, additional):
        if value is not None and not isinstance(value, list) and value != {}:
            return False  # named extra tokens (a dict) become roles of their own in transformers 5
    return not (extra and additional)  # both given: the two transformers lines merge them differently


class TokenizerJson:
    """The slice of transformers' tokenizer interface tokview uses, over a `tokenizers.Tokenizer`."""

    is_fast = True

    def __init__(
        self,
        tokenizer: RustTokenizer,
        config: dict[str, Any],
        *,
        chat_template: str | None = None,
        name_or_path: str = "",
    ) -> None:
        self._tokenizer = tokenizer
        self.name_or_path = name_or_path
        self.chat_template = chat_template
        roles = {role: token_text(config.get(f"{role}_token")) for role in ROLES}
        self.bos_token, self.eos_token, self.unk_token = roles["bos"], roles["eos"], roles["unk"]
        self.sep_token, self.pad_token, self.cls_token, self.mask_token = (
            roles["sep"],
            roles["pad"],
            roles["cls"],
            roles["mask"],
        )
        extra = config.get("extra_special_tokens") or config.get("additional_special_tokens") or []
        self.additional_special_tokens = [t for t in map(token_text, extra) if t]
        max_len = config.get("model_max_length")
        self.model_max_length: int = VERY_LARGE_INTEGER
        if isinstance(max_len, int) and not isinstance(max_len, bool):
            self.model_max_length = max_len
        self.added_tokens_decoder = {
            int(i): AddedToken(t.content, bool(t.special)) for i, t in tokenizer.get_added_tokens_decoder().items()
        }
        self._is_bpe = type(tokenizer.model).__name__ == "BPE"
        self._byte_level = type(tokenizer.decoder).__name__ == "ByteLevel"
        self._piece_bytes: dict[int, bytes] = {}
        self._special_contents = frozenset(t.content for t in self.added_tokens_decoder.values() if t.special)
        self._kept_when_skipping: dict[int, bool] = {}
        """Per id seen: False for a special added token (`skip_special_tokens` drops it)."""
        self._literal: RustTokenizer | None = None
        self._literal_lock = threading.Lock()
        self._memo: SegmentMemo | bool | None = False
        """`encode_rendered`'s remembered pieces; None when this tokenizer's pieces cannot be encoded apart, False
        before the first use."""

    @classmethod
    def from_folder(cls, folder: TokenizerFolder, *, sliced: bool = False) -> TokenizerJson | None:
        """The folder's tokenizer, or None when transformers would load something else (then use it).

        `sliced`: answered from vocabulary slices until `load_whole` (`core.vocab_slices`: ~0.07 s instead of a
        0.3-0.5 s parse, for a run that may encode little), when this tokenizer.json's slice cache exists; when it
        does not, the whole file is read and the cache built beside the run for the next one."""
        from tokenizers import Tokenizer

        path = folder.path / "tokenizer.json"
        tokenizer: RustTokenizer | None = None
        if sliced:
            from tokview.core.vocab_slices import sliced_tokenizer

            tokenizer = sliced_tokenizer(path)  # never for a file with truncation or padding
        if tokenizer is None:
            try:
                whole = Tokenizer.from_file(str(path))
            except Exception:
                return None  # transformers' loader reports a broken file in its own words
            if whole.truncation is not None or whole.padding is not None:
                return None
            tokenizer = whole
        tok = cls(tokenizer, folder.config, chat_template=folder.chat_template(), name_or_path=str(folder.path))
        if not tok._config_agrees(folder.config):
            return None
        return tok

    def _config_agrees(self, config: dict[str, Any]) -> bool:
        """Every token the config names is already in tokenizer.json, as the same kind of token."""
        named = [t for t in (getattr(self, f"{r}_token") for r in ROLES) if t is not None]
        if any(self._tokenizer.token_to_id(t) is None for t in [*named, *self.additional_special_tokens]):
            return False  # transformers would add it as a new id
        declared = config.get("added_tokens_decoder")
        if not isinstance(declared, dict):
            return declared is None
        for key, value in declared.items():
            content = token_text(value)
            if not str(key).isdecimal() or content is None:
                return False
            have = self.added_tokens_decoder.get(int(key))
            special = bool(value.get("special", True)) if isinstance(value, dict) else True
            if have is None or have.content != content or have.special != special:
                return False
        return True

    # -- what transformers' tokenizers offer ---------------------------------------------------------
    @property
    def backend_tokenizer(self) -> RustTokenizer:
        """The Rust tokenizer read from the file (transformers' fast tokenizers name theirs so too)."""
        return self._tokenizer

    def __len__(self) -> int:
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    @property
    def vocab_size(self) -> int:
        return int(self._tokenizer.get_vocab_size(with_added_tokens=False))

    def get_vocab(self) -> dict[str, int]:
        return dict(self._tokenizer.get_vocab(with_added_tokens=True))

    def _id(self, token: str | None) -> int | None:
        return None if token is None else self._convert_token(token)

    @property
    def bos_token_id(self) -> int | None:
        return self._id(self.bos_token)

    @property
    def eos_token_id(self) -> int | None:
        return self._id(self.eos_token)

    @property
    def unk_token_id(self) -> int | None:
        return self._id(self.unk_token)

    @property
    def pad_token_id(self) -> int | None:
        return self._id(self.pad_token)

    @property
    def special_tokens_map(self) -> dict[str, Any]:
        """The named special tokens a chat template sees as variables (`bos_token`, `eos_token`, …)."""
        return {f"{r}_token": getattr(self, f"{r}_token") for r in ROLES if getattr(self, f"{r}_token") is not None}

    @property
    def all_special_tokens(self) -> list[str]:
        named = [getattr(self, f"{r}_token") for r in ROLES]
        return list(dict.fromkeys(t for t in [*named, *self.additional_special_tokens] if t is not None))

    @property
    def all_special_ids(self) -> list[int]:
        return [i for i in (self._convert_token(t) for t in self.all_special_tokens) if i is not None]

    def _convert_token(self, token: str) -> int | None:
        found = self._tokenizer.token_to_id(token)
        if found is not None:
            return int(found)
        return None if self.unk_token is None else self._tokenizer.token_to_id(self.unk_token)

    @overload
    def convert_tokens_to_ids(self, tokens: str) -> int | None: ...

    @overload
    def convert_tokens_to_ids(self, tokens: list[str] | tuple[str, ...]) -> list[int | None]: ...

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> int | list[int | None] | None:
        if isinstance(tokens, str):
            return self._convert_token(tokens)
        return [self._convert_token(t) for t in tokens]

    @overload
    def convert_ids_to_tokens(self, ids: int) -> str | None: ...

    @overload
    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str | None]: ...

    def convert_ids_to_tokens(self, ids: int | Sequence[int]) -> str | list[str | None] | None:
        if isinstance(ids, int):
            return self._tokenizer.id_to_token(ids)
        return [self._tokenizer.id_to_token(int(i)) for i in ids]

    def encode(
        self, text: str, add_special_tokens: bool = True, *, split_special_tokens: bool = False, **_: object
    ) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text to encode must be a string, not {type(text).__name__}")
        if not split_special_tokens:
            return self._encode(text, add_special_tokens)
        return _ids_of(self._literal_tokenizer(), [text], add_special_tokens)[0]

    def __getstate__(self) -> dict[str, Any]:
        """A copy (`copy.deepcopy`, a pickle) leaves out the literal copy and its lock, made again when needed."""
        state = dict(self.__dict__)
        state["_literal"], state["_literal_lock"] = None, None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._literal_lock = threading.Lock()

    def _literal_tokenizer(self) -> RustTokenizer:
        """A copy of the tokenizer that encodes special-token text as text (`split_special_tokens`): the flag is set
        once on the copy. Flipping it on the shared tokenizer for one call made renders in other threads meanwhile
        encode their markers as text."""
        with self._literal_lock:
            if self._literal is None:
                copy = getattr(self._tokenizer, "literal_copy", None)  # a sliced one makes its own
                if copy is not None:
                    self._literal = copy()
                else:
                    from tokenizers import Tokenizer

                    literal = Tokenizer.from_str(self._tokenizer.to_str())
                    literal.encode_special_tokens = True
                    self._literal = literal
            return self._literal

    def load_whole(self) -> None:
        """Load the whole tokenizer on a thread if it is answered from vocabulary slices (`from_folder(sliced=)`):
        for work that will encode a lot."""
        for tokenizer in (self._tokenizer, self._literal):
            upgrade = getattr(tokenizer, "upgrade", None)
            if upgrade is not None:
                upgrade()

    def encode_rendered(self, text: str) -> list[int]:
        """`encode(text, add_special_tokens=False)` of a rendered prompt, from the ids of its pieces between added
        tokens where they were encoded before (`core.segment_memo`: a conversation's next prompt repeats it)."""
        memo = self._segment_memo() if len(text) >= MIN_CHARS else None  # built at the first long text (8 ms)
        if memo is None:
            return self.encode(text, add_special_tokens=False)
        return memo.encode(text)

    def _segment_memo(self) -> SegmentMemo | None:
        if self._memo is False:
            state = self._tokenizer.pre_tokenizer
            markers = exact_markers(
                self._tokenizer.get_added_tokens_decoder().items(), None if state is None else state.__getstate__()
            )
            if getattr(self._tokenizer.model, "dropout", None):  # BPE dropout: each encoding a random draw
                markers = None
            self._memo = None if markers is None else SegmentMemo(markers, self._encode_pieces)
        return self._memo if isinstance(self._memo, SegmentMemo) else None

    def _encode_pieces(self, pieces: list[str]) -> list[list[int]]:
        return _ids_of(self._tokenizer, pieces, False)

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return _ids_of(self._tokenizer, [text], add_special_tokens)[0]

    def __call__(
        self, text: str, add_special_tokens: bool = True, split_special_tokens: bool = False, **_: object
    ) -> dict[str, list[int]]:
        return {"input_ids": self.encode(text, add_special_tokens, split_special_tokens=split_special_tokens)}

    def decode(
        self,
        ids: int | Iterable[int],
        skip_special_tokens: bool = False,
        clean_up_tokenization_spaces: bool | None = None,
        **_: object,
    ) -> str:
        ids = [ids] if isinstance(ids, int) else ids if isinstance(ids, list) else list(ids)
        if self._byte_level:
            text = self._decode_bytes(ids, skip_special_tokens).decode("utf-8", "replace")
        else:
            text = self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        if clean_up_tokenization_spaces and not self._is_bpe:  # transformers 5 never cleans up after BPE
            for old, new in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't")):
                text = text.replace(old, new)
            for old, new in ((" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
                text = text.replace(old, new)
        return text

    def _decode_bytes(self, ids: list[int], skip_special_tokens: bool) -> bytes:
        """What a ByteLevel decoder makes of `ids`, before its lossy UTF-8 step, from per-id bytes kept
        across calls (a 2,000-id answer is decoded several times per sample: one `join` each, not a
        Rust round trip that rebuilds every token string).

        The rule is the decoder's own: a token whose characters are all in the byte-level alphabet
        stands for those bytes, any other token (an added `<|im_end|>` with a space, say) for its UTF-8;
        ids the tokenizer does not know add nothing; `skip_special_tokens` drops tokens whose text is a
        special added token's. tests/test_tokenizer_json.py checks it against `Tokenizer.decode`."""
        table = self._piece_bytes
        try:
            pieces = list(map(table.__getitem__, ids))
        except KeyError:
            pieces = [table[i] if i in table else self._learn(i) for i in ids]
        if skip_special_tokens:
            pieces = list(compress(pieces, map(self._kept_when_skipping.__getitem__, ids)))  # in C
        return b"".join(pieces)

    def _learn(self, token_id: int) -> bytes:
        token = self._tokenizer.id_to_token(token_id)  # OverflowError outside u32, as Tokenizer.decode raises
        if token is None:
            raw = b""
        else:
            alphabet = byte_of_character()
            raw = bytes(alphabet[c] for c in token) if all(c in alphabet for c in token) else token.encode("utf-8")
        self._kept_when_skipping[token_id] = token is None or token not in self._special_contents
        self._piece_bytes[token_id] = raw
        return raw

    def apply_chat_template(
        self,
        conversation: list[dict[str, Any]],
        tools: object = None,
        tokenize: bool = False,
        add_generation_prompt: bool = False,
        **kwargs: object,
    ) -> str | list[int]:
        from tokview.core.chat_template import render_tokenizer_template

        text = render_tokenizer_template(
            self.chat_template,
            conversation,
            special_tokens=self.special_tokens_map,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            options=kwargs,
        )
        return self.encode(text, add_special_tokens=False) if tokenize else text
