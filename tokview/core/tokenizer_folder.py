"""What a model folder holds for its tokenizer, read with the standard library only.

Why a separate step before transformers: deciding *how* to load (Kimi's tiktoken natively, a
`tokenizer.json` whose class this transformers does not know, or the folder's own code) needs only the
config and the file names, and a folder that cannot load at all (missing, a file, empty, broken JSON)
deserves one line saying why, not whatever transformers happens to raise (`'NoneType' object has no
attribute 'endswith'` for an empty folder). Nothing here imports transformers or runs folder code.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from tokview.errors import TokviewError

# Files that carry a vocabulary: a folder with none of them has no tokenizer to load.
VOCAB_FILES = (
    "tokenizer.json",
    "tiktoken.model",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "vocab.json",
    "vocab.txt",
    "qwen.tiktoken",
)
# Kimi's code class, as `auto_map` names it; tokview reads its tiktoken.model itself (kimi_tiktoken.py).
KIMI_TIKTOKEN_CLASS = "tokenization_kimi.TikTokenTokenizer"


@lru_cache(maxsize=1)
def byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible byte → character map, the alphabet byte-level vocabularies spell tokens in.

    Here (stdlib only) so the native readers need not import the transformers-facing adapter for it."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    out, extra = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


@lru_cache(maxsize=1)
def byte_of_character() -> dict[str, int]:
    """The inverse of `byte_alphabet`."""
    return {c: b for b, c in byte_alphabet().items()}


class FolderError(TokviewError):
    """The folder cannot hold a tokenizer (missing, a file, no vocabulary, unreadable config)."""

    title = "tokenizer folder"


def existing_folder(path: str | os.PathLike[str]) -> Path:
    """`path` as a folder; FolderError, one line, when nothing is there or it is a file (`sim` and `ui` check before
    loading anything, and said "not found" of a file that was there)."""
    directory = Path(path).expanduser()
    if not directory.exists():
        raise FolderError(f"tokenizer directory not found: {directory}")
    if not directory.is_dir():
        raise FolderError(
            f"tokenizer path {directory} is a file, not a folder: pass the model folder that "
            f"holds it (--tokenizer {directory.absolute().parent})"
        )
    return directory


@dataclass(frozen=True)
class TokenizerFolder:
    path: Path
    config: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> TokenizerFolder:
        directory = existing_folder(path)
        folder = cls(directory.absolute(), _read_config(directory))  # recorded in runs: valid from any folder
        if not any((directory / name).is_file() for name in VOCAB_FILES) and not any(directory.glob("*.tiktoken")):
            raise FolderError(
                f"no tokenizer files in {directory} (looked for tokenizer.json, tiktoken.model, "
                f"tokenizer.model, vocab.json){_subfolder_hint(directory)}"
            )
        return folder

    def has(self, name: str) -> bool:
        return (self.path / name).is_file()

    @property
    def has_named_templates(self) -> bool:
        """Templates besides the default one (a config's list naming `tool_use`, an `additional_chat_templates`
        folder): transformers and the servers render a request with tools by the one named `tool_use`, and the
        native reading knows only the default, so such a folder is loaded by transformers."""
        values = [self.config.get("chat_template")]
        if self.has("chat_template.json"):
            try:
                data = json.loads((self.path / "chat_template.json").read_text(encoding="utf-8"))
            except (OSError, ValueError):
                data = None
            values.append(data.get("chat_template") if isinstance(data, dict) else None)
        for value in values:
            if isinstance(value, list) and any(isinstance(t, dict) and t.get("name") != "default" for t in value):
                return True
        extra = self.path / "additional_chat_templates"
        try:
            return extra.is_dir() and any(e.is_file() for e in extra.iterdir())
        except OSError:  # unreadable: transformers could not read it either
            return False

    @property
    def tokenizer_class(self) -> str | None:
        name = self.config.get("tokenizer_class")
        return name if isinstance(name, str) and name else None

    @property
    def auto_map_class(self) -> str | None:
        """The code class `auto_map` names for AutoTokenizer (slow one first, as transformers lists it)."""
        entry = (
            (self.config.get("auto_map") or {}).get("AutoTokenizer")
            if isinstance(self.config.get("auto_map"), dict)
            else None
        )
        if isinstance(entry, str):
            return entry
        if isinstance(entry, (list, tuple)):
            return next((e for e in entry if isinstance(e, str) and e), None)
        return None

    @property
    def is_kimi_tiktoken(self) -> bool:
        """Kimi's layout: tiktoken.model plus `auto_map` → tokenization_kimi.TikTokenTokenizer."""
        named = (self.auto_map_class or "").rsplit("--", 1)[-1]  # "repo--module.Class" for hub references
        return self.has("tiktoken.model") and named == KIMI_TIKTOKEN_CLASS

    @property
    def code_files(self) -> list[str]:
        return sorted(p.name for p in self.path.glob("tokenization_*.py"))

    def token_content(self, key: str) -> str | None:
        """A special token the config names (`"eos_token": "<|im_end|>"` or `{"content": …}`)."""
        return token_text(self.config.get(key))

    def extra_special_tokens(self) -> list[str]:
        """`additional_special_tokens` (transformers 4) and `extra_special_tokens` (transformers 5), in order."""
        out: list[str] = []
        for key in ("additional_special_tokens", "extra_special_tokens"):
            value = self.config.get(key)
            items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
            for item in items:
                text = token_text(item)
                if text and text not in out:
                    out.append(text)
        return out

    def chat_template(self) -> str | None:
        """The folder's chat template, where servers look for one.

        `chat_template.jinja` (what transformers saves and prefers), else the config's `chat_template`
        (a string, or a list of named templates: the one named "default"), else `chat_template.json`
        (`{"chat_template": …}`, as processors save it).
        """
        jinja = self.path / "chat_template.jinja"
        if jinja.is_file():
            try:
                return jinja.read_text(encoding="utf-8")
            except UnicodeDecodeError as exc:
                raise FolderError(f"chat_template.jinja in {self.path} is not UTF-8 text: {exc.reason}") from None
            except OSError as exc:
                raise FolderError(f"cannot read chat_template.jinja in {self.path}: {exc.strerror or exc}") from None
        found = _template_value(self.config.get("chat_template"))
        if found is None and self.has("chat_template.json"):
            try:
                data = json.loads((self.path / "chat_template.json").read_text(encoding="utf-8"))
            except ValueError as exc:
                raise FolderError(f"chat_template.json in {self.path} is not valid JSON: {exc}") from None
            found = _template_value(data.get("chat_template") if isinstance(data, dict) else None)
        return found


def token_text(value: object) -> str | None:
    if isinstance(value, str):
        return value or None
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"] or None
    return None


def _template_value(value: object) -> str | None:
    if isinstance(value, str):
        return value or None
    if isinstance(value, list):  # [{"name": "default", "template": …}, {"name": "tool_use", …}]
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        chosen = named.get("default")
        return chosen if isinstance(chosen, str) and chosen else None
    return None


def _read_config(directory: Path) -> dict[str, Any]:
    path = directory / "tokenizer_config.json"
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise FolderError(f"{path} is not UTF-8 text") from None
    except ValueError as exc:
        raise FolderError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise FolderError(f"{path} holds {type(data).__name__}, not a JSON object")
    return data


def _subfolder_hint(directory: Path) -> str:
    """Name sub-folders that do hold a tokenizer: the usual slip is pointing one level too high."""
    try:
        subs = sorted(p.name for p in directory.iterdir() if p.is_dir() and any((p / n).is_file() for n in VOCAB_FILES))
    except OSError:
        return ""
    if not subs:
        return ": pass the model folder that holds them"
    shown = ", ".join(str(directory / s) for s in subs[:3])
    return f": did you mean {shown}{' …' if len(subs) > 3 else ''}?"
