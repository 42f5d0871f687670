"""Tokenizer adapter: load a tokenizer offline, render chat templates, and show ids as pieces.

Why an adapter: tokview needs a handful of operations (render a prompt with the same
chat_template_kwargs the server gets, decode, encode, and a display piece per id that is honest about
multi-byte characters split across tokens and about special tokens). Keeping them here means the
UI, the batch command and the simulator all see the same pieces.
"""

from __future__ import annotations

import codecs
import contextlib
import hashlib
import json
import logging
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future
from functools import lru_cache
from itertools import filterfalse
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, cast, overload

from tokview.errors import TokviewError, first_line

if TYPE_CHECKING:
    from tokview.core.tokenizer_folder import TokenizerFolder


class TokenizerError(TokviewError):
    """The tokenizer could not be loaded or used.

    `needs_remote_code`: the folder's tokenizer is defined by its own Python code, which only runs with
    `--trust-remote-code` (callers word their hint around it).
    """

    title = "tokenizer"

    def __init__(self, message: str, *, needs_remote_code: bool = False) -> None:
        super().__init__(message)
        self.needs_remote_code = needs_remote_code


# How a tokenizer was loaded, as doctor, show and export manifests report it.
LOADED_TOKENIZER_JSON = "tokenizer.json"
LOADED_NATIVE_TIKTOKEN = "native tiktoken"
LOADED_REMOTE_CODE = "remote code"
LOADED_TRANSFORMERS = "transformers"  # a transformers class built from other files (vocab.json, tokenizer.model)


class TokenizerLike(Protocol):
    """What `TokenizerAdapter` calls on the tokenizer it wraps: the slice of transformers' interface that
    tokview's native readers (`TokenizerJson`, `KimiTiktokenTokenizer`) implement. Attributes not every
    tokenizer has (`all_special_ids`, `added_tokens_decoder`, `chat_template`, …) are read with getattr."""

    def __len__(self) -> int: ...

    def get_vocab(self) -> dict[str, int]: ...

    def convert_tokens_to_ids(self, tokens: str) -> int | None: ...

    @overload
    def convert_ids_to_tokens(self, ids: int) -> str | None: ...

    @overload
    def convert_ids_to_tokens(self, ids: list[int]) -> list[str | None]: ...

    def encode(self, text: str, add_special_tokens: bool = ...) -> Sequence[int]: ...

    def __call__(
        self, text: str, *, add_special_tokens: bool, split_special_tokens: bool
    ) -> Mapping[str, Sequence[int]]: ...

    def decode(self, ids: list[int], *, skip_special_tokens: bool, clean_up_tokenization_spaces: bool = ...) -> str: ...

    def apply_chat_template(
        self, conversation: list[dict[str, Any]], *, tokenize: bool, add_generation_prompt: bool, **kwargs: object
    ) -> str | list[int]: ...


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


FINGERPRINTED = ("merges.txt", "tiktoken.model", "tokenizer.json", "tokenizer_config.json", "vocab.json")
_fingerprints: dict[tuple[str, tuple[tuple[int, ...] | None, ...]], Future[str]] = {}
_fingerprints_lock = threading.Lock()


def files_fingerprint(folder: str | os.PathLike[str]) -> str:
    """sha256 over a tokenizer folder's files (`TokenizerAdapter.fingerprint`), computed once a process while their
    status is unchanged, and shared by threads asking at once: `start_files_fingerprint` begins it on a thread of
    its own, since reading and hashing 16 MB (Qwen3's) leave the GIL to a batch's other start-up work."""
    from tokview.core.file_digest import file_status, settled

    statuses = [file_status(os.path.join(folder, name)) for name in FINGERPRINTED]
    key = (os.path.abspath(folder), tuple(statuses))
    with _fingerprints_lock:
        future = _fingerprints.get(key)
        mine = future is None
        if mine:
            future = _fingerprints[key] = Future()
    assert future is not None
    if mine:
        try:
            h = hashlib.sha256()
            for name, status in zip(FINGERPRINTED, statuses):
                if status is not None:
                    h.update(name.encode())
                    h.update(Path(folder, name).read_bytes())
            future.set_result(h.hexdigest()[:16])
            if not all(map(settled, statuses)):  # a file changed just now: computed again next time
                with _fingerprints_lock:
                    _fingerprints.pop(key, None)
        except BaseException as exc:
            with _fingerprints_lock:
                _fingerprints.pop(key, None)
            future.set_exception(exc)
    if not mine and future.exception() is not None:  # another thread's error (a file it could not read then)
        with _fingerprints_lock:
            if _fingerprints.get(key) is future:
                del _fingerprints[key]
        return files_fingerprint(folder)
    return future.result()


def start_files_fingerprint(folder: str | os.PathLike[str]) -> None:
    """Begin `files_fingerprint(folder)` on a daemon thread (errors are raised to whoever asks later)."""

    def compute() -> None:
        with contextlib.suppress(Exception):
            files_fingerprint(folder)

    threading.Thread(target=compute, name="tokview-fingerprint", daemon=True).start()


def load_tokenizer(
    path: str | os.PathLike[str], *, trust_remote_code: bool = False, sliced: bool = False
) -> TokenizerAdapter:
    """Load a tokenizer from a local directory, never from the hub; `loaded_by` on the result says how.

    In order: Kimi's tiktoken layout is read natively (no folder code runs, no transformers import); so is
    a generic fast tokenizer's tokenizer.json when transformers would load it unchanged (`tokenizer_json.py`);
    `trust_remote_code` (only ever passed when the user asked) runs the folder's own tokenizer class;
    otherwise transformers' AutoTokenizer, and when the config names a class the installed transformers
    does not know (transformers 5's `TokenizersBackend` on 4.x, or a newer name) the folder's
    `tokenizer.json` with the config's special tokens and chat template.

    `sliced`: a tokenizer.json read natively is answered from vocabulary slices until `load_whole()` asks for the
    whole one (`core.vocab_slices`): for a caller that may encode little and wants its first ids soon.
    """
    from tokview.core.tokenizer_folder import FolderError, TokenizerFolder

    try:
        folder = TokenizerFolder.open(os.fspath(path))
        if folder.is_kimi_tiktoken and not trust_remote_code:
            from tokview.core.kimi_tiktoken import KimiTiktokenTokenizer

            tok = KimiTiktokenTokenizer.from_folder(folder)
            return TokenizerAdapter(tok, source=folder.path, loaded_by=LOADED_NATIVE_TIKTOKEN)
        from tokview.core.tokenizer_json import TokenizerJson, plain_folder, read_natively

        native = TokenizerJson.from_folder(folder, sliced=sliced) if read_natively(folder, trust_remote_code) else None
        if native is not None:
            return TokenizerAdapter(native, source=folder.path, loaded_by=LOADED_TOKENIZER_JSON)  # no transformers
        if not plain_folder(folder, trust_remote_code):
            return _load_with_transformers(folder, trust_remote_code)
        return _load_model_class(folder, sliced)
    except FolderError as exc:
        raise TokenizerError(str(exc)) from None


def _load_model_class(folder: TokenizerFolder, sliced: bool = False) -> TokenizerAdapter:
    """A folder that names a model-specific class (Qwen3's `Qwen2Tokenizer`) and is otherwise plain: read natively
    once the installed transformers has been seen to build the same tokenizer from it, else loaded by transformers
    (and the two compared, the first time: `tokenizer_equivalence.py`)."""
    from tokview.core import tokenizer_equivalence as equivalence
    from tokview.core.tokenizer_json import TokenizerJson

    key = equivalence.verdict_key(folder)
    verdict = equivalence.known_verdict(key)
    if verdict and (native := TokenizerJson.from_folder(folder, sliced=sliced)) is not None:
        return TokenizerAdapter(native, source=folder.path, loaded_by=LOADED_TOKENIZER_JSON)  # no transformers
    reference = _load_with_transformers(folder, False)
    if verdict is None and key is not None and equivalence.can_remember():
        native = TokenizerJson.from_folder(folder)
        same = native is not None and equivalence.same_tokenizer(
            TokenizerAdapter(native, source=folder.path, loaded_by=LOADED_TOKENIZER_JSON), reference
        )
        if equivalence.verdict_key(folder) == key:  # else a file changed while they loaded: decided next time
            equivalence.remember_verdict(key, same)
    return reference


def _load_with_transformers(folder: TokenizerFolder, trust_remote_code: bool) -> TokenizerAdapter:
    directory = folder.path
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import transformers  # lazily: importing transformers costs ~1 s
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity(logging.ERROR)  # what set_verbosity_error() does (it is untyped)
    known = _class_known(folder.tokenizer_class)
    if folder.auto_map_class and not known and not trust_remote_code:
        raise TokenizerError(
            f"cannot load tokenizer from {directory}: its class {folder.tokenizer_class or folder.auto_map_class} "
            f"is defined by the folder's own code ({', '.join(folder.code_files) or folder.auto_map_class}); pass "
            f"--trust-remote-code to run it",
            needs_remote_code=True,
        )
    if not known and folder.tokenizer_class and folder.has("tokenizer.json") and not folder.auto_map_class:
        return _from_tokenizer_json(folder)
    try:
        tok = transformers.AutoTokenizer.from_pretrained(
            str(directory), trust_remote_code=trust_remote_code, local_files_only=True
        )
    except Exception as exc:  # transformers raises many kinds; all mean "cannot load"
        if folder.has("tokenizer.json") and not folder.auto_map_class:
            return _from_tokenizer_json(folder)  # e.g. no tokenizer_class and no config.json to infer one from
        hint = ""
        if folder.is_kimi_tiktoken:
            hint = " (tokview reads Kimi's tiktoken tokenizer natively: drop --trust-remote-code)"
        elif folder.code_files and not trust_remote_code:
            hint = " (this folder ships its own tokenizer code: pass --trust-remote-code)"
        raise TokenizerError(
            f"cannot load tokenizer from {directory}: {first_line(exc)}{hint}",
            needs_remote_code=bool(hint) and not trust_remote_code,
        ) from None
    if not isinstance(getattr(tok, "chat_template", None), (str, dict)):
        template = folder.chat_template()  # e.g. only chat_template.json, which tokenizers do not read
        if template:
            tok.chat_template = template
    if not type(tok).__module__.startswith("transformers."):
        loaded_by = LOADED_REMOTE_CODE
    elif getattr(tok, "is_fast", False) and folder.has("tokenizer.json"):
        loaded_by = LOADED_TOKENIZER_JSON
    else:
        loaded_by = LOADED_TRANSFORMERS
    return TokenizerAdapter(_as_tokenizer_like(tok), source=directory, loaded_by=loaded_by)


def _class_known(name: str | None) -> bool:
    """Whether AutoTokenizer can resolve this `tokenizer_class` (it tries the Fast variant first)."""
    if not name:
        return False
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

    candidates = (name, name + "Fast") if not name.endswith("Fast") else (name, name[:-4])
    for candidate in candidates:
        try:
            if tokenizer_class_from_name(candidate) is not None:
                return True
        except Exception:  # an optional backend missing (sentencepiece, …) raises instead of returning None
            continue
    return False


def _from_tokenizer_json(folder: TokenizerFolder) -> TokenizerAdapter:
    """A fast tokenizer over the folder's tokenizer.json, with the config's special tokens and template.

    What a class-agnostic reader does with a tokenizer_class this transformers does not know: the
    vocabulary, normalizer, pre-tokenizer, added tokens and post-processor all live in tokenizer.json;
    the config adds only the special-token roles, the length limit and the chat template.
    """
    from transformers import PreTrainedTokenizerFast

    kwargs: dict[str, Any] = {}
    for role in ("bos", "eos", "unk", "pad", "sep", "cls", "mask"):
        token = folder.token_content(f"{role}_token")
        if token is not None:
            kwargs[f"{role}_token"] = token
    extra = folder.extra_special_tokens()
    if extra:
        kwargs["additional_special_tokens"] = extra
    max_len = folder.config.get("model_max_length")
    if isinstance(max_len, int) and not isinstance(max_len, bool):
        kwargs["model_max_length"] = max_len
    try:
        tok = PreTrainedTokenizerFast(tokenizer_file=str(folder.path / "tokenizer.json"), **kwargs)  # type: ignore[no-untyped-call, unused-ignore]
    except Exception as exc:
        raise TokenizerError(f"cannot load {folder.path / 'tokenizer.json'}: {first_line(exc)}") from None
    tok.name_or_path = str(folder.path)
    template = folder.chat_template()
    if template:
        tok.chat_template = template
    return TokenizerAdapter(_as_tokenizer_like(tok), source=folder.path, loaded_by=LOADED_TOKENIZER_JSON)


def _as_tokenizer_like(tok: object) -> TokenizerLike:
    """A transformers tokenizer as the adapter sees it. Its declared types are wider than the calls the adapter
    makes (`decode` of one flat id list gives a str, `apply_chat_template(tokenize=False)` a str; the unions
    also cover batches, tensors and BatchEncodings), and they differ between transformers 4 and 5."""
    return cast(TokenizerLike, tok)


RenderKey: TypeAlias = tuple[bytes, str | None]
"""A render's inputs: the digest of the conversation and flags, and the template (see `_render_key`)."""


class RecentRenders:
    """The last `size` rendered prompts (text and ids), keyed by the conversation's JSON.

    A batch renders each conversation up to three times: to measure it against the server's context
    (`batch.limits`), to send its ids on the raw path, and to compare them with what the server saw
    (`prompt_render_mismatch`): ~0.3 ms of a sample's ~2 ms. The length check runs for a whole batch's
    first requests before their answers come back to be checked (a 300-prompt run re-rendered 285 prompts
    with 64 entries), so the cache holds up to 1,024 and its byte bound decides; a conversation's JSON
    names it exactly (a template
    that reads the clock renders once per sample instead of three times, which is only more
    consistent). Shared by the batch's threads: one lock, held for a dict operation.

    Entries are also bounded by their size (`max_bytes`, counted as a str's length and 36 bytes per id,
    what a Python list of ints costs): a few huge prompts must not stay for the next renders.
    """

    def __init__(self, size: int = 1024, max_bytes: int = 64 << 20) -> None:
        self.size = size
        self.max_bytes = max_bytes
        self._entries: dict[tuple[str, RenderKey], str | list[int]] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: tuple[str, RenderKey]) -> str | list[int] | None:
        with self._lock:
            return self._entries.get(key)

    def put(self, key: tuple[str, RenderKey], value: str | list[int]) -> None:
        cost = _cost(value)
        if cost > self.max_bytes:
            return  # rendered once more if asked again: cheaper than holding it
        with self._lock:
            old = self._entries.pop(key, None)
            self._bytes -= _cost(old) if old is not None else 0
            self._entries[key] = value
            self._bytes += cost
            while len(self._entries) > self.size or self._bytes > self.max_bytes:
                oldest = next(iter(self._entries))  # dicts keep insertion order
                self._bytes -= _cost(self._entries.pop(oldest))


def _cost(value: str | list[int]) -> int:
    """Roughly the memory a cached render holds: a str's length, 36 bytes per id of a list."""
    return len(value) * 36 if isinstance(value, list) else len(value)


def server_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as a server hands them to the template: assistant tool-call arguments sent as JSON text (the
    OpenAI wire form) parsed to the object they hold, empty ones `{}` (vLLM's chat_utils `_postprocess_messages`;
    SGLang does the same). GLM's template reads arguments only as a mapping, so a local render without this would
    drop them. Text that is not JSON stays text. The caller's messages are not changed."""
    out = []
    for message in messages:
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if not isinstance(calls, list) or message.get("role") != "assistant":
            out.append(message)
            continue
        out.append({**message, "tool_calls": [_parsed_call(c) for c in calls]})
    return out


def _is_harmony_template(template: str | None) -> bool:
    """A Harmony (gpt-oss) template. vLLM renders those conversations through openai-harmony, which writes a
    history call's arguments as the text the client sent, not the parsed object the Jinja path gets."""
    return template is not None and "<|channel|>" in template


def _parsed_call(call: object) -> object:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(call, dict) or not isinstance(function, dict):
        return call
    arguments = function.get("arguments")
    if not arguments:
        parsed: object = {}
    elif isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            return call
    else:
        return call
    return {**call, "function": {**function, "arguments": parsed}}


def _render_key(
    messages: list[dict[str, Any]],
    add_generation_prompt: bool,
    template_kwargs: Mapping[str, object] | None,
    template: str | None,
) -> RenderKey | None:
    """The render's inputs: a digest of the conversation and flags as JSON (a huge prompt is not kept a
    second time as its key), and the template itself (compared by value, hashed once per string); None
    when they are not plain JSON (then nothing is remembered).

    Keys stay in their order: a template's `tojson` writes a mapping as ordered (a tool's parameters
    listed `city, country` and `country, city` are two prompts), so sorted keys handed one of them the
    other's render."""
    try:
        inputs = json.dumps([messages, add_generation_prompt, template_kwargs])
    except (TypeError, ValueError):
        return None
    return hashlib.sha256(inputs.encode("utf-8", "surrogatepass")).digest(), template  # SHA-NI: twice blake2b's speed


def _continued(text: str, messages: list[dict[str, Any]]) -> str:
    """`text` cut right after the last message's content, as transformers' `continue_final_message` cuts a render
    (its text, else its last text part; stripped when the template stripped it)."""
    final = messages[-1].get("content") if messages else None
    if isinstance(final, list):
        texts = [p.get("text") for p in final if isinstance(p, dict) and isinstance(p.get("text"), str)]
        final = texts[-1] if texts else None
    if not isinstance(final, str):
        raise TokenizerError("continue_final_message: the last message has no text content to continue")
    for piece in (final, final.strip()):
        at = text.rfind(piece)
        if at >= 0:
            return text[: at + len(piece)]
    raise TokenizerError("continue_final_message: the template does not write the last message's content")


MAX_VOCAB_PADDING = 65_536
"""How far past the tokenizer's length a model's `vocab_size` is taken as padding; a larger one (a config from
another model in the folder) is not believed."""


def padded_vocab_size(folder: Path | None, tokenizer_size: int) -> int:
    """The `vocab_size` of the folder's `config.json` (a multimodal model's `text_config` one too) when it pads
    `tokenizer_size` by at most `MAX_VOCAB_PADDING`; 0 when there is none, it cannot be read, or it is not believed."""
    if folder is None:
        return 0
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return 0
    if not isinstance(config, dict):
        return 0
    for place in (config, config.get("text_config"), config.get("llm_config")):
        size = place.get("vocab_size") if isinstance(place, dict) else None
        if type(size) is int and tokenizer_size <= size <= tokenizer_size + MAX_VOCAB_PADDING:
            return size
    return 0


class TokenizerAdapter:
    """The few tokenizer operations tokview relies on, over a Hugging Face tokenizer or a native one."""

    def __init__(self, tok: TokenizerLike, source: Path | None = None, loaded_by: str = LOADED_TRANSFORMERS) -> None:
        self.tok = tok
        self.source = source
        self.loaded_by = loaded_by  # LOADED_TOKENIZER_JSON, LOADED_NATIVE_TIKTOKEN, LOADED_REMOTE_CODE, …
        self._bytes_cache: dict[int, bytes] = {}
        self._renders = RecentRenders()
        self._vocab_size: int | None = None
        self._model_vocab_size: int | None = None
        self._vocab_fingerprint: str | None = None
        self._fingerprint: str | None = None
        self.special_ids: frozenset[int] = frozenset(int(i) for i in getattr(tok, "all_special_ids", []))
        added = getattr(tok, "added_tokens_decoder", {}) or {}
        self.added_ids: frozenset[int] = frozenset(int(i) for i in added)
        self._control_ids = self.special_ids | frozenset(
            int(i) for i, t in added.items() if getattr(t, "special", False)
        )

    # -- what decides whether two loadings are one tokenizer (`tokenizer_equivalence`) ----------------
    def backend_json(self) -> str | None:
        """The wrapped Rust tokenizer's own serialization (its whole pipeline), when it wraps one."""
        backend = getattr(self.tok, "backend_tokenizer", None)
        return None if backend is None else str(backend.to_str())

    def encode_with_special_tokens(self, text: str) -> list[int]:
        """`encode` with the post-processor's additions (a BOS or an EOS some tokenizers add)."""
        return list(self.tok.encode(text, add_special_tokens=True))

    @property
    def cleans_up_spaces(self) -> bool:
        """Whether a decode drops the spaces before punctuation (transformers' `clean_up_tokenization_spaces`)."""
        return bool(getattr(self.tok, "clean_up_tokenization_spaces", False))

    @property
    def control_ids(self) -> frozenset[int]:
        """Special ids and special added tokens: what is never text."""
        return self._control_ids

    def described_tokens(self) -> tuple[tuple[int | None, ...], dict[int, tuple[str, bool]]]:
        """(the bos, eos, unk and pad ids; every added token's id → (text, special))."""
        roles = tuple(getattr(self.tok, f"{role}_token_id", None) for role in ("bos", "eos", "unk", "pad"))
        added = getattr(self.tok, "added_tokens_decoder", {}) or {}
        return roles, {int(i): (str(t.content), bool(t.special)) for i, t in added.items()}

    # -- identity -------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return str(self.source) if self.source else str(getattr(self.tok, "name_or_path", "tokenizer"))

    @property
    def chat_template(self) -> str | None:
        tpl = getattr(self.tok, "chat_template", None)
        if isinstance(tpl, dict):  # named templates (a config's list): transformers renders "default"
            tpl = tpl.get("default")
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

    @property
    def model_vocab_size(self) -> int:
        """The model's own vocabulary (its `config.json` `vocab_size`), when the folder has one and pads the
        tokenizer's (Qwen3: 151,936 rows for 151,669 tokens; DeepSeek-V3 129,280 for 128,815): a server's top-K
        alternatives range over the model's logits, padding rows included. Else the tokenizer's length."""
        if self._model_vocab_size is None:
            self._model_vocab_size = max(self.vocab_size, padded_vocab_size(self.source, self.vocab_size))
        return self._model_vocab_size

    def load_whole(self) -> None:
        """Load the whole tokenizer in the background if it was loaded as vocabulary slices (`load_tokenizer(sliced=
        True)`), for work that will encode a lot; nothing otherwise."""
        load = getattr(self.tok, "load_whole", None)
        if load is not None:
            load()

    def fingerprint(self) -> str:
        """sha256 over the tokenizer's files (what the manifest records), as they were when first asked: a run
        asks twice (its identity and its run record) and the files are 16 MB for Qwen3."""
        if self._fingerprint is None:
            self._fingerprint = self._files_fingerprint()
        return self._fingerprint

    def _files_fingerprint(self) -> str:
        if self.source is not None:
            return files_fingerprint(self.source)
        return hashlib.sha256(str(self.vocab_size).encode()).hexdigest()[:16]

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

    def special_fingerprint(self) -> str:
        """sha256 over the sorted ids `is_special` holds: what `skip_special_tokens`, decoding and the
        reasoning split treat as control tokens.

        Two folders can share the id → token table (so `vocab_fingerprint` and every sample id) and differ
        only in whether `</think>` is special. Kept apart from `vocab_fingerprint` so that stored sample ids
        stay as they are; runs record it and merge and resume compare it (`batch.identity`).
        """
        return hashlib.sha256(",".join(map(str, sorted(self._control_ids))).encode()).hexdigest()[:16]

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
        ids = self.tok.encode(text, add_special_tokens=False)
        return ids if type(ids) is list else list(ids)  # a fresh list already: no second copy of a long prompt

    def encode_prompt(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Ids for a raw text prompt as a server's `/tokenize` or completions endpoint makes them: with the
        tokenizer's own added ids (a BOS) unless told not to, and special-token strings as their ids."""
        return list(self.tok.encode(text, add_special_tokens=add_special_tokens))

    def encode_literal(self, text: str) -> list[int]:
        """Ids for text as typed: "<think>" in the text becomes ordinary ids, never the special id.

        What a dataset's text field means (someone wrote it), unlike a rendered prompt where the template's
        markers stand for their ids."""
        if not text:
            return []
        try:
            return list(self.tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])
        except TypeError:  # a tokenizer without split_special_tokens: fall back to plain encoding
            return self.encode(text)

    def has_id(self, token_id: int) -> bool:
        """Whether the vocabulary names this id (special and added ones included)."""
        if token_id < 0:
            return False
        try:
            return self.tok.convert_ids_to_tokens(token_id) is not None
        except (OverflowError, IndexError, KeyError, ValueError, TypeError):
            return False

    def vocab_tokens(self) -> list[str]:
        """Every token string of the vocabulary (special and added ones included)."""
        return [str(t) for t in self.tok.get_vocab()]

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False)

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        template_kwargs: dict[str, Any] | None = None,
        continue_final_message: bool = False,
    ) -> list[int]:
        """Prompt ids exactly as the server's template would make them. `continue_final_message`: the last message
        is the assistant's start, which the answer goes on from (vLLM's and transformers' flag of that name)."""
        if continue_final_message:
            text = self.render_text(messages, add_generation_prompt=False, template_kwargs=template_kwargs)
            return list(self._encode_rendered(_continued(text, messages)))
        return list(self._rendered_ids(messages, add_generation_prompt, template_kwargs))

    def render_length(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        template_kwargs: dict[str, Any] | None = None,
    ) -> int:
        """How many ids `render` gives, without a copy of them (the ids are kept for the raw path's render)."""
        return len(self._rendered_ids(messages, add_generation_prompt, template_kwargs))

    def _rendered_ids(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool, template_kwargs: dict[str, Any] | None
    ) -> list[int]:
        """The ids of a render, from the recent renders when there (never to be changed by the caller)."""
        key = _render_key(messages, add_generation_prompt, template_kwargs, self.chat_template)
        ids = self._renders.get(("ids", key)) if key is not None else None
        if not isinstance(ids, list):  # not remembered ("ids" entries are always lists)
            ids = self._encode_rendered(self._render_text(messages, add_generation_prompt, template_kwargs, key))
            if key is not None:
                self._renders.put(("ids", key), ids)
        return ids

    def _encode_rendered(self, text: str) -> list[int]:
        """The ids of a rendered prompt: by pieces where the tokenizer remembers a conversation's earlier messages."""
        by_pieces = getattr(self.tok, "encode_rendered", None)
        return by_pieces(text) if by_pieces is not None else self.encode(text)

    def render_text(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The prompt text the template makes; the last few renders are remembered (see `RecentRenders`)."""
        key = _render_key(messages, add_generation_prompt, template_kwargs, self.chat_template)
        return self._render_text(messages, add_generation_prompt, template_kwargs, key)

    def _render_text(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool,
        template_kwargs: dict[str, Any] | None,
        key: RenderKey | None,
    ) -> str:
        if not self.chat_template:
            raise TokenizerError(f"tokenizer {self.name} has no chat template")
        remembered = self._renders.get(("text", key)) if key is not None else None
        if isinstance(remembered, str):  # "text" entries are always strings
            return remembered
        try:
            text = self.tok.apply_chat_template(
                messages if _is_harmony_template(self.chat_template) else server_messages(messages),
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                **(template_kwargs or {}),
            )
        except Exception as exc:  # jinja errors
            raise TokenizerError(f"chat template failed: {exc}") from None
        if not isinstance(text, str):  # tokenize=False gives text: ids here mean a tokenizer that ignores it
            raise TokenizerError(f"chat template gave {type(text).__name__}, not text")
        if key is not None:
            self._renders.put(("text", key), text)
        return text

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

    def pieces_bytes(self, ids: Sequence[int]) -> list[bytes]:
        """`piece_bytes` of every id; ids seen before cost a dict lookup in C (alignment reads every output id).

        The ids not seen yet are found in C too and looked up once each: a long prompt with a few new ids (an
        agent's next turn, checked by `literal_think_text`) went through `piece_bytes` id by id, 8.9 ms for 40,000
        ids against 2.8 ms now."""
        cache = self._bytes_cache
        try:
            return list(map(cache.__getitem__, ids))
        except KeyError:
            pass
        for token_id in set(filterfalse(cache.__contains__, ids)):
            self.piece_bytes(token_id)
        try:
            return list(map(cache.__getitem__, ids))
        except KeyError:  # an id kept under another key (an int subclass, a float): one by one, as before
            return [self.piece_bytes(t) for t in ids]

    def special_flags(self, ids: Sequence[int]) -> list[bool]:
        """`is_special` of every id, in one pass."""
        return list(map(self._control_ids.__contains__, ids))

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
