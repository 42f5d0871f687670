"""Which conversation a proxied request belongs to, and which turn of it it is.

A harness names its conversation with the session header or the request's `user` field; otherwise the
ids decide: a request whose prompt ids begin with an earlier request's prompt + output ids continues
that conversation (architecture.md, "conversations as chains"). A harness that re-renders its history
(drops the reasoning, re-serialises arguments, renumbers call ids) breaks that prefix; when its messages
still continue a conversation, the turn joins it and says where the ids first differ, which is what a
team needs to know about the prompts its drafter will see.

Only ids and messages of finished requests are kept (the HEADS_KEPT newest turns of each session: a side request
that finished first, another choice or a retry leaves the turn the harness goes on from still there), in memory,
for the most recently used sessions (`max_sessions`, `max_bytes`). A new prompt is compared (memcmp) with the kept
turns that share its first KEY_IDS ids and are no longer than it, longest first, until one matches: those are kept
sorted by length, so a new conversation among thousands that share one system prompt (shorter than any of
their prompt + output ids) costs a bisection, not a comparison per open session. It continues the turn it
extends: turn k+1 of that turn's session, whichever turn of it is the newest.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import math
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import orjson

SESSION_HEADER = "x-tokview-session"
KEY_IDS = 16
"""Sessions are indexed by the bytes of their first ids; a prompt's candidates share them."""
MAX_SESSIONS = 2_000
"""Sessions kept (the least recently used go first); a harness rarely has more conversations open at once."""
HEADS_KEPT = 4
"""Turns kept per session that a next request may continue: the newest, and the few before it that a side request
(a title, a summary, a check) finishing first, the other choices of an `n` > 1 request, or a retry still leave
someone to continue (the main loop's next turn extends the turn before the side request, not the side request)."""
MAX_SESSION_BYTES = 256 << 20
"""The ids all kept sessions may hold together (4 bytes an id: ~67M ids), the least recently used going first
beyond it. Each session holds its newest turn's prompt + output ids: 0.5 MB at a 128k-token agent trace, so
the count alone let 2,000 long traces hold 1 GB."""
_INT32 = next(code for code in "il" if array(code).itemsize == 4)


@dataclass
class _Head:
    """One finished turn a next request may continue: its prompt + output ids and its messages' digest."""

    session_id: str
    turn: int
    sample_id: str
    sequence: bytes | memoryview
    """prompt + output ids, as 32-bit ints (compared with `startswith`): a view of a newer head's when they are its
    first ids (as a turn's are its next turn's), so a long trace's kept turns hold its ids about once, not 4 times."""
    prompt_len: int
    """How many of `sequence`'s ids are the prompt (the rest the output)."""
    parent_sample: str | None
    """The turn's own parent (a regeneration of it has the same one)."""
    message_key: str | None
    """The digest of the turn's messages plus its answer (see `_digests`), None without messages."""
    order: int = 0
    """When it was indexed (unique): equal lengths in `SessionBook._by_start` go oldest first."""
    owned: bool = True
    """Its `sequence` is its own bytes (counted in `SessionBook._bytes`), not a view of a newer head's."""


@dataclass
class _Session:
    session_id: str
    turns: int = 0
    """One past the highest turn placed in it."""
    heads: list[_Head] = field(default_factory=list)
    """Its HEADS_KEPT most recent turns, the newest last: a request may continue any of them."""


@dataclass(frozen=True)
class Turn:
    """Where one request goes: its session, its turn index (0 first) and how it joined."""

    session_id: str
    turn: int
    joined_by: str
    """header | user | prefix | messages | new"""
    parent_sample: str | None = None
    break_at: int | None = None
    """When it joined by messages only: the first position where its prompt ids differ from the
    previous turn's prompt + output ids."""
    previous_len: int = 0


def _pack(ids: list[int]) -> bytes:
    try:
        return array(_INT32, ids).tobytes()
    except (OverflowError, TypeError):
        return orjson.dumps(ids)


def _message_text(message: object) -> bytes:
    """What a turn says, without what harnesses rewrite (reasoning, call ids, argument spacing and key order).

    A call's arguments count as the JSON value they hold: parallel rollouts of one task (the same prompt, the same
    first tool) differ only there, and keyed by the tool's name alone they were taken for one conversation."""
    if not isinstance(message, dict):
        return orjson.dumps(message, option=orjson.OPT_SORT_KEYS)
    content = message.get("content")
    calls = message.get("tool_calls")
    said = [_call_text(c) for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []
    return orjson.dumps([message.get("role"), content if content else None, said], option=orjson.OPT_SORT_KEYS)


def _call_text(call: dict[str, Any]) -> list[Any]:
    function = call.get("function")
    if not isinstance(function, dict):
        return [None, None]
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            arguments = arguments.strip()
    return [function.get("name"), arguments]


def _digests(messages: list[Any]) -> list[str]:
    """The digest of every prefix of `messages` (index k: the first k+1 messages)."""
    h = hashlib.blake2b(digest_size=16)
    out = []
    for message in messages:
        h.update(_message_text(message))
        h.update(b"\x1e")
        out.append(h.copy().hexdigest())
    return out


class SessionBook:
    def __init__(self, run_id: str, max_sessions: int = MAX_SESSIONS, max_bytes: int = MAX_SESSION_BYTES) -> None:
        self.run_id, self.max_sessions, self.max_bytes = run_id, max_sessions, max_bytes
        self._bytes = 0
        """The length of every kept head's `sequence`, summed."""
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._by_start: dict[bytes, list[tuple[int, int, _Head]]] = {}
        """Heads by their first KEY_IDS ids, each list sorted by (sequence length, order indexed)."""
        self._order = itertools.count()
        self._by_messages: dict[str, _Head] = {}
        self._counter = itertools.count(1)

    def number_after(self, last: int | None) -> None:
        """New sessions are numbered past `last`, the highest this run's store already holds: a dead proxy's spooled
        answers are recorded under its run id, whose numbering otherwise began at s1 again and named a new
        conversation like a stored one (two conversations under one id, two turns 0)."""
        if last is not None:
            self._counter = itertools.count(last + 1)

    def place(
        self,
        prompt_ids: list[int],
        messages: list[Any] | None,
        *,
        named: str | None = None,
        user: str | None = None,
    ) -> Turn:
        """The session and turn of a finished request (call `add` with its output next)."""
        packed = _pack(prompt_ids)
        if named or user:
            return self._place_named(packed, f"session:{named}" if named else f"user:{user}", named is not None)
        head = self._longest_prefix(packed)
        if head is not None:
            return Turn(head.session_id, head.turn + 1, "prefix", head.sample_id)
        head = self._by_message_prefix(messages)
        if head is not None:
            breaks = _first_difference(packed, head.sequence)
            return Turn(head.session_id, head.turn + 1, "messages", head.sample_id, breaks, len(head.sequence) // 4)
        return Turn(f"proxy:{self.run_id}:s{next(self._counter)}", 0, "new")

    def _place_named(self, packed: bytes, session_id: str, header: bool) -> Turn:
        """A turn of the session the harness named: after the longest kept turn its prompt extends, else that turn
        once more when it is one's prompt again (a retry), else after the newest with a break."""
        how = "header" if header else "user"
        session = self._sessions.get(session_id)
        if session is None:
            return Turn(session_id, 0, how)
        extended = [h for h in session.heads if packed.startswith(h.sequence)]
        if extended:
            head = max(extended, key=lambda h: (len(h.sequence), h.order))
            return Turn(session_id, head.turn + 1, how, head.sample_id)
        again = [h for h in session.heads if _is_regeneration(packed, h)]
        if again:
            return Turn(session_id, again[-1].turn, how, again[-1].parent_sample)
        newest = session.heads[-1] if session.heads else None
        if newest is None:
            return Turn(session_id, session.turns, how)
        breaks = _first_difference(packed, newest.sequence)
        return Turn(session_id, session.turns, how, newest.sample_id, breaks, len(newest.sequence) // 4)

    def add(
        self,
        turn: Turn,
        sample_id: str,
        *,
        prompt_ids: list[int],
        output_ids: list[int],
        messages: list[Any] | None,
        answer: dict[str, Any] | None,
    ) -> None:
        """Remember a finished turn as one its session's next request may continue (the newest of its heads)."""
        session = self._sessions.get(turn.session_id)
        if session is None:
            session = _Session(turn.session_id)
            self._sessions[turn.session_id] = session
        else:
            self._sessions.move_to_end(turn.session_id)
        session.turns = max(session.turns, turn.turn + 1)
        conversation = list(messages or [])
        if answer is not None:
            conversation.append(answer)
        sequence = _pack(list(prompt_ids) + list(output_ids))
        head = _Head(
            turn.session_id,
            turn.turn,
            sample_id,
            sequence,
            len(prompt_ids),
            turn.parent_sample,
            _digests(conversation)[-1] if messages and conversation else None,
        )
        for older in session.heads:
            if older.owned and sequence.startswith(older.sequence):
                older.sequence, older.owned = memoryview(sequence)[: len(older.sequence)], False
                self._bytes -= len(older.sequence)
        session.heads.append(head)
        self._index(head)
        while len(session.heads) > HEADS_KEPT:  # the oldest first: a view is only ever of a newer head's ids
            self._unindex(session.heads.pop(0))
        self._evict()

    # -- indexes -------------------------------------------------------------------------------------
    def _index(self, head: _Head) -> None:
        head.order = next(self._order)
        entry = (len(head.sequence), head.order, head)
        bisect.insort(self._by_start.setdefault(bytes(head.sequence[: KEY_IDS * 4]), []), entry)
        if head.message_key is not None:
            self._by_messages[head.message_key] = head
        self._bytes += len(head.sequence)

    def _unindex(self, head: _Head) -> None:
        key = bytes(head.sequence[: KEY_IDS * 4])
        entries = self._by_start.get(key)
        if entries:
            at = bisect.bisect_left(entries, (len(head.sequence), head.order))
            if at < len(entries) and entries[at][2] is head:
                del entries[at]
            if not entries:
                del self._by_start[key]
        if head.message_key is not None and self._by_messages.get(head.message_key) is head:
            del self._by_messages[head.message_key]
        if head.owned:
            self._bytes -= len(head.sequence)

    def _evict(self) -> None:
        """Forget the least recently used sessions past the count or the bytes (never the one just added)."""
        while len(self._sessions) > 1 and (len(self._sessions) > self.max_sessions or self._bytes > self.max_bytes):
            _, oldest = self._sessions.popitem(last=False)
            for head in oldest.heads:
                self._unindex(head)

    def _longest_prefix(self, packed: bytes) -> _Head | None:
        """The longest kept head whose prompt + output ids `packed` starts with; of equals, the first indexed."""
        entries = self._by_start.get(packed[: KEY_IDS * 4])
        if not entries:
            return None
        best: _Head | None = None
        best_len = -1
        at = bisect.bisect_right(entries, (len(packed), math.inf))  # past every head no longer than the prompt
        while at > 0:
            at -= 1
            length, _, head = entries[at]
            if length < best_len:
                break
            if packed.startswith(head.sequence):
                best, best_len = head, length  # equals go on down to the first indexed
        return best

    def _by_message_prefix(self, messages: list[Any] | None) -> _Head | None:
        if not messages:
            return None
        for key in reversed(_digests(messages)[:-1]):  # the longest earlier conversation it continues
            head = self._by_messages.get(key)
            if head is not None:
                return head
        return None


def _is_regeneration(packed: bytes, head: _Head) -> bool:
    """Whether a prompt is this kept turn's own prompt again: in a session the harness names, a retry of that turn.
    (Among unnamed ones the same first prompt may as well start a parallel rollout of one task: it starts a session
    of its own, and each rollout goes on from its own answer.)"""
    return len(packed) == head.prompt_len * 4 and head.sequence[: len(packed)] == packed


def _first_difference(packed: bytes, sequence: bytes | memoryview) -> int:
    """The first id position where the two packed sequences differ (the shorter length if one is a prefix)."""
    n = min(len(packed), len(sequence)) // 4
    lo, hi = 0, n
    while lo < hi:  # bisect on prefix equality: memcmp in C instead of a Python loop over thousands of ids
        mid = (lo + hi + 1) // 2
        if packed[: mid * 4] == sequence[: mid * 4]:
            lo = mid
        else:
            hi = mid - 1
    return lo


RESTORE_SQL = """
SELECT prompt_id, turn, sample_id, prompt_ids, output_ids, raw_request, content, raw_response
FROM samples
WHERE sample_id LIKE 'proxy:%' AND turn IS NOT NULL
QUALIFY row_number() OVER (PARTITION BY prompt_id ORDER BY turn DESC, created_at DESC) = 1
ORDER BY max(created_at) OVER (PARTITION BY prompt_id) DESC
LIMIT ?
"""
"""The newest turn of each of the most recently active proxied sessions in a store."""


LAST_NUMBER_SQL = """
SELECT max(try_cast(regexp_extract(prompt_id, ':s([0-9]+)$', 1) AS BIGINT))
FROM samples
WHERE starts_with(prompt_id, ?)
"""
"""The highest session number a run's proxy gave (its session ids are `proxy:RUN:sN`)."""


def assistant_message(content: str | None, calls: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The assistant message a harness appends for an answer (what its next request's messages hold), from the
    server's calls as plain records {id, name, arguments} (`core.tool_calls.server_tool_calls`)."""
    shaped = [
        {"id": c.get("id"), "type": "function", "function": {"name": c.get("name"), "arguments": c.get("arguments")}}
        for c in calls or ()
    ]
    return {"role": "assistant", "content": content, "tool_calls": shaped or None}


def _json_or_empty(text: str | None) -> Any:
    try:
        return orjson.loads(text) if text else {}
    except orjson.JSONDecodeError:
        return {}


def restore(book: SessionBook, rows: list[tuple[Any, ...]]) -> int:
    """Put the newest turn of stored sessions back in `book` (oldest first, so the newest stay): a harness
    whose conversation outlived a proxy restart continues its session instead of starting a new one.

    The answer's tool calls are read back from the stored response: a turn that called tools is what the next
    request's messages hold with those calls, and without them its key matched no next request."""
    from tokview.core.tool_calls import tool_calls_of_response

    for session_id, turn, sample_id, prompt_ids, output_ids, raw_request, content, raw_response in reversed(rows):
        request = _json_or_empty(raw_request)
        body = request.get("body") if isinstance(request, dict) else None
        messages = body.get("messages") if isinstance(body, dict) else None
        answer = None
        if isinstance(messages, list):
            answer = assistant_message(content, tool_calls_of_response(_json_or_empty(raw_response)))
        placed = Turn(session_id, int(turn), "restored")
        book.add(
            placed,
            sample_id,
            prompt_ids=list(prompt_ids),
            output_ids=list(output_ids),
            messages=messages if isinstance(messages, list) else None,
            answer=answer,
        )
    return len(rows)
