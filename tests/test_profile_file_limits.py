"""A profile file that tokview cannot use is refused in one line when it is read: an empty or out-of-range id, a
symlink loop, values nested past what TOML's reader takes; and its dates and times, at any depth, become text."""

from __future__ import annotations

import json

import pytest

from tokview.core.profiles import ProfileError, load_profile_toml


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("stop_ids = []", "stop_ids is empty"),
        ("stop_ids = [4294967296]", "stop_ids 4294967296 is not a token id"),
        ("think_close_id = 9223372036854775807", "think_close_id 9223372036854775807 is not a token id"),
        ("think_open_id = -1", "think_open_id -1 is not a token id"),
    ],
)
def test_ids_a_tokenizer_cannot_look_up_are_refused(tmp_path, body, message):
    path = tmp_path / "p.toml"
    path.write_text(f'base = "kimi-k2.5"\n{body}\n')
    with pytest.raises(ProfileError, match=message):  # past 2^32 a tokenizer's lookup overflowed (exit 70)
        load_profile_toml(path)


def test_a_symlink_loop_and_values_nested_too_deep_are_refused(tmp_path):
    (tmp_path / "a.toml").symlink_to("b.toml")
    (tmp_path / "b.toml").symlink_to("a.toml")
    with pytest.raises(ProfileError, match="symlink loop"):
        load_profile_toml(tmp_path / "a.toml")
    deep = tmp_path / "deep.toml"
    deep.write_text("a = " + "[" * 2000 + "]" * 2000 + "\n")
    with pytest.raises(ProfileError, match="too deep"):
        load_profile_toml(deep)


def test_dates_and_times_in_default_kwargs_are_text_at_any_depth(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text('base = "kimi-k2.5"\nname = "x"\n[default_kwargs]\nt = 07:32:00\nd = {when = 2025-01-01}\n')
    kwargs = load_profile_toml(path).default_kwargs
    assert kwargs == {"t": "07:32:00", "d": {"when": "2025-01-01"}}
    json.dumps(kwargs)  # a run's identity writes them down: a time crashed `batch` and `tokenize` (exit 70)


def test_a_profile_file_that_starts_with_a_bom_is_read(tmp_path):
    """As an editor on Windows saves it: refused as "Invalid statement (at line 1, column 1)"."""
    path = tmp_path / "p.toml"
    path.write_bytes(b'\xef\xbb\xbfbase = "kimi-k2.5"\nname = "mine"\n')
    assert load_profile_toml(path).name == "mine"
