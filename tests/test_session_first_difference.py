"""`sessions._first_difference`: where two packed id sequences part, found by memcmp probes over views.

The bisect probes only the part not yet known equal; a differential check against a plain loop over ids keeps it
exact at every length, for a prefix either way, and for a memoryview of a longer sequence (a head's view)."""

from __future__ import annotations

import random
import struct

from tokview.proxy.sessions import _first_difference


def _packed(ids: list[int]) -> bytes:
    return struct.pack(f"<{len(ids)}i", *ids)


def _by_loop(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b)) // 4
    return next((i for i in range(n) if a[i * 4 : i * 4 + 4] != b[i * 4 : i * 4 + 4]), n)


def test_the_first_difference_matches_a_plain_loop_at_every_length():
    rng = random.Random(7)
    for _ in range(3000):
        a = [rng.randrange(3) for _ in range(rng.randrange(60))]
        b = a[: rng.randrange(len(a) + 1)] + [rng.randrange(3) for _ in range(rng.randrange(60))]
        packed_a, packed_b = _packed(a), _packed(b)
        longer_view = memoryview(packed_b + _packed([5, 6]))[: len(packed_b)]
        for x, y in ((packed_a, packed_b), (packed_b, packed_a), (packed_a, longer_view)):
            assert _first_difference(x, y) == _by_loop(x, bytes(y)), (a, b)


def test_a_long_prompt_parts_where_its_ids_change():
    ids = list(range(1, 40_001))
    changed = ids[:30_000] + [0] + ids[30_001:]
    assert _first_difference(_packed(ids), _packed(changed)) == 30_000
    assert _first_difference(_packed(ids), _packed(ids[:25_000])) == 25_000
    assert _first_difference(_packed(ids[:1]), _packed([2])) == 0
    assert _first_difference(b"", _packed(ids)) == 0
