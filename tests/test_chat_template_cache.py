"""Compiled chat templates are kept in tokview's cache folder (Jinja's bytecode cache), and a cache that cannot be
read or written only means compiling again: the render is the same either way."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tokview.core import chat_template

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2+2? <think> is text here"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And 3+3?"},
]


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A cache folder of this test's own, and no template or cache object remembered from other tests."""
    monkeypatch.setenv("TOKVIEW_CACHE", str(tmp_path / "cache"))
    chat_template.compile_template.cache_clear()
    chat_template._bytecode_cache.cache_clear()
    yield tmp_path / "cache"
    chat_template.compile_template.cache_clear()
    chat_template._bytecode_cache.cache_clear()


def render(source: str) -> str:
    return chat_template.render_chat_template(source, MESSAGES, add_generation_prompt=True)


def compiled_files(cache):
    return sorted(p for p in cache.rglob("*") if p.is_file() and not p.name.endswith(".tmp"))


def test_a_template_compiled_once_is_read_back_and_renders_the_same(fresh, qwen_tok_dir):
    from tokview.core.tokenizer_folder import TokenizerFolder

    source = TokenizerFolder.open(qwen_tok_dir).chat_template()
    assert source
    first = render(source)
    files = compiled_files(fresh)
    assert len(files) == 1
    chat_template.compile_template.cache_clear()  # a new process: compiled code comes from the file
    calls = []
    real = chat_template._quiet_cache

    def counting(inner):
        cache = real(inner)
        load = cache.load_bytecode

        def load_bytecode(bucket):
            load(bucket)
            calls.append(bucket.code is not None)

        cache.load_bytecode = load_bytecode
        return cache

    chat_template._bytecode_cache.cache_clear()
    original = chat_template._quiet_cache
    chat_template._quiet_cache = counting
    try:
        assert render(source) == first
    finally:
        chat_template._quiet_cache = original
    assert calls == [True]  # found and used


def test_two_templates_are_kept_apart(fresh, qwen_tok_dir, kimi_tok_dir):
    from tokview.core.tokenizer_folder import TokenizerFolder

    qwen = TokenizerFolder.open(qwen_tok_dir).chat_template()
    kimi = TokenizerFolder.open(kimi_tok_dir).chat_template()
    assert qwen and kimi and qwen != kimi
    expected = {qwen: render(qwen), kimi: render(kimi)}
    assert len(compiled_files(fresh)) == 2
    chat_template.compile_template.cache_clear()
    assert {s: render(s) for s in (kimi, qwen)} == expected


def test_a_torn_or_foreign_cache_file_is_compiled_again(fresh):
    source = (
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<a>{% endif %}"
    )
    expected = render(source)
    (only,) = compiled_files(fresh)
    for garbage in (b"", b"j2garbage", only.read_bytes()[:20], os.urandom(200)):
        only.write_bytes(garbage)
        chat_template.compile_template.cache_clear()
        assert render(source) == expected


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_cache_folder_still_renders(fresh):
    fresh.mkdir(parents=True)
    fresh.chmod(0o500)
    try:
        assert render("{{ messages[0].content }}") == "Be brief."
    finally:
        fresh.chmod(0o700)


def test_a_cache_folder_that_is_a_file_still_renders(fresh):
    fresh.parent.mkdir(parents=True, exist_ok=True)
    fresh.write_text("not a folder")
    assert render("{{ messages[1].role }}") == "user"


def test_a_cache_folder_that_cannot_take_files_still_renders(fresh, monkeypatch):
    """A full disk or a folder taken away after the cache was set up: the write fails, the render does not."""
    source = "{{ messages | length }}"
    chat_template._bytecode_cache(__import__("jinja2").__version__)  # set up while the folder can be made
    for p in fresh.rglob("*"):
        if p.is_dir():
            p.chmod(0o700)
    import tempfile

    def refuse(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tempfile, "NamedTemporaryFile", refuse)
    assert render(source) == "4"


def test_another_process_reads_what_this_one_compiled(fresh, qwen_tok_dir):
    from tokview.core.tokenizer_folder import TokenizerFolder

    source = TokenizerFolder.open(qwen_tok_dir).chat_template()
    expected = render(source)
    code = (
        "import sys; from tokview.core.chat_template import render_chat_template as r; "
        f"sys.stdout.write(r(sys.stdin.read(), {MESSAGES!r}, add_generation_prompt=True))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], input=source, capture_output=True, text=True, check=True, env=os.environ
    )
    assert out.stdout == expected


def test_a_template_holding_a_lone_surrogate_still_renders(fresh):
    """JSON escapes let a template hold one; Jinja's cache checksum cannot encode it, so it is compiled each time."""
    assert render("{{ '\\ud800' }}x") == "\ud800x"


def test_a_cache_folder_others_can_write_is_not_used(fresh):
    """Jinja runs what the folder holds: one that is group- or world-writable is left alone."""
    import jinja2

    folder = fresh / f"{chat_template.TEMPLATE_CODE}-jinja{jinja2.__version__}-{sys.implementation.cache_tag}"
    folder.mkdir(parents=True)
    folder.chmod(0o777)
    assert chat_template._bytecode_cache(jinja2.__version__) is None
    assert render("{{ messages[0].content }}") == "Be brief."
    assert compiled_files(fresh) == []
