"""The messages a server's template renders, which are not always the request's: content a harness sends as text
parts, or as null beside its tool calls (the OpenAI SDK's own shape), is made a string first.

A template that writes `message.content` as a string (Qwen3's, GLM's: "string" content) is handed
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
    """`messages` as the server hands them to its template (`template`: its chat template, to tell whether it loops
    over content parts). The list itself when nothing changes (the caller's cache keys and identity checks keep)."""
    if not any(isinstance(m, dict) and _changes(m, server_kind) for m in messages):
        return messages
    parts_content = loops_over_content(template or "")
    return [_served(m, server_kind, parts_content) if isinstance(m, dict) else m for m in messages]


def _changes(message: dict[str, Any], server_kind: str | None) -> bool:
    content = message.get("content")
    if content is None or isinstance(content, list):  # null or missing: both servers render ""
        return True
    return server_kind == "sglang" and any(value is None for value in message.values())


def _served(message: dict[str, Any], server_kind: str | None, parts_content: bool) -> dict[str, Any]:
    content = message.get("content")
    if server_kind == "sglang":
        out = {k: v for k, v in message.items() if v is not None}
        out["content"] = "" if content is None else content
        if isinstance(content, list) and (not parts_content or (message.get("role") == "tool" and _only_text(content))):
            out["content"] = SGLANG_SEPARATOR.join(_texts(content))
        return out
    out = dict(message)
    if content is None:
        out["content"] = [] if parts_content else ""
    elif isinstance(content, list) and (not parts_content or (message.get("role") == "tool" and _only_text(content))):
        out["content"] = VLLM_SEPARATOR.join(_texts(content))
    return out


def _only_text(parts: list[Any]) -> bool:
    """Text parts (or bare strings) alone: a tool result both servers join whatever the template."""
    return all(isinstance(p, str) or (isinstance(p, dict) and p.get("type") == "text") for p in parts)


def _texts(parts: list[Any]) -> list[str]:
    """The text of each text part (and of a bare string, which vLLM takes as one)."""
    out = []
    for part in parts:
        if isinstance(part, str):
            out.append(part)
        elif isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
            out.append(part["text"])
    return out


@lru_cache(maxsize=32)
def loops_over_content(template: str) -> bool:
    """Whether the template loops over a message's content (`{% for part in message['content'] %}`): it renders
    content parts itself ("openai" content, in vLLM's and SGLang's words), so they reach it as parts. Read from the
    template's syntax tree, as both servers detect it; a template that does not parse counts as taking strings."""
    import jinja2
    from jinja2 import nodes

    try:
        tree = jinja2.Environment().parse(template)
    except jinja2.TemplateError:
        return False
    for loop in tree.find_all(nodes.For):
        target = loop.iter
        while isinstance(target, nodes.Filter) and target.node is not None:  # `message['content'] | list`
            target = target.node
        if isinstance(target, nodes.Getitem) and isinstance(target.arg, nodes.Const) and target.arg.value == "content":
            return True
        if isinstance(target, nodes.Getattr) and target.attr == "content":
            return True
    return False
