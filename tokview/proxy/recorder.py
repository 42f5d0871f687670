"""Each proxied generation becomes a sample, through the batch's own writer (`batch.writer_thread.GroupWriter`),
off the path of the client's bytes.

The event loop only forwards: once an answer's last byte is out it hands the raw exchange over with
`take` (a queue put; `recorder_process` puts it on a pipe to a child running this same Recorder). The recorder's thread parses it into a capture, places it in its session and
hands it to the writer, whose thread analyses it and writes a crash-safe part (`store.parts`); the
batch's `Lander` lands each part the moment it is written (at most every `land_s`: each landing costs
~30-50 ms of CPU however small, so under a steady stream of answers they land every LAND_BUSY_S), so the
app and `stats` see a sample as soon as it is recorded (within two seconds while a harness is busy). When the store cannot be written (a full disk, a
store another process holds too long) the writer or the Lander stops, the proxy keeps forwarding,
and says so loudly once: nothing from then on is recorded, and the harness never notices.

Session findings ride the same record: `_WithSessionFindings` wraps the store the writer writes through
and adds a turn's `session_prefix_break` finding to its part line (a finding of the conversation, which
`core.analysis` cannot see from one capture).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import queue
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from tokview.batch.vocabulary_guard import AnswerVocabularyCheck, tokenizer_name
from tokview.batch.workers import Lander
from tokview.batch.writer_thread import GroupWriter, failure_reason
from tokview.core.findings import HISTORY_RERENDERS, WARN, id_text, rerender_causes
from tokview.core.json_value import as_pydantic_bool
from tokview.core.record import Capture
from tokview.errors import TokviewError
from tokview.proxy.break_causes import harness_changes
from tokview.proxy.capture import (
    CHAT,
    MAX_CHOICES,
    NoIds,
    build_capture,
    choice_indexes,
    choice_view,
    served_model,
    settings_of,
)
from tokview.proxy.ids import RETURN_TOKEN_IDS, SGLEXT_FLAGS, VLLM, echo_hides_ids, id_fields
from tokview.proxy.sessions import SessionBook, Turn, assistant_message
from tokview.proxy.sse import read_stream
from tokview.secrets import DATA_MIN_SECRET_LEN, MASK, scrub_text
from tokview.servers.errors import Retryable, stream_abort
from tokview.store.errors import StoreHeld
from tokview.store.prompt_refs import PAST_KEY, PAST_LEN
from tokview.store.sample_rows import capture_secrets, masked_text

if TYPE_CHECKING:
    from tokview.core.analysis import Analysis
    from tokview.core.profiles import ModelProfile
    from tokview.core.tokenizer import TokenizerAdapter
    from tokview.store.sample_rows import SampleIdentity
    from tokview.store.store import Store

PREFIX_BREAK = "session_prefix_break"
LAND_BUSY_S = 2.0
"""The gap between landings while a harness keeps answers coming (`Recorder._landed`)."""
LANDING_SHARE = 10.0
"""A landing is followed by a gap of at least this many times what it took (`Recorder._landed`)."""
KEYS_KEPT = 100_000
"""Key turns remembered (`_WithSessionFindings.keys`): far more than the sessions keep turns of (a session keeps its
last few)."""
KEY_LOOKS = 3
"""Landings that look for a row written whole before it is given up as a key turn."""
EARLY_KEY_IDS = 16_384
"""A row written whole with this many prompt ids (a long conversation's first turn: the key its next turns are stored
past) is landed at once, not at the next gap (`Recorder._committed`)."""
EARLY_WAIT_S = 0.5
"""How long the writer waits for a key turn's early landing (a held store's wait is the lander's alone)."""
LAND_MAX_S = 30.0
"""The longest gap between landings, however long they take."""
BUSY_RATE = 8.0
"""Samples a second (over the last landing's gap) from which the recorder counts as busy."""


@dataclass(frozen=True)
class Finished:
    """An answered generation as the proxy's loop hands it over: plain data (it may cross to another
    process), the answer still the bytes that came in."""

    endpoint: str
    kind: str
    server: str
    stamp: dict[str, Any]
    max_model_len: int | None
    request: dict[str, Any]
    stored_request: dict[str, Any]
    raw: bytes
    """The answer's bytes as they came: a JSON body, or a whole stream (one bytes: pickled as a copy)."""
    stream: bool
    latency_s: float
    named: str | None
    user: str | None
    client_secrets: tuple[str, ...] = ()
    """The credentials of the client's Authorization (`secrets.authorization_values`): an upstream may quote them in
    its answer or its stream's abort, and the recorder knows only the store's own server credentials."""


@dataclass(frozen=True)
class Failed:
    """A request the upstream refused, the client abandoned, or that broke off."""

    reason: str
    server: str
    named: str | None
    user: str | None


@dataclass(frozen=True)
class _Item:
    """What the writer needs of a work item: ids, and where the sample sits in its conversation."""

    sample_id: str
    prompt_id: str
    turn: int | None
    index: int = 0


class _WithSessionFindings:
    """The store as the writer sees it, with the session findings of some samples added to their lines, and their
    prompt ids stored past a key turn's where the sessions found one (`store.prompt_refs`)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.extra: OrderedDict[str, dict[str, Any]] = OrderedDict()
        """sample id → its session finding, taken when its line is written (the newest KEYS_KEPT: one whose analysis
        failed is never taken)."""
        self.stored_past: OrderedDict[str, tuple[str, int]] = OrderedDict()
        """sample id → (key turn's sample id, shared ids), from `SessionBook.stored_past` (the newest KEYS_KEPT: one
        whose analysis failed is never taken)."""
        self._lock = threading.Lock()
        self.keys: OrderedDict[str, None] = OrderedDict()
        """Rows seen landed in the store with their whole prompt ids: key turns a row is cut past as it is written.
        Seen landed, not only written: a line set aside at its landing (cut by a power loss) or a replayed answer
        whose id is stored already would leave the rows stored past it unreadable."""
        self.written: OrderedDict[str, int] = OrderedDict()
        """Rows written whole and not yet seen landed, with how many landings have looked for them."""
        self.queued_whole: OrderedDict[str, None] = OrderedDict()
        """Rows handed to the writer to be written whole (`SessionBook.stored_past` found no key for them)."""
        self.long_key = False
        """The group being written holds a row written whole with EARLY_KEY_IDS prompt ids or more (a long
        conversation's first turn: the key its next turns are stored past; the writer's thread only)."""
        self.key_part = False
        """The part just written holds such a row (`Recorder._committed` lands it; the writer's thread only)."""

    def sample_record(
        self,
        key: SampleIdentity,
        capture: Capture,
        analysis: Analysis,
    ) -> dict[str, Any]:
        record = self.store.sample_record(key, capture, analysis)
        finding = self.extra.pop(key.sample_id, None)
        if finding is not None:
            # it quotes the prompt's text: masked as the row's payloads are (the upstream's credentials are in the
            # capture's server URL)
            finding = {**finding, "detail": masked_text(finding.get("detail"), capture_secrets(capture))}
            record["findings"] = [*record["findings"], finding]
            record["codes"] = [*record["codes"], finding["code"]]
        past = self.stored_past.pop(key.sample_id, None)
        if past is not None and record.get("prompt_len") != len(record["prompt_ids"]):
            past = None  # not its whole prompt: stored as it is
        with self._lock:
            self.queued_whole.pop(key.sample_id, None)
            landed = past is not None and past[0] in self.keys
            if past is None:
                self.written[key.sample_id] = 0
                _trim(self.written)
                self.long_key = self.long_key or len(record["prompt_ids"]) >= EARLY_KEY_IDS
        if past is not None:
            if landed:
                record["prompt_ids"] = record["prompt_ids"][past[1] :]
                record["prompt_from"], record["prompt_from_len"] = past
            else:  # its key is written or about to be, not seen landed: the landing cuts it if the key lands whole
                record[PAST_KEY], record[PAST_LEN] = past
        return record

    def is_key(self, sample_id: str) -> bool:
        """Whether a turn may be stored past `sample_id`: a key seen landed (cut as it is written), or a row written
        whole or about to be (written whole with the key named, cut by the landing once the key has landed whole:
        `store.prompt_refs.CUT_PAST_KEYS`). A harness's turns often come faster than the landings."""
        with self._lock:
            return sample_id in self.keys or sample_id in self.written or sample_id in self.queued_whole

    def queue_whole(self, sample_id: str) -> None:
        """`sample_id` goes to the writer to be written whole (a key the turns after it may name)."""
        with self._lock:
            self.queued_whole[sample_id] = None
            _trim(self.queued_whole)

    def store_past(self, sample_id: str, past: tuple[str, int]) -> None:
        self.stored_past[sample_id] = past
        _trim(self.stored_past)

    def keys_landed(self, sample_ids: Sequence[str]) -> None:
        """Rows in the store with their whole prompt ids (turns a restarted proxy restored)."""
        with self._lock:
            for sample_id in sample_ids:
                self.keys[sample_id] = None
            _trim(self.keys)

    def confirm_keys(self, *, count_look: bool = True) -> None:
        """After a landing: the rows written whole that the store now holds whole become key turns (one query). A row
        looked for by KEY_LOOKS landings that landed parts (`count_look`) and never found is given up."""
        with self._lock:
            waiting = list(self.written)
        if not waiting:
            return
        try:
            rows = self.store.query(
                "SELECT s.sample_id FROM samples s JOIN (SELECT unnest(?::VARCHAR[]) AS id) q ON s.sample_id = q.id "
                "WHERE s.prompt_from IS NULL",
                [waiting],
            )
        except TokviewError:  # a store held or failing now: the next landing looks again (nothing is stored past them)
            return
        found = {r[0] for r in rows}
        with self._lock:
            for sample_id in waiting:
                if sample_id in found:
                    self.written.pop(sample_id, None)
                    self.keys[sample_id] = None
                elif sample_id in self.written and count_look:
                    self.written[sample_id] += 1
                    if self.written[sample_id] >= KEY_LOOKS:
                        del self.written[sample_id]
            _trim(self.keys)

    def write_part(self, samples: Sequence[Any], failures: Sequence[Any] = ()) -> None:
        if failures:  # a turn whose analysis failed is written as a failure: never a key the turns after it may name
            with self._lock:
                for failure in failures:
                    sample_id = failure.get("sample_id") if isinstance(failure, dict) else None
                    if isinstance(sample_id, str):
                        self.queued_whole.pop(sample_id, None)
                        self.stored_past.pop(sample_id, None)
        self.key_part, self.long_key = self.long_key, False
        self.store.write_part(samples, failures)

    def ingest(self) -> tuple[int, int]:
        """Land the parts, then see which rows written whole are now key turns, with the store still open: the
        look opened and closed it again after each landing (a few ms of an attach and a detach each time). Looked
        for when this landing landed nothing too (not counted as a look): another command opening the store
        (`tokview stats`, the app, a batch) lands the parts beside it, the proxy's among them, and then no turn of
        the proxy became a key."""
        with self.store.hold():
            landed = self.store.ingest()
            self.confirm_keys(count_look=bool(landed[0]))
        return landed

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)  # anything else the writer asks of its store


def _trim(entries: OrderedDict[str, Any]) -> None:
    """Keep the newest KEYS_KEPT entries."""
    while len(entries) > KEYS_KEPT:
        entries.popitem(last=False)


def prefix_break_finding(
    turn: Turn,
    prompt_ids: list[int],
    tokenizer: TokenizerAdapter | None,
    *,
    messages: list[Any] | None = None,
    profile: ModelProfile | None = None,
    server_kind: str | None = None,
) -> dict[str, Any]:
    """Where this turn's prompt stops extending the previous turn's prompt + output ids, what is there, and why:
    what the harness changed in the previous answer, else the template's re-render (`break_causes`)."""
    at = turn.break_at or 0
    here = _piece(tokenizer, prompt_ids, at)
    compared = turn.previous_turn if turn.previous_turn is not None else turn.turn - 1
    there = "" if turn.previous_id is None else f", where turn {compared} has {id_text(tokenizer, turn.previous_id)}"
    differ = (
        f"its prompt ids do not extend turn {compared}'s prompt + output ids ({turn.previous_len} ids): they "
        f"first differ at position {at} (here {here}{there})"
    )
    if turn.by_name_only:
        detail = (
            f"turn {turn.turn} is in the session its harness named, but neither its ids nor its messages continue a "
            f"kept turn of it; {differ}. The harness rewrote its history (a compaction, a summary) or gave another "
            "conversation the same session name: a drafter trained on these turns sees a prompt the model never "
            "continued."
        )
        return _break(detail, at, prompt_ids)
    detail = (
        f"turn {turn.turn} continues its conversation by its messages, but {differ}. "
        f"{_why(turn, compared, at, messages, profile, server_kind, tokenizer)}: a drafter trained on these turns sees "
        "a prompt the model never continued."
    )
    return _break(detail, at, prompt_ids)


def _why(
    turn: Turn,
    compared: int,
    at: int,
    messages: list[Any] | None,
    profile: ModelProfile | None,
    server_kind: str | None,
    tokenizer: TokenizerAdapter | None,
) -> str:
    """What broke the prefix: the harness's changes to turn `compared`'s answer when it made any; else, the answer
    sent back as served, the template's re-render (before the answer: of an earlier turn)."""
    served = turn.previous_served
    changes = harness_changes(served, messages, server_kind) if served is not None and messages else None
    if served is None or changes is None:  # nothing to compare (a completions prompt, no answer where it goes)
        return (
            "The harness or the server's chat template re-rendered the history (reasoning dropped, content or "
            "arguments re-serialised, call ids renumbered)"
        )
    also = (
        f"; it also changed turn {compared}'s answer before sending it back: it {'; '.join(changes)}" if changes else ""
    )
    if at < served.prompt_len:  # before the answer: no change to the answer broke it
        return (
            f"The break is in the history before turn {compared}'s answer: the server's template rendered it otherwise "
            f"than in turn {compared}'s prompt {HISTORY_RERENDERS}, or the harness changed an earlier message's "
            f"reasoning, call ids or whitespace{also}"
        )
    reaching = harness_changes(served, messages or [], server_kind, reaching=at - served.prompt_len)
    if reaching:
        later = [c for c in changes if c not in reaching]
        after = f"; it also {'; '.join(later)}, after the break" if later else ""
        return f"The harness changed turn {compared}'s answer before sending it back: it {'; '.join(reaching)}{after}"
    if changes:  # its changes are all in parts after the break (Qwen3's template re-spaces `</think>` before the calls)
        faithful = (
            f"The harness changed turn {compared}'s answer only after the break (it {'; '.join(changes)}): the break "
            "comes first"
        )
    else:
        faithful = f"The harness sent turn {compared}'s answer back as served"
    if profile is None:
        return f"{faithful}; the server's chat template rendered the history otherwise than turn {compared} held it"
    return f"{faithful}. {rerender_causes(profile, tokenizer, turn.previous_id, turn.previous_len, at)}"


def _break(detail: str, at: int, prompt_ids: list[int]) -> dict[str, Any]:
    return {
        "code": PREFIX_BREAK,
        "severity": WARN,
        "detail": detail,
        "positions": [min(at, max(len(prompt_ids) - 1, 0))],
    }


def _piece(tokenizer: TokenizerAdapter | None, ids: list[int], at: int) -> str:
    return id_text(tokenizer, ids[at]) if at < len(ids) else "the prompt ends"


PROXY_VOCABULARY_ADVICE = (
    "the ids are recorded exactly, but every finding on them and any text export reads them as other text: restart "
    "the proxy with the served model's tokenizer folder (--tokenizer DIR; `tokview doctor --server URL --tokenizer DIR` "
    "compares one with the server)"
)


class Recorder:
    """Sessions, sample ids, the writer and the Lander of one proxy run, on threads of their own."""

    def __init__(
        self,
        store: Store,
        *,
        profile: ModelProfile,
        tokenizer: TokenizerAdapter | None,
        run_id: str,
        say: Callable[[str], None] | None = None,
        group_s: float = 0.05,
        land_s: float = 0.5,
        threaded: bool = True,
    ) -> None:
        """`threaded`: `take` hands an item to a thread of the recorder's own (the forwarding loop must not wait
        for it); False records it on the caller's thread (the recorder process's main thread, which does
        nothing else: a thread between it and the writer only cost a GIL hand-over per request)."""
        self.run_id, self.tokenizer, self.store, self.profile = run_id, tokenizer, store, profile
        self.say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self.sessions = SessionBook(run_id, profile=profile)
        self._sink = _WithSessionFindings(store)
        self.land_s, self._landed_at = land_s, time.monotonic()
        self.lander = Lander(
            self._sink, every_s=land_s, live=True, on_error=self._warn, on_landed=self._landed, on_held=self._held
        )
        self.writer = GroupWriter(
            self._sink,
            profile=profile,
            tokenizer=tokenizer,
            run_id=run_id,
            ingest=False,
            group_s=group_s,
            on_commit=lambda _: self._committed(),
            ends_group=lambda: self._sink.long_key and self._may_land_early(),  # a long key turn lands at once
        )
        self._seq = itertools.count(1)
        self._warned = threading.Lock()
        self._said_held = False
        self.recorded = self.failed = self.not_recorded = 0
        self._models_said: set[tuple[str | None, str | None]] = set()
        self._vocabulary = (
            AnswerVocabularyCheck(tokenizer_name(None, tokenizer), advice=PROXY_VOCABULARY_ADVICE)
            if tokenizer is not None
            else None
        )
        """Whether the first answers read, with this tokenizer, as what the upstream said (said once if not)."""
        self._jobs: queue.SimpleQueue[tuple[Finished | Failed, str | None] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        if threaded:
            self._thread = threading.Thread(target=self._loop, name="tokview-proxy-recorder", daemon=True)
            self._thread.start()

    def _landed(self, samples: int) -> None:
        """Space the landings out while answers keep coming, back to `land_s` once they ease; and at least
        LANDING_SHARE times as far apart as they take (up to LAND_MAX_S).

        A landing costs ~30-50 ms of CPU however few samples it holds (the store opened, a transaction, the
        store closed): one every `land_s` under a harness's steady traffic was a third of the recorder's CPU
        per stream. Busy, a sample shows in the app within LAND_BUSY_S instead; its part is on disk at once
        either way (a kill loses nothing it holds).

        Why the share: a landing of a few rows costs more the more the store holds. DuckDB appends them to the
        table's last row group and its checkpoint rewrites that whole group (up to 122,880 rows), so with an
        agent's long rows (45,000 prompt ids and the conversation's text each) the close took 5 ms at the first
        row and 236 ms at the 120th, measured on DuckDB 2.0.1. Landing every `land_s` regardless, the recorder of
        a long-running proxy would spend a core on checkpoints; spaced by their cost, landings take at most a
        tenth of its time, and a sample shows in the app later instead."""
        now = time.monotonic()
        rate = samples / max(now - self._landed_at, 1e-3)
        self._landed_at = now
        gap = max(self.land_s, LAND_BUSY_S) if rate >= BUSY_RATE else self.land_s
        self.lander.every_s = max(gap, min(LAND_MAX_S, LANDING_SHARE * self.lander.last_took))

    def _committed(self) -> None:
        """A part is on disk: land it soon, or now when it ends with a long key turn (`_may_land_early`), waiting
        up to EARLY_WAIT_S for it before the writer writes the turns after it.

        Why: a turn whose key is written but not landed is written whole, naming the key, and the landing cuts it
        (`store.prompt_refs.CUT_PAST_KEYS`): each carried its whole prompt through the part's JSON and the landing's
        cut (~5 ms of the recorder's CPU a turn of a 40,000-id context). An agent's next turns come every second or
        so, landings every two (up to LAND_MAX_S on a big store), and a recorder behind its harness (its child runs
        at a lower priority) writes a session's turns in a burst: all of them were written whole. Landed at once
        (~15 ms, once a session), the key is seen landed and the turns after it are written cut."""
        key_part, self._sink.key_part = self._sink.key_part, False
        if key_part and self._may_land_early():
            self.lander.land_soon(EARLY_WAIT_S)
        else:
            self.lander.poke()

    def _may_land_early(self) -> bool:
        """Whether a key turn may land out of turn: no landing under way, the store not held at the last one (its
        wait is the lander's alone: the writer waits EARLY_WAIT_S at most), and the last landing ended at least
        LANDING_SHARE times what it took ago (early landings keep to the cost share too)."""
        lander = self.lander
        if lander.held is not None or lander.busy:
            return False
        return time.monotonic() - lander.ended_at >= LANDING_SHARE * lander.last_took

    def keys_landed(self, sample_ids: Sequence[str]) -> None:
        """Rows already in the store with their whole prompt ids (restored turns): later turns may be stored past them."""
        self._sink.keys_landed(sample_ids)

    @property
    def error(self) -> BaseException | None:
        return self.writer.error or self.lander.error

    @property
    def recording(self) -> bool:
        """Nothing handed over is lost: no error, or only a last landing that met a held store (what it held is in
        parts, and the next command on the store lands it)."""
        error = self.error
        return error is None or (error is self.lander.error and isinstance(error, StoreHeld))

    def take(self, item: Finished | Failed, sample_id: str | None = None) -> None:
        """Record `item` on the recorder's thread, in order: what the event loop calls once the client has
        its last byte (a queue put), so no recording work delays a client. `sample_id`: the id a spooled answer
        has wherever it is recorded (`spool_folder.spooled_id`); else the run's next."""
        if self.error is not None:  # said and counted now: nothing recorded from here on
            self._check()
            return
        if self._thread is None:
            self._record_or_say(item, sample_id)
        else:
            self._jobs.put((item, sample_id))

    def _loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            self._record_or_say(*job)

    def _record_or_say(self, item: Finished | Failed, sample_id: str | None = None) -> None:
        try:
            self.record(item, sample_id)
        except Exception as exc:  # a bug: this request is lost and said, recording goes on
            self.say(f"tokview proxy: a request was not recorded: {failure_reason(exc)}")
            self.not_recorded += 1

    def record(self, item: Finished | Failed, sample_id: str | None = None) -> None:
        """The answer's bytes parsed into a capture and placed in its session, or the failure written."""
        if isinstance(item, Failed):
            self.failure(item.reason, item.server, named=item.named, user=item.user, sample_id=sample_id)
            return
        if item.client_secrets:
            item = dataclasses.replace(item, raw=without_secrets(item.raw, item.client_secrets))
        chunks, done, unreadable = read_stream(item.raw) if item.stream else ([], False, 0)
        answer = (chunks if done and not unreadable else None) if item.stream else _parsed_json(item.raw)
        if answer is None:
            if item.stream and not done:
                reason = f"the upstream's stream ended without [DONE] after {len(chunks)} chunks"
            elif item.stream:
                reason = (
                    f"malformed response: {unreadable} of the upstream's stream events held no JSON object "
                    "(the ids one carried would be missing from the sample)"
                )
            else:
                reason = "malformed response: the upstream's answer is not JSON"
            self.failure(reason, item.server, named=item.named, user=item.user, sample_id=sample_id)
            return
        # Only a stream whose bytes name an "error" (a string's quotes are escaped: these bytes are a key or a value)
        # or hold a \u escape (which may spell one) can hold an abort: the look at each chunk is skipped for the rest.
        maybe = item.stream and (b'"error"' in item.raw or b"\\u" in item.raw)
        looked = answer if maybe else ()
        aborts = ((k, m) for k, c in enumerate(looked) if (m := stream_abort(c)) is not None)
        if (aborted := next(aborts, None)) is not None:  # the chunks before it: a cut-off answer, never a sample
            reason = f"the upstream aborted the stream after {aborted[0]} chunks: {aborted[1]}"
            self.failure(reason, item.server, named=item.named, user=item.user, sample_id=sample_id)
            return
        request = item.request
        messages = request.get("messages") if isinstance(request.get("messages"), list) else None
        indexes = choice_indexes(answer, stream=item.stream)
        for index in indexes[MAX_CHOICES:]:  # said and counted, never dropped unsaid
            reason = f"not recorded: choice {index} of an answer with more than {MAX_CHOICES} choices"
            own_id = f"{sample_id}.c{index}" if sample_id is not None else None
            self.failure(reason, item.server, named=item.named, user=item.user, sample_id=own_id)
        indexes = indexes[:MAX_CHOICES]
        placed: list[tuple[list[int], Turn]] = []
        """Each prompt's first choice recorded: its prompt ids and turn (`/v1/completions` takes a list of prompts,
        and vLLM numbers their choices on, prompt by prompt: `n` > 1 choices of one prompt share its turn)."""
        for index in indexes:  # `n` > 1: every choice is a generation of its own, a sample of its own
            view = answer if len(indexes) == 1 else choice_view(answer, index, stream=item.stream)
            own_id = sample_id if index == indexes[0] or sample_id is None else f"{sample_id}.c{index}"
            self._record_choice(item, view, messages, own_id, placed)

    def _record_choice(
        self,
        item: Finished,
        answer: Any,
        messages: list[Any] | None,
        sample_id: str | None,
        placed: list[tuple[list[int], Turn]],
    ) -> None:
        request = item.request
        try:
            capture = build_capture(
                item.endpoint,
                item.kind,
                answer,
                stream=item.stream,
                settings=settings_of(request, self.profile, item.max_model_len),
                # rendered locally to check the served prompt, only when the local render can match it
                messages=messages if messages and not request.get("tools") else None,
                raw_request=item.stored_request,
                stamp=item.stamp,
                latency_s=item.latency_s,
            )
        except NoIds as exc:
            reason = _why_no_ids(item) or str(exc)
            self.failure(reason, item.server, named=item.named, user=item.user, sample_id=sample_id)
            return None
        except Retryable as exc:  # the servers layer's "malformed response from …" (a lone surrogate in a text)
            self.failure(exc.reason, item.server, named=item.named, user=item.user, sample_id=sample_id)
            return None
        except (ValueError, TypeError) as exc:  # a malformed answer
            self.failure(
                f"malformed response: {exc}", item.server, named=item.named, user=item.user, sample_id=sample_id
            )
            return
        named, probed = served_model(answer), item.stamp.get("model")
        if named and probed and named != probed:
            self._model_differs(item.server, str(probed), named)
        if self._vocabulary is not None and (wrong := self._vocabulary.see(capture, self.tokenizer)):
            self.say(f"tokview proxy: {wrong}")
        same_prompt = [turn for ids, turn in placed if ids == capture.prompt_ids]
        done = self.sample(
            capture,
            messages=messages,
            named=item.named,
            user=item.user,
            answer_message=_answer(capture, answer, item.endpoint),
            sample_id=sample_id,
            index=len(same_prompt),
            sibling_of=same_prompt[0] if same_prompt else None,
            parallel_to=placed[0][1] if placed else None,
        )
        if done is not None:
            placed.append((capture.prompt_ids, done[1]))

    def _model_differs(self, server: str | None, probed: str, named: str | None) -> None:
        """Said once per upstream and name: an answer names another model than the start-up probe read (the
        upstream restarted with another checkpoint, or the request used another of its served names)."""
        if (server, named) in self._models_said or len(self._models_said) >= MODEL_NAMES_SAID:
            return
        self._models_said.add((server, named))
        self.say(
            f"tokview proxy: {scrub_text(server or 'the upstream')} answers as model {scrub_text(repr(named))}, not "
            f"{scrub_text(repr(probed))} as its start-up probe said: the name the request gave (SGLang and vLLM echo "
            "it), or another model since a restart that no failed connection showed (then restart the proxy: its "
            "samples are recorded under the probe's name)."
        )

    def next_id(self) -> str:
        """The run's next sample id (the recorder child's journal names an answer before it is recorded)."""
        return f"proxy:{self.run_id}:{next(self._seq):07d}"

    def _check(self) -> bool:
        error = self.error
        if error is None:
            return True
        self.not_recorded += 1
        self._warn()
        return False

    @property
    def not_landing(self) -> bool:
        """NOT LANDING was said (a store another program holds) and no landing has gone through since."""
        return self._said_held

    def held_at_start(self, why: StoreHeld) -> None:
        """The store was held as the proxy started (`late_store`): said as a landing that met it says it, and the
        first landing that opens it says "landing again"."""
        self.lander.held = why
        self._held(why)

    def _held(self, why: BaseException | None) -> None:
        """Said once when landings start meeting a store another program holds, and once when one lands again:
        recording goes on into parts all the while (`Lander.held`)."""
        if why is not None and not self._said_held:
            self._said_held = True
            self.say(
                f"tokview proxy: NOT LANDING: {why}. Recording goes on: answers are kept in parts and land once the "
                "store is free (the app and `stats` see them then)."
            )
        elif why is None and self._said_held:
            self._said_held = False
            self.say("tokview proxy: landing again: the store is free and the answers kept meanwhile are in it.")

    def _warn(self) -> None:
        error = self.error
        if isinstance(error, StoreHeld) and error is self.lander.error and self._warned.acquire(blocking=False):
            self.say(  # the last landing, as the proxy stops: nothing is lost
                f"tokview proxy: the last answers are recorded but not landed: {error}; the next tokview command "
                "on the store lands them."
            )
            return
        if error is not None and self._warned.acquire(blocking=False):  # once, from whichever thread sees it
            self.say(
                f"tokview proxy: STOPPED RECORDING: {error}. Requests are still forwarded, but "
                "nothing is stored from now on (what was written is kept); restart the proxy once the store "
                "can be written."
            )

    def sample(
        self,
        capture: Capture,
        *,
        messages: list[Any] | None,
        named: str | None,
        user: str | None,
        answer_message: dict[str, Any] | None,
        sample_id: str | None = None,
        index: int = 0,
        sibling_of: Turn | None = None,
        parallel_to: Turn | None = None,
    ) -> tuple[str, Turn] | None:
        """Place a finished generation in its session and hand it to the writer: (sample id, turn).

        `sibling_of`: another choice of the same request (`n` > 1), stored at the same session and turn as its first
        choice, generation `index`; a next request may continue any of the choices (the one the harness kept).
        `parallel_to`: the turn of the first prompt of its request, when it is another one (`SessionBook.place`)."""
        if not self._check():
            return None
        sample_id = sample_id or self.next_id()
        if sibling_of is not None:  # the same prompt as its first choice: the same break, if any
            turn = sibling_of
        else:
            turn = self.sessions.place(capture.prompt_ids, messages, named=named, user=user, parallel_to=parallel_to)
        if turn.break_at is not None:
            self._sink.extra[sample_id] = prefix_break_finding(
                turn,
                capture.prompt_ids,
                self.tokenizer,
                messages=messages,
                profile=self.profile,
                server_kind=capture.server_kind,
            )
            _trim(self._sink.extra)
        self.sessions.add(  # a sibling too: the harness may go on from any choice
            turn,
            sample_id,
            prompt_ids=capture.prompt_ids,
            output_ids=capture.output_ids,
            messages=messages,
            answer=answer_message,
            sibling=sibling_of is not None,
        )
        past = self.sessions.stored_past(turn, sample_id, len(capture.prompt_ids), self._sink.is_key)
        if past is not None:  # before the writer takes it: its row is written with the prompt ids past the key's
            self._sink.store_past(sample_id, past)
        else:
            self._sink.queue_whole(sample_id)
        self.writer.add_sample(_Item(sample_id, turn.session_id, turn.turn, index), capture)
        self.recorded += 1
        return sample_id, turn

    def failure(
        self,
        reason: str,
        server: str | None,
        *,
        named: str | None = None,
        user: str | None = None,
        sample_id: str | None = None,
    ) -> None:
        """A request the upstream refused, the client abandoned, or that came back without ids."""
        if not self._check():
            return
        session = f"session:{named}" if named else (f"user:{user}" if user else f"proxy:{self.run_id}:unplaced")
        self.writer.add_failure(_Item(sample_id or self.next_id(), session, None), reason, server)
        self.failed += 1

    def close(self, leave: bool = False) -> None:
        """Record what was handed over, write it and land it (blocks for the last group). `leave` (a second Ctrl-C)
        changes nothing here: the recording threads die with the process, so it waits for them all the same."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
        self.writer.close()
        self.lander.close()
        self._settle_counts()
        self._warn()

    def _settle_counts(self) -> None:
        """The counts as the writer wrote them: an answer is counted recorded when handed to the writer, and a part
        the writer could not write (a full disk) was still said recorded at the end (6 recorded for 3 stored)."""
        w = self.writer
        self.not_recorded += max(0, w.handed - w.ok - w.failed)
        self.recorded, self.failed = w.ok, w.failed  # an answer whose analysis failed is written as a failure


MODEL_NAMES_SAID = 32
"""Names said at most (an upstream naming another model in each answer said a line per answer)."""


def _why_no_ids(item: Finished) -> str | None:
    """Why an answer has no ids when the proxy chose not to ask for them or the upstream withholds them (None: the
    upstream did not send them)."""
    hidden = item.request.get("include_reasoning")
    if item.kind == VLLM and item.endpoint == CHAT and hidden is not None and as_pydantic_bool(hidden) is False:
        return (
            "not recorded: the request asks for include_reasoning false, and vLLM then withholds the token ids "
            "(with a reasoning parser running); the client got the server's answer as is"
        )
    if echo_hides_ids(item.request, item.kind, item.endpoint) and not as_pydantic_bool(
        item.request.get(RETURN_TOKEN_IDS)
    ):
        return (
            "not recorded: the request asks for echo, and vLLM drops the echoed prompt text when asked for token ids, "
            "so the proxy asked for none (the client got the server's answer as is)"
        )
    sglext = id_fields(item.kind, item.stream, item.endpoint) == SGLEXT_FLAGS  # an SGLang chat stream's
    return _one_sglext_flag(item.request) if sglext else None


def without_secrets(raw: bytes, secrets: tuple[str, ...]) -> bytes:
    """The answer's bytes with a client's credentials masked wherever the upstream quoted them. Only values long
    enough and holding a letter: none can match inside an id array (digits and commas) or a JSON key of the answer."""
    for secret in secrets:
        if len(secret) >= DATA_MIN_SECRET_LEN and any(c.isalpha() for c in secret):
            raw = raw.replace(secret.encode("utf-8", "surrogateescape"), MASK.encode())
    return raw


def _one_sglext_flag(request: dict[str, Any]) -> str | None:
    """Why a stream the client asked for one of SGLang's two sglext id flags has no ids: the proxy adds neither (the
    two share one object, and SGLang's answer with one flag is not known well enough to edit the other out)."""
    own = [flag for flag in SGLEXT_FLAGS if as_pydantic_bool(request.get(flag))]  # "false" is not asked
    if len(own) != 1:
        return None
    return (
        f"the upstream's stream has no ids to record: the client set only {own[0]} itself, so the proxy asked for "
        "none (a client that sets both sglext flags is recorded)"
    )


def _answer(capture: Capture, answer: object, endpoint: str) -> dict[str, Any] | None:
    """The assistant message a harness would append for this answer (what the next request's messages hold)."""
    if endpoint != CHAT:
        return None
    if isinstance(answer, dict):  # the message's own calls, as the harness got them
        choices = answer.get("choices") or [{}]
        message = choices[0].get("message") if isinstance(choices[0], dict) else None
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        return assistant_message(capture.content, None, capture.reasoning) | {"tool_calls": calls or None}
    return assistant_message(capture.content, capture.tool_calls, capture.reasoning)  # a stream's calls as parsed


def _parsed_json(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    try:  # a lone surrogate escape ("\ud800") is valid JSON that orjson refuses (as `sse.data_of` reads it)
        return json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than Python's json reads (orjson refused it)
        return None
