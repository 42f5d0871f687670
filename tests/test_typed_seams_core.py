"""Typed seams of the core: the typed views stay in step with what they describe."""

from __future__ import annotations

import dataclasses

from tokview.core.profiles import ModelProfile, ProfileChanges, get_profile


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
