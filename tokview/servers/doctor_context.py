"""What one doctor check sees and writes: the server, its endpoint pair, the settings, and the verdicts.

Its own module so the checks (doctor_checks.py) and the command that runs them (doctor.py) both import
it and neither imports the other's internals.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, TypeVar

from tokview.core.analysis import analyze
from tokview.core.finding_rules import Finding
from tokview.core.profiles import ModelProfile
from tokview.core.record import Capture
from tokview.servers.capture import chat_capture, raw_capture
from tokview.servers.errors import CaptureFailed, IdsNotReturned
from tokview.servers.http import ServerClient
from tokview.servers.info import ServerInfo
from tokview.servers.registry import ServerChoice, choose
from tokview.servers.request import CaptureRequest, resolve_settings
from tokview.servers.retry import GaveUp, RetryPolicy

T = TypeVar("T")

if TYPE_CHECKING:
    from tokview.core.tokenizer import TokenizerAdapter

QUESTION = [{"role": "user", "content": "What is 6 times 7?"}]
STATUSES = ("ok", "fail", "warn", "skip")


@dataclass
class DoctorCheck:
    status: str
    """ok | fail | warn | skip"""
    title: str
    detail: str
    recommendation: str = ""

    @property
    def ok(self) -> bool | None:
        return {"ok": True, "fail": False}.get(self.status)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "status": self.status,
            "title": self.title,
            "detail": self.detail,
            "recommendation": self.recommendation,
        }


@dataclass
class CountingPolicy(RetryPolicy):
    """The doctor's retry policy: any policy's, and every request it gave up on (timed out, 5xx, the connection
    lost, past the retries) noted in `gave_up`. A server that stalled after its first answers had its later checks
    skipped, and the doctor said "no blocking problems" and exited 0: a `doctor && batch` gate let it through."""

    gave_up: list[str] = field(default_factory=list)

    async def run(
        self,
        attempt_fn: Callable[[], Awaitable[T]],
        on_retryable: Callable[[Any], None] | None = None,
        *,
        on_retry: Callable[[Any], None] | None = None,
    ) -> T:
        try:
            return await super().run(attempt_fn, on_retryable, on_retry=on_retry)
        except GaveUp as exc:
            self.gave_up.append(exc.reason)
            raise

    @classmethod
    def like(cls, policy: RetryPolicy) -> CountingPolicy:
        return cls(**{f.name: getattr(policy, f.name) for f in fields(RetryPolicy)})


VOCABULARY_TITLE = "Vocabulary"
"""The check `DoctorContext.check_vocabulary` adds."""


@dataclass
class DoctorContext:
    """The running doctor, as a check sees it: ask the server (`raw`, `chat`), judge (`analysis`), say (`add`).

    `choice` is the endpoint pair of the server's kind (None when the probe could not tell SGLang from vLLM).
    """

    client: ServerClient
    policy: RetryPolicy
    info: ServerInfo
    profile: ModelProfile
    tokenizer: TokenizerAdapter | None
    thinking: bool
    checks: list[DoctorCheck] = field(default_factory=list)
    settings: dict[str, Any] = field(init=False)
    request: CaptureRequest = field(init=False)
    choice: ServerChoice | None = field(init=False)
    policy_gave_up: list[str] = field(init=False, default_factory=list)
    """The requests the policy gave up on (`CountingPolicy`): the report's, to say which checks could not run."""
    ids_not_returned: bool = field(init=False, default=False)
    """A probe was answered without the id field it asked for (`IdsNotReturned`), not failed."""
    other_vocabulary: str | None = field(init=False, default=None)
    """Why the server's ids are not this tokenizer's (`read_vocabulary`), else None: the checks that read ids by this
    tokenizer's layout are skipped then (they blamed the server's template, parser or version for it)."""

    def __post_init__(self) -> None:
        self.policy = counting = CountingPolicy.like(self.policy)
        self.policy_gave_up = counting.gave_up
        self.settings = resolve_settings(
            {"temperature": 0.0, "max_new_tokens": 256, "thinking": self.thinking, "seed": 0}, self.profile
        )
        self.request = CaptureRequest(messages=QUESTION, mode="dual")
        try:
            self.choice = choose("auto", self.info)
        except CaptureFailed:
            self.choice = None

    def add(self, status: str, title: str, detail: str, recommendation: str = "") -> None:
        scrub = self.client.secrets.scrub  # details quote server answers, which may echo a key
        self.checks.append(DoctorCheck(status, title, scrub(detail), scrub(recommendation)))

    async def attempt(self, fn: Callable[[], Awaitable[T]]) -> tuple[T | None, str | None]:
        """(result, None) or (None, why): a failed request is evidence for a check, never the doctor's end."""
        if self.choice is None:
            return None, "the server kind is unknown"
        try:
            return await self.policy.run(fn), None
        except CaptureFailed as exc:
            self.ids_not_returned = self.ids_not_returned or isinstance(exc, IdsNotReturned)
            return None, exc.reason

    async def raw(self, skip_special_tokens: bool = False) -> Capture:
        assert self.choice is not None
        cap = await raw_capture(
            self.client,
            self.info,
            choice=self.choice,
            request=self.request,
            settings=self.settings,
            tokenizer=self.tokenizer,
            skip_special_tokens=skip_special_tokens,
        )
        cap.messages, cap.settings = QUESTION, {**self.settings, "backend": self.choice.name, "mode": "raw"}
        return cap

    async def chat(self) -> tuple[Capture, list[int] | None]:
        assert self.choice is not None
        got = await chat_capture(self.client, self.info, self.choice, self.request, self.settings, require_ids=False)
        got.capture.messages = QUESTION
        got.capture.settings = {**self.settings, "backend": self.choice.name, "mode": "chat"}
        return got.capture, got.returned_ids

    def read_vocabulary(self, *captures: Capture | None) -> None:
        """Set `other_vocabulary` from the probes' answers: an id this tokenizer lacks, or ids whose decode holds
        next to none of the words the server said of them (batch's first-answers test: a Qwen3 server read with the
        Kimi layout, whose ids it all holds)."""
        from tokview.batch.answer_words import answer_ids, read_back

        tok = self.tokenizer
        for cap in captures:
            if tok is None or cap is None:
                continue
            lacking = next((i for i in answer_ids(cap) if not tok.has_id(i)), None)
            if lacking is not None:
                self.other_vocabulary = f"id {lacking} is none of its ids"
                return
            if read_back(cap, tok)[0] is False:
                self.other_vocabulary = "the answer's ids read as other text than the server said"
                return

    def check_vocabulary(self) -> None:
        """A failed check of its own when the server's ids are not this tokenizer's: the checks it skips could fail
        on it (a doctor that only skipped them passed such a tokenizer, exit 0, where the server returned no prompt
        ids for "Local tokenizer" to compare)."""
        if self.other_vocabulary is not None:
            self.add(
                "fail",
                VOCABULARY_TITLE,
                f"the server's ids are not this tokenizer's: {self.other_vocabulary}",
                "give doctor (and batch) the served model's tokenizer folder (--tokenizer DIR)",
            )

    def skip_on_other_vocabulary(self, title: str) -> bool:
        """Said as skipped when the server's ids are not this tokenizer's (True: the caller returns)."""
        if self.other_vocabulary is None:
            return False
        self.add("skip", title, f"skipped: the server's ids are not this tokenizer's (see {VOCABULARY_TITLE})")
        return True

    def analysis(self, cap: Capture) -> dict[str, str]:
        return {f.code: f.detail for f in self.findings(cap)}

    def findings(self, cap: Capture) -> list[Finding]:
        """Every finding a batch would store for this probe's answer."""
        return list(analyze(cap, self.profile, self.tokenizer).findings)

    def name(self, token_id: int) -> str:
        if self.tokenizer is None:
            return str(token_id)
        return f"{token_id} {self.tokenizer.piece_text(token_id)}"
