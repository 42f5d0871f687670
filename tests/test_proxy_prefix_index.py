"""`PrefixGroup.extended_by` finds exactly the kept turns a prompt starts with, whichever path searches (a small group
scanned in Python, a large one by a vectorised compare of every turn's last ids), through adds, removals and the
compaction that follows them. Placing a turn walked every kept turn of every session that shared the prompt's start:
5 ms a request among 2,000 sessions, growing with a proxy's run (benchmarks/bench_recorder.py measures it now)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokview.core.prefix_memo import pack_int32
from tokview.proxy.prefix_index import VECTOR_FROM, PrefixGroup


@dataclass(eq=False)
class _Turn:
    sequence: bytes | memoryview
    order: int = 0
    slot: int = -1


def _brute(turns: list[_Turn], packed: bytes) -> set[int]:
    return {id(t) for t in turns if packed.startswith(t.sequence)}


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    size=st.sampled_from([3, VECTOR_FROM - 1, VECTOR_FROM * 3]),
    removed=st.floats(0, 0.8),
)
def test_the_turns_found_are_exactly_those_the_prompt_starts_with(seed: int, size: int, removed: float) -> None:
    rng = random.Random(seed)
    start = [rng.randrange(5) for _ in range(16)]
    conversations = [start + [rng.randrange(3) for _ in range(rng.randrange(0, 40))] for _ in range(6)]
    group: PrefixGroup[_Turn] = PrefixGroup()
    kept: list[_Turn] = []
    for _ in range(size):
        base = rng.choice(conversations)
        ids = base[: rng.randrange(1, len(base) + 1)] + [rng.randrange(3) for _ in range(rng.randrange(0, 3))]
        packed = pack_int32(ids)
        assert packed is not None
        turn = _Turn(memoryview(packed) if rng.random() < 0.3 else packed)
        group.add(turn)
        kept.append(turn)
    for turn in [t for t in kept if rng.random() < removed]:
        group.remove(turn)
        kept.remove(turn)
    assert len(group) == len(kept)
    for _ in range(20):
        base = rng.choice(conversations)
        ids = base[: rng.randrange(1, len(base) + 1)] + [rng.randrange(3) for _ in range(rng.randrange(0, 5))]
        packed = pack_int32(ids)
        assert packed is not None
        assert {id(t) for t in group.extended_by(packed)} == _brute(kept, packed)


@pytest.mark.parametrize("size", [VECTOR_FROM // 2, VECTOR_FROM * 4])
def test_ids_that_are_not_4_byte_ints_and_short_turns_are_compared_whole(size: int) -> None:
    group: PrefixGroup[_Turn] = PrefixGroup()
    filler = [_Turn(pack_int32([9, 9, 9, 9, k]) or b"") for k in range(size)]
    odd = [_Turn(b'[1,2,"x"'), _Turn(pack_int32([1, 2]) or b"")]
    for turn in [*filler, *odd]:
        group.add(turn)
    assert group.extended_by(b'[1,2,"x"]') == [odd[0]]
    assert group.extended_by(pack_int32([1, 2, 3, 4, 5]) or b"") == [odd[1]]
    assert group.extended_by(pack_int32([9, 9, 9, 9, 3, 7]) or b"") == [filler[3]]
    group.remove(odd[0])
    assert group.extended_by(b'[1,2,"x"]') == []
