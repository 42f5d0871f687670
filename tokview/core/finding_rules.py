"""The findings registry: severities, `Hit`, `Rule`, `@rule` and `run_checks`.

Apart from the checks (`findings`, `harmony_findings`) so a module of checks can register its rules
without importing the module that imports it: `findings` imports every module of checks."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tokview.core.finding_context import Context

INFO, WARN, ERROR = "info", "warn", "error"
CHAT_ENDPOINTS = {"sglang-chat", "vllm-chat", "dual", "imported"}


@dataclass(frozen=True)
class Finding:
    """One finding of one sample, as stored (the `findings` table) and shown."""

    code: str
    severity: str
    detail: str
    positions: tuple[int, ...] = ()


@dataclass(frozen=True)
class Hit:
    """What a check saw in one capture: the sentence that explains it and the positions it names."""

    detail: str
    positions: tuple[int, ...]
    absent: bool = False
    """The finding is about something missing (a delimiter, a text field, ids the usage counted), so it
    has no id to name: the only case where `positions` may be empty."""
    severity: str | None = None
    """This hit's own severity, when it differs from the code's (literal think text only in the prompt)."""

    def __post_init__(self) -> None:
        if bool(self.positions) == self.absent:
            raise ValueError(f"a hit names positions unless it is about an absence, never both: {self.detail}")

    @classmethod
    def at(cls, detail: str, positions: Sequence[int], severity: str | None = None) -> Hit:
        return cls(detail, tuple(positions), severity=severity)

    @classmethod
    def missing(cls, detail: str) -> Hit:
        """A hit about an absence: it names no position."""
        return cls(detail, (), absent=True)


Check = Callable[[Context], Hit | None]


@dataclass(frozen=True)
class Rule:
    """One finding code, declared once: its default severity, why it matters, and its check."""

    code: str
    severity: str
    why: str
    """One line, in general terms; the finding's own detail says what this sample shows."""
    check: Check

    def finding(self, hit: Hit, severity: str | None = None) -> Finding:
        """The stored finding for a hit; `severity` (an override) beats the hit's own and the default."""
        return Finding(self.code, severity or hit.severity or self.severity, hit.detail, hit.positions)


RULES: dict[str, Rule] = {}
"""Every finding code, in the order the checks run (and findings are listed and stored)."""


def rule(code: str, severity: str, why: str) -> Callable[[Check], Check]:
    """Declare a finding code with its check; the check function is named after the code."""
    if severity not in (INFO, WARN, ERROR):
        raise ValueError(f"finding {code}: unknown severity {severity!r}")

    def register(check: Check) -> Check:
        if code in RULES:
            raise ValueError(f"finding {code} is declared twice")
        if getattr(check, "__name__", code) != code:
            raise ValueError(f"the check of finding {code} is named {check.__name__}: name it after its code")
        RULES[code] = Rule(code, severity, why, check)
        return check

    return register


def default_severity(code: str) -> str:
    """A code's declared severity; info for a code this version does not know (a store from a newer one)."""
    declared = RULES.get(code)
    return declared.severity if declared else INFO


def why(code: str) -> str:
    """Why a code matters, in one line ('' for a code this version does not know)."""
    declared = RULES.get(code)
    return declared.why if declared else ""


def run_checks(ctx: Context, severities: dict[str, str] | None = None) -> list[Finding]:
    """Run every registered check; `severities` overrides the severity of any registered code."""
    overrides = severities or {}
    for code, severity in overrides.items():
        if code not in RULES or severity not in (INFO, WARN, ERROR):
            what = f"unknown finding code {code!r}" if code not in RULES else f"unknown severity {severity!r}"
            raise ValueError(f"severity override: {what} (codes: {', '.join(RULES)}; severities: info, warn, error)")
    found = []
    for code, declared in RULES.items():
        hit = declared.check(ctx)
        if hit is not None:
            found.append(declared.finding(hit, overrides.get(code)))
    return found
