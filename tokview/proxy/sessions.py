"""Which conversation a proxied request belongs to, and which turn of it it is.

A harness names its conversation with the session header or the request's `user` field; otherwise the
ids decide: a request whose prompt ids begin with an earlier request's prompt + output ids continues
that conversation (architecture.md, "conversations as chains"). A harness that re-renders its history
(drops the reasoning, re-serialises arguments, renumbers call ids) breaks that prefix; when its messages
still continue a conversation, the turn joins it and says where the ids first differ, which is what a
team needs to know about the prompts its drafter will see.

Only ids and messages of finished requests are kept (the newest turn of each session), in memory, for
the `max_sessions` most recently used sessions. A new prompt is compared (memcmp) with the kept sessions
that share its first KEY_IDS ids and are no longer than it, longest first, until one matches: those are kept
sorted by length, so a new conversation among thousands that share one system prompt (shorter than any of
their prompt + output ids) costs a bisection, not a comparison per open session.
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
MAX_SESSION_BYTES = 256 << 20
"""The ids all kept sessions may hold together (4 bytes an id: ~67M ids), the least recently used going first
beyond it. Each session holds its newest turn's prompt + output ids: 0.5 MB at a 128k-token agent trace, so
the count alone let 2,000 long traces hold 1 GB."""
_INT32 = next(code for code in "il" if array(code).itemsize == 4)


@dataclass
class _Session:
    session_id: str
    turns: int = 0
    sequence: bytes = b""
    """prompt + output ids of the newest turn, as 32-bit ints (compared with `startswith`)."""
    last_sample: str | None = None
    prompt_len: int = 0
    """How many of `sequence`'s ids are the newest turn's prompt (the rest its output)."""
    parent_sample: str | None = None
    """The newest turn's own parent (a regeneration of it has the same one)."""
    message_keys: list[str] = field(default_factory=list)
    """Digests of the newest turn's messages plus its answer, each prefix's digest (see `_digests`)."""
    indexed: tuple[int, int, str] = (0, 0, "")
    """Its entry in `SessionBook._by_start`: (sequence length, order indexed, session id)."""


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
        """The length of every kept session's `sequence`, summed."""
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._by_start: dict[bytes, list[tuple[int, int, str]]] = {}
        """Sessions by their first KEY_IDS ids, each list sorted by (sequence length, order indexed)."""
        self._order = itertools.count()
        self._by_messages: dict[str, str] = {}
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
            session_id = f"session:{named}" if named else f"user:{user}"
            session = self._sessions.get(session_id)
            how = "header" if named else "user"
            if session is None:
                return Turn(session_id, 0, how)
            if _is_regeneration(packed, session):  # a retry: that turn once more, not the next one with a break
                return Turn(session_id, session.turns - 1, how, session.parent_sample)
            breaks = None if packed.startswith(session.sequence) else _first_difference(packed, session.sequence)
            return Turn(session_id, session.turns, how, session.last_sample, breaks, len(session.sequence) // 4)
        session = self._longest_prefix(packed)
        if session is not None:
            return Turn(session.session_id, session.turns, "prefix", session.last_sample)
        session = self._by_message_prefix(messages)
        if session is not None:
            return Turn(
                session.session_id,
                session.turns,
                "messages",
                session.last_sample,
                _first_difference(packed, session.sequence),
                len(session.sequence) // 4,
            )
        return Turn(f"proxy:{self.run_id}:s{next(self._counter)}", 0, "new")

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
        """Remember a finished turn as its session's newest (the one a next request may extend)."""
        session = self._sessions.get(turn.session_id)
        if session is None:
            session = _Session(turn.session_id)
            self._sessions[turn.session_id] = session
        else:
            self._sessions.move_to_end(turn.session_id)
            self._unindex(session)
        session.turns = max(session.turns, turn.turn + 1)
        self._bytes -= len(session.sequence)
        session.sequence = _pack(list(prompt_ids) + list(output_ids))
        self._bytes += len(session.sequence)
        session.prompt_len = len(prompt_ids)
        session.parent_sample = turn.parent_sample
        session.last_sample = sample_id
        conversation = list(messages or [])
        if answer is not None:
            conversation.append(answer)
        session.message_keys = _digests(conversation) if messages else []
        self._index(session)
        self._evict()

    # -- indexes -------------------------------------------------------------------------------------
    def _index(self, session: _Session) -> None:
        session.indexed = (len(session.sequence), next(self._order), session.session_id)
        bisect.insort(self._by_start.setdefault(session.sequence[: KEY_IDS * 4], []), session.indexed)
        if session.message_keys:
            self._by_messages[session.message_keys[-1]] = session.session_id

    def _unindex(self, session: _Session) -> None:
        key = session.sequence[: KEY_IDS * 4]
        entries = self._by_start.get(key)
        if entries:
            at = bisect.bisect_left(entries, session.indexed)
            if at < len(entries) and entries[at] == session.indexed:
                del entries[at]
            if not entries:
                del self._by_start[key]
        if session.message_keys and self._by_messages.get(session.message_keys[-1]) == session.session_id:
            del self._by_messages[session.message_keys[-1]]

    def _evict(self) -> None:
        """Forget the least recently used sessions past the count or the bytes (never the one just added)."""
        while len(self._sessions) > 1 and (len(self._sessions) > self.max_sessions or self._bytes > self.max_bytes):
            _, oldest = self._sessions.popitem(last=False)
            self._unindex(oldest)
            self._bytes -= len(oldest.sequence)

    def _longest_prefix(self, packed: bytes) -> _Session | None:
        """The longest kept session whose prompt + output ids `packed` starts with; of equals, the first indexed."""
        entries = self._by_start.get(packed[: KEY_IDS * 4])
        if not entries:
            return None
        best: _Session | None = None
        best_len = -1
        at = bisect.bisect_right(entries, (len(packed), math.inf))  # past every session no longer than the prompt
        while at > 0:
            at -= 1
            length, _, session_id = entries[at]
            if length < best_len:
                break
            session = self._sessions[session_id]
            if packed.startswith(session.sequence):
                best, best_len = session, length  # equals go on down to the first indexed
        return best

    def _by_message_prefix(self, messages: list[Any] | None) -> _Session | None:
        if not messages:
            return None
        for key in reversed(_digests(messages)[:-1]):  # the longest earlier conversation it continues
            session_id = self._by_messages.get(key)
            if session_id is not None and session_id in self._sessions:
                return self._sessions[session_id]
        return None


def _is_regeneration(packed: bytes, session: _Session) -> bool:
    """Whether a prompt is the session's newest turn's own prompt again: in a session the harness names, a retry of
    that turn. (Among unnamed ones the same prompt may as well start a parallel rollout of one task: it starts a
    session of its own, and each rollout goes on from its own answer.)"""
    return session.turns > 0 and len(packed) == session.prompt_len * 4 and session.sequence.startswith(packed)


def _first_difference(packed: bytes, sequence: bytes) -> int:
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
