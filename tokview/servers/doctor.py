"""`tokview doctor`: probe one server and say, in plain words, what it does with token ids.

Each check answers one question a person training a drafter must get right (which id fields come
back where, whether the template pre-fills the think opener, which reasoning field the parser fills
and which ids it hides, whether output_ids are honest, whether skip_special_tokens rewrites text,
whether the local tokenizer agrees with the server, whether its tool parser returns the calls the ids hold and a
stream the ids a whole answer does), from real requests, judged by the same
`analyze` the rest of tokview uses.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from tokview.core.profiles import BUILTIN_PROFILES, ModelProfile, ProfileError, detect_profile, get_profile
from tokview.core.record import Capture
from tokview.secrets import Secrets
from tokview.servers import doctor_checks as checks
from tokview.servers import doctor_tool_checks as tool_checks
from tokview.servers.chat import served_prompt_ids
from tokview.servers.doctor_context import QUESTION, DoctorCheck, DoctorContext
from tokview.servers.errors import CaptureFailed
from tokview.servers.features import INFO_PATHS, detect
from tokview.servers.http import ServerClient
from tokview.servers.info import ServerInfo
from tokview.servers.retry import RetryPolicy
from tokview.untrusted_text import printable_line, storable

if TYPE_CHECKING:
    from rich.text import Text

    from tokview.core.tokenizer import TokenizerAdapter

__all__ = ["MARKS", "QUESTION", "SYMBOLS", "DoctorCheck", "DoctorReport", "ReportLine", "run_doctor"]

MARKS = {"ok": ("✓", "green"), "fail": ("✗", "bold red"), "warn": ("!", "yellow"), "skip": ("-", "dim")}
"""One mark per status, and its colour in the app: warn and skip never share one."""
SYMBOLS = {status: mark for status, (mark, _) in MARKS.items()}
"""The marks alone (status → mark)."""


class ReportLine(NamedTuple):
    """One line of the rendered report and the Rich style the app shows it in ("" for plain)."""

    text: str
    style: str = ""


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
    gave_up: list[str] = field(default_factory=list)
    """The requests the doctor gave up on (timed out, 5xx, connection lost, past the retries)."""

    @property
    def failed(self) -> bool:
        return any(c.status == "fail" for c in self.checks)

    @property
    def incomplete(self) -> bool:
        """A check was skipped for a request the server failed past its retries (its detail quotes why): no clean
        bill, whatever else passed. A skip for another reason (no --tokenizer) beside it is no such check."""
        return any(c.status == "skip" and any(r in c.detail for r in self.gave_up) for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        """The report as data: secrets masked, and any lone surrogate a server sent written as its escape
        (`--json` must be encodable; JSON itself escapes the control characters)."""
        return {key: _scrubbed(value, self.secrets) for key, value in self._dict().items()}

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
            "ok": not self.failed and not self.incomplete,
            "gave_up": list(self.gave_up),
            "notes": list(self.notes),
            "checks": [c.to_dict() for c in self.checks],
        }

    def lines(self) -> list[ReportLine]:
        """The report as the CLI prints it and the app's doctor panel shows it (one renderer for both):
        what was probed, notes about the URL, each check with its mark, then the verdict. Secrets masked;
        control characters and lone surrogates (a server's error body, its model name) as escapes, so
        nothing a server sent acts on the terminal or stops the print."""
        scrub = self.secrets.scrub
        lines = [
            ReportLine(f"tokview doctor: {self.url}", "bold"),
            ReportLine(
                f"  profile {self.profile.name if self.profile else '(none)'}, "
                f"tokenizer {self.tokenizer_name or '(none: pass --tokenizer)'}"
            ),
            ReportLine(
                f"  max_model_len {self.info.max_model_len or '(not reported: prompt lengths are not checked)'}"
            ),
        ]
        lines += [ReportLine(f"  note: {n}", "italic yellow") for n in self.notes]
        lines.append(ReportLine(""))
        for c in self.checks:
            mark, style = MARKS[c.status]
            lines.append(ReportLine(f"{mark} {c.title}: {c.detail}", style))
            if c.recommendation:
                lines.append(ReportLine(f"    → {c.recommendation}", "italic"))
        if self.failed:
            verdict = "problems found (✗ above)"
        elif self.incomplete:
            verdict = (
                f"checks could not run: the server failed {len(self.gave_up)} request(s) past their retries "
                f"({self.gave_up[0]}); run the doctor again once it answers"
            )
        else:
            verdict = "no blocking problems"
        lines += [
            ReportLine(""),
            ReportLine(verdict, "bold green" if verdict == "no blocking problems" else "bold red"),
        ]
        return [ReportLine(printable_line(scrub(line.text)), line.style) for line in lines]

    def render_text(self) -> str:
        """The report as plain text (`tokview doctor`)."""
        return "\n".join(line.text for line in self.lines())

    def render_rich(self, reword: Callable[[str], str] | None = None) -> Text:
        """The same lines as Rich text, each in its status colour (the app's doctor panel); `reword`: the panel's
        wording of a line's advice (the CLI's flags said as the app takes them)."""
        from rich.text import Text

        from tokview.untrusted_text import printable

        text = Text()
        for i, line in enumerate(self.lines()):  # a server's own words among them: never its terminal escapes
            said = reword(line.text) if reword is not None else line.text
            text.append(("\n" if i else "") + printable(said), line.style or None)
        return text


def _scrubbed(value: object, secrets: Secrets) -> object:
    if isinstance(value, str):
        return storable(secrets.scrub(value))
    if isinstance(value, dict):
        return {storable(k) if isinstance(k, str) else k: _scrubbed(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrubbed(v, secrets) for v in value]
    return value


GUESS_MIN_ID = 1_000
"""A profile's ids below this (DeepSeek's stop id 1) are ordinary text ids in other vocabularies: never a clue."""

FAMILY_MARKS: dict[str, tuple[int, ...]] = {
    "deepseek-r1": (128803, 128804),  # <｜User｜>, <｜Assistant｜> (protocols.md)
    "gpt-oss": (200006, 200008),  # Harmony's <|start|>, <|message|>
}
"""Ids every chat prompt of a family holds besides its think and stop ids, which do not name it: DeepSeek's only stop
id is 1, and a Harmony prompt ends its messages with <|end|>, no stop id. All of them must be there (one alone may be
another vocabulary's text id)."""


def guess_profile(ids: list[int] | None) -> ModelProfile | None:
    """The built-in profile the served prompt ids point to, without a tokenizer: the first whose think opener the
    prompt holds (the template pre-filled it), else the first whose `FAMILY_MARKS` it holds all of, else the first
    whose think delimiters or stop ids it holds (a chat prompt ends each earlier message with the stop id: Qwen3's
    `<|im_end|>`, GLM's `<|user|>`). Earlier profiles win (Qwen's text ids reach 151,642, GLM's `<|user|>` is one of
    them). None for ids that point to none of them (a plain model); None without ids."""
    if not ids:
        return None
    present = set(ids)
    for profile in BUILTIN_PROFILES.values():
        if profile.think_open_id in present:
            return profile
    for profile in BUILTIN_PROFILES.values():
        family = FAMILY_MARKS.get(profile.name)
        if family and all(m in present for m in family):
            return profile
    for profile in BUILTIN_PROFILES.values():
        delimiters = (profile.think_open_id, profile.think_close_id, *profile.stop_ids)
        if any(m is not None and m >= GUESS_MIN_ID and m in present for m in delimiters):
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
    # the info endpoints in one round: with two connections a hung server was asked them in two, and was said
    # unreachable after twice the --timeout × attempts its message named (20 s for --timeout 5)
    client = ServerClient(url, timeout=timeout, concurrency=len(INFO_PATHS))
    policy = RetryPolicy(retries=retries, backoff=0.2)
    named = profile
    try:
        if profile is None and tokenizer is not None:
            try:
                profile = detect_profile(tokenizer)
            except ProfileError:
                profile = None
        info = await detect(client, policy, profile or get_profile("kimi-k2.5"))
        served = info.details.get("probe_prompt_ids") or info.details.get("tokenize_prompt_ids")
        # The served ids name the model's family; ids that name none are a plain model's (judged as Kimi, a
        # healthy Qwen3 or plain server failed the opener check). No ids at all: Kimi's, the first target.
        profile = profile or guess_profile(served) or get_profile("plain" if served else "kimi-k2.5")
        from tokview.core.kimi_layout import KIMI_ID

        if (
            tokenizer is None
            and default_tokenizer
            and info.features.get("simulator")
            and served
            and KIMI_ID["<|im_user|>"] in served
        ):
            from tokview.core.profiles import default_tokenizer_dir
            from tokview.core.tokenizer import load_tokenizer

            tokenizer = load_tokenizer(default_tokenizer_dir(named.name if named else None))
        ctx = DoctorContext(client, policy, info, profile, tokenizer, thinking)
        if named is not None and tokenizer is not None:
            _check_profile_fits(ctx, named, tokenizer)
        report = DoctorReport(
            url=client.url,
            info=info,
            profile=profile,
            tokenizer_name=f"{tokenizer.name} (loaded from {tokenizer.loaded_by})" if tokenizer else None,
            checks=ctx.checks,
            notes=list(dict.fromkeys([*notes, *client.notes])),
            secrets=client.secrets,
            gave_up=ctx.policy_gave_up,  # filled as the checks run
        )
        await run_checks(ctx)
        return report
    finally:
        await client.aclose()


async def run_checks(ctx: DoctorContext) -> None:
    """Every check in order, each adding one verdict to `ctx.checks`."""
    checks.check_server(ctx)
    raw, raw_error = await ctx.attempt(ctx.raw)
    chat_pair, chat_error = await ctx.attempt(ctx.chat)
    chat, chat_ids_returned = chat_pair if chat_pair else (None, None)
    served = served_prompt(chat) or await tokenize_prompt(ctx)
    ctx.read_vocabulary(raw, chat if chat_ids_returned else None)
    ctx.check_vocabulary()
    checks.check_ids(ctx, raw=raw, raw_error=raw_error, chat=chat, chat_ids=chat_ids_returned, chat_error=chat_error)
    probe = raw if raw is not None else chat
    checks.check_opener(ctx, served, list(probe.output_ids) if probe is not None and probe.output_ids else None)
    checks.check_parser(ctx, raw, chat, chat_ids_returned, chat_error)
    checks.check_output_ids(ctx, raw, raw_error, chat if chat_ids_returned else None)
    await checks.check_skip_special(ctx, raw)
    checks.check_tokenizer(ctx, served)
    tooled = await tool_checks.probe(ctx, tools=True, stream=False)
    tool_checks.check_tools(ctx, tooled, chat is not None)
    # The stream probe streams the tool request unless the server refused tools (then the plain question).
    tools = not tool_checks.refused_tools(tooled, chat is not None)
    whole = tooled if tools else await tool_checks.probe(ctx, tools=False, stream=False)
    streamed = await tool_checks.probe(ctx, tools=tools, stream=True)
    tool_checks.check_stream(ctx, whole, streamed, tools)


def _check_profile_fits(ctx: DoctorContext, profile: ModelProfile, tokenizer: TokenizerAdapter) -> None:
    """The first check when `--profile` names ids this tokenizer has as other tokens: the checks after it judge the
    server by that profile, so a failed parser check then said to restart the server with another model's parser."""
    from tokview.core.profiles import check_tool_layout_fits
    from tokview.core.resolve import check_profile_fits

    try:
        check_profile_fits(profile, tokenizer, profile.name)
        check_tool_layout_fits(profile, tokenizer, profile.name)
    except ProfileError as exc:
        ctx.add(
            "fail",
            "Profile",
            str(exc),
            "--profile names another model's delimiters: the checks below judge the server by them; pass the served "
            "model's profile, or leave --profile out to detect it",
        )


def served_prompt(chat: Capture | None) -> list[int] | None:
    """The prompt ids the server itself rendered for QUESTION, from its chat answer."""
    if chat is None:
        return None
    return served_prompt_ids(chat.raw_response) or (list(chat.prompt_ids) if chat.prompt_ids else None)


async def tokenize_prompt(ctx: DoctorContext) -> list[int] | None:
    """The server's /tokenize of QUESTION with the doctor's template kwargs (when it takes messages)."""
    if not ctx.info.features.get("tokenize_messages"):
        return None
    body: dict[str, Any] = {
        "messages": QUESTION,
        "add_generation_prompt": True,
        "chat_template_kwargs": ctx.settings["chat_template_kwargs"],
    }
    if ctx.info.model:
        body["model"] = ctx.info.model
    try:
        data = await ctx.policy.run(lambda: ctx.client.post_json("/tokenize", body))
    except CaptureFailed:
        return None
    tokens = data.get("tokens") if isinstance(data, dict) else None
    return list(tokens) if isinstance(tokens, list) else None
