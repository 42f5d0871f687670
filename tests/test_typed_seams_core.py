"""Typed seams of the core: the typed views stay in step with what they describe."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from tokview.core.profiles import ModelProfile, ProfileChanges, get_profile
from tokview.core.tokenizer import TokenizerAdapter, TokenizerError
from tokview.core.tokenizer_folder import TokenizerFolder
from tokview.core.tokenizer_json import TokenizerJson


def test_profile_changes_names_every_profile_field_with_its_type() -> None:
    """`with_overrides(**changes)` is checked against `ProfileChanges`: a field added to the profile and not there
    could not be overridden without a type error."""
    fields = {f.name: f.type for f in dataclasses.fields(ModelProfile)}
    changes = {name: ref.__forward_arg__ for name, ref in ProfileChanges.__annotations__.items()}
    assert changes == fields


def test_with_overrides_changes_only_the_named_fields() -> None:
    qwen = get_profile("qwen3")
    changed = qwen.with_overrides(stop_ids=(1, 2), max_length=99)
    assert (changed.stop_ids, changed.max_length) == ((1, 2), 99)
    assert dataclasses.replace(changed, stop_ids=qwen.stop_ids, max_length=qwen.max_length) == qwen


class _IdsForText(TokenizerJson):
    """The tokenizer.json reader, but its template render ignores `tokenize=False` (what a careless tokenizer class does)."""

    def apply_chat_template(
        self,
        conversation: list[dict[str, Any]],
        tools: object = None,
        tokenize: bool = False,
        add_generation_prompt: bool = False,
        **kwargs: object,
    ) -> str | list[int]:
        return super().apply_chat_template(
            conversation, tools, tokenize=True, add_generation_prompt=add_generation_prompt, **kwargs
        )


def test_a_render_that_gives_ids_instead_of_text_is_a_tokenizer_error(kimi_tok_dir: Path) -> None:
    """`TokenizerLike.apply_chat_template` may give ids; a text render that got them says so, instead of
    handing a list on as the prompt text."""
    tok = _IdsForText.from_folder(TokenizerFolder.open(kimi_tok_dir))
    assert isinstance(tok, _IdsForText)
    adapter = TokenizerAdapter(tok, source=kimi_tok_dir)
    with pytest.raises(TokenizerError, match="chat template gave list, not text"):
        adapter.render_text([{"role": "user", "content": "hi"}])
