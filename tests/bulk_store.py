"""The 500-sample store of the curation-at-scale scenario (a helper module, no tests): shared by the shell test
(`tokview review`) and the Pilot-driven one, so both review the same samples.

350 `a-NNN` (a parser_split_mismatch warning, valid), 50 `b-NNN` (the same warning and truncated: invalid),
100 `c-NNN` (neither). Runs: r1 = a-000..a-199, r2 = a-200..a-249, r3 = the other a and every b, r4 = the c.
The finding filter parser_split_mismatch shows 400, a first, in id order (one seed each, copied by SQL).
"""

from __future__ import annotations

from typing import Any

from builders import make_capture, put

KINDS: tuple[tuple[str, int, dict[str, Any]], ...] = (
    ("a", 350, {"reasoning_text": "x"}),
    ("b", 50, {"reasoning_text": "x", "finish_reason": "length", "stop": False}),
    ("c", 100, {}),
)
FINDING = "parser_split_mismatch"


def fill_500(store) -> None:
    for prefix, n, kwargs in KINDS:
        seed = put(store, prefix, make_capture(**kwargs), run_id="seed")
        run = "CASE WHEN ? = 'c' THEN 'r4' WHEN ? = 'b' OR r.i >= 250 THEN 'r3' WHEN r.i >= 200 THEN 'r2' ELSE 'r1' END"
        new_id = "s.prompt_id || '-' || lpad(r.i::VARCHAR, 3, '0')"
        store.execute(
            f"INSERT INTO samples SELECT s.* REPLACE ({new_id} AS sample_id, {run} AS run_id) "
            "FROM samples s, range(?) r(i) WHERE s.sample_id = ?",
            [prefix, prefix, n, seed],
        )
        store.execute(
            f"INSERT INTO findings SELECT {new_id.replace('s.prompt_id', '?')}, f.code, f.severity, f.detail, "
            "f.positions FROM findings f, range(?) r(i) WHERE f.sample_id = ?",
            [prefix, n, seed],
        )
        store.execute("DELETE FROM findings WHERE sample_id = ?", [seed])
        store.execute("DELETE FROM samples WHERE sample_id = ?", [seed])
