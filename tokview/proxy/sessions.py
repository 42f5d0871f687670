"""Which conversation a proxied request belongs to, and which turn of it it is.

A harness names its conversation with the session header or the request's `user` field; otherwise the
ids decide: a request whose prompt ids begin with an earlier request's prompt + output ids continues
that conversation (architecture.md, "conversations as chains"). A harness that re-renders its history
(drops the reasoning, re-serialises arguments, renumbers call ids) breaks that prefix; when its messages
still continue a conversation, the turn joins it and says where the ids first differ, which is what a
team needs to know about the prompts its drafter will see.

Only ids and messages of finished requests are kept (the turns of each session's TURNS_KEPT newest requests: a side
request that finished first, another choice or a retry leaves the turn the harness goes on from still there), in memory,
for the most recently used sessions (`max_sessions`, `max_bytes`). A new prompt is compared (memcmp) only with the kept
turns that share its first KEY_IDS ids and whose last ids it holds at their length (`prefix_index`: one vectorised
compare, not a step per open session, among thousands that share one system prompt). It continues the longest it
extends: turn k+1 of that turn's session, whichever turn of it is the newest.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import struct
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import orjson

from tokview.core.prefix_memo import pack_int32
from tokview.proxy.break_causes import Served, harness_changes, served_of
from tokview.proxy.prefix_index import PrefixGroup

if TYPE_CHECKING:
    from tokview.core.profiles import ModelProfile
    from tokview.store.connection import Database

SESSION_HEADER = "x-tokview-session"
KEY_IDS = 16
"""Sessions are indexed by the bytes of their first ids; a prompt's candidates share them."""
MAX_SESSIONS = 2_000
"""Sessions kept (the least recently used go first); a harness rarely has more conversations open at once."""
KEY_MIN_IDS = 2_048
"""Ids a turn must share with its key turn to store its prompt past it (`SessionBook.stored_past`): fewer save less
than the join that puts them back costs."""
TURNS_KEPT = 32
"""Requests kept per session that a next request may continue: the newest, and those before it that a side request
(a title, a summary, a check) finishing first, a retry, or sub-agents forked from the main loop still leave someone
to continue (the main loop's next turn extends its own last turn, not theirs). At 4, a sub-agent of 4 turns pushed
the main loop's turn out: its next turn started a session of its own, or (named) was flagged as a rewritten history
against the sub-agent's turn. A chain's turns share one buffer (`_Head.sequence`), so more of them cost little."""
RESTORED_TURNS = 4
"""Requests per session a restarted proxy reads back (`RESTORE_SQL`): this many of the newest and of the highest turns;
every kept turn of 2,000 sessions would make each start read their whole ids."""
CHOICES_KEPT = 8
"""Of one request's `n` choices, the first this many are kept (each may be the one a best-of-n harness goes on from);
they count as one request towards TURNS_KEPT."""
MAX_SESSION_BYTES = 256 << 20
"""The ids all kept sessions may hold together (4 bytes an id: ~67M ids), the least recently used going first
beyond it. A session holds its kept turns' prompt + output ids (about once: see `_Head.sequence`), 0.5 MB at a
128k-token agent trace, so the count alone let 2,000 long traces hold 1 GB."""
UNNAMED = "proxy:"
"""How the id of a session the proxy placed by prefix begins (`proxy:RUN:sN`): a harness named none of its requests."""
NAMED_TURNS_KEPT = 100_000
"""Named sessions forgotten (evicted) whose turn count is still kept, so one that comes back goes on numbering."""


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
    request: int = 0
    """The request it came from: the choices of one `n` > 1 request share it."""
    stored_from: str | None = None
    """The key turn its row's prompt ids are stored past (`store.prompt_refs`), None when stored whole."""
    stored_len: int = 0
    """With `stored_from`: how many of the key turn's prompt + output ids begin its prompt (its `prompt_from_len`)."""
    int32: bool = True
    """`sequence` holds its ids as 32-bit ints (False: as JSON, `_pack`'s fallback): only such turns share ids by
    their bytes with a prompt (`stored_past`)."""
    continued: bool = False
    """A later turn was placed after it: of heads with the same ids (rollouts of one task at temperature 0), a next
    turn goes on from one that has none yet."""
    slot: int = -1
    """Its place in its `PrefixGroup` (an unnamed session's turn; `prefix_index`)."""
    placed: Turn | None = None
    """How `place` placed it, when that broke the prefix (None otherwise, and for a restored turn): a retry of it in a
    session the harness names breaks it where it did (`_retry`)."""
    served: Served | None = None
    """Its answer as the server returned it (digests), which a next turn that breaks its prefix is compared with."""


@dataclass
class _Session:
    session_id: str
    turns: int = 0
    """One past the highest turn placed in it."""
    heads: list[_Head] = field(default_factory=list)
    """Its TURNS_KEPT most recent requests' turns (their choices), the newest last: a request may continue any."""


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
    by_name_only: bool = False
    """It joined the session the harness named though neither its ids nor its messages continue a kept turn (a
    compacted history, or a session name reused for another conversation): placed after the newest turn."""
    previous_turn: int | None = None
    """With `by_name_only`: the turn of the newest kept request its ids were compared with (a retry of an earlier
    turn, maybe: not always the turn before)."""
    previous_id: int | None = None
    """With `break_at`: the id the compared turn has there (None where its ids end): the finding shows both sides."""
    previous_served: Served | None = None
    """With `break_at`: the compared turn's answer as served (`break_causes`: what the harness changed in it)."""


def _pack(ids: Sequence[int]) -> tuple[bytes, bool]:
    """The ids as 4-byte integers, or, when one is not a signed 32-bit integer (a gateway's garbage), as JSON: placed
    by those bytes like any other sequence (a packed one could share them only by holding ids like 858,927,451);
    and whether they are 4-byte integers (a JSON list's length can be 4 bytes an id too)."""
    packed = pack_int32(ids)
    return (packed, True) if packed is not None else (_as_json(ids), False)


def _as_json(ids: Sequence[int]) -> bytes:
    return orjson.dumps(list(ids))


@dataclass
class _Placed:
    """What `place` computed for a request, which `add` (called next for it) reads again: on an agent's long
    conversation each is a pass over all of it (packing 46,000 ids, hashing 150,000 characters of messages).
    Found by the lists' identity: `place` and `add` are given the same lists, unchanged in between (the recorder's
    capture and request); held until the next `place`."""

    prompt_ids: Sequence[int]
    packed: bytes | None
    """`pack_int32` of the prompt."""
    messages: list[Any] | None = None
    digests: tuple[list[str], Any] | None = None
    """`_digests` of `messages`, once computed."""


def _message_text(message: object) -> bytes:
    """What a turn says, without what harnesses rewrite (reasoning, call ids, argument spacing and key order, the
    whitespace around a text, a text sent back as text parts: a stripped answer's next request was taken for one
    going on from an older turn, or for a new conversation).

    A call's arguments count as the JSON value they hold: parallel rollouts of one task (the same prompt, the same
    first tool) differ only there, and keyed by the tool's name alone they were taken for one conversation."""
    if not isinstance(message, dict):
        return _sorted_json(message)
    content = message.get("content")
    if isinstance(content, list) and all(_is_text_part(part) for part in content):
        content = "".join(part["text"] for part in content)  # the answer sent back as text parts: the same text
    if isinstance(content, str):  # harnesses strip the answer before it goes back in the history ("\n\nHi" → "Hi")
        content = content.strip()
    calls = message.get("tool_calls")
    said = [_call_text(c) for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []
    return _sorted_json([message.get("role"), content if content else None, said])


def _is_text_part(part: object) -> bool:
    return isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)


def _sorted_json(value: object) -> bytes:
    """`value` as JSON with sorted keys; by Python's json (every character escaped) when orjson cannot write it: a
    lone surrogate, which a request's JSON may hold (`"\\ud800"`), or an int past 64 bits."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # orjson's JSONEncodeError is one
        return json.dumps(value, sort_keys=True).encode()


def _call_text(call: dict[str, Any]) -> list[Any]:
    function = call.get("function")
    if not isinstance(function, dict):
        return [None, None]
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = _whole_numbers(orjson.loads(arguments))
        except orjson.JSONDecodeError:
            arguments = arguments.strip()
        except RecursionError:  # nested past Python's stack: compared as sent
            arguments = arguments.strip()
    else:  # sent as a JSON object (off the spec, and taken): its numbers too
        try:
            arguments = _whole_numbers(arguments)
        except RecursionError:
            pass
    return [function.get("name"), arguments]


def _whole_numbers(value: Any) -> Any:
    """`value` with each whole float as the int it equals: a harness that parsed the served `{"a": 1}` into a float
    sends back `{"a": 1.0}` (JavaScript's numbers, pydantic's float fields), the same call to the tool; compared as
    written, the turn was taken for a new conversation and its break never reported."""
    if isinstance(value, float):
        return int(value) if value.is_integer() and abs(value) < 2**53 else value
    if isinstance(value, dict):
        return {k: _whole_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_whole_numbers(v) for v in value]
    return value


def _digests(messages: list[Any], after: Any = None) -> tuple[list[str], Any]:
    """The digest of every prefix of `messages` (index k: the first k+1 messages), and the hash state after them all,
    to go on from (`after`: the state of an earlier call, which these messages follow)."""
    h = hashlib.blake2b(digest_size=16) if after is None else after.copy()
    out = []
    for message in messages:
        h.update(_message_text(message))
        h.update(b"\x1e")
        out.append(h.copy().hexdigest())
    return out, h


SHORT_MIN_OUTPUT = 2
"""A turn shorter than a key is continued only past an answer of at least this many ids: a one-id answer (a
warm-up, a health check: `"Hello"` answered `","`) was the start of every later prompt that opened the same way."""


def _continued_short(head: _Head, key: bytes) -> bool:
    """Whether a head keyed by fewer than KEY_IDS ids (all of it) may be continued by a longer prompt (`_short_keys`)."""
    return len(key) < KEY_IDS * 4 and len(head.sequence) // 4 - head.prompt_len >= SHORT_MIN_OUTPUT


class SessionBook:
    def __init__(
        self,
        run_id: str,
        max_sessions: int = MAX_SESSIONS,
        max_bytes: int = MAX_SESSION_BYTES,
        *,
        profile: ModelProfile | None = None,
    ) -> None:
        """`profile`: where a kept answer's parts begin on its ids (`break_causes.Served`), to tell which of a
        harness's changes can have broken a next turn's prefix."""
        self.run_id, self.max_sessions, self.max_bytes, self.profile = run_id, max_sessions, max_bytes, profile
        self._bytes = 0
        """The length of every owned head `sequence`, summed (a view's bytes are its newer head's)."""
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._by_start: dict[bytes, PrefixGroup[_Head]] = {}
        """The unnamed sessions' heads (only theirs are continued by ids alone) by their first KEY_IDS ids."""
        self._short_keys: Counter[int] = Counter()
        """How many `_by_start` keys are shorter than KEY_IDS ids, per length in bytes: a head that short (a short
        `/v1/completions` prompt and answer) is keyed by all of it, and a longer prompt continuing it is looked up
        at those lengths too (it was keyed at KEY_IDS ids only, and no turn could ever continue such a head)."""
        self._order = itertools.count()
        self._requests = itertools.count()
        self._by_messages: dict[str, list[_Head]] = {}
        """Heads by their messages' digest, the newest last."""
        self._named_turns: OrderedDict[str, int] = OrderedDict()
        """How many turns each forgotten named session had."""
        self._user_numbers: dict[str, int] = {}
        """`user:NAME` → the highest N of a `user:NAME/N` conversation seen (added or restored): where a new one goes
        on. A map, not a scan of every session's id at each request (19 ms at 100,000 named sessions)."""
        self._counter = itertools.count(1)
        self._placed: _Placed | None = None
        """The last request `place` saw."""

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
        parallel_to: Turn | None = None,
    ) -> Turn:
        """The session and turn of a finished request (call `add` with its output next). `parallel_to`: the turn of
        the first prompt of the same request (a `/v1/completions` list of prompts): in a session the harness named,
        a prompt that extends none of its kept turns sits beside that one, not after the newest with a break."""
        packed_ints = pack_int32(prompt_ids)
        self._placed = _Placed(prompt_ids, packed_ints, messages)
        packed = packed_ints if packed_ints is not None else _as_json(prompt_ids)
        if named:
            turn = self._place_named(packed, messages, f"session:{named}", "header", parallel_to)
            assert turn is not None  # not strict: always a turn
            return turn
        if user:
            return self._place_user(packed, messages, f"user:{user}", parallel_to)
        head = self._longest_prefix(packed)
        if head is not None:
            deeper = self._deeper_by_messages(head, messages)
            if deeper is not None:
                return _after(deeper, packed, "messages", breaks=True)
            if not self._messages_hold(head, messages):
                # The ids extend `head` only because its answer is the start of another's (a rollout cut at its
                # max_tokens, the same task run again): the turn the messages continue is the one it goes on from.
                # Placed after `head`, another rollout's turn joined the cut one's session unflagged, its harness's
                # renumbered call ids never said.
                other = self._by_message_prefix(messages, UNNAMED)
                if other is not None and other is not head and packed[: len(other.sequence)] != other.sequence:
                    # (a turn whose ids it extends too is on `head`'s own line: an earlier turn of it, not another's)
                    return _after(other, packed, "messages", breaks=True)
            return _after(head, packed, "prefix")
        head = self._by_message_prefix(messages, UNNAMED)
        if head is not None:
            return _after(head, packed, "messages", breaks=True)
        return Turn(f"proxy:{self.run_id}:s{next(self._counter)}", 0, "new")

    def _place_user(self, packed: bytes, messages: list[Any] | None, base: str, parallel_to: Turn | None) -> Turn:
        """A turn of one of the conversations of the request's `user` (`user:NAME`, then `user:NAME/2`, …): the one
        it continues (as `_place_named` finds it, newest conversation first), else a new one.

        Why not one session per `user`, as per session header: OpenAI documents `user` as the end user, so a
        harness sends one value with every conversation of that user. A second, unrelated task joined the first
        as its next turns, flagged with a prefix break that said the harness had re-rendered the history."""
        if base not in self._user_numbers:  # the user's first conversation (this run's, or the store's)
            if parallel_to is not None and parallel_to.session_id == base:
                return Turn(base, parallel_to.turn, "user", parallel_to.parent_sample)
            return Turn(base, 0, "user")
        for session_id in reversed(self._user_conversations(base)):
            turn = self._place_named(packed, messages, session_id, "user", parallel_to, strict=True)
            if turn is not None:
                return turn
        # It continues none of the user's kept turns: another conversation. One the proxy no longer keeps (forgotten
        # past MAX_SESSIONS, or not restored at a start) is no more continued than a kept one it does not extend:
        # it went on by its name, and an unrelated task became the forgotten conversation's next turns (or, after a
        # restart, its turn 0 again).
        return Turn(f"{base}/{self._user_numbers[base] + 1}", 0, "user")

    def _user_conversations(self, base: str) -> list[str]:
        """The session ids of `base`'s conversations this book keeps, oldest first, and last the newest number seen
        (kept or not: a restart that restored only `/3` leaves `/1` and `/2` out, and a new one is `/4`)."""
        highest = self._user_numbers.get(base, 1)
        newest = base if highest == 1 else f"{base}/{highest}"
        prefix = base + "/"
        kept = [sid for sid in self._sessions if sid == base or (sid.startswith(prefix) and sid != newest)]
        return [*kept, newest]

    def note_user_session(self, session_id: str) -> None:
        """Remember a `user:NAME` (or `user:NAME/N`) conversation as the user's: added here, restored, or only stored
        (`restore_sessions`), so a new conversation of that user is never numbered as one that exists."""
        if not session_id.startswith("user:"):
            return
        self._user_numbers.setdefault(session_id, 1)  # a user's first conversation: a name may end in `/3` itself
        base, _, tail = session_id.rpartition("/")
        if base.startswith("user:") and tail.isascii() and tail.isdigit() and len(tail) <= 9:  # a name's own digits:
            self._user_numbers[base] = max(self._user_numbers.get(base, 1), int(tail))  # "²" is no int

    def _place_named(
        self,
        packed: bytes,
        messages: list[Any] | None,
        session_id: str,
        how: str,
        parallel_to: Turn | None = None,
        *,
        strict: bool = False,
    ) -> Turn | None:
        """A turn of the session the harness named: after the longest kept turn its prompt extends, else that turn
        once more when it is one's prompt again (a retry), else beside `parallel_to` (another prompt of its request),
        else after the kept turn its messages continue, else after the newest; the last two with the break.
        `strict`: None instead of after the newest (a `user`'s request may begin another conversation)."""
        session = self._sessions.get(session_id)
        if session is None or not session.heads:
            if parallel_to is not None and parallel_to.session_id == session_id:
                return Turn(session_id, parallel_to.turn, how, parallel_to.parent_sample)
            return None if strict else Turn(session_id, self._named_turns.get(session_id, 0), how)
        extended = [h for h in session.heads if packed.startswith(h.sequence)]
        if extended:
            longest = max(extended, key=lambda h: (len(h.sequence), h.order))
            deeper = self._deeper_by_messages(longest, messages)
            if deeper is not None:
                return _after(deeper, packed, how, breaks=True)
            return _after(longest, packed, how)
        again = [h for h in session.heads if _is_regeneration(packed, h)]
        if again:  # a retry: the turn once more, its break (where its ids left the turn before) with it
            return _retry(again[-1], session, packed, how)
        if parallel_to is not None and parallel_to.session_id == session_id:
            return _beside(parallel_to, session, packed, how)
        head = self._by_message_prefix(messages, session_id)
        if head is not None:
            return _after(head, packed, how, breaks=True)
        if strict:
            return None
        newest = session.heads[-1]
        breaks = _first_difference(packed, newest.sequence)
        return Turn(
            session_id,
            session.turns,
            how,
            newest.sample_id,
            breaks,
            len(newest.sequence) // 4,
            True,
            newest.turn,
            _id_at(newest, breaks),
        )

    def add(
        self,
        turn: Turn,
        sample_id: str,
        *,
        prompt_ids: list[int],
        output_ids: list[int],
        messages: list[Any] | None,
        answer: dict[str, Any] | None,
        sibling: bool = False,
        stored_from: str | None = None,
        stored_len: int = 0,
    ) -> None:
        """Remember a finished turn as one its session's next request may continue (the newest of its heads).
        `sibling`: another choice of the request `add` was last called for (`n` > 1); `stored_from`: the key turn
        its stored row's prompt ids are past (a turn restored from the store; `stored_past` decides for new ones), and
        `stored_len` how many of that key's ids they are past."""
        session = self._sessions.get(turn.session_id)
        if session is None:
            session = _Session(turn.session_id)
            self._sessions[turn.session_id] = session
            self.note_user_session(turn.session_id)
        else:
            self._sessions.move_to_end(turn.session_id)
        session.turns = max(session.turns, turn.turn + 1)
        if turn.parent_sample is not None:  # by ids or by messages: a twin's next turn goes on from the other twin
            for parent in session.heads:
                parent.continued = parent.continued or (
                    parent.sample_id == turn.parent_sample and parent.turn < turn.turn
                )
        last = session.heads[-1] if session.heads else None
        request = last.request if sibling and last is not None else next(self._requests)
        if sum(h.request == request for h in session.heads) >= CHOICES_KEPT:
            return
        (sequence, int32), key = self._packed_turn(prompt_ids, output_ids), None
        if messages:  # the key of its messages plus the answer the next request's messages hold
            digests, state = self._digests_of(messages)
            key = _digests([answer], after=state)[0][-1] if answer is not None else digests[-1]
            if turn.joined_by == "restored":  # the turn its messages continue was continued, as its parent was marked
                earlier = set(digests[:-1])
                for older in session.heads:
                    older.continued = older.continued or (older.turn < turn.turn and older.message_key in earlier)
        head = _Head(
            turn.session_id,
            turn.turn,
            sample_id,
            sequence,
            len(prompt_ids),
            turn.parent_sample,
            key,
            request=request,
            stored_from=stored_from,
            stored_len=stored_len if stored_from is not None else 0,
            int32=int32,
            placed=turn if turn.break_at is not None and turn.joined_by != "restored" else None,
            served=served_of(answer, messages, len(prompt_ids), output_ids, self.profile),
        )
        for older in session.heads:  # every older head it begins with, views included: one buffer holds them all
            if sequence.startswith(older.sequence):
                if turn.joined_by == "restored" and older.turn < turn.turn:
                    older.continued = True  # what its continuation's parent marked when it was placed
                if older.owned:
                    self._bytes -= len(older.sequence)
                older.sequence, older.owned = memoryview(sequence)[: len(older.sequence)], False
        session.heads.append(head)
        self._index(head)
        while len({h.request for h in session.heads}) > TURNS_KEPT:  # the oldest first: views are of newer heads
            self._unindex(session.heads.pop(0))
        self._evict()

    def whole_rows(self) -> list[str]:
        """The sample ids of rows holding their whole prompt ids that kept turns are or are stored past (what a key
        turn must be): a restarted proxy's, whose restored rows `restore` read whole, key turns included."""
        rows = (h.stored_from or h.sample_id for s in self._sessions.values() for h in s.heads)
        return list(dict.fromkeys(rows))

    def stored_past(
        self, turn: Turn, sample_id: str, prompt_len: int, is_key: Callable[[str], bool] = lambda sample_id: True
    ) -> tuple[str, int] | None:
        """(key turn's sample id, how many of its prompt + output ids begin this prompt) when the turn `add` just kept
        as `sample_id` may store its prompt ids past a key turn's (`store.prompt_refs`); None: stored whole.

        A key turn is stored whole (one join puts any prompt back) and is a key by `is_key` (the recorder's: its row
        seen landed whole); the turn must share at least KEY_MIN_IDS ids and half its prompt with it, else it is
        stored whole and may become a key itself. Each kept turn of the session offers one key, the most shared
        taken: a turn stored whole offers itself (the ids its prompt shares with it, compared); a turn stored past a
        key offers that key, for the ids the prompt shares with the turn up to the turn's own `stored_len` (those are
        the key's ids too), so the key need not still be kept here. Why not only the turn it continues: a recorder
        that gets turns faster than its landings (a lower-priority child after a burst) saw the turn before
        unlanded every time, and a key dropped from the kept turns made the next turn whole: a long agent session
        stored its whole conversation again every few turns."""
        session = self._sessions.get(turn.session_id)
        if session is None or turn.parent_sample is None or prompt_len < 2 * KEY_MIN_IDS:
            return None
        head = next((h for h in reversed(session.heads) if h.sample_id == sample_id), None)
        if head is None or not head.int32:
            return None
        prompt = bytes(head.sequence[: prompt_len * 4])
        buffer = _whole(head.sequence)
        best: tuple[str, int] | None = None
        for other in reversed(session.heads):
            if other is head or other.sample_id == head.sample_id or not other.int32:
                continue
            key_id = other.sample_id if other.stored_from is None else other.stored_from
            if key_id == sample_id:  # a replayed turn (a spool after a restart) under a turn stored past it
                continue
            bound = min(len(other.sequence) // 4, prompt_len)  # the most it can share: compared only if that wins
            if other.stored_from is not None:
                bound = min(bound, other.stored_len)
            if bound < KEY_MIN_IDS or bound * 2 < prompt_len or (best is not None and bound <= best[1]):
                continue
            if not is_key(key_id):
                continue
            # a turn this one's ids begin with is a view of them (`add`): it shares all it holds, up to the prompt
            same = isinstance(other.sequence, memoryview) and other.sequence.obj is buffer
            shared = bound if same else min(bound, _first_difference(prompt, other.sequence))
            if shared >= KEY_MIN_IDS and shared * 2 >= prompt_len and (best is None or shared > best[1]):
                best = (key_id, shared)
        if best is not None:
            head.stored_from, head.stored_len = best
        return best

    def _packed_turn(self, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> tuple[bytes, bool]:
        """`_pack` of prompt + output ids, the prompt's packing `place` made reused."""
        placed = self._placed
        if placed is not None and placed.prompt_ids is prompt_ids and placed.packed is not None:
            output = pack_int32(output_ids)
            if output is not None:
                return placed.packed + output, True
        return _pack([*prompt_ids, *output_ids])

    def _digests_of(self, messages: list[Any]) -> tuple[list[str], Any]:
        """`_digests(messages)`, once per request: `place` and `add` both read them."""
        placed = self._placed
        if placed is None or placed.messages is not messages:
            return _digests(messages)
        if placed.digests is None:
            placed.digests = _digests(messages)
        return placed.digests

    # -- indexes -------------------------------------------------------------------------------------
    def _index(self, head: _Head) -> None:
        head.order = next(self._order)
        if head.session_id.startswith(UNNAMED):  # only these are continued by their ids alone (`_longest_prefix`)
            key = bytes(head.sequence[: KEY_IDS * 4])
            self._by_start.setdefault(key, PrefixGroup()).add(head)
            if _continued_short(head, key):
                self._short_keys[len(key)] += 1
        if head.message_key is not None:
            self._by_messages.setdefault(head.message_key, []).append(head)
        self._bytes += len(head.sequence)

    def _unindex(self, head: _Head) -> None:
        key = bytes(head.sequence[: KEY_IDS * 4])
        group = self._by_start.get(key)
        if group is not None:
            group.remove(head)
            if head.session_id.startswith(UNNAMED) and _continued_short(head, key):  # as `_index` counted it
                self._short_keys[len(key)] -= 1
                if not self._short_keys[len(key)]:
                    del self._short_keys[len(key)]
            if not len(group):
                del self._by_start[key]
        same = self._by_messages.get(head.message_key) if head.message_key is not None else None
        if same is not None:
            same[:] = [h for h in same if h is not head]
            if not same:
                del self._by_messages[head.message_key]  # type: ignore[arg-type]  # not None: `same` was found
        if head.owned:
            self._bytes -= len(head.sequence)

    def _evict(self) -> None:
        """Forget the least recently used sessions past the count or the bytes (never the one just added); a named
        one's turn count is kept, so if it comes back its turns go on from there."""
        while len(self._sessions) > 1 and (len(self._sessions) > self.max_sessions or self._bytes > self.max_bytes):
            session_id, oldest = self._sessions.popitem(last=False)
            for head in oldest.heads:
                self._unindex(head)
            if not session_id.startswith(UNNAMED):
                self._named_turns[session_id] = oldest.turns
                self._named_turns.move_to_end(session_id)
                if len(self._named_turns) > NAMED_TURNS_KEPT:
                    self._named_turns.popitem(last=False)

    def _longest_prefix(self, packed: bytes) -> _Head | None:
        """The longest kept head of an unnamed session whose prompt + output ids `packed` starts with; of equals, the
        first indexed that no turn continues yet, this run's before an earlier run's (identical unnamed rollouts, one
        per session, each go on in their own), else the first. A named session's turns are never continued by a request without its name: a harness
        that names its sessions names every request, and another harness sending the same first prompt unnamed was
        filed into the named one."""
        key = packed[: KEY_IDS * 4]
        group = self._by_start.get(key)
        extended = group.extended_by(packed) if group is not None else []
        for size in self._short_keys:  # heads shorter than a key (rare: only short completions make them)
            shorter = self._by_start.get(packed[:size]) if size < len(key) else None
            if shorter is not None:
                extended += [h for h in shorter.extended_by(packed) if _continued_short(h, packed[:size])]
        # A first turn whose answer was empty, asked once more: without a name, the same first prompt again (a
        # rollout of the same task) starts a session of its own, as after any answer (every later rollout of it was
        # filed into the empty one's session). A later turn's prompt again is a retry of that turn (`_after`).
        extended = [h for h in extended if not (h.turn == 0 and len(h.sequence) == len(packed) == h.prompt_len * 4)]
        if not extended:
            return None
        longest = max(len(h.sequence) for h in extended)
        equals = sorted((h for h in extended if len(h.sequence) == longest), key=lambda h: h.order)
        # of equals no turn continues, this run's first: a restarted proxy put a new rollout's next turn after an
        # abandoned rollout of the same task it read back, and `export --run` showed the new one start late
        mine = f"{UNNAMED}{self.run_id}:"
        open_ones = [h for h in equals if not h.continued]
        return next((h for h in open_ones if h.session_id.startswith(mine)), open_ones[0] if open_ones else equals[0])

    def _messages_hold(self, head: _Head, messages: list[Any] | None) -> bool:
        """Whether `messages` hold `head`'s conversation and answer as an earlier part (True when either side has no
        messages to tell by: a completions prompt, a turn restored without them)."""
        if not messages or head.message_key is None:
            return True
        return head.message_key in self._digests_of(messages)[0][:-1]

    def _deeper_by_messages(self, head: _Head, messages: list[Any] | None) -> _Head | None:
        """A later kept turn that goes on from `head` (same session, its ids starting with `head`'s) and whose
        conversation `messages` continue, when the request's ids extend only `head`: its history broke the prefix
        inside the later turn's output (SGLang numbers a Kimi call id from 0 again each turn, so the break shows from
        the second tool round on). Placed after `head` it was a second turn of `head`'s next number beside the real
        one (a branch), without the break's finding. Of the turns the longest earlier part of `messages` is, only
        those on `head`'s own line: twin lines (choices of one request, one task run twice) share their messages,
        not their ids. None when the messages continue `head` itself (a harness that branched from it)."""
        if not messages:
            return None
        line = head.sequence
        for key in reversed(self._digests_of(messages)[0][:-1]):  # the longest earlier conversation it continues
            later = [
                h
                for h in self._by_messages.get(key, ())
                if h.session_id == head.session_id and h.turn > head.turn and h.sequence[: len(line)] == line
            ]
            if later:
                return self._closest(later, messages)
        return None

    def _by_message_prefix(self, messages: list[Any] | None, session_id: str) -> _Head | None:
        """The kept head of `session_id` (of any unnamed session, given UNNAMED) whose messages plus answer the
        longest earlier part of `messages` is: the newest that no turn continues yet, else the newest. Two
        conversations with the same first turns (one task run twice) each go on from their own: the newest alone
        sent both second turns to one."""
        if not messages:
            return None
        for key in reversed(self._digests_of(messages)[0][:-1]):  # the longest earlier conversation it continues
            heads = [h for h in self._by_messages.get(key, ()) if _of(h, session_id)]
            if heads:
                return self._closest(heads, messages)
        return None

    def _closest(self, heads: list[_Head], messages: list[Any]) -> _Head:
        """Of kept turns whose messages plus answer the request's messages continue, the one it goes on from: the one
        sharing the most ids with its prompt, then the one whose answer it sent back as served, then the newest no
        turn continues yet, then the newest. Messages leave reasoning and call ids out, so two rollouts of one task (or
        the choices of one request) share them: the newest alone put a rollout's next turn after its twin's, and its
        break finding compared its answer with the twin's (call ids "renumbered" that were never changed)."""
        packed = self._placed.packed if self._placed is not None else None

        def closeness(h: _Head) -> tuple[int, bool, bool, int]:
            shared = _first_difference(packed, h.sequence) if packed is not None and h.int32 else 0
            faithful = h.served is not None and harness_changes(h.served, messages, None) == []
            return (shared, faithful, not h.continued, h.order)

        return max(heads, key=closeness)


def _of(head: _Head, session_id: str) -> bool:
    """Whether `head` is a turn of `session_id` (UNNAMED: of any session the proxy named by prefix)."""
    return head.session_id.startswith(UNNAMED) if session_id == UNNAMED else head.session_id == session_id


def _after(head: _Head, packed: bytes, how: str, *, breaks: bool = False) -> Turn:
    """The turn after `head` (with where `packed` leaves its ids, when `breaks`); or `head`'s own turn once more when
    its answer was empty and `packed` is its prompt again (a retry, not a turn that continues nothing)."""
    if not breaks and len(packed) == len(head.sequence) == head.prompt_len * 4:
        return Turn(head.session_id, head.turn, how, head.parent_sample)
    at = _first_difference(packed, head.sequence) if breaks else None
    previous_len = len(head.sequence) // 4 if breaks else 0
    previous_id = _id_at(head, at) if at is not None else None
    served = head.served if breaks else None
    return Turn(
        head.session_id,
        head.turn + 1,
        how,
        head.sample_id,
        at,
        previous_len,
        previous_id=previous_id,
        previous_served=served,
    )


def _retry(head: _Head, session: _Session, packed: bytes, how: str) -> Turn:
    """`head`'s turn once more (its prompt again, in a session the harness names), breaking the prefix where `head`
    did: as it was placed, else (a turn a restarted proxy restored) against its parent, or the turn before it, when
    that is still kept."""
    placed = head.placed
    if placed is not None:
        return replace(placed, joined_by=how)
    named = [h for h in session.heads if h.sample_id == head.parent_sample]
    # a restored turn names no parent: the kept turns before it (of several branches, the one it shares most with)
    before = named or [h for h in session.heads if h.turn == head.turn - 1]
    if not before or any(packed.startswith(h.sequence) for h in before):
        return Turn(head.session_id, head.turn, how, head.parent_sample)
    parent = max(before, key=lambda h: _first_difference(packed, h.sequence))
    return _breaking(head.session_id, head.turn, how, head.parent_sample, parent, packed)


def _beside(first: Turn, session: _Session, packed: bytes, how: str) -> Turn:
    """Another prompt of `first`'s request, at its turn after its parent; with where its ids leave the parent's when
    they do not extend them (the same prompt alone would have been flagged: its place in the list must not hide it)."""
    parent = next((h for h in session.heads if h.sample_id == first.parent_sample), None)
    if parent is None or packed.startswith(parent.sequence):
        return Turn(first.session_id, first.turn, how, first.parent_sample)
    return _breaking(  # neither its ids nor (being a completions prompt) its messages continue the parent
        first.session_id,
        first.turn,
        how,
        first.parent_sample,
        parent,
        packed,
        by_name_only=True,
        previous_turn=parent.turn,
    )


def _breaking(
    session_id: str, turn: int, how: str, parent_sample: str | None, parent: _Head, packed: bytes, **marks: Any
) -> Turn:
    """Turn `turn` of `session_id`, with where `packed` leaves `parent`'s ids (its `session_prefix_break`)."""
    at = _first_difference(packed, parent.sequence)
    return Turn(
        session_id,
        turn,
        how,
        parent_sample,
        at,
        len(parent.sequence) // 4,
        previous_id=_id_at(parent, at),
        previous_served=parent.served,
        **marks,
    )


def _id_at(head: _Head, at: int) -> int | None:
    """The kept turn's id at position `at` (None past its ids, or when they are not held as 32-bit ints)."""
    if not head.int32 or at >= len(head.sequence) // 4:
        return None
    return int(struct.unpack_from("=i", _whole(head.sequence), at * 4)[0])


def _is_regeneration(packed: bytes, head: _Head) -> bool:
    """Whether a prompt is this kept turn's own prompt again: in a session the harness names, a retry of that turn.
    (Among unnamed ones the same first prompt may as well start a parallel rollout of one task: it starts a session
    of its own, and each rollout goes on from its own answer.)"""
    return len(packed) == head.prompt_len * 4 and _whole(head.sequence).startswith(packed)


def _whole(sequence: bytes | memoryview) -> bytes:
    """The bytes a head's sequence is the start of (itself, or the newer head's a view is of): compared with
    `bytes` methods (memcmp), where comparing a memoryview goes byte by byte (~16x slower at 128k ids)."""
    return sequence.obj if isinstance(sequence, memoryview) else sequence  # type: ignore[return-value]


def _first_difference(packed: bytes, sequence: bytes | memoryview) -> int:
    """The first id position where the two packed sequences differ (the shorter length if one is a prefix).

    One memcmp when one is a prefix of the other (a session going on), else a bisect over only the part not yet
    known equal, each probe a memcmp against a view (no copy): probes that sliced both sides from the start copied
    ~2.5 MB at 40,000 ids."""
    n = min(len(packed), len(sequence)) // 4
    whole = _whole(sequence)  # its first n ids are the view's
    view = memoryview(whole)
    if packed.startswith(view[: n * 4]):
        return n
    lo, hi = 0, n - 1  # the first lo ids are equal; the first hi + 1 are not
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if packed.startswith(view[lo * 4 : mid * 4], lo * 4):
            lo = mid
        else:
            hi = mid - 1
    return lo


RESTORE_SQL = """
WITH proxied AS (
    SELECT sample_id, prompt_id, turn, created_at, coalesce(gen_index, 0) AS gen,
        sum(CASE WHEN coalesce(gen_index, 0) = 0 THEN 1 ELSE 0 END) OVER (
            PARTITION BY prompt_id ORDER BY created_at, sample_id ROWS UNBOUNDED PRECEDING) AS request,
        dense_rank() OVER (PARTITION BY prompt_id ORDER BY turn DESC) AS from_top,
        max(created_at) OVER (PARTITION BY prompt_id) AS active
    FROM samples
    WHERE starts_with(sample_id, 'proxy:') AND turn IS NOT NULL
), ranked AS (
    SELECT *, max(request) OVER (PARTITION BY prompt_id) AS newest,
        dense_rank() OVER (ORDER BY active DESC, prompt_id) AS recency
    FROM proxied
)
SELECT s.prompt_id, s.turn, s.sample_id, s.prompt_ids, s.output_ids, s.raw_request, s.content, s.raw_response,
    s.prompt_from, s.prompt_from_len, s.prompt_len, r.gen, s.messages, s.reasoning
FROM ranked r JOIN samples s ON s.sample_id = r.sample_id
WHERE (r.request > r.newest - ? OR r.from_top <= ?) AND r.gen < ? AND r.recency <= ?
ORDER BY r.active, r.prompt_id, r.created_at, r.sample_id
"""
"""The turns of each of the most recently active proxied sessions a live proxy keeps (those of its RESTORED_TURNS newest
requests and of its RESTORED_TURNS highest turns, CHOICES_KEPT choices of each), least recently active session first,
each session's in the order recorded. Both: the newest are what a harness goes on from (a main loop whose sub-agent's
turns are numbered past its own), the highest what it goes on from when the times lie (they are local wall-clock
times: after a restart under another TZ, a daylight-saving fall-back or a clock stepped back, older turns looked
newest and the next request was numbered as a turn the session had)."""


LAST_NUMBER_SQL = """
SELECT max(try_cast(regexp_extract(prompt_id, ':s([0-9]+)$', 1) AS BIGINT))
FROM samples
WHERE starts_with(prompt_id, ?)
"""
"""The highest session number a run's proxy gave (its session ids are `proxy:RUN:sN`)."""


def assistant_message(
    content: str | None, calls: list[dict[str, Any]] | None, reasoning: str | None = None
) -> dict[str, Any]:
    """The assistant message a harness appends for an answer (what its next request's messages hold), from the
    server's calls as plain records {id, name, arguments} (`core.tool_calls.server_tool_calls`)."""
    shaped = [
        {"id": c.get("id"), "type": "function", "function": {"name": c.get("name"), "arguments": c.get("arguments")}}
        for c in calls or ()
    ]
    return {"role": "assistant", "content": content, "tool_calls": shaped or None, "reasoning_content": reasoning}


def _json_or_empty(text: str | None) -> Any:
    try:
        return orjson.loads(text) if text else {}
    except orjson.JSONDecodeError:
        return {}


USER_SESSIONS_SQL = (
    "SELECT DISTINCT prompt_id FROM samples WHERE starts_with(prompt_id, 'user:') AND starts_with(sample_id, 'proxy:')"
)
"""Every stored `user:NAME[/N]` conversation a proxy recorded (a batch row's id may begin `user:` too), restored or
not."""


def restore_sessions(book: SessionBook, db: Database) -> int:
    """`restore` the stored sessions a live proxy would keep (`RESTORE_SQL`): how many turns were put back. Every
    stored conversation of a `user` is noted too (`SessionBook.note_user_session`): one past the restored ones was
    taken for a new user's, and that user's next conversation became its turn 0 again."""
    for (session_id,) in db.query(USER_SESSIONS_SQL):
        book.note_user_session(str(session_id))
    return restore(book, db.query(RESTORE_SQL, [RESTORED_TURNS, RESTORED_TURNS, CHOICES_KEPT, book.max_sessions]), db)


def restore(book: SessionBook, rows: list[tuple[Any, ...]], db: Database) -> int:
    """Put stored sessions' turns back in `book` (rows of `RESTORE_SQL`: the least recently active session first, so
    the newest stay; a session's turns in the order recorded, a choice after the request it is one of): a harness whose
    conversation outlived a proxy restart continues its session instead of starting a new one. A session gets back
    the turns of its newest requests, as it kept them: only its newest turn, and the main loop's next turn (which
    extends the turn before a side request, or the choice the harness kept) continued nothing. A turn a later restored
    turn's ids extend is marked continued, as it was (`_Head.continued`).

    The answer's tool calls are read back from the stored response: a turn that called tools is what the next
    request's messages hold with those calls, and without them its key matched no next request. A row stored past a
    key turn (`store.prompt_refs`) gets its whole prompt back from `db`, and its head remembers the key."""
    from tokview.core.tool_calls import tool_calls_of_response
    from tokview.store.packed_chunks import unpack  # a stored stream of many chunks is kept packed
    from tokview.store.prompt_refs import whole_prompts

    columns = ("prompt_id", "turn", "sample_id", "prompt_ids", "output_ids", "raw_request", "content", "raw_response")
    extra = ("prompt_from", "prompt_from_len", "prompt_len", "gen", "messages", "reasoning")
    dicts = [dict(zip((*columns, *extra), r)) for r in rows]
    keys = {d["sample_id"]: (d["prompt_from"], d["prompt_from_len"] or 0) for d in dicts}
    broken: list[tuple[dict[str, Any], str]] = []
    whole_prompts(db, dicts, broken=broken)  # a turn whose prompt cannot be put back is not restored (its session
    unreadable = {id(row) for row, _ in broken}  # starts anew): it never keeps the proxy from starting
    dicts = [d for d in dicts if id(d) not in unreadable]
    previous: tuple[str, int] | None = None
    for d in dicts:
        session_id, turn, sample_id, prompt_ids, output_ids, raw_request, content, raw_response = (
            d[c] for c in columns
        )
        sibling = bool(d.get("gen")) and previous == (session_id, int(turn))  # another choice of the request before
        previous = (session_id, int(turn))
        request = _json_or_empty(raw_request)
        body = request.get("body") if isinstance(request, dict) else None
        messages = body.get("messages") if isinstance(body, dict) else None
        if messages is None and d.get("messages"):  # stored once, in the row's column (`store.elided_ids`)
            messages = _json_or_empty(d["messages"])
        answer = None
        if isinstance(messages, list):
            calls = tool_calls_of_response(unpack(_json_or_empty(raw_response)))
            answer = assistant_message(content, calls, d.get("reasoning"))
        placed = Turn(session_id, int(turn), "restored")
        book.add(
            placed,
            sample_id,
            prompt_ids=list(prompt_ids),
            output_ids=list(output_ids),
            messages=messages if isinstance(messages, list) else None,
            answer=answer,
            sibling=sibling,
            stored_from=keys[sample_id][0],
            stored_len=keys[sample_id][1],
        )
    return len(dicts)
