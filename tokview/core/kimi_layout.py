"""A tiny, offline stand-in for the Kimi-K2.5 tokenizer (spec: docs real-servers.md §3.3-§3.4).

tokview must be testable without the Hugging Face hub and without the real 160k-entry Kimi
tokenizer, yet its tests need Kimi's *exact* special-token ids and strings, a Kimi-style chat
template whose generation prompt ends with ``<think>``, and a vocabulary of exactly 163840 so
ids that a real server emits are always in range.  This module builds such a tokenizer
deterministically from nothing but ``tokenizers`` + ``transformers`` in a couple of seconds, and the same
vocabulary in the layout of Kimi's real tiktoken folder (``build_kimi_tiktoken_dir``).

Only light imports happen at module level (the standard library, tokview's tiktoken reader): the heavy libraries are imported inside
the builder so importing tokview stays cheap.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import string
import tempfile
import threading
from pathlib import Path

from tokview.core.json_cache import build_folder, cache_folder
from tokview.core.kimi_tiktoken import DEFAULT_ADDITIONAL_SPECIAL

VOCAB_SIZE = 163840
SPECIAL_START = 163584  # first id of the Kimi special range; 163583 is the last ordinary id
LAYOUT_MARKER = "tokview_layout.json"
LAYOUT_VERSION = 4  # 2: added_tokens_decoder written explicitly (transformers 4 and 5 agree); 3, 4: tool rules

KIMI_SPECIAL_TOKENS: dict[int, str] = {
    163584: "[BOS]",
    163585: "[EOS]",
    163586: "<|im_end|>",
    163587: "<|im_user|>",
    163588: "<|im_assistant|>",
    163590: "<|start_header_id|>",
    163591: "<|end_header_id|>",
    163593: "[EOT]",
    163594: "<|im_system|>",
    163595: "<|tool_calls_section_begin|>",
    163596: "<|tool_calls_section_end|>",
    163597: "<|tool_call_begin|>",
    163598: "<|tool_call_argument_begin|>",
    163599: "<|tool_call_end|>",
    163601: "<|im_middle|>",
    163606: "<think>",
    163607: "</think>",
    163838: "[UNK]",
    163839: "[PAD]",
}
KIMI_ID: dict[str, int] = {text: token_id for token_id, text in KIMI_SPECIAL_TOKENS.items()}
"""The same table by text: `KIMI_ID["<think>"] == 163606` (profiles and the doctor name ids this way)."""

# The word list of §3.3, in order.  Its ids (256-379) are what the crafted model's "chain" emits.
WORDS = [
    "Okay",
    ",",
    "let",
    "me",
    "think",
    "about",
    "this",
    "carefully",
    ".",
    "The",
    "answer",
    "is",
    "forty",
    "-",
    "two",
    "!",
    "hello",
    "world",
    "Hello",
    "what",
    "how",
    "why",
    "yes",
    "no",
    "a",
    "an",
    "of",
    "to",
    "in",
    "and",
    "or",
    "for",
    "on",
    "with",
    "as",
    "by",
    "at",
    "from",
    "this",
    "that",
    "it",
    "be",
    "are",
    "was",
    "were",
    "not",
    "but",
    "can",
    "will",
    "would",
    "should",
    "could",
    "model",
    "token",
    "reason",
    "step",
    "first",
    "second",
    "then",
    "so",
    "therefore",
    "because",
    "question",
    "user",
    "assistant",
]
EXTRA_PIECES = ("ĠLet", "ĠOkay", "ĠThe")  # appended after the word list; only ĠLet (379) is new

# Kimi-style template, no newlines between turns.  Differences from the real one are deliberate
# (§3.4): no default system prompt, and a conversation without tools keeps every history turn's
# reasoning.  A conversation with tools (a `tools` list, an assistant `tool_calls` or a `tool` turn)
# follows Kimi-K2-Thinking / K2.5 exactly (the recordings' tiny_kimi_tools.jinja, tools README §7):
# the `tool_declare` turn first (`tools | tojson`), assistant turns up to the last one without
# `tool_calls` render `<think></think>`, the turns after it (the tool loop in progress) render
# `<think>{reasoning_content}</think>` (empty with thinking=false), the calls as Kimi's section, and a
# result as `<|im_system|>{name or 'tool'}<|im_middle|>## Return of {tool_call_id}\n{content}`.
# Other unknown roles are rendered like a system turn carrying the role name.
CHAT_TEMPLATE = (
    "{%- macro text_of(message) -%}"
    "{%- set content = message.content -%}"
    "{%- if content is none or content is not defined -%}"
    "{%- elif content is string -%}{{ content }}"
    "{%- else -%}{%- for part in content -%}{%- if part.type == 'text' -%}{{ part.text }}{%- endif -%}{%- endfor -%}"
    "{%- endif -%}"
    "{%- endmacro -%}"
    "{%- set ns = namespace(tools_used=false, last_plain=-1) -%}"
    "{%- if tools -%}{%- set ns.tools_used = true -%}{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message.tool_calls or message.role == 'tool' -%}{%- set ns.tools_used = true -%}{%- endif -%}"
    "{%- if message.role == 'assistant' and not message.tool_calls -%}{%- set ns.last_plain = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if tools -%}"
    "<|im_system|>tool_declare<|im_middle|>"
    "{%- if tools_ts_str is defined -%}{{ tools_ts_str }}{%- else -%}{{ tools | tojson }}{%- endif -%}"
    "<|im_end|>"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'user' -%}"
    "<|im_user|>user<|im_middle|>{{ text_of(message) }}<|im_end|>"
    "{%- elif message.role == 'assistant' -%}"
    "<|im_assistant|>assistant<|im_middle|>"
    "{%- if ns.tools_used -%}"
    "{%- if loop.index0 <= ns.last_plain or (thinking is defined and thinking is false) -%}<think></think>"
    "{%- else -%}<think>{{ message.reasoning_content or '' }}</think>{%- endif -%}"
    "{%- else -%}"
    "{%- if message.reasoning_content -%}<think>{{ message.reasoning_content }}</think>"
    "{%- else -%}<think></think>{%- endif -%}"
    "{%- endif -%}"
    "{{ text_of(message) }}"
    "{%- if message.tool_calls -%}"
    "<|tool_calls_section_begin|>"
    "{%- for tool_call in message.tool_calls -%}"
    "<|tool_call_begin|>{{ tool_call.id }}<|tool_call_argument_begin|>"
    "{%- if tool_call.function.arguments is string -%}{{ tool_call.function.arguments }}"
    "{%- else -%}{{ tool_call.function.arguments | tojson }}{%- endif -%}"
    "<|tool_call_end|>"
    "{%- endfor -%}"
    "<|tool_calls_section_end|>"
    "{%- endif -%}"
    "<|im_end|>"
    "{%- elif message.role == 'tool' -%}"
    "<|im_system|>{{ message.name or 'tool' }}<|im_middle|>## Return of {{ message.tool_call_id }}\n"
    "{{ text_of(message) }}<|im_end|>"
    "{%- else -%}"
    "<|im_system|>{{ message.role }}<|im_middle|>{{ text_of(message) }}<|im_end|>"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "<|im_assistant|>assistant<|im_middle|>"
    "{%- if thinking is defined and thinking is false -%}<think></think>"
    "{%- else -%}<think>{%- endif -%}"
    "{%- endif -%}"
)


K26_CHAT_TEMPLATE = CHAT_TEMPLATE.replace(
    "{%- if loop.index0 <= ns.last_plain or (thinking is defined and thinking is false) -%}",
    "{%- set ns.keep_all = preserve_thinking is defined and preserve_thinking -%}"
    "{%- if (loop.index0 <= ns.last_plain and not ns.keep_all) or (thinking is defined and thinking is false "
    "and not ns.keep_all) -%}",
).replace("namespace(tools_used=false, last_plain=-1)", "namespace(tools_used=false, last_plain=-1, keep_all=false)")
"""Kimi-K2.6's variant: `preserve_thinking: true` keeps every history turn's reasoning (K2.6 sets its last plain
assistant index to -1 then, and renders `<think></think>` for `thinking: false` only when it is false)."""
assert K26_CHAT_TEMPLATE.count("preserve_thinking") == 2 and K26_CHAT_TEMPLATE.count("keep_all") == 4

K2_THINKING_CHAT_TEMPLATE = CHAT_TEMPLATE.replace(
    "{%- if loop.index0 <= ns.last_plain or (thinking is defined and thinking is false) -%}",
    "{%- if loop.index0 <= ns.last_plain -%}",
).replace(
    "<|im_assistant|>assistant<|im_middle|>"
    "{%- if thinking is defined and thinking is false -%}<think></think>"
    "{%- else -%}<think>{%- endif -%}"
    "{%- endif -%}",
    "<|im_assistant|>assistant<|im_middle|>{%- endif -%}",
)
"""Kimi-K2-Thinking's variant (protocols §3.3): the generation prompt ends `<|im_middle|>` and the model writes its own
`<think>`; no `thinking` switch (the model always reasons). Served for `--profile kimi-k2-thinking`: with K2.5's
template the prompt pre-filled the `<think>` the profile says the model writes, so every answer opened reasoning twice."""
assert "thinking" not in K2_THINKING_CHAT_TEMPLATE and K2_THINKING_CHAT_TEMPLATE.endswith(
    "<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
)

MODELS = {"kimi-k2.5": CHAT_TEMPLATE, "kimi-k2.6": K26_CHAT_TEMPLATE, "kimi-k2-thinking": K2_THINKING_CHAT_TEMPLATE}
"""The layouts built: one vocabulary, each model's template (a run serves or renders the one its profile names)."""


def _vocab_and_merges() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Build the id layout of §3.3.  Insertion order == id order, which keeps output deterministic."""
    from tokview.core.tokenizer import bytes_to_unicode

    b2u = bytes_to_unicode()
    vocab: dict[str, int] = {b2u[b]: b for b in range(256)}

    def add(s: str) -> None:
        if s not in vocab:
            vocab[s] = len(vocab)

    pieces = [p for w in WORDS for p in (w, "Ġ" + w)] + list(EXTRA_PIECES)
    for p in pieces:
        add(p)
    assert len(vocab) == 380, len(vocab)
    # Pseudo-words: random ids then decode to pronounceable junk instead of replacement chars.
    combos = ("".join(c) for n in (2, 3, 4) for c in itertools.product(string.ascii_lowercase, repeat=n))
    for s in itertools.chain.from_iterable(("Ġ" + w, w) for w in combos):
        if len(vocab) == SPECIAL_START:
            break
        add(s)
    for i in range(SPECIAL_START, VOCAB_SIZE):
        vocab[KIMI_SPECIAL_TOKENS.get(i, f"<|reserved_token_{i}|>")] = i
    assert len(vocab) == VOCAB_SIZE

    # Merges only for pieces all of whose prefixes exist, so that e.g. "user" is one token but
    # "What" is W h at: the §3.4 example prompt depends on exactly this set and order.
    merges: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for p in pieces:
        if len(p) < 2 or not all(p[:k] in vocab for k in range(1, len(p))):
            continue
        for k in range(1, len(p)):
            m = (p[:k], p[k])
            if m not in seen:
                seen.add(m)
                merges.append(m)
    return vocab, merges


def _write_tokenizer(out: Path, think_special: bool, model: str) -> None:
    """Write all tokenizer files into ``out`` (an empty directory)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab, merges = _vocab_and_merges()
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    # added_tokens alone would renumber the gappy range, so the BPE vocab already holds these
    # strings at their ids; registering them only makes them atomic (and, mostly, special).
    think = {"<think>", "</think>"}
    names = [s for s, i in vocab.items() if i >= SPECIAL_START]  # dict order == id order
    tok.add_special_tokens(
        [AddedToken(s, special=True, normalized=False) for s in names if think_special or s not in think]
    )
    if not think_special:
        tok.add_tokens([AddedToken(s, special=False, normalized=False) for s in sorted(think)])
    for s in ("<|im_end|>", "<think>", "</think>", "<|im_user|>"):
        assert tok.token_to_id(s) == vocab[s], s

    hf = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call, unused-ignore]  # untyped in transformers 5
        tokenizer_object=tok,
        bos_token="[BOS]",
        eos_token="<|im_end|>",
        unk_token="[UNK]",
        pad_token="[PAD]",
        model_max_length=4096,
    )
    template = MODELS[model]
    hf.chat_template = template
    hf.save_pretrained(str(out))
    # transformers 5 writes tokenizer_class "TokenizersBackend", which transformers 4.x (pinned by
    # some servers) cannot resolve; the v4 name loads in both.  The template also goes into the
    # config so readers that ignore chat_template.jinja still find it.
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    cfg.update(tokenizer_class="PreTrainedTokenizerFast", chat_template=template)
    cfg.pop("backend", None)
    # Written by hand: transformers 4 writes this table and 5 does not, and tokenizers that ship
    # their own code (Kimi's TikTokenTokenizer) read the special names from it.
    cfg["added_tokens_decoder"] = {
        str(vocab[s]): {
            "content": s,
            "special": think_special or s not in think,
            "normalized": False,
            "lstrip": False,
            "rstrip": False,
            "single_word": False,
        }
        for s in names
    }
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    (out / "chat_template.jinja").write_text(template, encoding="utf-8")
    (out / LAYOUT_MARKER).write_text(json.dumps(_marker(think_special, model), indent=2) + "\n", encoding="utf-8")


def _marker(think_special: bool, model: str) -> dict[str, str | bool | int]:
    return {"layout": model, "think_special": think_special, "version": LAYOUT_VERSION}


def _is_built(d: Path, think_special: bool, model: str) -> bool:
    try:
        marker: object = json.loads((d / LAYOUT_MARKER).read_text(encoding="utf-8"))
        return marker == _marker(think_special, model)
    except (OSError, ValueError):
        return False


_BUILD_LOCK = threading.Lock()
"""One build at a time in a process: `tokview batch` asks for the default tokenizer from its start-up
thread and its tokenizer-loading thread at once, and two threads importing transformers' lazy module
together fail in one of them (ImportError on a machine whose cache is still empty)."""


def _build(out_dir: Path, think_special: bool, replace: bool, model: str = "kimi-k2.5") -> Path:
    """Build in a sibling temp dir and rename it into place, so readers never see half a dir.

    With ``replace=False`` (the cache path) losing a race to another process is fine: its
    finished build is kept and ours is discarded.
    """
    out_dir = Path(out_dir).expanduser().absolute()
    tmp = build_folder(out_dir, f".{out_dir.name}.tmp-")
    try:
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp makes 0700; servers may run as another user
        _write_tokenizer(tmp, think_special, model)
        try:
            os.rename(tmp, out_dir)  # atomic; succeeds if out_dir is absent or an empty dir
            return out_dir
        except OSError:
            if not out_dir.exists():
                raise
        if not replace and _is_built(out_dir, think_special, model):
            return out_dir
        trash = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
        os.rename(out_dir, trash / "old")
        os.rename(tmp, out_dir)
        shutil.rmtree(trash, ignore_errors=True)
        return out_dir
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def build_kimi_tokenizer_dir(out_dir: Path, *, think_special: bool = True, model: str = "kimi-k2.5") -> Path:
    """(Re)build the tiny Kimi tokenizer into ``out_dir`` and return its absolute path.

    Writes tokenizer.json, tokenizer_config.json (plus whatever else ``save_pretrained`` emits),
    chat_template.jinja and the ``tokview_layout.json`` marker.  Output is byte-identical across
    runs.  ``think_special=False`` registers ``<think>``/``</think>`` as ordinary added tokens so
    ``skip_special_tokens=True`` keeps them, which text-based reasoning parsers need (§4.6).
    An existing ``out_dir`` is replaced.
    """
    with _BUILD_LOCK:
        return _build(Path(out_dir), think_special, replace=True, model=model)


def kimi_tokenizer_dir(*, think_special: bool = True, cache_dir: Path | None = None, model: str = "kimi-k2.5") -> Path:
    """Return a cached build, building it only if its marker file is missing or stale.

    ``cache_dir`` (default ``$TOKVIEW_CACHE`` or ``~/.cache/tokview``) is a base directory; the
    build lives in its ``kimi-layout`` or ``kimi-layout-nonspecial`` subdirectory (``kimi-k2.6-layout…``
    for ``model="kimi-k2.6"``, whose template reads ``preserve_thinking``), so every variant can share one
    cache. K2.5's folder keeps its name and template: run identities and verdict caches hash them.
    """
    if model not in MODELS:
        raise ValueError(f"no Kimi layout for {model!r} (known: {', '.join(MODELS)})")
    base = Path(cache_dir) if cache_dir is not None else cache_folder()
    name = "kimi-layout" if model == "kimi-k2.5" else f"{model}-layout"
    d = base.expanduser() / (name if think_special else f"{name}-nonspecial")
    if _is_built(d, think_special, model):
        return d.absolute()
    with _BUILD_LOCK:
        if _is_built(d, think_special, model):  # another thread built it while this one waited
            return d.absolute()
        return _build(d, think_special, replace=False, model=model)


# What Kimi's real tokenizer_config.json names: its TikTokenTokenizer's defaults (one definition, there).
KIMI_ADDITIONAL_SPECIAL = DEFAULT_ADDITIONAL_SPECIAL


def kimi_tiktoken_ranks() -> dict[bytes, int]:
    """The layout's 163,584 ordinary tokens as tiktoken ranks (token bytes → id)."""
    from tokview.core.tokenizer import bytes_to_unicode

    decoder = {c: b for b, c in bytes_to_unicode().items()}
    vocab, _ = _vocab_and_merges()
    return {bytes(decoder[c] for c in token): i for token, i in vocab.items() if i < SPECIAL_START}


def build_kimi_tiktoken_dir(out_dir: Path, *, think_special: bool = True) -> Path:
    """Write the layout as Kimi's real folder holds its tokenizer, and return the folder.

    ``tiktoken.model`` (``base64-token rank`` lines, 163,584 ranks, so the special ids start at 163584 as
    Kimi's do), ``tokenizer_config.json`` with ``added_tokens_decoder`` (Kimi's named special tokens),
    ``auto_map`` → ``tokenization_kimi.TikTokenTokenizer`` and the special-token roles, and
    ``chat_template.jinja``. No ``tokenization_kimi.py``: tokview reads this layout natively. Only the
    standard library is used; output is byte-identical across runs.
    """
    import base64

    out = Path(out_dir).expanduser().absolute()
    out.mkdir(parents=True, exist_ok=True)
    ranks = kimi_tiktoken_ranks()
    assert len(ranks) == SPECIAL_START, len(ranks)
    lines = sorted((i, t) for t, i in ranks.items())
    (out / "tiktoken.model").write_text(
        "".join(f"{base64.b64encode(t).decode()} {i}\n" for i, t in lines), encoding="ascii"
    )
    think = {"<think>", "</think>"}
    config = {
        "added_tokens_decoder": {
            str(i): {
                "content": s,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": think_special or s not in think,
            }
            for i, s in sorted(KIMI_SPECIAL_TOKENS.items())
        },
        "additional_special_tokens": list(KIMI_ADDITIONAL_SPECIAL),
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
        "bos_token": "[BOS]",
        "clean_up_tokenization_spaces": False,
        "eos_token": "[EOS]",
        "model_max_length": 4096,
        "pad_token": "[PAD]",
        "tokenizer_class": "TikTokenTokenizer",
        "unk_token": "[UNK]",
    }
    (out / "tokenizer_config.json").write_text(
        json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    return out
