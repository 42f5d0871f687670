"""Tokenizer adapter: load a tokenizer offline, render chat templates, and show ids as pieces.

Why an adapter: tokview needs a handful of operations (render a prompt with the same
chat_template_kwargs the server gets, decode, encode, and a display piece per id that is honest about
multi-byte characters split across tokens and about special tokens). Keeping them here means the
UI, the batch command and the simulator all see the same pieces.
"""

from __future__ import annotations

import codecs
import hashlib
import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Sequence


class TokenizerError(ValueError):
    """The tokenizer could not be loaded or used."""


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte → printable-character map (what byte-level BPE vocabularies spell)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    return {c: b for b, c in bytes_to_unicode().items()}


def load_tokenizer(path: str | os.PathLike[str], *, trust_remote_code: bool = False) -> "TokenizerAdapter":
    """Load a tokenizer from a local directory, never from the hub.

    `trust_remote_code` runs the model folder's own tokenizer code (Kimi's `tokenization_kimi.py`
    needs it); it is only ever passed when the user asked for it.
    """
    directory = Path(path).expanduser()
    if not directory.is_dir():
        raise TokenizerError(f"tokenizer directory not found: {directory}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import transformers  # lazily: importing transformers costs ~1 s
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    needs_code = any(directory.glob("tokenization_*.py"))
    try:
        tok = transformers.AutoTokenizer.from_pretrained(
            str(directory), trust_remote_code=trust_remote_code, local_files_only=True
        )
    except Exception as exc:  # transformers raises many kinds; all mean "cannot load"
        hint = ""
        if needs_code and not trust_remote_code:
            hint = " (this folder ships its own tokenizer code, e.g. Kimi's tokenization_kimi.py: pass --trust-remote-code)"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TokenizerError(f"cannot load tokenizer from {directory}: {first}{hint}") from None
    return TokenizerAdapter(tok, source=directory.absolute())  # recorded in runs: valid from any folder


class TokenizerAdapter:
    """The few tokenizer operations tokview relies on, over a Hugging Face tokenizer."""

    def __init__(self, tok: Any, source: Path | None = None) -> None:
        self.tok = tok
        self.source = source
        self._bytes_cache: dict[int, bytes] = {}
        self._vocab_size: int | None = None
        self._vocab_fingerprint: str | None = None
        self.special_ids: frozenset[int] = frozenset(int(i) for i in getattr(tok, "all_special_ids", []))
        added = getattr(tok, "added_tokens_decoder", {}) or {}
        self.added_ids: frozenset[int] = frozenset(int(i) for i in added)
        self._control_ids = self.special_ids | frozenset(
            int(i) for i, t in added.items() if getattr(t, "special", False)
        )

    # -- identity -------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return str(self.source or getattr(self.tok, "name_or_path", "tokenizer"))

    @property
    def chat_template(self) -> str | None:
        tpl = getattr(self.tok, "chat_template", None)
        return tpl if isinstance(tpl, str) else None

    @property
    def eos_token_id(self) -> int | None:
        return getattr(self.tok, "eos_token_id", None)

    @property
    def model_max_length(self) -> int | None:
        n = getattr(self.tok, "model_max_length", None)
        return int(n) if isinstance(n, int) and n < 10**9 else None

    @property
    def vocab_size(self) -> int:
        """Cached: `len()` of a fast tokenizer recounts the vocabulary (~60 ms for Kimi's 163,840)."""
        if self._vocab_size is None:
            self._vocab_size = len(self.tok)
        return self._vocab_size

    def fingerprint(self) -> str:
        """sha256 over the tokenizer's files (what the manifest records)."""
        h = hashlib.sha256()
        if self.source is not None:
            for name in sorted(("tokenizer.json", "tokenizer_config.json", "tiktoken.model", "vocab.json", "merges.txt")):
                f = self.source / name
                if f.is_file():
                    h.update(name.encode())
                    h.update(f.read_bytes())
        else:
            h.update(str(self.vocab_size).encode())
        return h.hexdigest()[:16]

    def vocab_fingerprint(self) -> str:
        """sha256 over the id → token table only: what decides which ids mean what.

        Unlike `fingerprint()`, editing tokenizer_config.json, re-saving the files or rebuilding a cached
        tokenizer leaves it unchanged, so sample ids built from it survive those and resumes still resume.
        """
        if self._vocab_fingerprint is None:
            table = sorted((i, t) for t, i in self.tok.get_vocab().items())
            h = hashlib.sha256()
            for i, t in table:
                h.update(f"{i}\t{t}\n".encode("utf-8", "surrogatepass"))
            self._vocab_fingerprint = h.hexdigest()[:16]
        return self._vocab_fingerprint

    def template_hash(self) -> str | None:
        tpl = self.chat_template
        return hashlib.sha256(tpl.encode()).hexdigest()[:16] if tpl else None

    # -- ids and text -----------------------------------------------------------------------
    def token_to_id(self, token: str) -> int | None:
        tid = self.tok.convert_tokens_to_ids(token)
        unk = getattr(self.tok, "unk_token_id", None)
        if tid is None or (tid == unk and token != getattr(self.tok, "unk_token", None)):
            return None
        return int(tid)

    def is_special(self, token_id: int) -> bool:
        return token_id in self._control_ids

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=skip_special_tokens,
                               clean_up_tokenization_spaces=False)

    def render(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
               template_kwargs: dict[str, Any] | None = None) -> list[int]:
        """Prompt ids exactly as the server's template would make them."""
        text = self.render_text(messages, add_generation_prompt=add_generation_prompt,
                                template_kwargs=template_kwargs)
        return self.encode(text)

    def render_text(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
                    template_kwargs: dict[str, Any] | None = None) -> str:
        if not self.chat_template:
            raise TokenizerError(f"tokenizer {self.name} has no chat template")
        try:
            return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                                **(template_kwargs or {}))
        except Exception as exc:  # jinja errors
            raise TokenizerError(f"chat template failed: {exc}") from None

    # -- display pieces ----------------------------------------------------------------------
    def piece_bytes(self, token_id: int) -> bytes:
        """The bytes one id stands for (special tokens: their own string)."""
        cached = self._bytes_cache.get(token_id)
        if cached is not None:
            return cached
        token = self.tok.convert_ids_to_tokens(int(token_id))
        if token is None:
            raw = f"<id {token_id}>".encode()
        elif token_id in self.added_ids or token_id in self.special_ids:
            raw = token.encode("utf-8")
        else:
            decoder = _byte_decoder()
            if all(ch in decoder for ch in token):
                raw = bytes(decoder[ch] for ch in token)
            elif token.startswith("<0x") and token.endswith(">") and len(token) == 6:
                raw = bytes([int(token[3:5], 16)])  # sentencepiece byte fallback
            else:
                raw = self.tok.decode([int(token_id)], skip_special_tokens=False).encode("utf-8")
                if not raw:
                    raw = token.replace("▁", " ").encode("utf-8")
        self._bytes_cache[token_id] = raw
        return raw

    def piece_text(self, token_id: int) -> str:
        return self.piece_bytes(token_id).decode("utf-8", errors="replace")

    def pieces(self, ids: Iterable[int]) -> list[str]:
        """One display string per id, correct for characters split across tokens.

        Bytes go through one incremental UTF-8 decoder; a character is shown on the token that
        completes it, and a token that completes none shows its bytes as `‹e4›`. Special tokens show
        as themselves. Only the ids asked for are looked up, never the whole vocabulary.
        """
        out: list[str] = []
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        for tid in ids:
            if self.is_special(tid):
                decoder.reset()
                out.append(self.piece_text(tid))
                continue
            raw = self.piece_bytes(tid)
            text = decoder.decode(raw)
            if text:
                out.append(text)
            else:
                out.append("‹" + " ".join(f"{b:02x}" for b in raw) + "›")
        return out
