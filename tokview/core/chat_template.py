"""Render a chat template the way transformers' `apply_chat_template` does, without importing transformers.

Why: tokenizers tokview reads natively (Kimi's tiktoken one) still have to turn messages into exactly the
text a server renders. transformers compiles templates in a sandboxed Jinja environment with
`trim_blocks`/`lstrip_blocks`, loop controls, a `{% generation %}` tag, a `tojson` filter that does not
escape HTML, `raise_exception` and `strftime_now`, and passes the tokenizer's special tokens
(`bos_token`, `eos_token`, …) as variables. This module sets up the same environment (checked against
transformers' own rendering in tests/test_tokenizer_native.py), and skips the ~1 s transformers import.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable, Mapping
from datetime import datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jinja2 import Template
    from jinja2.bccache import BytecodeCache
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

    try:
        name = hashlib.sha256(source.encode("utf-8")).hexdigest()[:32]
        cache = _bytecode_cache(jinja2.__version__)
    except UnicodeEncodeError:  # a lone surrogate (JSON escapes allow one): Jinja's checksum would refuse it
        name, cache = "chat_template", None
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[GenerationTag, loopcontrols],
        loader=jinja2.DictLoader({name: source}),
        bytecode_cache=cache,
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.get_template(name)


def _quiet_cache(inner: BytecodeCache) -> BytecodeCache:
    """`inner`, except that a cache file it cannot read or write means compiling (a full disk, a read-only home,
    a torn file), never an error in the render."""
    from jinja2.bccache import Bucket, BytecodeCache

    class QuietBytecodeCache(BytecodeCache):
        def load_bytecode(self, bucket: Bucket) -> None:
            try:
                inner.load_bytecode(bucket)
            except Exception:
                bucket.reset()

        def dump_bytecode(self, bucket: Bucket) -> None:
            try:
                inner.dump_bytecode(bucket)
            except OSError:
                pass

    return QuietBytecodeCache()


TEMPLATE_CODE = "chat-template-code-1"
"""Names the compiled templates' folder; changed with anything above that changes the code Jinja compiles."""


@lru_cache(maxsize=1)
def _bytecode_cache(jinja_version: str) -> BytecodeCache | None:
    """Jinja's own cache of compiled templates (its Python code, marshalled; Jinja checks the source's hash and the
    Python version), in tokview's cache folder: compiling Qwen3's template took ~38 ms of every run's start. Each
    template is named by its source's hash, so templates do not evict each other. None when there is no folder."""
    from jinja2 import FileSystemBytecodeCache

    from tokview.core.json_cache import cache_path

    folder = cache_path(f"{TEMPLATE_CODE}-jinja{jinja_version}-{sys.implementation.cache_tag}")
    if folder is None:
        return None
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        status = folder.stat()
    except OSError:
        return None  # compiled each time
    if status.st_uid != os.getuid() or status.st_mode & 0o022:
        return None  # Jinja runs what is in it: only a folder no one else can write (as its own default requires)
    return _quiet_cache(FileSystemBytecodeCache(str(folder)))


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
