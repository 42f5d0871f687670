"""A tiny, offline stand-in for the GLM-4.5/4.6/4.7 tokenizer, built like `kimi_layout` builds Kimi's.

Why: the `glm-4.5`/`glm-4.7` profiles name GLM's real special ids, and a simulator run or a test that serves them
needs a tokenizer whose `<think>` is 151350 and whose `<|endoftext|>` is 151329, not the real 151k-entry
tokenizer from the hub. This module builds one deterministically from ``tokenizers`` + ``transformers``: byte-level
BPE over the same word list as the Kimi layout (so any text encodes and round-trips), pseudo-words up to 151329,
GLM's special tokens at their ids, reserved tokens up to the model's 151552 rows, and a GLM-4.7-style template.

The special ids: 151329 ``<|endoftext|>``, 151331 ``[gMASK]``, 151333 ``<sop>``, 151336 ``<|user|>``, 151337
``<|assistant|>``, 151338 ``<|observation|>`` (ChatGLM4's tokenization_chatglm.py special table; the same ids read
from GLM-4.5's added vocabulary in ik_llama.cpp PR #668's GGUF conversion), 151350/151351 ``<think>``/``</think>``
(the profiles; protocols.md's reasoning table believes them); 151352-151364 follow GLM-4.5's tokenizer_config.json
order (``<tool_call>`` … ``<|video|>``), recalled, not confirmed against a stored copy.

The template (``CHAT_TEMPLATE``) follows GLM-4.7's chat_template.jinja (zai-org/GLM-4.7 and GLM-4.7-Flash; read
from llama.cpp's models/templates/GLM-4.7-Flash.jinja): ``[gMASK]<sop>``, no newlines between turns;
an assistant turn after the last user turn, or any with ``clear_thinking=false``, renders
``<think>{reasoning|trim}</think>``, every other one ``</think>`` alone; content trimmed; tool calls as
``<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>`` over ``arguments.items()`` (a JSON
string renders no arguments, as in the real template: vLLM parses JSON-string arguments before rendering, and so does
`TokenizerAdapter.render`); string results after one ``<|observation|>`` per run of tool turns, a list result as
``<|observation|>`` and one ``<tool_response>`` per item (its ``output``); ``tools`` as the real template's system
block, word for word, one ``tojson`` line per tool; the generation prompt ``<|assistant|><think>`` (``</think>`` with
``enable_thinking=false``). Left out: a ``None`` tool content renders empty (the real template fails on it).
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
from tokview.core.kimi_layout import EXTRA_PIECES, WORDS

VOCAB_SIZE = 151552
SPECIAL_START = 151329
LAYOUT_MARKER = "tokview_layout.json"
LAYOUT_VERSION = 3

GLM_SPECIAL_TOKENS: dict[int, str] = {
    151329: "<|endoftext|>",
    151330: "[MASK]",
    151331: "[gMASK]",
    151332: "[sMASK]",
    151333: "<sop>",
    151334: "<eop>",
    151335: "<|system|>",
    151336: "<|user|>",
    151337: "<|assistant|>",
    151338: "<|observation|>",
    151339: "<|begin_of_image|>",
    151340: "<|end_of_image|>",
    151341: "<|begin_of_video|>",
    151342: "<|end_of_video|>",
    151343: "<|begin_of_audio|>",
    151344: "<|end_of_audio|>",
    151345: "<|begin_of_transcription|>",
    151346: "<|end_of_transcription|>",
    151347: "<|code_prefix|>",
    151348: "<|code_middle|>",
    151349: "<|code_suffix|>",
    151350: "<think>",
    151351: "</think>",
    151352: "<tool_call>",
    151353: "</tool_call>",
    151354: "<tool_response>",
    151355: "</tool_response>",
    151356: "<arg_key>",
    151357: "</arg_key>",
    151358: "<arg_value>",
    151359: "</arg_value>",
    151360: "/nothink",
    151361: "<|begin_of_box|>",
    151362: "<|end_of_box|>",
    151363: "<|image|>",
    151364: "<|video|>",
}
GLM_ID: dict[str, int] = {text: token_id for token_id, text in GLM_SPECIAL_TOKENS.items()}
"""The same table by text: `GLM_ID["<think>"] == 151350`."""
NOT_SPECIAL = frozenset({"<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
                         "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "/nothink"})  # fmt: skip
"""Registered as added tokens but not special in GLM-4.5's config, so `skip_special_tokens` keeps them (vLLM's
glm45 parsers read them from the text)."""

CHAT_TEMPLATE = (
    "{%- macro text_of(content) -%}"
    "{%- if content is string -%}{{ content }}"
    "{%- elif content is iterable and content is not mapping -%}"
    "{%- for part in content -%}"
    "{%- if part is mapping and part.type == 'text' -%}{{ part.text }}{%- elif part is string -%}{{ part }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- elif content is not none -%}{{ content }}"
    "{%- endif -%}"
    "{%- endmacro -%}"
    "[gMASK]<sop>"
    "{%- if tools -%}"
    "<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    "{% for tool in tools %}{{ tool | tojson(ensure_ascii=False) }}\n{% endfor -%}"
    "</tools>\n\nFor each function call, output the function name and arguments within the following XML format:\n"
    "<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}</arg_value>"
    "<arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>...</tool_call>"
    "{%- endif -%}"
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'user' -%}<|user|>{{ text_of(m.content) }}"
    "{%- elif m.role == 'assistant' -%}<|assistant|>"
    "{%- set content = text_of(m.content) -%}"
    "{%- set reasoning = '' -%}"
    "{%- if m.reasoning_content is string -%}{%- set reasoning = m.reasoning_content -%}"
    "{%- elif '</think>' in content -%}"
    "{%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}"
    "{%- endif -%}"
    "{%- if ((clear_thinking is defined and not clear_thinking) or loop.index0 > ns.last_user) and reasoning -%}"
    "<think>{{ reasoning.strip() }}</think>"
    "{%- else -%}</think>{%- endif -%}"
    "{{ content.strip() }}"
    "{%- for tc in m.tool_calls or [] -%}"
    "{%- set f = tc.function if tc.function else tc -%}"
    "<tool_call>{{ f.name }}"
    "{%- set args = f.arguments if f.arguments is mapping else {} -%}"
    "{%- for k, v in args.items() -%}"
    "<arg_key>{{ k }}</arg_key><arg_value>{{ v if v is string else v | tojson(ensure_ascii=False) }}</arg_value>"
    "{%- endfor -%}"
    "</tool_call>"
    "{%- endfor -%}"
    "{%- elif m.role == 'tool' -%}"
    "{%- if m.content is string or m.content is none -%}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}<|observation|>{%- endif -%}"
    "<tool_response>{{ m.content or '' }}</tool_response>"
    "{%- else -%}<|observation|>"
    "{%- for tr in m.content -%}<tool_response>{{ tr.output if tr.output is defined else tr }}</tool_response>"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{%- else -%}<|system|>{{ text_of(m.content) }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>"
    "{%- if enable_thinking is defined and not enable_thinking -%}</think>{%- else -%}<think>{%- endif -%}"
    "{%- endif -%}"
)


def _vocab_and_merges() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Bytes, the word list's pieces, pseudo-words up to GLM's special range, the specials, reserved rows."""
    from tokview.core.tokenizer import bytes_to_unicode

    b2u = bytes_to_unicode()
    vocab: dict[str, int] = {b2u[b]: b for b in range(256)}
    pieces = [p for w in WORDS for p in (w, "Ġ" + w)] + list(EXTRA_PIECES)
    for p in pieces:
        vocab.setdefault(p, len(vocab))
    combos = ("".join(c) for n in (2, 3, 4) for c in itertools.product(string.ascii_lowercase, repeat=n))
    for s in itertools.chain.from_iterable(("Ġ" + w, w) for w in combos):
        if len(vocab) == SPECIAL_START:
            break
        vocab.setdefault(s, len(vocab))
    for i in range(SPECIAL_START, VOCAB_SIZE):
        vocab[GLM_SPECIAL_TOKENS.get(i, f"<|reserved_token_{i}|>")] = i
    assert len(vocab) == VOCAB_SIZE
    merges: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for p in pieces:  # merges only where every prefix is a token, as in the Kimi layout
        if len(p) < 2 or not all(p[:k] in vocab for k in range(1, len(p))):
            continue
        for k in range(1, len(p)):
            if (m := (p[:k], p[k])) not in seen:
                seen.add(m)
                merges.append(m)
    return vocab, merges


def _write_tokenizer(out: Path) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab, merges = _vocab_and_merges()
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    names = [s for s, i in vocab.items() if i >= SPECIAL_START]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in names if s not in NOT_SPECIAL])
    tok.add_tokens([AddedToken(s, special=False, normalized=False) for s in names if s in NOT_SPECIAL])
    for s in ("<|endoftext|>", "<think>", "</think>", "<|user|>", "<|reserved_token_151551|>"):
        assert tok.token_to_id(s) == vocab[s], s
    hf = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call, unused-ignore]  # untyped in transformers 5
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>", model_max_length=4096
    )
    hf.chat_template = CHAT_TEMPLATE
    hf.save_pretrained(str(out))
    cfg_path = out / "tokenizer_config.json"  # the v4 class name and the table, as kimi_layout writes them
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    cfg.update(tokenizer_class="PreTrainedTokenizerFast", chat_template=CHAT_TEMPLATE)
    cfg.pop("backend", None)
    cfg["added_tokens_decoder"] = {
        str(vocab[s]): {
            "content": s,
            "special": s not in NOT_SPECIAL,
            "normalized": False,
            "lstrip": False,
            "rstrip": False,
            "single_word": False,
        }
        for s in names
    }
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    # What GLM-4.5's generation_config.json lists, and what servers stop on.
    stops = [GLM_ID["<|endoftext|>"], GLM_ID["<|user|>"], GLM_ID["<|observation|>"]]
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": stops}) + "\n", encoding="utf-8")
    (out / LAYOUT_MARKER).write_text(json.dumps(_marker(), indent=2) + "\n", encoding="utf-8")


def _marker() -> dict[str, str | int]:
    return {"layout": "glm-4.7", "version": LAYOUT_VERSION}


def _is_built(d: Path) -> bool:
    try:
        marker: object = json.loads((d / LAYOUT_MARKER).read_text(encoding="utf-8"))
        return marker == _marker()
    except (OSError, ValueError):
        return False


_BUILD_LOCK = threading.Lock()


def _build(out_dir: Path, replace: bool) -> Path:
    """Build in a sibling temp dir and rename it into place, so readers never see half a dir."""
    out_dir = Path(out_dir).expanduser().absolute()
    tmp = build_folder(out_dir, f".{out_dir.name}.tmp-")
    try:
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)
        _write_tokenizer(tmp)
        try:
            os.rename(tmp, out_dir)
            return out_dir
        except OSError:
            if not out_dir.exists():
                raise
        if not replace and _is_built(out_dir):
            return out_dir  # another process built it first
        trash = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
        os.rename(out_dir, trash / "old")
        os.rename(tmp, out_dir)
        shutil.rmtree(trash, ignore_errors=True)
        return out_dir
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def build_glm_tokenizer_dir(out_dir: Path) -> Path:
    """(Re)build the GLM-layout tokenizer into ``out_dir`` and return its absolute path."""
    with _BUILD_LOCK:
        return _build(Path(out_dir), replace=True)


def glm_tokenizer_dir(*, cache_dir: Path | None = None) -> Path:
    """A cached build under ``cache_dir`` (default ``$TOKVIEW_CACHE`` or ``~/.cache/tokview``)/``glm-layout``."""
    base = Path(cache_dir) if cache_dir is not None else cache_folder()
    d = base.expanduser() / "glm-layout"
    if _is_built(d):
        return d.absolute()
    with _BUILD_LOCK:
        return d.absolute() if _is_built(d) else _build(d, replace=False)
