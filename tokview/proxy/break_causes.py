"""Why a proxied turn's prompt ids leave the turn before: what the harness changed in the answer it sent back, or,
when it sent the answer back as served, that the server's chat template re-rendered it.

The session book joins such a turn by its messages, compared on what a turn says: reasoning, call ids, argument
spelling and the whitespace around a text are left out (`sessions._message_text`). Those are the parts that decide
whether the next prompt holds the ids the model wrote, so here they are compared as sent with what the server
returned. The finding blamed the harness for every break, and the commonest one, a faithful harness and Kimi's
template dropping a finished tool loop's reasoning, read as a harness bug.

What the server returned is kept as digests on the session book's turn (`Served`): a long answer is stored once,
in its sample.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tokview.proxy.ids import SGLANG
from tokview.untrusted_text import printable_line

if TYPE_CHECKING:
    from tokview.core.profiles import ModelProfile

REASONING_FIELDS = ("reasoning_content", "reasoning")
"""Where a history message's reasoning goes: SGLang reads `reasoning_content` only; vLLM reads both (it renames
`reasoning_content` to `reasoning`)."""


@dataclass(frozen=True)
class Served:
    """A turn's answer as the server returned it, and where its next request's messages should hold it."""

    at: int
    """The index of the assistant message the next request's messages hold for this answer (its request's count)."""
    prompt_len: int
    reasoning: bytes | None
    """The digest of the reasoning text; None when the answer had none."""
    content: bytes
    calls: tuple[tuple[object, bytes], ...]
    """(call id, digest of the arguments as a string) of each call, in order."""
    answer_at: int = 0
    """Where the answer after its reasoning begins in the output ids (past `</think>`); 0 when not known."""
    calls_at: int = 0
    """Where its first tool call begins in the output ids (its section or call marker); 0 when not known. A change to
    a part of the answer changes no id before that part: a break before it is not the change's (`harness_changes`)."""


def served_of(
    answer: dict[str, Any] | None,
    messages: list[Any] | None,
    prompt_len: int,
    output_ids: list[int] | None = None,
    profile: ModelProfile | None = None,
) -> Served | None:
    """The digests of `answer` (the assistant message the recorder built, `reasoning_content` included) for a
    request of `messages`; None for a request without messages (a `/v1/completions` one) or without an answer.
    With the output ids and the profile, where its parts begin (`Served.answer_at`, `Served.calls_at`)."""
    if answer is None or not messages:
        return None
    reasoning = answer.get("reasoning_content")
    calls = answer.get("tool_calls")
    answer_at = calls_at = 0
    if output_ids is not None and profile is not None:
        close = profile.think_close_id
        if isinstance(reasoning, str) and reasoning and close is not None and close in output_ids:
            answer_at = output_ids.index(close) + 1  # (no reasoning parser: the think block is the content's)
        calls_at = len(output_ids)
        if calls:  # list scans in C: a Python walk of a 2,000-id answer cost ~0.1 ms a request
            layout = profile.tool_calls
            marks = (layout.section_begin_id, layout.call_begin_id) if layout is not None else ()
            found = [output_ids.index(m) for m in marks if m is not None and m in output_ids]
            calls_at = min(found) if found else 0
    return Served(
        len(messages),
        prompt_len,
        _digest(reasoning) if isinstance(reasoning, str) and reasoning else None,
        _digest(_text(answer.get("content"))),
        tuple((c.get("id"), _digest(_arguments(c))) for c in calls if isinstance(c, dict))
        if isinstance(calls, list)
        else (),
        answer_at,
        calls_at,
    )


def harness_changes(
    served: Served, messages: list[Any], server_kind: str | None, *, reaching: int | None = None
) -> list[str] | None:
    """What the request's copy of the answer changed, in words ("dropped its reasoning", …); [] when it sent it back
    as served; None when it holds no assistant message where the answer goes (nothing to compare: a retry placed
    against another branch's turn). `reaching`: only the changes to parts that begin at or before that position of
    the output (a renumbered call id cannot break the ids at the answer's `</think>`)."""
    sent = messages[served.at] if served.at < len(messages) else None
    if not isinstance(sent, dict) or sent.get("role") != "assistant":
        return None
    said: list[tuple[int, str]] = []  # (where the changed part begins in the output, the change in words)
    if served.reasoning is not None:
        kept = {f: v for f in REASONING_FIELDS if isinstance(v := sent.get(f), str) and v}
        if server_kind == SGLANG and "reasoning" in kept:  # SGLang reads `reasoning_content` only
            kept.pop("reasoning")
            if not kept:
                said.append(
                    (
                        0,
                        "sent its reasoning as `reasoning`, a field SGLang does not read (it reads `reasoning_content`)",
                    )
                )
        elif not kept:
            said.append((0, "dropped its reasoning"))
        if kept and all(_digest(v) != served.reasoning for v in kept.values()):
            said.append((0, "re-wrote its reasoning"))
    if _digest(_text(sent.get("content"))) != served.content:
        said.append((served.answer_at, "changed its content (the whitespace around it)"))
    calls = sent.get("tool_calls")
    sent_calls = [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []
    renumbered = [(c.get("id"), own) for (own, _), c in zip(served.calls, sent_calls) if c.get("id") != own]
    if renumbered:
        first, own = renumbered[0]
        said.append((served.calls_at, f"renumbered its call ids ({_quoted(first)} for the served {_quoted(own)})"))
    if any(_digest(_arguments(c)) != args for (_, args), c in zip(served.calls, sent_calls)):
        said.append((served.calls_at, "re-serialised its arguments"))
    return [change for start, change in said if reaching is None or start <= reaching]


def _text(content: object) -> str:
    """A message's content as one text: a string, or the texts of its parts (None and anything else: "")."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _arguments(call: dict[str, Any]) -> str:
    function = call.get("function")
    arguments = function.get("arguments") if isinstance(function, dict) else None
    return arguments if isinstance(arguments, str) else repr(arguments)


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()


def _quoted(value: object) -> str:
    """A call id a client sent, as a finding can show it: on one printable line, cut to 48 characters."""
    text = f"'{printable_line(value)}'" if isinstance(value, str) else printable_line(repr(value))
    return text if len(text) <= 48 else text[:47] + "…"
