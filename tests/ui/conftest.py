"""Fixtures for the UI tests: the Kimi-layout tokenizer, example captures, a temporary store.

Hermetic: no user config (TOKVIEW_CONFIG points at a missing file), no hub, fixed terminal sizes.
"""

from __future__ import annotations

import os

import pytest

from tokview.core.analysis import analyze
from tokview.core.kimi_layout import kimi_tokenizer_dir
from tokview.core.profiles import get_profile
from tokview.core.tokenizer import load_tokenizer
from tokview.ui import examples

os.environ["HF_HUB_OFFLINE"] = "1"


@pytest.fixture(autouse=True)
def no_user_config(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKVIEW_CONFIG", str(tmp_path / "no-such-config.toml"))


@pytest.fixture(scope="session")
def tokenizer():
    return load_tokenizer(kimi_tokenizer_dir())


@pytest.fixture(scope="session")
def profile():
    return get_profile("kimi-k2.5")


@pytest.fixture(scope="session")
def short(tokenizer, profile):
    capture = examples.short_capture()
    return capture, analyze(capture, profile, tokenizer)
