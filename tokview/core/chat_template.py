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
from collections.abc import Callable, Mapping
from datetime import datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jinja2 import Template
    from jinja2.nodes import Node
    from jinja2.parser import Parser


def _raise_exception(message: str) -> None:
    import jinja2

    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: object,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def compile_template(source: str) -> Template:
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(Extension):
        """`{% generation %}…{% endgeneration %}` marks assistant text for masks; rendering keeps the body."""

        tags: set[str] = {"generation"}  # noqa: RUF012 - jinja2 declares it a plain set[str] on Extension

        def parse(self, parser: Parser) -> Node:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Callable[[], str]) -> str:
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
    special_tokens: Mapping[str, object] | None = None,
    tools: object = None,
    **variables: object,
) -> str:
    """The prompt text for `messages`; `variables` (e.g. `thinking=False`, `documents=[…]`) override
    special-token variables. `documents` is None unless given, as transformers passes it."""
    context: dict[str, object] = {**(special_tokens or {}), **variables}
    context.setdefault("documents", None)
    return compile_template(source).render(
        messages=messages, tools=tools, add_generation_prompt=add_generation_prompt, **context
    )


def render_tokenizer_template(
    chat_template: str | None,
    conversation: list[dict[str, Any]],
    *,
    special_tokens: Mapping[str, object],
    tools: object,
    add_generation_prompt: bool,
    options: dict[str, object],
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
