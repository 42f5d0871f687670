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
        return self._resolved()[0]

    def profile(self) -> "ModelProfile":
        return self._resolved()[1]

    def _resolved(self) -> tuple["TokenizerAdapter", "ModelProfile"]:
        """Loaded once, on first use (in a worker), exactly as the batch command resolves them."""
        with self._lock:
            if self._tokenizer is None or self._profile is None:
                from tokview.core.resolve import resolve_tokenizer_and_profile

                self._tokenizer, self._profile = resolve_tokenizer_and_profile(
                    self.tokenizer_dir, self.profile_name, trust_remote_code=self.trust_remote_code,
                    tokenizer=self._tokenizer, model_profile=self._profile)
            return self._tokenizer, self._profile

    def load(self, sample_id: str) -> tuple["StoredSample", "Analysis"]:
        """One stored sample and its analysis, derived from the ids exactly as the batch command does."""
        from tokview.core.analysis import analyze

        stored = self.store.load_sample(sample_id)
        return stored, analyze(stored.capture, self.profile(), self.tokenizer())
