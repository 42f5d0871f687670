"""A model-specific class (Qwen3's `Qwen2Tokenizer`) is read natively once the installed transformers built the same.

Each test has a cache folder of its own (`TOKVIEW_CACHE`), so its first load is always transformers'. Run on
both transformers lines by CI: transformers 5 rebuilds Qwen's pipeline in code, 4.57 loads the file.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_tokenizer_json import TEXTS, _assert_same, _copy

from tokview.core import tokenizer_equivalence as equivalence
from tokview.core.tokenizer import TokenizerAdapter, _load_with_transformers, load_tokenizer
from tokview.core.tokenizer_folder import TokenizerFolder
from tokview.core.tokenizer_json import TokenizerJson


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("TOKVIEW_CACHE", str(cache))
    return cache


def _verdicts(cache) -> dict:
    path = cache / "native-tokenizers.json"
    return json.loads(path.read_text()) if path.exists() else {}


def test_qwen3_reads_natively_after_transformers_built_the_same(tmp_path, qwen_tok_dir, own_cache):
    d = _copy(tmp_path, qwen_tok_dir, "qwen3")  # the folder as Qwen3 ships it: tokenizer_class Qwen2Tokenizer
    first = load_tokenizer(d)
    assert not isinstance(first.tok, TokenizerJson)  # nothing decided yet: transformers loads it
    assert list(_verdicts(own_cache).values()) == [True]
    second = load_tokenizer(d)
    assert isinstance(second.tok, TokenizerJson)
    reference = _load_with_transformers(TokenizerFolder.open(d), False)
    for thinking in (True, False):
        _assert_same(second, reference, template_kwargs={"enable_thinking": thinking})


def test_a_fresh_process_then_never_imports_transformers(tmp_path, qwen_tok_dir, own_cache):
    d = _copy(tmp_path, qwen_tok_dir, "qwen3")
    load_tokenizer(d)  # decides
    code = (
        "import sys\n"
        "from tokview.core.resolve import load_tokenizer_and_profile\n"
        f"tok, profile = load_tokenizer_and_profile({str(d)!r}, None)\n"
        "print(type(tok.tok).__name__, profile.name, 'transformers' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["TokenizerJson", "qwen3", "False"]


def test_an_edited_folder_is_decided_again(tmp_path, qwen_tok_dir, own_cache):
    d = _copy(tmp_path, qwen_tok_dir, "qwen3")
    load_tokenizer(d)
    assert isinstance(load_tokenizer(d).tok, TokenizerJson)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "model_max_length": 4096}))
    edited = load_tokenizer(d)
    assert not isinstance(edited.tok, TokenizerJson)  # another folder as far as the verdicts go
    assert edited.model_max_length == 4096
    assert len(_verdicts(own_cache)) == 2
    assert load_tokenizer(d).model_max_length == 4096  # and read natively from then on, with the edit


def test_a_verdict_of_differs_is_kept_and_not_paid_again(tmp_path, qwen_tok_dir, own_cache, monkeypatch):
    d = _copy(tmp_path, qwen_tok_dir, "qwen3")
    calls = []
    monkeypatch.setattr(equivalence, "same_tokenizer", lambda native, ref: calls.append(1) or False)
    for _ in range(2):
        assert not isinstance(load_tokenizer(d).tok, TokenizerJson)
    assert calls == [1]
    assert list(_verdicts(own_cache).values()) == [False]


def test_a_cache_that_cannot_be_written_loads_through_transformers_each_time(tmp_path, qwen_tok_dir, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("TOKVIEW_CACHE", str(blocker))
    d = _copy(tmp_path, qwen_tok_dir, "qwen3")
    for _ in range(2):  # no verdict is kept, so none lets the next load read it natively
        assert not isinstance(load_tokenizer(d).tok, TokenizerJson)


def test_an_unwritable_cache_skips_the_comparison(tmp_path, qwen_tok_dir, monkeypatch):
    """A verdict that cannot be kept would be paid on every load (+40% over transformers' own load)."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("TOKVIEW_CACHE", str(blocker))
    monkeypatch.setattr(equivalence, "same_tokenizer", lambda native, ref: pytest.fail("compared"))
    assert not isinstance(load_tokenizer(_copy(tmp_path, qwen_tok_dir, "qwen3")).tok, TokenizerJson)


def test_a_folder_edited_while_it_was_compared_keeps_no_verdict(tmp_path, qwen_tok_dir, own_cache, monkeypatch):
    """The verdict is for the files that were compared: a file that changed meanwhile (a download, a pull) would
    have tied "same" to content nobody compared, and every later load would have read it natively."""
    import tokview.core.tokenizer as tokenizer_module

    d = _copy(tmp_path, qwen_tok_dir, "qwen3")
    load = tokenizer_module._load_with_transformers

    def load_then_edit(folder, trust):
        loaded = load(folder, trust)
        cfg = json.loads((d / "tokenizer_config.json").read_text())
        (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "model_max_length": 4096}))
        return loaded

    monkeypatch.setattr(tokenizer_module, "_load_with_transformers", load_then_edit)
    load_tokenizer(d)
    assert _verdicts(own_cache) == {}
    monkeypatch.setattr(tokenizer_module, "_load_with_transformers", load)
    assert not isinstance(load_tokenizer(d).tok, TokenizerJson)  # decided now, on the files as they are
    assert list(_verdicts(own_cache).values()) == [True]


def test_a_change_to_the_comparing_code_decides_again(tmp_path, qwen_tok_dir, own_cache, monkeypatch):
    """tokview's version string outlives many commits: the key holds the source of the reading and comparing
    modules, so a fixed `TokenizerJson` or a stricter comparison is not overruled by an old verdict."""
    d = _copy(tmp_path, qwen_tok_dir, "qwen3")
    key = equivalence.verdict_key(TokenizerFolder.open(d))
    monkeypatch.setattr(equivalence, "_source_hash", ["another source"])
    assert equivalence.verdict_key(TokenizerFolder.open(d)) not in (None, key)


def test_named_templates_are_loaded_by_transformers(tmp_path, qwen_tok_dir, own_cache):
    """A request with tools renders by the template named `tool_use` (transformers, vLLM): the native reading knows
    only the default one, so it would have rendered tool prompts otherwise from the second load on."""
    d = _copy(tmp_path, qwen_tok_dir, "qwen3")
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    default = cfg.get("chat_template") or (d / "chat_template.jinja").read_text()
    (d / "chat_template.jinja").unlink(missing_ok=True)
    named = [{"name": "default", "template": default}, {"name": "tool_use", "template": "TOOLS {{ tools | length }}"}]
    (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": named}))
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    for _ in range(2):
        tok = load_tokenizer(d)
        assert not isinstance(tok.tok, TokenizerJson)
        assert tok.render_text([{"role": "user", "content": "hi"}], template_kwargs={"tools": tools}) == "TOOLS 1"
    assert _verdicts(own_cache) == {}


def test_no_home_folder_means_no_cache_and_a_clear_error_where_one_is_needed(tmp_path, qwen_tok_dir, monkeypatch):
    """A user id without a passwd entry (some containers) has no home: verdicts are not kept (transformers loads the
    folder), and what must be built on disk says how to name a folder."""
    from pathlib import Path

    from tokview.core.json_cache import NoCacheFolder, cache_folder, read_json_cache, write_json_cache

    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.delenv("TOKVIEW_CACHE", raising=False)
    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    assert not isinstance(load_tokenizer(_copy(tmp_path, qwen_tok_dir, "qwen3")).tok, TokenizerJson)
    with pytest.raises(NoCacheFolder, match="set TOKVIEW_CACHE"):
        cache_folder()
    assert read_json_cache(None) == {}
    write_json_cache(None, {"a": 1})  # nothing to write to: nothing happens


def test_cache_files_that_cannot_be_replaced_leave_no_temporary_file(tmp_path):
    from tokview.core.json_cache import read_json_cache, write_json_cache

    target = tmp_path / "cache" / "native-tokenizers.json"
    target.mkdir(parents=True)  # a folder where the file should be: os.replace fails
    write_json_cache(target, {"b": True})
    assert [p.name for p in target.parent.iterdir()] == ["native-tokenizers.json"]
    nested = tmp_path / "nested.json"
    nested.write_text("[" * 200_000)
    assert read_json_cache(nested) == {}


def test_a_class_that_builds_another_tokenizer_keeps_loading_through_transformers(tmp_path, kimi_tok_dir, own_cache):
    """Kimi's vocabulary under `Qwen2Tokenizer`: transformers 5 rebuilds it with Qwen's pre-tokenizer and
    normalizer (another tokenizer: the verdict is "differs"); 4.57 loads the file (the same: read natively).
    Either way every load gives transformers' ids."""
    import transformers

    d = _copy(tmp_path, kimi_tok_dir, "kimi-as-qwen", {"tokenizer_class": "Qwen2Tokenizer"})
    reference = _load_with_transformers(TokenizerFolder.open(d), False)
    for _ in range(2):
        tok = load_tokenizer(d)
        for text in TEXTS:
            assert tok.encode(text) == reference.encode(text), text
    rebuilds = int(transformers.__version__.split(".")[0]) >= 5
    assert isinstance(tok.tok, TokenizerJson) is not rebuilds
    assert list(_verdicts(own_cache).values()) == [not rebuilds]


def _native(d) -> TokenizerAdapter:
    native = TokenizerJson.from_folder(TokenizerFolder.open(d))
    assert native is not None
    return TokenizerAdapter(native, source=d)


class _AsTransformers:
    """A native tokenizer dressed as transformers' (a `backend_tokenizer`), with its pipeline edited."""

    def __init__(self, native: TokenizerJson, **components) -> None:
        from tokenizers import Tokenizer

        self._native = native
        self.backend_tokenizer = Tokenizer.from_str(native._tokenizer.to_str())
        for name, component in components.items():
            setattr(self.backend_tokenizer, name, component)
        native._tokenizer = self.backend_tokenizer  # its encodes and decodes follow the edit

    def __getattr__(self, name):
        return getattr(self._native, name)

    def __len__(self) -> int:
        return len(self._native)

    def __call__(self, *args, **kwargs):
        return self._native(*args, **kwargs)


def test_same_tokenizer_ignores_what_only_moves_offsets_and_sees_what_changes_ids(kimi_tok_dir):
    from tokenizers import decoders, normalizers, pre_tokenizers

    native = _native(kimi_tok_dir)
    offsets_only = _AsTransformers(
        _native(kimi_tok_dir).tok,
        pre_tokenizer=pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=True),
        decoder=decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    )
    assert equivalence.same_tokenizer(native, TokenizerAdapter(offsets_only, source=kimi_tok_dir))
    lowered = _AsTransformers(_native(kimi_tok_dir).tok, normalizer=normalizers.Lowercase())
    assert not equivalence.same_tokenizer(native, TokenizerAdapter(lowered, source=kimi_tok_dir))
    prefixed = _AsTransformers(
        _native(kimi_tok_dir).tok, pre_tokenizer=pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    )
    assert not equivalence.same_tokenizer(native, TokenizerAdapter(prefixed, source=kimi_tok_dir))
    cleaned = _AsTransformers(_native(kimi_tok_dir).tok)
    cleaned.clean_up_tokenization_spaces = True
    assert not equivalence.same_tokenizer(native, TokenizerAdapter(cleaned, source=kimi_tok_dir))
