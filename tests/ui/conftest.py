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


def fill(store, tokenizer, profile, n: int = 30) -> list[str]:
    """n samples over two runs: every third long (560+ ids), every fifth truncated; ids sortable by index."""
    from tokview.core.analysis import analyze

    ids = []
    for i in range(n):
        capture = examples.long_capture(tokenizer, 560 + i) if i % 3 == 0 else examples.short_capture()
        if i % 5 == 0:  # cut by the length limit: no stop id at its end (a stop id there would be a whole turn)
            capture.finish_reason, capture.matched_stop = "length", None
            if capture.output_ids and capture.output_ids[-1] in profile.stop_ids:
                capture.output_ids = capture.output_ids[:-1]
        sid = f"p{i:03d}@demo_gen0"
        store.put_sample(
            sid, f"p{i:03d}", "run-a" if i < n // 2 else "run-b", capture, analyze(capture, profile, tokenizer)
        )
        ids.append(sid)
    return ids


@pytest.fixture(scope="session")
def filled_store_file(tmp_path_factory, tokenizer, profile):
    """The filled store, made once per test process and closed (checkpointed: one file, no log): analysing and
    storing its 30 samples took ~0.45 s, paid again by each of ~150 tests; a copy takes milliseconds."""
    from tokview.store import Store

    path = tmp_path_factory.mktemp("filled") / "ui.duckdb"
    with Store(path) as s:
        fill(s, tokenizer, profile)
    return path


@pytest.fixture
def store(tmp_path, filled_store_file):
    """A store of its own for each test: a copy of the filled one."""
    import shutil

    from tokview.store import Store

    shutil.copyfile(filled_store_file, tmp_path / "ui.duckdb")
    with Store(tmp_path / "ui.duckdb") as s:
        yield s


@pytest.fixture
def make_app(store, tokenizer, profile):
    """An app on the filled store, with the tokenizer already loaded (no second load per test)."""
    from tokview.ui.app import TokviewApp
    from tokview.ui.config import UIConfig
    from tokview.ui.session import Session

    def make(config: UIConfig | None = None, server_url: str | None = None) -> TokviewApp:
        session = Session(store, tokenizer=tokenizer, profile=profile, server_url=server_url, who="tester")
        return TokviewApp(session, config)

    return make


@pytest.fixture(autouse=True)
def no_heap_collections(monkeypatch):
    """A full collection of pytest's heap takes about 0.25 s, once per screen that opens token views: the
    heap policy (ui/gc_pause.py) is tested by itself in test_gc_pause.py; elsewhere views still count in and out."""
    from tokview.ui import gc_pause

    monkeypatch.setattr(gc_pause, "collect_and_freeze", lambda: None)


@pytest.fixture(autouse=True)
def no_cursor_blink(monkeypatch):
    """A blinking cursor would make snapshots depend on timing."""
    from textual.widgets import Input

    monkeypatch.setattr(Input, "_toggle_cursor", lambda self: None)
