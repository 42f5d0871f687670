"""Kimi's tiktoken tokenizer, read natively: no code from the model folder is imported or executed.

Kimi's folders ship `tokenization_kimi.py` (a `TikTokenTokenizer`) that transformers only runs with
`trust_remote_code`, and that file imports `bytes_to_unicode` from transformers' gpt2 module, which is
gone in transformers 5. Its behaviour is small and fully determined by the published file, so tokview
implements it here with tiktoken itself:

- base ranks come from `tiktoken.model` (`base64-token rank` lines, ranks 0..n-1);
- special tokens take the ids n .. n+257, named by the config's `added_tokens_decoder`, else
  `<|reserved_token_ID|>`;
- `encode` allows every special token in the text (`allowed_special="all"`), after cutting the text into
  400,000-character chunks and those into runs of at most 25,000 consecutive whitespace or non-whitespace
  characters (tiktoken's BPE is quadratic in a piece's length);
- the split pattern is `KIMI_PATTERN` below;
- `decode` is tiktoken's decode; `skip_special_tokens` drops the tokens transformers would drop for
  that class (bos/eos/unk/pad and `additional_special_tokens`).

The object offers the slice of transformers' tokenizer interface tokview uses (`encode`, `decode`,
`__call__`, `apply_chat_template`, `convert_ids_to_tokens`, …), so the adapter, the simulator and the
audit reader treat it like any other tokenizer. Token strings use GPT-2's byte-to-unicode alphabet, as
Kimi's file does. `tiktoken.model` is parsed here rather than with `tiktoken.load`, whose reader caches
a file by its path in a temp folder and would serve a stale copy after the file changes.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

from tokview.core.tokenizer_folder import FolderError, TokenizerFolder, byte_alphabet, token_text

KIMI_PATTERN = "|".join(
    [
        r"""[\p{Han}]+""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
NUM_SPECIAL = 256 + 2  # Kimi: num_reserved_special_tokens = 256, and range(n, n + 256 + 2)
MAX_ENCODE_CHARS = 400_000
MAX_RUN_CHARS = 25_000
# What Kimi's class uses when the config names no additional_special_tokens.
DEFAULT_ADDITIONAL_SPECIAL = (
    "<|im_end|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "[EOT]",
    "<|im_system|>",
    "<|im_middle|>",
)
_RUNS = re.compile(r"\s+|\S+")  # Python's \s is str.isspace(), the test Kimi's splitter uses


@dataclass(frozen=True)
class AddedToken:
    """What transformers' `added_tokens_decoder` values offer: the text and whether it is special."""

    content: str
    special: bool = True

    def __str__(self) -> str:
        return self.content


_BASE64 = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="
"""base64's alphabet and its padding: the ranks' digits are among them."""


def read_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    """`base64-token rank` lines → {token bytes: rank}; ranks must be exactly 0..n-1."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise FolderError(f"cannot read {path}: {exc.strerror or exc}") from None
    ranks = _plain_ranks(data)  # 0..n-1 in order by construction: only a file read line by line is checked
    if ranks is not None:
        return ranks
    ranks = _ranks_by_line(path, data)
    if not ranks:
        raise FolderError(f"{path} holds no tokens")
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise FolderError(
            f"{path}: ranks are not 0..{len(ranks) - 1} without gaps or repeats, so the special ids "
            f"Kimi's tokenizer derives from the token count would collide"
        )
    return ranks


def _plain_ranks(data: bytes) -> dict[bytes, int] | None:
    """The ranks of a plain file (one `token rank` pair a line with one space between, canonical base64, ranks
    0..n-1 in order, no blank line), read in passes over the whole file instead of a line at a time: Kimi's 163,584
    lines took 0.14-0.26 s line by line, 0.12-0.18 s so on this project's 2-core machines (a batch, the proxy and
    the app wait for it before their first request; the dict itself is most of what is left). None for any other
    file, which `_ranks_by_line` reads (and says which line is wrong)."""
    if not data.endswith(b"\n"):
        data += b"\n"
    separators = data.translate(None, _BASE64)
    lines = len(separators) // 2
    if not lines or separators != b" \n" * lines:
        return None  # a tab, a carriage return, a blank line, a line of one field or of three, a non-base64 byte
    fields = data.split()
    if len(fields) != 2 * lines or _misplaced_padding(data):
        return None  # a space at a line's start or end (an empty field), padding base64 does not allow
    if b"\n".join(fields[1::2]) != "\n".join(map(str, range(lines))).encode():
        return None  # ranks out of order, or not written as plain numbers: read line by line
    tokens = fields[0::2]
    if any(n % 4 for n in set(map(len, tokens))):
        return None  # a length base64 does not have ("QUI==": the lenient decoder below would take it)
    try:
        decoded = list(map(binascii.a2b_base64, tokens))
    except binascii.Error:
        return None
    ranks = dict(zip(decoded, range(lines)))
    return ranks if len(ranks) == lines else None  # a token twice: line by line, which the rank check refuses


def _misplaced_padding(data: bytes) -> bool:
    """Whether a token holds padding `b64decode(validate=True)` refuses: inside it, three of it, or a token of
    padding alone. Every "=" of a plain file ends its token or is followed by the other one, at most two ("= "
    or "== "): counted in C instead of matched by a regular expression (4 passes: ~2 ms, the expression ~40)."""
    return (
        data.count(b"=") != data.count(b"= ") + data.count(b"==")
        or b"===" in data
        or data.startswith(b"=")
        or b"\n=" in data
    )


def _ranks_by_line(path: Path, data: bytes) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    for lineno, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except (ValueError, binascii.Error):
            raise FolderError(f"{path} line {lineno} is not a 'base64-token rank' line") from None
    return ranks


def split_for_encoding(text: str, *, chunk: int = MAX_ENCODE_CHARS, run: int = MAX_RUN_CHARS) -> Iterator[str]:
    """Kimi's cut: 400,000-character chunks, each cut inside runs longer than 25,000 characters.

    Within a chunk, a cut falls after every 25,000th character of one whitespace or non-whitespace run
    (the pieces between cuts may mix both kinds), which is what Kimi's `_split_whitespaces_or_nonwhitespaces`
    yields.
    """
    for start in range(0, len(text), chunk):
        part = text[start : start + chunk]
        if len(part) <= run:
            yield part
            continue
        cut = 0
        for found in _RUNS.finditer(part):
            for pos in range(found.start() + run, found.end(), run):
                yield part[cut:pos]
                cut = pos
        yield part[cut:]


class KimiTiktokenTokenizer:
    """Kimi's TikTokenTokenizer, reimplemented from its published behaviour (see the module docstring)."""

    is_fast = False

    def __init__(
        self,
        ranks: dict[bytes, int],
        config: dict[str, Any],
        *,
        chat_template: str | None = None,
        name_or_path: str = "",
    ) -> None:
        import tiktoken

        self.name_or_path = name_or_path
        self.chat_template = chat_template
        n = len(ranks)
        names = {}
        decoder = config.get("added_tokens_decoder") or {}
        if not isinstance(decoder, dict):
            raise FolderError(
                f"tokenizer_config.json in {name_or_path or 'the folder'}: added_tokens_decoder must be an object of "
                f"ids, not {type(decoder).__name__}"
            )
        for key, value in decoder.items():
            text = token_text(value)
            if text is not None and str(key).isdecimal():
                names[int(key)] = (text, bool(value.get("special", True)) if isinstance(value, dict) else True)
        self._ranks = ranks
        self.special_tokens: dict[str, int] = {}
        self.added_tokens_decoder: dict[int, AddedToken] = {}
        for i in range(n, n + NUM_SPECIAL):
            text, special = names.get(i, (f"<|reserved_token_{i}|>", True))
            self.special_tokens[text] = i
            self.added_tokens_decoder[i] = AddedToken(text, special)
        self._special_by_id = {i: t for t, i in self.special_tokens.items()}
        self._memo: Any = False
        """`encode_rendered`'s remembered pieces (a `SegmentMemo`); None when they cannot be; False before first use."""
        self.model = tiktoken.Encoding(
            name="tiktoken.model", pat_str=KIMI_PATTERN, mergeable_ranks=ranks, special_tokens=self.special_tokens
        )
        self.bos_token = token_text(config.get("bos_token", "[BOS]"))
        self.eos_token = token_text(config.get("eos_token", "[EOS]"))
        self.unk_token = token_text(config.get("unk_token"))
        self.pad_token = token_text(config.get("pad_token"))
        extra = config.get("additional_special_tokens")
        self.additional_special_tokens = (
            [t for t in map(token_text, extra) if t] if isinstance(extra, list) else list(DEFAULT_ADDITIONAL_SPECIAL)
        )
        for role in ("bos", "eos", "unk", "pad"):
            token = getattr(self, f"{role}_token")
            if token is not None and token not in self.special_tokens:
                raise FolderError(
                    f"tokenizer_config.json names {role}_token {token!r}, which is not one of the "
                    f"special tokens (ids {n}..{n + NUM_SPECIAL - 1})"
                )
        max_len = config.get("model_max_length")
        self.model_max_length = max_len if isinstance(max_len, int) and not isinstance(max_len, bool) else 10**30
        self._byte_encoder: dict[int, str] | None = None
        self._byte_decoder: dict[str, int] | None = None

    @classmethod
    def from_folder(cls, folder: TokenizerFolder) -> KimiTiktokenTokenizer:
        ranks = read_tiktoken_ranks(folder.path / "tiktoken.model")
        return cls(ranks, folder.config, chat_template=folder.chat_template(), name_or_path=str(folder.path))

    # -- what transformers' tokenizers offer ---------------------------------------------------------
    def __len__(self) -> int:
        return self.model.n_vocab

    @property
    def vocab_size(self) -> int:
        return self.model.n_vocab

    def _id(self, token: str | None) -> int | None:
        return self.special_tokens.get(token) if token is not None else None

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
        """The variables transformers hands a chat template (`bos_token`, `eos_token`, …)."""
        out: dict[str, Any] = {
            f"{r}_token": getattr(self, f"{r}_token")
            for r in ("bos", "eos", "unk", "pad")
            if getattr(self, f"{r}_token") is not None
        }
        if self.additional_special_tokens:
            out["additional_special_tokens"] = list(self.additional_special_tokens)
        return out

    @property
    def all_special_tokens(self) -> list[str]:
        named = [getattr(self, f"{r}_token") for r in ("bos", "eos", "unk", "pad")]
        return list(dict.fromkeys(t for t in [*named, *self.additional_special_tokens] if t is not None))

    @property
    def all_special_ids(self) -> list[int]:
        return [i for i in (self.special_tokens.get(t) for t in self.all_special_tokens) if i is not None]

    def _bytes_alphabet(self) -> tuple[dict[int, str], dict[str, int]]:
        if self._byte_encoder is None:
            self._byte_encoder = byte_alphabet()
            self._byte_decoder = {c: b for b, c in self._byte_encoder.items()}
        return self._byte_encoder, self._byte_decoder  # type: ignore[return-value]

    def token_bytes(self, token_id: int) -> bytes | None:
        if token_id in self._special_by_id:
            return self._special_by_id[token_id].encode("utf-8")
        if 0 <= token_id < len(self._ranks):
            return self.model.decode_single_token_bytes(token_id)
        return None

    def _token(self, token_id: int) -> str | None:
        if token_id in self._special_by_id:
            return self._special_by_id[token_id]
        raw = self.token_bytes(token_id)
        if raw is None:
            return None
        enc, _ = self._bytes_alphabet()
        return "".join(enc[b] for b in raw)

    @overload
    def convert_ids_to_tokens(self, ids: int) -> str | None: ...

    @overload
    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str | None]: ...

    def convert_ids_to_tokens(self, ids: int | Sequence[int]) -> str | list[str | None] | None:
        if isinstance(ids, int):
            return self._token(ids)
        return [self._token(int(i)) for i in ids]

    def _token_id(self, token: str) -> int | None:
        if token in self.special_tokens:
            return self.special_tokens[token]
        _, dec = self._bytes_alphabet()
        if not token or any(c not in dec for c in token):
            return self.unk_token_id
        return self._ranks.get(bytes(dec[c] for c in token), self.unk_token_id)

    @overload
    def convert_tokens_to_ids(self, tokens: str) -> int | None: ...

    @overload
    def convert_tokens_to_ids(self, tokens: list[str] | tuple[str, ...]) -> list[int | None]: ...

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> int | list[int | None] | None:
        if isinstance(tokens, str):
            return self._token_id(tokens)
        return [self._token_id(t) for t in tokens]

    def get_vocab(self) -> dict[str, int]:
        enc, _ = self._bytes_alphabet()
        vocab = {"".join(enc[b] for b in raw): i for raw, i in self._ranks.items()}
        vocab.update(self.special_tokens)
        return vocab

    def encode(
        self, text: str, add_special_tokens: bool = True, *, split_special_tokens: bool = False, **_: object
    ) -> list[int]:
        """Kimi's `encode`: special-token text becomes its id (unless `split_special_tokens`); no BOS is added."""
        if not isinstance(text, str):
            raise TypeError(f"text to encode must be a string, not {type(text).__name__}")
        out: list[int] = []
        for piece in split_for_encoding(text):
            if split_special_tokens:
                out.extend(self.model.encode(piece, disallowed_special=()))
            else:
                out.extend(self.model.encode(piece, allowed_special="all"))
        return out

    def encode_rendered(self, text: str) -> list[int]:
        """`encode(text)` of a rendered prompt, from the ids of its pieces between special tokens where they were
        encoded before (`core.segment_memo`: a conversation's next prompt repeats it).

        Exact by construction: tiktoken encodes the text between two special tokens on its own, and the pieces are
        cut within Kimi's chunks, as `encode` cuts them. Special tokens that begin with another (none of Kimi's)
        could match otherwise than tiktoken matches them: then the text is encoded whole."""
        from tokview.core.segment_memo import MIN_CHARS, SegmentMemo

        if len(text) < MIN_CHARS:  # the memo is built for the first long text, not at start-up's short renders
            return self.encode(text)
        if self._memo is False:
            names = list(self.special_tokens)
            unambiguous = not any(a != b and b.startswith(a) for a in names for b in names)
            self._memo = SegmentMemo(self.special_tokens, self._encode_pieces) if unambiguous else None
        if not isinstance(self._memo, SegmentMemo):
            return self.encode(text)
        out: list[int] = []
        for piece in split_for_encoding(text):
            out.extend(self._memo.encode(piece))
        return out

    def _encode_pieces(self, pieces: list[str]) -> list[list[int]]:
        return [self.model.encode_ordinary(p) for p in pieces]  # not `_batch`: it starts a thread pool every call

    def __call__(
        self, text: str, add_special_tokens: bool = True, split_special_tokens: bool = False, **kwargs: object
    ) -> dict[str, list[int]]:
        return {"input_ids": self.encode(text, add_special_tokens, split_special_tokens=split_special_tokens)}

    def decode(self, ids: int | Iterable[int], skip_special_tokens: bool = False, **_: object) -> str:
        ids = [ids] if isinstance(ids, int) else list(map(int, ids))
        n = self.model.n_vocab
        if ids and not (min(ids) >= 0 and max(ids) < n):  # the common case costs two C-level scans
            ids = [i for i in ids if 0 <= i < n]  # as fast tokenizers do: unknown ids add nothing
        if skip_special_tokens:
            skip = set(self.all_special_ids)
            if not skip.isdisjoint(ids):
                ids = [i for i in ids if i not in skip]
        return self.model.decode_bytes(ids).decode("utf-8", errors="replace")

    def apply_chat_template(
        self,
        conversation: list[dict[str, Any]],
        tools: object = None,
        tokenize: bool = False,
        add_generation_prompt: bool = True,
        **kwargs: object,
    ) -> str | list[int]:
        """Kimi's override: tools with their keys sorted, generation prompt on by default."""
        from tokview.core.chat_template import render_tokenizer_template

        text = render_tokenizer_template(
            self.chat_template,
            conversation,
            special_tokens=self.special_tokens_map,
            tools=_deep_sort(tools),
            add_generation_prompt=add_generation_prompt,
            options=kwargs,
        )
        return self.encode(text) if tokenize else text


def _deep_sort(value: object) -> object:
    """`value` with every object's keys sorted, at every depth (Kimi's template sees tools in that order)."""
    if isinstance(value, dict):
        return {k: _deep_sort(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_deep_sort(v) for v in value]
    return value
