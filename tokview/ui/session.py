"""What one app run works on: the store, the tokenizer and profile, the server; no Textual here.

Why a separate object: screens and workers share it (attributes down), and tests build it on a
temporary DuckDB file without going through the command line. Tokenizers load lazily (each costs
about a second), always in a worker, never before the first paint.

Which tokenizer and profile: what the user named (`--tokenizer`, `--profile`, or objects handed to the
constructor), else what the store's runs recorded, through `core.resolve.resolve_for_stored` as
`tokview show` and the exports do; a store holding Qwen3 and Kimi runs shows each sample with its own
run's tokenizer, so the app's findings agree with the stored codes. Each distinct tokenizer loads once.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokview.core.analysis import Analysis
    from tokview.core.profiles import ModelProfile
    from tokview.core.tokenizer import TokenizerAdapter
    from tokview.store import Store, StoredSample

_GIVEN = "<given>"
"""Cache key of a tokenizer or profile the user named: it applies to every run."""


class Session:
    def __init__(
        self,
        store: Store,
        *,
        tokenizer_dir: Path | None = None,
        profile_name: str | None = None,
        tokenizer: TokenizerAdapter | None = None,
        profile: ModelProfile | None = None,
        server_url: str | None = None,
        trust_remote_code: bool = False,
        who: str | None = None,
    ) -> None:
        """`tokenizer`/`profile`: already loaded objects (the demo, tests); they win over the names."""
        self.store = store
        self.tokenizer_dir = tokenizer_dir
        self.profile_name = profile_name
        self.server_url = server_url
        self.trust_remote_code = trust_remote_code
        self.who = who
        self._given_tokenizer = tokenizer
        self._given_profile = profile
        self._tokenizers: dict[str | None, TokenizerAdapter] = {}
        self._pairs: dict[tuple[str | None, str | None], tuple[TokenizerAdapter, ModelProfile]] = {}
        self._runs: dict[str, dict[str, Any]] | None = None
        self._missing_runs: set[str] = set()
        """run ids with no runs row when last looked up: misses are cached too."""
        self._lock = threading.Lock()

    # -- the server (generate, doctor) ------------------------------------------------------------
    @property
    def server_shown(self) -> str:
        """The server URL as the panels display it: without `user:password@` (those stay in the session). With
        none named, the server the store's latest run recorded (generate and doctor start from it)."""
        from tokview.secrets import redact_url
        from tokview.servers.urls import BadServerURL, public_url

        if not self.server_url:
            return self.recorded_server() or ""
        try:
            return public_url(self.server_url)
        except BadServerURL:
            return redact_url(self.server_url)  # shown as typed, password masked; the panel then says why it is bad

    def recorded_server(self) -> str | None:
        """The first server URL the store's latest run with one recorded (as stored: without credentials)."""
        for run in reversed(list(self._run_table(refresh=False).values())):
            for info in run.get("server_info") or []:
                if isinstance(info, dict) and info.get("url"):
                    return str(info["url"])
        return None

    def use_server(self, url: str) -> None:
        """The one server setting: a URL a panel ran against (as `server_for` returned it) is the one both
        panels show from now on."""
        self.server_url = url

    def server_for(self, typed: str) -> tuple[str, list[str]]:
        """(URL to connect to, notes about it) for what the user left or typed in a panel's URL box.

        The box shows `server_shown`; when it still names that server, the session's credentials go back
        on. Raises BadServerURL ("bad server URL …", or "give a server URL" for an empty box), like
        `validate_server_url`.
        """
        from tokview.servers.urls import BadServerURL, parse_server_url, server_url_notes, validate_server_url

        typed = typed.strip()
        if not typed:
            raise BadServerURL("give a server URL")
        validate_server_url(typed)
        if self.server_url and typed == self.server_shown and parse_server_url(typed).auth is None:
            typed = self.server_url
        return validate_server_url(typed), server_url_notes(typed)

    # -- the pair for new work (generate, doctor, stats) -----------------------------------------
    def tokenizer(self) -> TokenizerAdapter:
        return self._default()[0]

    def profile(self) -> ModelProfile:
        return self._default()[1]

    def _default(self) -> tuple[TokenizerAdapter, ModelProfile]:
        """The named pair, else the latest run's recorded one, else tokview's Kimi-layout default."""
        latest = next((r for r in reversed(self._run_table(refresh=False).values()) if r.get("tokenizer_dir")), {})
        return self.resolve(latest.get("tokenizer_dir"), latest.get("profile"))

    def export_pair(self, run: str | None) -> tuple[TokenizerAdapter, ModelProfile]:
        """The tokenizer and profile an export from the app uses: the objects handed in (the demo, tests),
        else what `tokview export` resolves for these flags (`commands.export.resolve_tokenizer`: the runs'
        recorded pair, a mix of vocabularies refused)."""
        if self._given_tokenizer is not None:
            return self._given_tokenizer, self._given_profile or self.for_run(run)[1]
        from tokview.commands.export import resolve_tokenizer

        return resolve_tokenizer(self.store, run, self.tokenizer_dir, self.trust_remote_code, self.profile_name)

    # -- stored samples -------------------------------------------------------------------------
    def for_sample(self, stored: StoredSample) -> tuple[TokenizerAdapter, ModelProfile]:
        """The pair to re-analyse one stored sample with: named, else its run's."""
        return self.for_run(stored.run_id, stored.profile)

    def for_run(self, run_id: str | None, sample_profile: str | None = None) -> tuple[TokenizerAdapter, ModelProfile]:
        """The pair for the samples of one run (those carrying `sample_profile`): named, else the run's."""
        run = self._run_table(refresh=False).get(run_id) if run_id else None
        if run is None and run_id and run_id not in self._missing_runs:
            run = self._run_table(refresh=True).get(run_id)  # a run generated since the app opened
            if run is None:  # no runs row at all (an import, an old store): re-read once, not on every open
                self._missing_runs.add(run_id)
        run = run or {}
        name = sample_profile or run.get("profile")
        return self.resolve(
            run.get("tokenizer_dir"), name, run.get("profile_def") if name == run.get("profile") else None
        )

    def load(self, sample_id: str) -> tuple[StoredSample, Analysis, TokenizerAdapter, ModelProfile]:
        """One stored sample, its analysis and the tokenizer/profile it was derived with (as batch does)."""
        from tokview.core.analysis import analyze

        stored = self.store.load_sample(sample_id)
        tokenizer, profile = self.for_sample(stored)
        return stored, analyze(stored.capture, profile, tokenizer).with_recorded(stored.findings), tokenizer, profile

    def resolve(
        self, recorded_tokenizer_dir: str | None, recorded_profile: str | None, recorded_profile_def: object = None
    ) -> tuple[TokenizerAdapter, ModelProfile]:
        """Cached per (tokenizer, profile); a tokenizer shared by two profiles loads once. A recorded profile
        is keyed by its whole definition too: two runs' .toml profiles may share a name."""
        tok_key = _GIVEN if self._given_tokenizer is not None or self.tokenizer_dir else recorded_tokenizer_dir
        prof_key = recorded_profile
        if self._given_profile is not None or self.profile_name:
            prof_key = _GIVEN
        elif recorded_profile_def:
            prof_key = f"{recorded_profile}\0{json.dumps(recorded_profile_def, sort_keys=True)}"
        with self._lock:
            pair = self._pairs.get((tok_key, prof_key))
            if pair is None:
                pair = self._resolve(tok_key, recorded_tokenizer_dir, recorded_profile, recorded_profile_def)
                self._pairs[(tok_key, prof_key)] = pair
            return pair

    def _resolve(
        self,
        tok_key: str | None,
        recorded_tokenizer_dir: str | None,
        recorded_profile: str | None,
        recorded_profile_def: object = None,
    ) -> tuple[TokenizerAdapter, ModelProfile]:
        from tokview.core.resolve import resolve_for_stored

        tokenizer = self._given_tokenizer if self._given_tokenizer is not None else self._tokenizers.get(tok_key)
        tokenizer, profile = resolve_for_stored(
            self.tokenizer_dir,
            self.profile_name,
            recorded_tokenizer_dir=recorded_tokenizer_dir,
            recorded_profile=recorded_profile,
            trust_remote_code=self.trust_remote_code,
            tokenizer=tokenizer,
            model_profile=self._given_profile,
            recorded_profile_def=recorded_profile_def,
        )
        self._tokenizers.setdefault(tok_key, tokenizer)
        return tokenizer, profile

    def _run_table(self, refresh: bool) -> dict[str, dict[str, Any]]:
        """run_id → the runs row (tokenizer_dir, profile), in start order; re-read when a new run shows up."""
        if self._runs is None or refresh:
            self._runs = {r["run_id"]: r for r in self.store.runs()}
        return self._runs
