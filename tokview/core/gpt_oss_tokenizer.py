"""gpt-oss's tokenizer (o200k_harmony), built offline from ranks a registry package ships.

No network at run or test time: the o200k_base ranks come from the npm package `js-tiktoken`
(`dist/ranks/o200k_base.js`: a JSON object whose `bpe_ranks` are lines `! OFFSET TOKEN TOKEN …`, each
TOKEN base64, ranks OFFSET, OFFSET+1, …), fetched once at install time (`npm pack js-tiktoken`, see
.ci/run) and read straight out of its .tgz. The ranks are written back as `o200k_base.tiktoken` and its
SHA-256 is checked against the one tiktoken and openai-harmony pin for that file (446a95…), so the
vocabulary is OpenAI's byte for byte; openai-harmony reads the same file from `TIKTOKEN_ENCODINGS_BASE`.

o200k_harmony = o200k_base's 199,998 ranks plus the Harmony special ids (`HARMONY_SPECIAL`, as
tiktoken's `o200k_harmony` names them), vocabulary 201,088. tokview writes it as a `tokenizer.json`
folder (byte-level BPE, merges recovered from the ranks, o200k's split pattern) with a Harmony chat
template (`GPT_OSS_TEMPLATE`, tokview's own, checked against openai-harmony's rendering in
tests/test_harmony_tokenizer.py), so it loads through the generic `tokenizer.json` path like any folder.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

from tokview.core.json_cache import NoCacheFolder, build_folder, cache_folder, home_expanded
from tokview.core.tokenizer_folder import byte_alphabet
from tokview.errors import TokviewError

O200K_BASE_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
"""The SHA-256 tiktoken and openai-harmony pin for o200k_base.tiktoken."""
O200K_RANKS = 199_998
JS_TIKTOKEN_RANKS_MEMBER = "package/dist/ranks/o200k_base.js"
VOCAB_SIZE = 201_088
O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)

RETURN, CONSTRAIN, CHANNEL, START, END, MESSAGE, CALL = 200002, 200003, 200005, 200006, 200007, 200008, 200012
HARMONY_NAMED = {
    "<|startoftext|>": 199998,
    "<|endoftext|>": 199999,
    "<|return|>": RETURN,
    "<|constrain|>": CONSTRAIN,
    "<|channel|>": CHANNEL,
    "<|start|>": START,
    "<|end|>": END,
    "<|message|>": MESSAGE,
    "<|call|>": CALL,
    "<|endofprompt|>": 200018,
}


def harmony_special_tokens() -> dict[int, str]:
    """id → text of every special id of o200k_harmony: the named ones, `<|reserved_N|>` for the rest."""
    names = {i: f"<|reserved_{i}|>" for i in range(199998, VOCAB_SIZE)}
    names.update({i: text for text, i in HARMONY_NAMED.items()})
    return names


class GptOssDataError(TokviewError):
    """The o200k ranks are not here (js-tiktoken was not fetched) or are not OpenAI's."""

    title = "gpt-oss tokenizer"


def find_js_tiktoken() -> Path | None:
    """The js-tiktoken package (.tgz from `npm pack`, or its unpacked `package` folder, or the ranks .js):
    `$TOKVIEW_JS_TIKTOKEN`, else the newest `js-tiktoken-*.tgz` in the tokview cache, else in
    ~/.cache/tokview (where .ci/run's `npm pack` puts it, also when a test suite moves TOKVIEW_CACHE)."""
    named = os.environ.get("TOKVIEW_JS_TIKTOKEN")
    if named:
        return home_expanded(named, "TOKVIEW_JS_TIKTOKEN")
    for folder in _packed_folders():
        packed = sorted(folder.glob("js-tiktoken-*.tgz"))
        if packed:
            return packed[-1]
    return None


def _packed_folders() -> list[Path]:
    """The tokview cache, then ~/.cache/tokview: those of them there are (no home folder: neither may be)."""
    folders = []
    try:
        folders.append(cache_folder())
    except NoCacheFolder:
        pass
    try:
        folders.append(Path.home() / ".cache" / "tokview")
    except RuntimeError:
        pass
    return folders


def _ranks_source(where: Path) -> str:
    if where.is_dir():
        for candidate in (where / "dist/ranks/o200k_base.js", where / "package/dist/ranks/o200k_base.js"):
            if candidate.is_file():
                return candidate.read_text(encoding="utf-8")
        raise GptOssDataError(f"{where}: no dist/ranks/o200k_base.js in this js-tiktoken folder")
    if where.name.endswith((".tgz", ".tar.gz")):
        with tarfile.open(where, "r:gz") as tar:
            member = tar.extractfile(JS_TIKTOKEN_RANKS_MEMBER)
            if member is None:
                raise GptOssDataError(f"{where}: no {JS_TIKTOKEN_RANKS_MEMBER} in this package")
            return member.read().decode("utf-8")
    return where.read_text(encoding="utf-8")


def read_js_tiktoken_ranks(where: Path) -> dict[bytes, int]:
    """o200k_base's ranks as js-tiktoken ships them → {token bytes: rank}, ranks exactly 0 … 199,997."""
    try:
        source = _ranks_source(where)
        body = source.strip().removeprefix("export default").strip().rstrip(";")
        packed = json.loads(body)["bpe_ranks"]
    except (OSError, KeyError, ValueError, tarfile.TarError) as exc:
        raise GptOssDataError(f"cannot read o200k_base ranks from {where}: {exc}") from None
    ranks: dict[bytes, int] = {}
    for line in packed.split("\n"):
        if not line:
            continue
        _, offset, *tokens = line.split(" ")
        start = int(offset)
        for k, token in enumerate(tokens):
            ranks[base64.b64decode(token)] = start + k
    if sorted(ranks.values()) != list(range(O200K_RANKS)):
        raise GptOssDataError(f"{where}: the ranks are not 0 … {O200K_RANKS - 1} ({len(ranks)} tokens)")
    return ranks


def tiktoken_file_bytes(ranks: dict[bytes, int]) -> bytes:
    """The ranks as tiktoken's `.tiktoken` file (`base64 rank` lines in rank order)."""
    lines = sorted(ranks.items(), key=lambda kv: kv[1])
    return b"".join(base64.b64encode(token) + b" " + str(rank).encode() + b"\n" for token, rank in lines)


def write_o200k_tiktoken(ranks: dict[bytes, int], folder: Path) -> Path:
    """Write `o200k_base.tiktoken` into `folder` after checking it is OpenAI's file (its pinned SHA-256)."""
    data = tiktoken_file_bytes(ranks)
    digest = hashlib.sha256(data).hexdigest()
    if digest != O200K_BASE_SHA256:
        raise GptOssDataError(f"the o200k_base ranks hash to {digest}, not OpenAI's {O200K_BASE_SHA256}")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "o200k_base.tiktoken"
    path.write_bytes(data)
    return path


def merges_from_ranks(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The BPE merges that reproduce tiktoken's rank order: each multi-byte token is the merge of the two
    parts byte-level BPE reaches on its bytes with only the lower ranks (as transformers' converter does)."""
    merges: list[tuple[int, bytes, bytes]] = []
    for token, rank in ranks.items():
        if len(token) < 2:
            continue
        parts = [token[i : i + 1] for i in range(len(token))]
        while len(parts) > 2:
            best, at = rank, -1
            for i in range(len(parts) - 1):
                r = ranks.get(parts[i] + parts[i + 1])
                if r is not None and r < best:
                    best, at = r, i
            if at < 0:
                break
            parts[at : at + 2] = [parts[at] + parts[at + 1]]
        if len(parts) == 2:
            merges.append((rank, parts[0], parts[1]))
    merges.sort()
    return [(a, b) for _, a, b in merges]


def tokenizer_json(ranks: dict[bytes, int]) -> str:
    """o200k_harmony as a `tokenizers` JSON: byte-level BPE over the ranks, o200k's split, the specials."""
    alphabet = byte_alphabet()

    def spell(raw: bytes) -> str:
        return "".join(alphabet[b] for b in raw)

    vocab = {spell(token): rank for token, rank in sorted(ranks.items(), key=lambda kv: kv[1])}
    specials = harmony_special_tokens()
    vocab.update({text: i for i, text in specials.items()})
    added = [
        {"id": i, "content": text, "single_word": False, "lstrip": False, "rstrip": False}
        | {"normalized": False, "special": True}
        for i, text in sorted(specials.items())
    ]
    model = {
        "type": "BPE",
        "dropout": None,
        "unk_token": None,
        "continuing_subword_prefix": None,
        "end_of_word_suffix": None,
        "fuse_unk": False,
        "byte_fallback": False,
        "ignore_merges": True,
        "vocab": vocab,
        "merges": [[spell(a), spell(b)] for a, b in merges_from_ranks(ranks)],
    }
    split = {"type": "Split", "pattern": {"Regex": O200K_PATTERN}, "behavior": "Isolated", "invert": False}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
    data = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [split, byte_level]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": model,
    }
    return json.dumps(data, ensure_ascii=False)


LAYOUT_MARKER = "tokview_layout.json"


def _layout() -> dict[str, str | int]:
    """The cache marker: a build with another template (or layout version) is rebuilt."""
    template = hashlib.sha256(GPT_OSS_TEMPLATE.encode()).hexdigest()[:16]
    return {"layout": "gpt-oss", "encoding": "o200k_harmony", "version": 1, "template": template}


def _config() -> dict[str, object]:
    specials = harmony_special_tokens()
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|startoftext|>",
        "eos_token": "<|return|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 131072,
        "added_tokens_decoder": {
            str(i): {"content": text, "special": True, "normalized": False}
            | {"lstrip": False, "rstrip": False, "single_word": False}
            for i, text in sorted(specials.items())
        },
        "chat_template": GPT_OSS_TEMPLATE,
    }


def write_gpt_oss_folder(ranks: dict[bytes, int], out: Path) -> Path:
    """Write gpt-oss's tokenizer folder (tokenizer.json, tokenizer_config.json, chat_template.jinja,
    generation_config.json with its three stop ids, o200k_base.tiktoken for openai-harmony) into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    write_o200k_tiktoken(ranks, out)
    (out / "tokenizer.json").write_text(tokenizer_json(ranks), encoding="utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps(_config(), indent=2) + "\n", encoding="utf-8")
    (out / "chat_template.jinja").write_text(GPT_OSS_TEMPLATE, encoding="utf-8")
    generation = {"bos_token_id": 199998, "eos_token_id": [RETURN, CALL, 199999], "pad_token_id": 199999}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n", encoding="utf-8")
    (out / LAYOUT_MARKER).write_text(json.dumps(_layout()) + "\n", encoding="utf-8")
    return out


def _is_built(folder: Path) -> bool:
    try:
        marker: object = json.loads((folder / LAYOUT_MARKER).read_text(encoding="utf-8"))
        return marker == _layout()
    except (OSError, ValueError):
        return False


def gpt_oss_tokenizer_dir(source: Path | None = None, cache_dir: Path | None = None) -> Path:
    """The cached gpt-oss tokenizer folder, built from js-tiktoken's ranks on first use (~30 s, once).

    Raises GptOssDataError naming what to fetch when the package is not on this machine."""
    folder = (Path(cache_dir) if cache_dir else cache_folder()) / "gpt-oss-o200k-harmony"
    if _is_built(folder):
        return folder.absolute()
    where = source or find_js_tiktoken()
    if where is None or not where.exists():
        raise GptOssDataError(
            "the o200k_base ranks are not on this machine: run `npm pack js-tiktoken@1.0.21 --pack-destination "
            "~/.cache/tokview` (or set TOKVIEW_JS_TIKTOKEN to the package)"
        )
    ranks = read_js_tiktoken_ranks(where)
    tmp = build_folder(folder, ".gpt-oss.tmp-")
    try:
        write_gpt_oss_folder(ranks, tmp)
        try:
            os.rename(tmp, folder)  # atomic: readers never see half a folder
        except OSError:
            if _is_built(folder):
                return folder.absolute()  # another process built it meanwhile
            stale = Path(tempfile.mkdtemp(prefix=".gpt-oss.old-", dir=folder.parent))
            os.rename(folder, stale / "old")  # a build of an older template: replaced whole
            os.rename(tmp, folder)
            shutil.rmtree(stale, ignore_errors=True)
        return folder.absolute()
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


GPT_OSS_TEMPLATE = r"""{#- tokview's Harmony template for gpt-oss (o200k_harmony). Kwargs: reasoning_effort (low|medium|high,
    default medium), current_date (YYYY-MM-DD; default today, as the published template stamps it),
    model_identity. History as openai-harmony renders it: while a tool loop is open (the conversation ends
    with a call or a tool result) every analysis (`thinking`) is kept; once it ends with a user message or a
    final answer, the analysis of the turns before the last user message is dropped. Tool calls go to the
    commentary channel with the recipient in the role header. -#}
{%- macro ts_type(spec) -%}
{%- if spec.enum is defined -%}{%- for v in spec.enum -%}{{ v | tojson }}{{ " | " if not loop.last }}{%- endfor -%}
{%- elif spec.type == "array" -%}{{ ts_type(spec.get("items", {})) }}[]
{%- elif spec.type in ("number", "integer") -%}number
{%- elif spec.type == "boolean" -%}boolean
{%- elif spec.type == "string" -%}string
{%- else -%}any{%- endif -%}
{%- endmacro -%}
{%- set effort = reasoning_effort | default("medium") -%}
{%- set tools_list = tools | default(none) -%}
{{- "<|start|>system<|message|>" + (model_identity | default("You are ChatGPT, a large language model trained by OpenAI.")) + "\nKnowledge cutoff: 2024-06\nCurrent date: " + (current_date | default(strftime_now("%Y-%m-%d"))) + "\n\nReasoning: " + effort + "\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message." -}}
{%- if tools_list %}{{ "\nCalls to these tools must go to the commentary channel: 'functions'." }}{% endif -%}
{{- "<|end|>" -}}
{%- set instructions = messages | selectattr("role", "in", ["system", "developer"]) | map(attribute="content") | list -%}
{%- if instructions or tools_list -%}
{{- "<|start|>developer<|message|>" -}}
{%- if instructions %}{{ "# Instructions\n\n" + instructions | join("\n\n") }}{% endif -%}
{%- if instructions and tools_list %}{{ "\n\n" }}{% endif -%}
{%- if tools_list -%}
{{- "# Tools\n\n## functions\n\nnamespace functions {\n\n" -}}
{%- for t in tools_list -%}{%- set f = t.function if t.function is defined else t -%}
{{- "// " + f.description + "\n" if f.description -}}
{%- set params = f.get("parameters") or {} -%}
{%- if params.get("properties") -%}
{{- "type " + f.name + " = (_: {\n" -}}
{%- for name, spec in params.properties.items() -%}
{{- "// " + spec.description + "\n" if spec.description -}}
{{- name + ("" if name in params.get("required", []) else "?") + ": " + ts_type(spec) + ",\n" -}}
{%- endfor -%}
{{- "}) => any;\n\n" -}}
{%- else -%}{{- "type " + f.name + " = () => any;\n\n" -}}{%- endif -%}
{%- endfor -%}
{{- "} // namespace functions" -}}
{%- endif -%}
{{- "<|end|>" -}}
{%- endif -%}
{%- set ns = namespace(last_user=-1) -%}
{%- for m in messages -%}{%- if m.role == "user" %}{% set ns.last_user = loop.index0 %}{% endif -%}{%- endfor -%}
{%- set last = messages[-1] if messages else {} -%}
{%- set closed = last.role == "user" or (last.role == "assistant" and last.content and not last.tool_calls) -%}
{%- for m in messages -%}
{%- if m.role == "user" -%}
{{- "<|start|>user<|message|>" + m.content + "<|end|>" -}}
{%- elif m.role == "assistant" -%}
{%- set thinking = m.thinking or m.reasoning_content or m.reasoning or "" -%}
{%- if thinking and not (closed and loop.index0 < ns.last_user) -%}
{{- "<|start|>assistant<|channel|>analysis<|message|>" + thinking + "<|end|>" -}}
{%- endif -%}
{%- for call in m.tool_calls or [] -%}{%- set fn = call.function if call.function is defined else call -%}
{%- set args = fn.arguments if fn.arguments is string else fn.arguments | tojson -%}
{{- "<|start|>assistant to=functions." + fn.name + "<|channel|>commentary <|constrain|>json<|message|>" + args + "<|call|>" -}}
{%- endfor -%}
{%- if m.content and not m.tool_calls -%}
{{- "<|start|>assistant<|channel|>final<|message|>" + m.content + "<|end|>" -}}
{%- endif -%}
{%- elif m.role == "tool" -%}
{{- "<|start|>functions." + (m.name or "tool") + " to=assistant<|channel|>commentary<|message|>" + m.content + "<|end|>" -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}{{ "<|start|>assistant" }}{% endif -%}
"""
