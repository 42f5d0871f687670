"""The batch's writer thread: analyse finished captures and hand them to the store a group at a time.

Why a group: one DuckDB transaction per sample cost ~5 ms of a 2,000-token sample's ~15 ms. The
writer analyses each capture as it arrives and writes those that finished in the last `group_s` (at
most `group_max`) as one crash-safe part (`tokview.store.parts`): a kill loses at most the
requests in flight plus this one short group. Every `ingest_s` (longer when ingesting gets slow on
a big store) it lands the parts in the database in one short transaction, so the app and other
commands see new samples while the run goes on; a writer in a `--workers` child never ingests
(the parent does).

The drift check's re-encode (`finding_context.reencode_output`: ~0.45 ms of Rust for a 2,000-id
sample, as much as the rest of its analysis) runs without the GIL, so `_Reencoder` starts it on its
own thread the moment a capture is handed over: when the writer comes to that capture the result is
(usually) there, and the writer's Python overlaps the encode instead of waiting for it.

Counters move only once a part is on disk. A full disk (`StoreFull`) stops the writer: what was
written stays for the resume, and the runner stops taking work. So does any other error writing a part
(a bug): the thread records it as its `error` and keeps draining its queue, so a run never waits on a
writer that died.
"""

from __future__ import annotations

import queue
import threading
import time
from array import array
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, TypeAlias

from tokview.batch.chains import CHAIN_STOP_PREFIX, CHAINS_STOPPED_PREFIX
from tokview.batch.config import FLAGGED_PREFIX
from tokview.batch.inputs import InputError
from tokview.core.analysis import analyze
from tokview.core.finding_context import reencode_output
from tokview.core.finding_rules import ERROR
from tokview.core.prefix_memo import known_packing
from tokview.errors import first_line
from tokview.secrets import scrub_text
from tokview.store.part_sink import PartWriter, StoreError
from tokview.store.parts import dumps_lines
from tokview.store.sample_rows import SampleIdentity
from tokview.untrusted_text import storable

if TYPE_CHECKING:
    from tokview.batch.chains import ChainResult
    from tokview.core.profiles import ModelProfile
    from tokview.core.record import Capture
    from tokview.core.tokenizer import TokenizerAdapter

    Ahead: TypeAlias = "Future[list[int]]"
    """A re-encode `_Reencoder` started ahead of the analysis."""
    _Entry: TypeAlias = (
        "tuple[Literal['sample'], Slot, tuple[Capture, Ahead | None]]"
        " | tuple[Literal['failure'], Slot, tuple[str, str | None]]"
        " | tuple[Literal['chain'], Slot, tuple[ChainResult, list[Ahead | None]]]"
    )
    """What the writer's queue carries: (kind, the slot, what it needs to write it)."""


class Slot(Protocol):
    """What the writer reads of a piece of work (a `WorkItem`, a chain's `TurnItem`, the proxy's exchange):
    the sample's ids and where it sits in its conversation."""

    @property
    def sample_id(self) -> str: ...
    @property
    def prompt_id(self) -> str: ...
    @property
    def turn(self) -> int | None: ...
    @property
    def index(self) -> int: ...


INT32_MAX = 2**31 - 1


class _Stop(Enum):
    """The end marker of the writer's queue: a one-member enum, so the queue's type can name it."""

    STOP = "stop"


_STOP: Final = _Stop.STOP
"""Put on the writer's queue by `close`: write what came before it, then end."""
COUNT_FIELDS = ("ok", "failed", "flagged", "truncated", "output_tokens")
"""A writer's counters, as `counts()` reports them to a parent (a `--workers` child, a Ray task)."""


@dataclass
class _Group:
    """What the writer collected since its last part: encoded sample lines, failures, counts to add."""

    count: int = 0
    samples: list[bytes] = field(default_factory=list)
    sample_ids: list[str] = field(default_factory=list)
    """The ids of `samples`, in order (what `on_part` names)."""
    failures: list[dict[str, Any]] = field(default_factory=list)
    stats: list[tuple[bool, bool, int]] = field(default_factory=list)
    chain_stops: list[tuple[str, int]] = field(default_factory=list)
    """(why, turns left) of the chains in this group that stopped early (`batch.chains`)."""
    flagged_codes: Counter[str] = field(default_factory=Counter)
    """Samples per error finding code (a flagged sample counts once under each of its codes)."""


class _Reencoder:
    """One daemon thread computing `reencode_output` for the captures in the order they are handed over.

    Not a ThreadPoolExecutor: its idle worker is a thread the interpreter waits for at exit, which a
    writer left unclosed after an error would turn into a hang."""

    def __init__(self, tokenizer: TokenizerAdapter) -> None:
        self.tokenizer = tokenizer
        self._jobs: queue.SimpleQueue[tuple[Ahead, list[int]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="tokview-reencode", daemon=True)
        self._thread.start()

    def submit(self, output_ids: list[int]) -> Ahead:
        ahead: Ahead = Future()
        self._jobs.put((ahead, output_ids))
        return ahead

    def close(self) -> None:
        """Stop after the re-encodes already asked for (a few ms at most), so none outlives the writer."""
        self._jobs.put(None)
        self._thread.join()

    def _loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            ahead, output_ids = job
            try:
                ahead.set_result(reencode_output(self.tokenizer, output_ids))
            except BaseException as exc:  # the analysis then computes it itself and reports it its own way
                ahead.set_exception(exc)


def _ahead(ahead: Ahead | None) -> list[int] | None:
    """The re-encode started ahead; None when none was started or it failed (the drift check tries again)."""
    if ahead is None:
        return None
    try:
        return ahead.result()
    except Exception:
        return None


class GroupWriter:
    def __init__(
        self,
        store: PartWriter,
        *,
        profile: ModelProfile,
        tokenizer: TokenizerAdapter | None,
        run_id: str,
        ingest: bool = True,
        group_s: float = 0.25,
        group_max: int = 64,
        ingest_s: float = 1.0,
        on_commit: Callable[[GroupWriter], None] | None = None,
        on_part: Callable[[list[str]], None] | None = None,
        ends_group: Callable[[], bool] = lambda: False,
    ) -> None:
        """`on_commit`: called once a part is on disk and the counters moved. `on_part`: called with a
        part's sample ids (samples, then failures) just before the part is written (a `--workers`
        child names them to its parent, which then knows what a child that dies had written).
        `ends_group`: asked after each item is taken; True writes the group now (the proxy's recorder: a key
        turn that must land before the turns after it are written)."""
        self.store, self.profile, self.tokenizer, self.run_id = store, profile, tokenizer, run_id
        self.do_ingest, self.group_s, self.group_max, self.ingest_s = ingest, group_s, group_max, ingest_s
        self.on_commit, self.on_part, self.ends_group = on_commit, on_part, ends_group
        self.ok = self.failed = self.flagged = self.truncated = self.output_tokens = 0
        self.reasons: Counter[str] = Counter()
        self.error: BaseException | None = None
        """The StoreError (StoreFull on a full disk) that stopped the writer, if any."""
        self._queue: queue.Queue[_Entry | Literal[_Stop.STOP]] = queue.Queue()
        self._handed = 0  # moved only by the thread that hands work over
        self._written = 0  # moved only by the writer thread: `+=` from two threads could lose a count
        self._next_ingest = time.monotonic() + ingest_s
        self._reencoder = _Reencoder(tokenizer) if tokenizer is not None else None
        self._thread = threading.Thread(target=self._loop, name="tokview-writer", daemon=True)
        self._thread.start()

    def counts(self) -> dict[str, Any]:
        """The counters and failure reasons, as plain values (what a child or a Ray task sends back)."""
        return {**{key: getattr(self, key) for key in COUNT_FIELDS}, "reasons": dict(self.reasons)}

    @property
    def pending(self) -> int:
        """Captures handed over and not yet written: the runner waits when too many pile up."""
        return self._handed - self._written

    @property
    def handed(self) -> int:
        """Items handed over so far (samples, failures, chains)."""
        return self._handed

    @property
    def written(self) -> int:
        """Items the writer is done with: written in a part, unless `error` says the write failed."""
        return self._written

    def add_sample(self, item: Slot, capture: Capture) -> None:
        self._handed += 1
        ahead = self._reencoder.submit(capture.output_ids) if self._reencoder and capture.output_ids else None
        self._queue.put(("sample", item, (capture, ahead)))

    def add_failure(self, item: Slot, reason: str, server: str | None) -> None:
        self._handed += 1
        self._queue.put(("failure", item, (reason, server)))

    def add_chain(self, item: Slot, result: ChainResult) -> None:
        """A regenerated chain (`batch.chains.ChainResult`), written in one part: its turns' samples, or its
        failure (named by its first turn's sample id), and the count of the turns it left with the reason."""
        self._handed += 1
        aheads = [
            self._reencoder.submit(capture.output_ids) if self._reencoder and capture.output_ids else None
            for _, capture in result.samples
        ]
        self._queue.put(("chain", item, (result, aheads)))

    def close(self) -> None:
        """Write what was handed over, ingest (unless a child), and stop. Blocks.

        While the thread analyses what is still queued (the last ~40 ms of a run), the parts it has
        already written are landed from here, on the other core: its own last landing then holds only
        its last part (a 300-sample run: -33 ms of wall time, +3 ms of CPU)."""
        self._queue.put(_STOP)
        try:
            if self.do_ingest and self.error is None and self._thread.is_alive():
                self._ingest()
            self._thread.join()
        finally:
            if self._reencoder is not None:
                self._reencoder.close()

    # -- the thread ------------------------------------------------------------------------
    def _loop(self) -> None:
        stopping = False
        while not stopping:
            first = self._queue.get()
            group = _Group()
            if first is _STOP:
                stopping = True
            else:
                self._take(first, group)
                deadline = time.monotonic() + self.group_s
                while group.count < self.group_max and not self.ends_group():
                    try:
                        entry = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                    except queue.Empty:
                        break
                    if entry is _STOP:
                        stopping = True
                        break
                    self._take(entry, group)
            try:
                if group.count and self.error is None:
                    self._write(group)
                if self.error is None and self.do_ingest and (stopping or time.monotonic() >= self._next_ingest):
                    self._ingest()
            except Exception as exc:  # a bug: stop the run with it said, never a dead thread the run waits on
                self.error = StoreError(f"the batch's writer failed: {failure_reason(exc)}")
            self._written += group.count

    def _ingest(self) -> None:
        started = time.monotonic()
        try:
            self.store.ingest()
        except StoreError as exc:
            self.error = exc
            return
        took = time.monotonic() - started
        self._next_ingest = time.monotonic() + max(self.ingest_s, 4 * took)  # a big store ingests less often

    def _take(self, entry: _Entry, group: _Group) -> None:
        """Analyse one finished capture as it arrives (so the last group is not analysed after the last
        answer came in); it is written with its group."""
        group.count += 1
        if self.error is not None:
            return
        if entry[0] == "failure":
            _, item, (reason, server) = entry
            group.failures.append(self._failure(item, reason, server))
            return
        if entry[0] == "chain":
            _, item, (result, aheads) = entry
            self._take_chain(item, result, aheads, group)
            return
        _, item, (capture, ahead) = entry
        self._take_sample(item, capture, ahead, group)

    def _take_chain(self, item: Slot, result: ChainResult, aheads: list[Ahead | None], group: _Group) -> None:
        for (turn_item, capture), ahead in zip(result.samples, aheads, strict=True):
            self._take_sample(turn_item, capture, ahead, group)
        if result.failure is not None:
            group.failures.append(self._failure(item, *result.failure[:2]))
        if result.left:
            why = result.stop or "its chain failed (recorded on its first turn; the next run retries the chain whole)"
            group.chain_stops.append((why, result.left))

    def _take_sample(self, item: Slot, capture: Capture, ahead: Ahead | None, group: _Group) -> None:
        try:
            analysis = analyze(capture, self.profile, self.tokenizer, reencoded=_ahead(ahead))
            _check_ids(capture)
            key = SampleIdentity(
                item.sample_id,
                item.prompt_id,
                self.run_id,
                gen_index=item.index,
                turn=item.turn,
                profile=self.profile.name,
            )
            record = self.store.sample_record(key, capture, analysis)
            group.samples.append(dumps_lines([record]))
            group.sample_ids.append(item.sample_id)
        except Exception as exc:  # this sample's analysis or data failed: record it, keep going
            group.failures.append(self._failure(item, failure_reason(exc), capture.server_url))
            return
        truncated = any(f.code == "truncated" for f in analysis.findings)  # not a stop id at the limit (a whole turn)
        group.stats.append((analysis.valid, truncated, len(capture.output_ids)))
        group.flagged_codes.update({f.code for f in analysis.findings if f.severity == ERROR})

    def _write(self, group: _Group) -> None:
        """One part on disk for the group; only then do the counters move."""
        if self.on_part is not None:
            self.on_part([*group.sample_ids, *(f["sample_id"] for f in group.failures)])
        try:
            self.store.write_part(group.samples, group.failures)
        except (StoreError, InputError) as exc:  # InputError: the store refused the run (`wait_until_recorded`)
            self.error = exc
            return
        self.ok += len(group.stats)
        for valid, truncated, n in group.stats:
            self.flagged += 0 if valid else 1
            self.truncated += truncated
            self.output_tokens += n
        self.failed += len(group.failures)
        for f in group.failures:
            self.reasons[scrub_text(f["reason"])] += 1
        for why, left in group.chain_stops:  # counted beside the failure reasons, told apart by the runner
            self.reasons[CHAIN_STOP_PREFIX + scrub_text(why)] += left
            self.reasons[CHAINS_STOPPED_PREFIX + scrub_text(why)] += 1
        for code, n in group.flagged_codes.items():  # so are the error findings' codes (`split_flagged`)
            self.reasons[FLAGGED_PREFIX + code] += n
        if self.on_commit is not None:
            self.on_commit(self)

    def _failure(self, item: Slot, reason: str, server: str | None) -> dict[str, Any]:
        """A failure as a part takes it: its reason quotes a server, whose lone surrogates no part holds."""
        return {
            "prompt_id": item.prompt_id,
            "sample_id": item.sample_id,
            "run_id": self.run_id,
            "reason": storable(reason),
            "server": None if server is None else storable(server),
        }


def _check_ids(capture: Capture) -> None:
    """DuckDB keeps ids as INTEGER: an id it cannot hold fails this sample, not the whole part.

    Packing the ids into a 32-bit `array` is the range check, in one C pass (half of `min` + `max`); ids packed as
    32-bit integers lately (an agent's long prompt, by the proxy) passed it already."""
    for name in ("prompt_ids", "output_ids", "parsed_output_ids"):
        ids = getattr(capture, name)
        if not ids or known_packing(ids) is not None:
            continue
        try:
            array(_INT32, ids)
            continue
        except OverflowError:
            pass
        except TypeError:  # not all ints (a float id, from a capture made outside the servers layer)
            if min(ids) >= -INT32_MAX - 1 and max(ids) <= INT32_MAX:
                continue
        raise ValueError(f"{name} hold an id outside the 32-bit range DuckDB stores")


_INT32 = next(code for code in "il" if array(code).itemsize == 4)
"""The array type code of a 32-bit signed integer on this platform ("i" wherever CPython runs today)."""


def failure_reason(exc: BaseException) -> str:
    """One line for an error that is not a CaptureFailed (a bug, a tokenizer error, an odd response)."""
    text = first_line(exc, 300) if str(exc).strip() else ""
    return f"unexpected error: {type(exc).__name__}" + (f": {text}" if text else "")
