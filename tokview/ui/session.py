"""What one app run works on: the store, the tokenizer and profile, the server; no Textual here.

Why a separate object: screens and workers share it (attributes down), and tests build it on a
temporary DuckDB file without going through the command line. The tokenizer loads lazily (it costs
about a second), always in a worker, never before the first paint.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokview.core.analysis import Analysis
    from tokview.core.profiles import ModelProfile
    from tokview.core.tokenizer import TokenizerAdapter
    from tokview.store import Store, StoredSample


@dataclass
class Session:
    store: "Store"
    tokenizer_dir: Path | None = None
    """None → the Kimi-layout tokenizer tokview builds itself."""
    profile_name: str | None = None
    """None → detected from the tokenizer."""
    server_url: str | None = None
    trust_remote_code: bool = False
    who: str | None = None
    _tokenizer: "TokenizerAdapter | None" = field(default=None, repr=False)
    _profile: "ModelProfile | None" = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def tokenizer(self) -> "TokenizerAdapter":
        with self._lock:
            if self._tokenizer is None:
                from tokview.core.tokenizer import load_tokenizer

                directory = self.tokenizer_dir
                if directory is None:
                    from tokview.core.kimi_layout import kimi_tokenizer_dir

                    directory = kimi_tokenizer_dir()
                self._tokenizer = load_tokenizer(directory, trust_remote_code=self.trust_remote_code)
            return self._tokenizer

    def profile(self) -> "ModelProfile":
        if self._profile is None:
            from tokview.core.profiles import detect_profile, get_profile

            self._profile = get_profile(self.profile_name) if self.profile_name else detect_profile(self.tokenizer())
        return self._profile

    def load(self, sample_id: str) -> tuple["StoredSample", "Analysis"]:
        """One stored sample and its analysis, derived from the ids exactly as the batch command does."""
        from tokview.core.analysis import analyze

        stored = self.store.load_sample(sample_id)
        return stored, analyze(stored.capture, self.profile(), self.tokenizer())
