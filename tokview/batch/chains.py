"""Regeneration as a chain (`--history served`): each served turn is the history of the next.

Why: a drafter trained on turns whose history the model never wrote learns from prompts no deployment
shows it (speculators #693: multi-turn regenerated data beats single-turn and off-policy data). So for a
multi-turn row the assistant turns are regenerated in order; the served output (its reasoning and tool
calls exactly as the server returned them: `Capture.reasoning`, `Capture.tool_calls`) becomes the next
turn's history, and the file's tool results are spliced in after the served calls, all of them, matched
by position and tool name. When the served turn calls other tools, or another number of them, than the
file has results for (or was cut at the token limit), the chain stops there: that turn's sample is kept
with a `chain_stopped` finding, and the turns after it are counted with the reason (never dropped silently).

Each turn records, in its settings' `chain` entry, where it sits (conversation, turn, parent sample) and
whether its prompt ids extend the previous turn's prompt + output ids, else where they first differ (the
`session_prefix_break` finding, the proxy's code for the same fact).

A chain is written whole when it ends (`GroupWriter.add_chain`, one part), so a resume never finds half a
chain: a chain whose first turn is stored is done (its later turns, if absent, stopped); one whose request
failed (after the pool's retries) is recorded as a failure on its first turn's sample id, naming the turn,
and is retried whole by the next run. A later turn whose prompt cannot be sent at all (over the server's
context length) ends the chain like a stop: the turns before it are kept.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tokview.core.finding_context import cut_by_length
from tokview.core.finding_rules import CHAT_ENDPOINTS
from tokview.core.findings import COMPLETE_FINISH_REASONS, end_lost
from tokview.core.harmony import parse_harmony
from tokview.core.profiles import HARMONY
from tokview.core.record import Capture

if TYPE_CHECKING:
    from tokview.core.json_value import JsonObject
    from tokview.core.profiles import ModelProfile
    from tokview.core.tokenizer import TokenizerAdapter

HISTORY_MODES = ("served", "file")
HISTORY_REASONING = ("template", "all", "none")
"""`template`: every served turn goes back with its `reasoning_content` and the template keeps what it keeps
(Kimi: the turns of the tool loop in progress); `all`: the same plus the kwarg that keeps every turn's reasoning
(`keep_all_reasoning`: Kimi-K2.6 `preserve_thinking`); `none`: no reasoning goes back."""
CHAIN_STOP_PREFIX = "\x00chain stopped: "
"""How a writer's `reasons` counts the turns a stopped chain left (read apart from failures by the runner)."""
EARLIER_STOP = (
    "stopped in an earlier run (its first turns are stored, the reason in their chain_stopped finding, which "
    "`tokview show` prints)"
)


CHAINS_STOPPED_PREFIX = "\x00chains stopped: "
"""How a writer's `reasons` counts the chains that stopped for a reason (`CHAIN_STOP_PREFIX` counts their turns)."""


def split_chain_stops(reasons: Mapping[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    """(failure reasons, chain stop reasons): a writer counts the turns a chain left beside its failures."""
    failures = {r: n for r, n in reasons.items() if not r.startswith((CHAIN_STOP_PREFIX, CHAINS_STOPPED_PREFIX))}
    stops = {r[len(CHAIN_STOP_PREFIX) :]: n for r, n in reasons.items() if r.startswith(CHAIN_STOP_PREFIX)}
    return failures, stops


def chains_stopped(reasons: Mapping[str, int]) -> dict[str, int]:
    """How many chains stopped for each reason (the turns they left are `split_chain_stops`'s)."""
    return {r[len(CHAINS_STOPPED_PREFIX) :]: n for r, n in reasons.items() if r.startswith(CHAINS_STOPPED_PREFIX)}


@dataclass(frozen=True)
class ChainItem:
    """One conversation's turns to regenerate in order, taken as one piece of work."""

    sample_id: str
    """The first turn's sample id: what a `--workers` lease and a failure of the chain name."""
    prompt_id: str
    index: int
    messages: list[dict[str, Any]]
    """The row's messages, as the file has them."""
    tools: list[dict[str, Any]] | None
    turns: tuple[tuple[int, int, str], ...]
    """(turn, position of the assistant turn in `messages` (or len(messages)), sample id) per turn."""
    history_reasoning: str = "template"
    todo: int = 0
    """Its turns not yet stored (all of them, unless a store met the same chain twice): the slots it takes."""

    @property
    def turn(self) -> int:
        return self.turns[0][0]

    @property
    def slots(self) -> int:
        return len(self.turns)

    @property
    def conversation(self) -> str:
        """The chain's id: its sample ids without `#turn{t}`."""
        return self.prompt_id + self.sample_id[self.sample_id.rindex("@") :]


@dataclass(frozen=True)
class TurnItem:
    """One turn of a chain as the writer takes it (a `WorkItem`'s fields)."""

    sample_id: str
    prompt_id: str
    turn: int
    index: int
    messages: list[dict[str, Any]]


@dataclass
class ChainResult:
    samples: list[tuple[TurnItem, Capture]] = field(default_factory=list)
    failure: tuple[str, str | None, bool] | None = None
    """(reason, server, whether it was sent) when a turn failed: the chain is recorded as failed on its
    first turn's sample id, nothing of it stored."""
    stop: str | None = None
    """Why the chain stopped before its last turn (its turns after that are `left`)."""
    left: int = 0


Attempt = Callable[[list[dict[str, Any]], dict[str, Any]], Awaitable[Any]]
"""Capture one turn (messages, extra template kwargs): the capture, or (failure reason, server, sent[, refused]):
refused, the server refused the request as it is (400, 413, 422: `capture_loop.REFUSED_REQUEST`)."""


async def run_chain(
    item: ChainItem, attempt: Attempt, tokenizer: TokenizerAdapter | None = None, profile: ModelProfile | None = None
) -> ChainResult:
    """Regenerate `item`'s turns in order; what to write and what to count."""
    result = ChainResult()
    kwargs = keep_all_reasoning(profile) if item.history_reasoning == "all" else {}
    sent = [dict(m) for m in item.messages[: item.turns[0][1]]]
    previous: tuple[str, Capture] | None = None
    for k, (turn, _at, sample_id) in enumerate(item.turns):
        got = await attempt(sent, kwargs)
        if not isinstance(got, Capture):
            reason, server, sent = got[:3]
            refused = len(got) > 3 and bool(got[3])
            if k and (not sent or refused):
                # the prompt cannot go (too long), or the server refuses what the chain added (a call whose arguments
                # are no JSON, sent back as the model wrote them: SGLang's 400): as final as a stop, the turns before
                # kept with the reason. Failed whole, the chain was asked again every run and never landed its turns,
                # the one that explains it among them.
                how = "was not sent" if not sent else "was refused by the server"
                result.stop, result.left = f"turn {turn} {how}: {reason}", item.slots - k
                result.samples[-1][1].settings["chain"]["stopped"] = result.stop
                return result
            result.samples, result.left = [], item.slots - 1
            result.failure = (f"chain turn {turn} failed: {reason}" if k else reason, server, sent)
            return result
        stop = None
        if k + 1 < item.slots:
            spliced, stop = _next_history(item, k, got, tokenizer, profile)
        got.settings = {**got.settings, "chain": _chain_entry(item, turn, previous, got, stop)}
        result.samples.append((TurnItem(sample_id, item.prompt_id, turn, item.index, sent), got))
        if stop is not None:
            result.stop, result.left = stop, item.slots - k - 1
            return result
        if k + 1 < item.slots:
            sent = [*sent, *spliced]
        previous = (sample_id, got)
    return result


def keep_all_reasoning(profile: ModelProfile | None) -> dict[str, bool]:
    """The template kwarg that keeps every history turn's reasoning: the profile's (`history_kwarg`:
    Kimi-K2.6 `preserve_thinking: true`, GLM-4.7 `clear_thinking: false`), else `preserve_thinking`."""
    key = getattr(profile, "history_kwarg", None) or "preserve_thinking"
    return {key: not key.startswith("clear")}


def _chain_entry(
    item: ChainItem, turn: int, previous: tuple[str, Capture] | None, capture: Capture, stop: str | None
) -> dict[str, Any]:
    """Where this turn sits in its chain, and whether its prompt continues the previous turn's ids."""
    entry: dict[str, Any] = {
        "conversation": item.conversation,
        "turn": turn,
        "history": "served",
        "history_reasoning": item.history_reasoning,
        "parent": None,
        "extends": None,
        "break_at": None,
        "previous_len": None,
    }
    if previous is not None:
        parent_id, parent = previous
        before = [*parent.prompt_ids, *parent.output_ids]
        at = first_difference(before, capture.prompt_ids)
        entry.update(parent=parent_id, extends=at is None, break_at=at, previous_len=len(before))
        if at is not None:
            entry["previous_prompt_len"] = len(parent.prompt_ids)  # a break before its answer: not the answer's
        if at is not None and at < len(before):
            entry["previous_id"] = before[at]  # the finding shows both sides of the break
    if stop is not None:
        entry["stopped"] = stop
    return entry


def first_difference(before: Sequence[int], prompt: Sequence[int]) -> int | None:
    """None when `prompt` starts with `before`; else the first position where they differ (or where
    `prompt` ends)."""
    n = len(before)
    if len(prompt) >= n and list(prompt[:n]) == list(before):
        return None
    for pos in range(min(n, len(prompt))):
        if prompt[pos] != before[pos]:
            return pos
    return min(n, len(prompt))


def _next_history(
    item: ChainItem, k: int, served: Capture, tokenizer: TokenizerAdapter | None, profile: ModelProfile | None
) -> tuple[list[dict[str, Any]], str | None]:
    """(the served turn + the file's results and turns up to the next assistant turn, why the chain stops)."""
    turn, at, _ = item.turns[k]
    following = item.messages[at + 1 : item.turns[k + 1][1]]
    results = []
    for msg in following:
        if msg["role"] != "tool":
            break
        results.append(msg)
    calls = served.tool_calls or []
    if cut_by_length(served.finish_reason, served.output_ids, profile.stop_ids if profile is not None else ()):
        return [], f"turn {turn} was cut at the token limit (finish_reason length): its calls or answer are incomplete"
    if isinstance(served.finish_reason, str) and served.finish_reason not in COMPLETE_FINISH_REASONS:
        return [], f"turn {turn} was ended by the server (finish_reason {served.finish_reason}): it is incomplete"
    if end_lost(served, profile.stop_ids if profile is not None else ()):
        return [], f"turn {turn} names no finish_reason and does not end with a stop id: its end was lost"
    file_calls = [str(c["function"]["name"]) for c in item.messages[at].get("tool_calls") or []]
    answers = _answered_calls(item.messages[at], results)
    wanted = [file_calls[p] if p < len(file_calls) else "?" for p in answers]
    got = [str(c.get("name")) for c in calls]
    if len(got) != len(wanted):
        return [], (
            f"turn {turn} called {len(got)} tool(s) ({', '.join(got) or 'none'}) where the file has {len(wanted)} "
            f"result(s) ({', '.join(wanted) or 'none'})" + _parser_lost(served, profile, len(got))
        )
    for p, want in sorted(zip(answers, wanted, strict=True)):
        if p >= len(got) or got[p] != want:
            name = got[p] if p < len(got) else "nothing"
            return [], f"turn {turn} called {name} as call {p + 1} where the file's call {p + 1} is {want}"
    spliced = [served_message(served, item.history_reasoning, tokenizer, profile)]
    for p, result in zip(answers, results, strict=True):  # the file's order of results, each to its call's place
        spliced.append({**result, "tool_call_id": calls[p].get("id") or result.get("tool_call_id")})
    spliced += [dict(m) for m in following[len(results) :]]
    return spliced, None


def _parser_lost(served: Capture, profile: ModelProfile | None, parsed: int) -> str:
    """Said after a stop's reason when the ids hold another number of calls than the server's tool parser returned
    (`tool_calls_field_mismatch`): "called 1 tool" read as the model's doing, where the parser dropped one."""
    layout = profile.tool_calls if profile is not None else None
    if layout is None or layout.call_begin_id is None:
        return ""
    ids = served.output_ids
    close = profile.think_close_id if profile is not None else None
    if close is not None and close in ids:  # a call marker written while thinking is no call (the servers' reasoning
        ids = ids[ids.index(close) + 1 :]  # parsers end the reasoning at the first closer)
    in_ids = ids.count(layout.call_begin_id)
    if in_ids == parsed:
        return ""
    return f"; its ids hold {in_ids} call(s): the server's tool parser returned {parsed}"


def _answered_calls(turn: Mapping[str, Any], results: Sequence[Mapping[str, Any]]) -> list[int]:
    """For each of the file's results, the position of the file call it answers (by `tool_call_id`, which
    `agent_traces.check_trace` gave every result): the served call at that position takes it. Paired by the
    results' order, a harness that listed Oslo's result before Paris's gave the served Paris call Oslo's weather."""
    position = {c.get("id"): i for i, c in enumerate(turn.get("tool_calls") or [])}
    answers = [position.get(r.get("tool_call_id"), -1) for r in results]
    if sorted(answers) != list(range(len(results))):  # not one result per call: by order, as before
        return list(range(len(results)))
    return answers


def served_message(
    capture: Capture,
    history_reasoning: str,
    tokenizer: TokenizerAdapter | None = None,
    profile: ModelProfile | None = None,
) -> JsonObject:
    """The served turn as an assistant message: its content, reasoning and calls as the server returned them.

    A raw endpoint returns no split: the ids are split at the profile's closer and decoded. A chat answer's null
    fields are empty text: vLLM with thinking off answers a turn of tool calls alone with null content and null
    reasoning, and the ids decoded put the call section, as text, into the next turn's history."""
    reasoning, content = capture.reasoning, capture.content
    raw = capture.endpoint not in CHAT_ENDPOINTS
    if raw and reasoning is None and content is None and tokenizer is not None and profile is not None:
        reasoning, content = split_on_ids(capture, tokenizer, profile)
    msg: JsonObject = {"role": "assistant", "content": content or ""}
    if history_reasoning != "none" and reasoning:
        msg["reasoning_content"] = reasoning
    if capture.tool_calls:
        msg["tool_calls"] = [
            {
                "id": c.get("id"),
                "type": "function",
                "function": {"name": c.get("name"), "arguments": c.get("arguments")},
            }
            for c in capture.tool_calls
        ]
    return msg


def split_on_ids(capture: Capture, tokenizer: TokenizerAdapter, profile: ModelProfile) -> tuple[str | None, str]:
    """(reasoning, answer) of a raw capture: the ids before and after the profile's closer, the stop id dropped;
    for Harmony, the analysis and final channels' bodies (decoded whole, the channel names and headers were read
    as the answer's text)."""
    out = list(capture.output_ids)
    if profile.format == HARMONY:
        messages = parse_harmony(out)
        bodies = {
            channel: "".join(tokenizer.decode(out[slice(*m.body)]) for m in messages if m.channel == channel)
            for channel in ("analysis", "final")
        }
        return bodies["analysis"] or None, bodies["final"]
    if out and out[-1] in profile.stop_ids:
        out = out[:-1]
    close = profile.think_close_id
    if close is None or close not in out:
        return None, tokenizer.decode(out, skip_special_tokens=True)
    at = out.index(close)
    start = out.index(profile.think_open_id) + 1 if profile.think_open_id in out[:at] else 0
    return tokenizer.decode(out[start:at]), tokenizer.decode(out[at + 1 :], skip_special_tokens=True)
