"""A model-specific tokenizer class read from tokenizer.json, once transformers has shown it changes nothing.

Why: Qwen3's folder names `Qwen2Tokenizer`, so `read_natively` sent it to transformers on every load: importing
transformers and building the tokenizer took ~1 s of every `tokview batch`, `show`, `export` and app start
(the native reading takes ~0.2 s). A model-specific class may rebuild parts of the tokenizer in code
(transformers 5's `Qwen2Tokenizer` rebuilds its normalizer, pre-tokenizer and decoder from the vocabulary and
merges; 4.x's `Qwen2TokenizerFast` loads the file), so whether the native reading gives the same tokenizer depends
on the class *and* on the installed transformers. No table of classes can know that; the installed transformers
can. When it loads a folder that qualifies for the native reading in every respect but its class, the tokenizer
it built is compared with the native reading (`same_tokenizer`): the Rust pipeline component by component
(settings that only move character offsets aside), the special-token roles and ids, the added tokens, the length
limit, the template, and encodes and decodes of probe texts. The verdict is kept in the tokview cache under a
hash of the folder's tokenizer files and the transformers, tokenizers and tokview versions (`verdict_key`). From
then on that folder is read natively when the verdict was "same"; an edited file or another transformers
version is decided afresh, and a verdict of "differs" is kept too, so the comparison is paid once.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from tokview.core.file_digest import file_digest
from tokview.core.json_cache import cache_path, cache_writable, read_json_cache, write_json_cache

if TYPE_CHECKING:
    from tokview.core.tokenizer import TokenizerAdapter
    from tokview.core.tokenizer_folder import TokenizerFolder

VERDICT_SUFFIXES = (".json", ".jinja", ".model", ".txt", ".tiktoken", ".py")
"""Files of a folder transformers may read while it builds the tokenizer (configs, vocabularies, templates)."""
TEMPLATE_SUBFOLDER = "additional_chat_templates"
PROBE_TEXTS = (
    "Okay, let me think about this carefully.",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nThe answer is 42.<|im_end|>",
    "<|endoftext|><|im_user|>user<|im_middle|>hi<|im_end|><think></think>[BOS] [EOS] [PAD]",
    "中文 and émoji 👍 1234567 ﬁ Ångström Ω ① ｶﾀｶﾅ",
    "   spaces\n\n\ttabs \r\n  trailing   ",
    "Hello , world . It 's a test ! Isn 't it ? do n't",
    "def f(x):\n    return x ** 2  # it's\n",
    "",
)
"""Texts whose ids and decodes must agree: special and added tokens, Unicode a normalizer changes, whitespace runs a
pre-tokenizer splits, and the spaces a decode-time clean-up would remove."""


def cache_file() -> Path | None:
    return cache_path("native-tokenizers.json")


def verdict_key(folder: TokenizerFolder) -> str | None:
    """A hash of what decides the verdict: the folder's tokenizer files and the library versions. None when a
    file cannot be read or transformers is not installed (then transformers loads the folder, as before)."""
    import tokenizers

    from tokview import __version__

    transformers = _transformers_version()
    if transformers is None:
        return None
    h = hashlib.sha256()
    try:
        h.update(f"{__version__}\0{transformers}\0{tokenizers.__version__}\0{_comparison_source()}\0".encode())
        files = [e for e in os.scandir(folder.path) if e.name.endswith(VERDICT_SUFFIXES) and e.is_file()]
        subfolder = folder.path / TEMPLATE_SUBFOLDER
        if subfolder.is_dir():
            files += [e for e in os.scandir(subfolder) if e.is_file()]
        for entry in sorted(files, key=lambda e: e.path):
            h.update(f"\0{os.path.relpath(entry.path, folder.path)}\0".encode())
            h.update(file_digest(entry.path))  # remembered: the run identity and slice cache hash them too
    except OSError:
        return None
    return h.hexdigest()[:32]


_source_hash: list[str] = []
COMPARED_SOURCES = (
    "tokenizer.py",
    "tokenizer_json.py",
    "tokenizer_folder.py",
    "chat_template.py",
    "tokenizer_equivalence.py",
)


def _comparison_source() -> str:
    """A hash of the source of the modules that make the native reading and this comparison: tokview's version
    string is not bumped by every commit, and a fix to `TokenizerJson` (or a stricter comparison) must decide
    afresh a folder a verdict was kept for. Read once a process (~0.2 ms); a module without its source (a
    frozen install) counts by name only."""
    if not _source_hash:
        h = hashlib.sha256()
        for name in COMPARED_SOURCES:  # read as files beside this one: importing them here would make a cycle
            h.update(name.encode())
            try:
                h.update((Path(__file__).parent / name).read_bytes())
            except OSError:
                pass
        _source_hash.append(h.hexdigest()[:16])
    return _source_hash[0]


def _transformers_version() -> str | None:
    """The installed transformers' version, without importing it: the name of the `dist-info` folder beside the
    package (~1 ms), else `importlib.metadata` (~20 ms: its import and a scan of every path entry), else None."""
    import importlib.util

    spec = importlib.util.find_spec("transformers")
    if spec is None or spec.origin is None:
        return None
    found = sorted(Path(spec.origin).parent.parent.glob("transformers-*.dist-info"))
    if len(found) == 1:
        return found[0].name.removeprefix("transformers-").removesuffix(".dist-info")
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("transformers")
    except PackageNotFoundError:
        return None


def known_verdict(key: str | None) -> bool | None:
    """True: read natively; False: transformers builds something else; None: not decided yet."""
    if key is None:
        return None
    verdict = read_json_cache(cache_file()).get(key)
    return verdict if isinstance(verdict, bool) else None


def can_remember() -> bool:
    """Whether a verdict can be kept: without a writable cache the comparison would be paid on every load, so
    the folder is then loaded by transformers alone, as before the comparison existed."""
    return cache_writable(cache_file())


def remember_verdict(key: str | None, same: bool) -> None:
    if key is None:
        return
    known = read_json_cache(cache_file())
    if known.get(key) is not same:
        write_json_cache(cache_file(), {**known, key: same})  # a read-only home: decided again next time


def same_tokenizer(native: TokenizerAdapter, reference: TokenizerAdapter) -> bool:
    """Whether tokview sees no difference between the native reading and what transformers built: the same
    pipeline, special and added tokens, length limit, template, ids and texts."""
    if reference.cleans_up_spaces or native.cleans_up_spaces:
        return False
    try:
        built, read = reference.backend_json(), native.backend_json()
        if built is None or read is None or _pipeline(built) != _pipeline(read):
            return False
        if _attributes(native) != _attributes(reference):
            return False
        ids: list[int] = sorted(reference.special_ids | reference.added_ids)
        for text in PROBE_TEXTS:
            encoded = reference.encode(text)
            if native.encode(text) != encoded:
                return False
            if native.encode_with_special_tokens(text) != reference.encode_with_special_tokens(text):
                return False  # a post-processor that adds a BOS or an EOS
            ids += encoded
        return all(
            native.decode(ids, skip_special_tokens=skip) == reference.decode(ids, skip_special_tokens=skip)
            for skip in (False, True)
        )
    except Exception:  # any comparison that cannot be made is a difference: transformers keeps loading it
        return False


def _attributes(tok: TokenizerAdapter) -> tuple[Any, ...]:
    return (
        tok.vocab_size,
        tok.special_ids,
        tok.added_ids,
        tok.control_ids,
        tok.model_max_length,
        tok.chat_template,
        tok.described_tokens(),
    )


def _pipeline(serialized: str) -> Any:
    """A tokenizer's JSON without the settings that only move character offsets (ids and texts never change):
    `trim_offsets` anywhere, and a byte-level decoder's flags (its decode maps characters back to bytes, whatever
    they say). The model (vocabulary and merges: most of the JSON) is compared as it is."""
    data = orjson.loads(serialized)

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k != "trim_offsets"}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    decoder = data.get("decoder")
    if isinstance(decoder, dict) and decoder.get("type") == "ByteLevel":
        data["decoder"] = {"type": "ByteLevel"}
    return {k: (v if k == "model" else strip(v)) for k, v in data.items()}
