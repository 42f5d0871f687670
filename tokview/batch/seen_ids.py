"""Prompt ids already met in a streamed read: duplicates and conflicts found without holding the ids."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy is imported only once `SMALL` ids were met (see `SeenIds`)
    import numpy as np
    from numpy.typing import NDArray

    Int64s = NDArray[np.int64]
    """A run's keys, digests or lines."""


class SeenIds:
    """Every prompt id met so far, by a 64-bit hash: the line it was first met on and its conversation's digest.

    24 bytes an id in sorted numpy runs, merged as they grow (a log-structured merge), where a dict
    of the ids themselves took ~150: a million prompts' duplicate and conflict checks in ~25 MB, and
    one vectorised lookup per chunk. Within one read only: Python's string hash is salted per process.

    The first `SMALL` ids live in a plain dict instead: importing numpy costs ~60 ms, a fifth of a
    300-prompt run's start-up, and a dict of a few thousand ids is as small as it is fast. Past
    `SMALL` the dict becomes the first sorted run and numpy takes over.
    """

    SMALL = 4096

    def __init__(self) -> None:
        self._runs: list[tuple[Any, Any, Any]] = []
        self._small: dict[int, tuple[int, int]] | None = {}

    def settle(self, keys: list[int], digests: list[int], lines: list[int]) -> dict[int, tuple[int, bool]]:
        """Meet a chunk of rows (in file order): {position in the chunk: (line of its id's first row, same
        conversation as that row)} for each row whose id was met before (the others are remembered)."""
        if not keys:
            return {}
        if self._small is not None:
            if len(self._small) + len(keys) <= self.SMALL:
                return self._settle_small(keys, digests, lines)
            self._to_runs()
        import numpy as np  # lazily: not every command that reads prompts needs it

        k = np.array(keys, dtype=np.int64)
        d = np.array(digests, dtype=np.int64)
        ln = np.array(lines, dtype=np.int64)
        first_line, first_digest = ln.copy(), d.copy()
        known = np.zeros(len(k), dtype=bool)
        for rk, rd, rl in self._runs:
            pos = np.minimum(np.searchsorted(rk, k), len(rk) - 1)
            hit = rk[pos] == k
            if hit.any():
                first_line[hit], first_digest[hit] = rl[pos[hit]], rd[pos[hit]]
                known |= hit
        order = np.argsort(k, kind="stable")
        sorted_keys = k[order]
        starts = np.ones(len(k), dtype=bool)
        starts[1:] = sorted_keys[1:] != sorted_keys[:-1]
        if starts.all():  # no id twice within the chunk: the usual case
            repeats = np.flatnonzero(known)
            new = ~known
        else:
            group_first = np.empty(len(k), dtype=np.int64)
            group_first[order] = order[np.maximum.accumulate(np.where(starts, np.arange(len(k)), 0))]
            local = ~known
            first_line[local], first_digest[local] = ln[group_first[local]], d[group_first[local]]
            new = local & (group_first == np.arange(len(k)))
            repeats = np.flatnonzero(~new)
        if new.any():
            self._add(k[new], d[new], ln[new])
        return {int(i): (int(first_line[i]), bool(first_digest[i] == d[i])) for i in repeats.tolist()}

    def _settle_small(self, keys: list[int], digests: list[int], lines: list[int]) -> dict[int, tuple[int, bool]]:
        small, repeats = self._small, {}
        assert small is not None
        for i, (key, digest, line) in enumerate(zip(keys, digests, lines)):
            first = small.get(key)
            if first is None:
                small[key] = (line, digest)
            else:
                repeats[i] = (first[0], first[1] == digest)
        return repeats

    def _to_runs(self) -> None:
        small, self._small = self._small or {}, None
        if small:
            import numpy as np

            self._add(
                np.fromiter(small, dtype=np.int64, count=len(small)),
                np.array([d for _, d in small.values()], dtype=np.int64),
                np.array([line for line, _ in small.values()], dtype=np.int64),
            )

    def _add(self, keys: Int64s, digests: Int64s, lines: Int64s) -> None:
        import numpy as np

        order = np.argsort(keys, kind="stable")
        self._runs.append((keys[order], digests[order], lines[order]))
        while len(self._runs) > 1 and len(self._runs[-2][0]) <= 2 * len(self._runs[-1][0]):
            (k1, d1, l1), (k2, d2, l2) = self._runs.pop(-2), self._runs.pop()
            k, d, ln = np.concatenate([k1, k2]), np.concatenate([d1, d2]), np.concatenate([l1, l2])
            order = np.argsort(k, kind="stable")
            self._runs.append((k[order], d[order], ln[order]))

    def __len__(self) -> int:
        return len(self._small or ()) + sum(len(r[0]) for r in self._runs)
