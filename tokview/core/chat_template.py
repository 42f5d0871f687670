"""Render a chat template the way transformers' `apply_chat_template` does, without importing transformers.

Why: tokenizers tokview reads natively (Kimi's tiktoken one) still have to turn messages into exactly the
text a server renders. transformers compiles templates in a sandboxed Jinja environment with
`trim_blocks`/`lstrip_blocks`, loop controls, a `{% generation %}` tag, a `tojson` filter that does not
escape HTML, `raise_exception` and `strftime_now`, and passes the tokenizer's special tokens
(`bos_token`, `eos_token`, …) as variables. This module sets up the same environment (checked against
transformers' own rendering in tests/test_tokenizer_native.py), and skips the ~1 s transformers import.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any


def _raise_exception(message: str) -> None:
    import jinja2

    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def compile_template(source: str):
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(Extension):
        """`{% generation %}…{% endgeneration %}` marks assistant text for masks; rendering keeps the body."""

        tags: set[str] = {"generation"}  # noqa: RUF012 - jinja2 declares it a plain set[str] on Extension

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def render_chat_template(
    source: str,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool,
    special_tokens: dict[str, Any] | None = None,
    tools: list[dict] | None = None,
    documents: list[dict] | None = None,
    **kwargs: Any,
) -> str:
    """The prompt text for `messages`; `kwargs` (e.g. `thinking=False`) override special-token variables."""
    variables = {**(special_tokens or {}), **kwargs}
    return compile_template(source).render(
        messages=messages, tools=tools, documents=documents, add_generation_prompt=add_generation_prompt, **variables
    )


def render_tokenizer_template(
    chat_template: str | None,
    conversation: list[dict[str, Any]],
    *,
    special_tokens: dict[str, Any],
    tools: list[dict] | None,
    add_generation_prompt: bool,
    options: dict[str, Any],
) -> str:
    """The body of a native tokenizer's `apply_chat_template` (tokenizer.json and Kimi tiktoken readers share it):
    refuse a tokenizer without a template, drop transformers' `return_dict`, render with the special tokens."""
    if not chat_template:
        raise ValueError("this tokenizer has no chat template")
    options.pop("return_dict", None)
    return render_chat_template(
        chat_template,
        conversation,
        add_generation_prompt=add_generation_prompt,
        special_tokens=special_tokens,
        tools=tools,
        **options,
    )
