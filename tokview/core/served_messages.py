"""The messages a server's template renders, which are not always the request's: content a harness sends as text
parts, or as null beside its tool calls (the OpenAI SDK's own shape), is made a string first.

A template that writes `message.content` as a string (Qwen3's: "string" content) is handed
each message's text parts joined, by vLLM with "\\n" (`chat_utils._parse_chat_message_content_parts`) and by SGLang with
" " (`jinja_template_utils.process_content_for_template_format`); a null (or missing) content becomes "" on both, and
SGLang drops every other key whose value is null (`serving_chat._apply_jinja_template`). A template that loops over
`message['content']` ("openai" content) gets the parts as they are (vLLM turns a null into no parts); a tool result of
text parts alone is joined all the same (vLLM's `_parse_chat_message_content`, SGLang's `normalize_tool_content`).

Rendered as sent, such a request failed in the template ("'list object' has no attribute 'startswith'") where the
server renders it: the simulator answered 400 to a harness the real servers serve, the local render could not check
the prompt, and an export wrote the parts where a trainer's template needs the text the server rendered.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

VLLM_SEPARATOR = "\n"
SGLANG_SEPARATOR = " "


def messages_as_served(messages: list[Any], server_kind: str | None, template: str | None) -> list[Any]:
    """`messages` as the server hands them to its template (`template`: its chat template, to tell whether it takes
    content parts). The list itself when nothing changes (the caller's cache keys and identity checks keep)."""
    if not any(isinstance(m, dict) and _changes(m, server_kind) for m in messages):
        return messages
    parts_content = takes_parts(template or "", server_kind)
    return [_served(m, server_kind, parts_content) if isinstance(m, dict) else m for m in messages]


def _changes(message: dict[str, Any], server_kind: str | None) -> bool:
    content = message.get("content")
    if content is None or isinstance(content, list):  # null or missing: both servers render ""
        return True
    return server_kind == "sglang" and any(value is None for value in message.values())


def _served(message: dict[str, Any], server_kind: str | None, parts_content: bool) -> dict[str, Any]:
    content = message.get("content")
    sglang = server_kind == "sglang"
    out = {k: v for k, v in message.items() if v is not None} if sglang else dict(message)
    if content is None:
        out["content"] = [] if parts_content and not sglang else ""
    elif isinstance(content, list):
        texts = _texts(content, sglang)
        tool_text = message.get("role") == "tool" and bool(content) and all(_is_text(p) for p in content)
        if not parts_content or tool_text:
            out["content"] = (SGLANG_SEPARATOR if sglang else VLLM_SEPARATOR).join(texts)
    return out


_VLLM_TEXT = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal", "thinking": "thinking"}
"""vLLM's part types that carry text, and the key holding it (`chat_utils.MM_PARSER_MAP`)."""
_SGLANG_TEXT = {"text": "text", "input_text": "text"}
"""SGLang's (`process_content_for_template_format`)."""


def _texts(parts: list[Any], sglang: bool) -> list[str]:
    """The text of each part that carries text (and of a bare string, which vLLM takes as one; SGLang skips it)."""
    kinds = _SGLANG_TEXT if sglang else _VLLM_TEXT
    out = []
    for part in parts:
        if isinstance(part, str):
            if not sglang:
                out.append(part)
        elif isinstance(part, dict) and isinstance(key := kinds.get(str(part.get("type"))), str):
            value = part.get(key)
            if isinstance(value, str):
                out.append(value)
    return out


def _is_text(part: object) -> bool:
    """A bare string or a text part: a tool result of these alone is joined whatever the template takes."""
    return isinstance(part, str) or (isinstance(part, dict) and part.get("type") == "text")


MEDIA_WORDS = ("image", "audio", "video", "vision")
"""SGLang takes a template that names any of these anywhere for one that renders content parts."""


@lru_cache(maxsize=64)
def takes_parts(template: str, server_kind: str | None) -> bool:
    """Whether the server hands this template content parts ("openai" content) rather than strings, as each detects
    it: SGLang when the template names a medium anywhere, or loops over the content of a variable named `message`,
    `msg` or `m` (`detect_jinja_template_content_format`); vLLM when it loops over the content of a message it loops
    over (`_detect_content_format`). Read from the template's syntax tree as parsed with transformers' extensions
    (loop controls, `{% generation %}`); a template that does not parse takes strings."""
    if server_kind == "sglang" and any(word in template for word in MEDIA_WORDS):
        return True
    from jinja2 import nodes

    from tokview.core.chat_template import compile_template

    try:
        tree = compile_template(template).environment.parse(template)
    except Exception:  # a template that does not compile: both servers then assume strings
        return False
    loops = list(tree.find_all(nodes.For))
    if server_kind == "sglang":
        holders = {"message", "msg", "m"}
    else:
        lists = _names_bound_to(tree, "messages")
        holders = {
            loop.target.name for loop in loops if isinstance(loop.target, nodes.Name) and _reads(loop.iter, lists)
        }
    return any(_reads(loop.iter, holders, "content") for loop in loops)


def _names_bound_to(tree: Any, name: str) -> set[str]:
    """`name` and every variable a `{% set %}` binds to it (or to a slice or filter of it), transitively."""
    from jinja2 import nodes

    names, grew = {name}, True
    while grew:
        grew = False
        for assign in tree.find_all(nodes.Assign):
            target = assign.target
            if isinstance(target, nodes.Name) and target.name not in names and _reads(assign.node, names):
                names.add(target.name)
                grew = True
    return names


def _reads(node: Any, names: set[str], key: str | None = None) -> bool:
    """Whether `node` is one of `names` (with `key`: its `[key]` or `.key`), through filters, tests and slices."""
    from jinja2 import nodes

    while True:
        if (isinstance(node, nodes.Filter | nodes.Test) and node.node is not None) or (
            isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice)
        ):
            node = node.node
        else:
            break
    if key is None:
        return isinstance(node, nodes.Name) and node.name in names
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const) and node.arg.value == key:
        return isinstance(node.node, nodes.Name) and node.node.name in names
    if isinstance(node, nodes.Getattr) and node.attr == key:
        return isinstance(node.node, nodes.Name) and node.node.name in names
    return False
