"""`tokview doctor`: probe one server and say, in plain words, what it does with token ids.

Each check answers one question a person training a drafter must get right (which id fields come
back where, whether the template pre-fills the think opener, which reasoning field the parser fills
and which ids it hides, whether output_ids are honest, whether skip_special_tokens rewrites text,
whether the local tokenizer agrees with the server), from real requests, judged by the same
`analyze` the rest of tokview uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tokview.core.analysis import analyze
from tokview.core.profiles import BUILTIN_PROFILES, ModelProfile, ProfileError, detect_profile, get_profile
from tokview.core.record import Capture
from tokview.servers.capture import chat_capture, effective_backend, raw_capture
from tokview.servers.errors import CaptureFailed
from tokview.servers.features import detect
from tokview.servers.http import ServerClient
from tokview.servers.info import ServerInfo
from tokview.servers.request import CaptureRequest, resolve_settings
from tokview.servers.retry import RetryPolicy
from tokview.servers.sglang import chat_ids
from tokview.servers.urls import Secrets

if TYPE_CHECKING:
    from tokview.core.tokenizer import TokenizerAdapter

QUESTION = [{"role": "user", "content": "What is 6 times 7?"}]
SYMBOLS = {"ok": "✓", "fail": "✗", "warn": "!", "skip": "-"}


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
class DoctorReport:
    url: str
    info: ServerInfo
    profile: ModelProfile | None
    tokenizer_name: str | None
    checks: list[DoctorCheck] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What tokview changed about the URL it was given (e.g. a dropped trailing /v1)."""
    secrets: Secrets = field(default_factory=Secrets, repr=False)
    """Masked in everything the report prints: any field may quote the server, which may echo them."""

    @property
    def failed(self) -> bool:
        return any(c.status == "fail" for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return _scrubbed(self._dict(), self.secrets)

    def _dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "kind": self.info.kind,
            "version": self.info.version,
            "model": self.info.model,
            "simulator": bool(self.info.features.get("simulator")),
            "profile": self.profile.name if self.profile else None,
            "tokenizer": self.tokenizer_name,
            "max_model_len": self.info.max_model_len,
            "features": dict(self.info.features),
            "ok": not self.failed,
            "notes": list(self.notes),
            "checks": [c.to_dict() for c in self.checks],
        }

    def render_text(self) -> str:
        lines = [
            f"tokview doctor: {self.url}",
            f"  profile {self.profile.name if self.profile else '(none)'}, "
            f"tokenizer {self.tokenizer_name or '(none: pass --tokenizer)'}",
            f"  max_model_len {self.info.max_model_len or '(not reported: prompt lengths are not checked)'}",
        ]
        lines += [f"  note: {n}" for n in self.notes] + [""]
        for c in self.checks:
            lines.append(f"{SYMBOLS[c.status]} {c.title}: {c.detail}")
            if c.recommendation:
                lines.append(f"    → {c.recommendation}")
        verdict = "problems found (✗ above)" if self.failed else "no blocking problems"
        return self.secrets.scrub("\n".join(lines + ["", verdict]))


def _scrubbed(value: Any, secrets: Secrets) -> Any:
    if isinstance(value, str):
        return secrets.scrub(value)
    if isinstance(value, dict):
        return {k: _scrubbed(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrubbed(v, secrets) for v in value]
    return value


def _guess_profile(ids: list[int] | None) -> ModelProfile | None:
    for profile in BUILTIN_PROFILES.values():
        if ids and profile.think_open_id in ids:
            return profile
    return None


async def run_doctor(
    url: str,
    tokenizer: TokenizerAdapter | None = None,
    profile: ModelProfile | None = None,
    *,
    thinking: bool = True,
    timeout: float = 30.0,
    retries: int = 1,
    default_tokenizer: bool = True,
    notes: Sequence[str] = (),
) -> DoctorReport:
    """Probe `url` and return the report. Raises ServerUnreachable when nothing answers, ValueError for a
    bad URL. Credentials in the URL are sent as Basic auth and TOKVIEW_API_KEY as a bearer token; neither
    appears in the report.

    `notes`: what was changed about the URL the user typed (`urls.server_url_notes`), for a caller that
    validated it first: the normalised `url` it passes on no longer shows the change."""
    client = ServerClient(url, timeout=timeout, concurrency=2)
    policy = RetryPolicy(retries=retries, backoff=0.2)
    try:
        if profile is None and tokenizer is not None:
            try:
                profile = detect_profile(tokenizer)
            except ProfileError:
                profile = None
        info = await detect(client, policy, profile or get_profile("kimi-k2.5"))
        served = info.details.get("probe_prompt_ids") or info.details.get("tokenize_prompt_ids")
        profile = profile or _guess_profile(served) or get_profile("kimi-k2.5")
        if tokenizer is None and default_tokenizer and info.features.get("simulator") and served and 163587 in served:
            from tokview.core.kimi_layout import kimi_tokenizer_dir
            from tokview.core.tokenizer import load_tokenizer

            tokenizer = load_tokenizer(kimi_tokenizer_dir())
        report = DoctorReport(
            url=client.url,
            info=info,
            profile=profile,
            tokenizer_name=f"{tokenizer.name} (loaded from {tokenizer.loaded_by})" if tokenizer else None,
            notes=list(dict.fromkeys([*notes, *client.notes])),
            secrets=client.secrets,
        )
        await _Doctor(client, policy, info, profile, tokenizer, thinking, report).run()
        return report
    finally:
        await client.aclose()


class _Doctor:
    def __init__(
        self,
        client: ServerClient,
        policy: RetryPolicy,
        info: ServerInfo,
        profile: ModelProfile,
        tokenizer: TokenizerAdapter | None,
        thinking: bool,
        report: DoctorReport,
    ) -> None:
        self.client, self.policy, self.info, self.profile = client, policy, info, profile
        self.tokenizer, self.report = tokenizer, report
        self.settings = resolve_settings(
            {"temperature": 0.0, "max_new_tokens": 256, "thinking": thinking, "seed": 0}, profile
        )
        self.request = CaptureRequest(messages=QUESTION, mode="dual")
        self.backend: str | None = None

    def add(self, status: str, title: str, detail: str, recommendation: str = "") -> None:
        scrub = self.client.secrets.scrub  # details quote server answers, which may echo a key
        self.report.checks.append(DoctorCheck(status, title, scrub(detail), scrub(recommendation)))

    async def run(self) -> None:
        from tokview.servers.doctor_checks import (
            check_ids,
            check_opener,
            check_output_ids,
            check_parser,
            check_server,
            check_skip_special,
            check_tokenizer,
        )

        check_server(self)
        try:
            self.backend = effective_backend("auto", self.info)
        except CaptureFailed:
            self.backend = None
        raw, raw_error = await self.attempt(self.raw)
        chat_pair, chat_error = await self.attempt(self.chat)
        chat, chat_ids_returned = chat_pair if chat_pair else (None, None)
        served = self.served_prompt_ids(chat) or await self.tokenize_prompt()
        check_ids(self, raw, raw_error, chat, chat_ids_returned, chat_error)
        check_opener(self, served)
        check_parser(self, raw, chat, chat_ids_returned, chat_error)
        check_output_ids(self, raw, raw_error, chat if chat_ids_returned else None)
        await check_skip_special(self, raw)
        check_tokenizer(self, served)

    async def attempt(self, fn: Any) -> tuple[Any, str | None]:
        if self.backend is None:
            return None, "the server kind is unknown"
        try:
            return await self.policy.run(fn), None
        except CaptureFailed as exc:
            return None, exc.reason

    async def raw(self, skip_special_tokens: bool = False) -> Capture:
        assert self.backend is not None
        cap = await raw_capture(
            self.client,
            self.info,
            self.backend,
            self.request,
            self.settings,
            self.tokenizer,
            skip_special_tokens=skip_special_tokens,
        )
        cap.messages, cap.settings = QUESTION, {**self.settings, "backend": self.backend, "mode": "raw"}
        return cap

    async def chat(self) -> tuple[Capture, list[int] | None]:
        assert self.backend is not None
        cap, returned = await chat_capture(
            self.client, self.info, self.backend, self.request, self.settings, require_ids=False
        )
        cap.messages, cap.settings = QUESTION, {**self.settings, "backend": self.backend, "mode": "chat"}
        return cap, returned

    def served_prompt_ids(self, chat: Capture | None) -> list[int] | None:
        """The prompt ids the server itself rendered for QUESTION (chat answer, else /tokenize)."""
        data = chat.raw_response if chat is not None else None
        if isinstance(data, dict) and data.get("choices"):
            prompt, _, _ = chat_ids(data, data["choices"][0])
            if prompt:
                return list(prompt)
        if chat is not None and chat.prompt_ids:
            return list(chat.prompt_ids)
        return None

    async def tokenize_prompt(self) -> list[int] | None:
        """The server's /tokenize of QUESTION with the doctor's template kwargs (when it takes messages)."""
        if not self.info.features.get("tokenize_messages"):
            return None
        body: dict[str, Any] = {
            "messages": QUESTION,
            "add_generation_prompt": True,
            "chat_template_kwargs": self.settings["chat_template_kwargs"],
        }
        if self.info.model:
            body["model"] = self.info.model
        try:
            data = await self.policy.run(lambda: self.client.post_json("/tokenize", body))
        except CaptureFailed:
            return None
        tokens = data.get("tokens") if isinstance(data, dict) else None
        return list(tokens) if isinstance(tokens, list) else None

    def analysis(self, cap: Capture) -> dict[str, str]:
        return {f.code: f.detail for f in analyze(cap, self.profile, self.tokenizer).findings}

    def name(self, token_id: int) -> str:
        if self.tokenizer is None:
            return str(token_id)
        return f"{token_id} {self.tokenizer.piece_text(token_id)}"
