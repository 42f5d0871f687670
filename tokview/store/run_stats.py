"""Per-run numbers (`tokview stats --by run`, the stats panel's runs table) and a sample's siblings (the same
prompt in other runs, what compare opens).

Why a module of its own: `Store.stats()` sums the whole store; comparing two regeneration runs needs the same
numbers grouped by run, each computed once in SQL (a 100,000-sample store answers in a few hundred ms), and the
panel and the command must print the same thing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokview.store.connection import Database

NO_RUN = "(no run)"

_ACCEPTED, _STEPS = (f"TRY_CAST(json_extract_string(spec_decode, '$.{k}') AS DOUBLE)" for k in ("accepted", "steps"))
_WITH_BOTH = f"FILTER (WHERE {_ACCEPTED} IS NOT NULL AND {_STEPS} IS NOT NULL)"
_RUN_ACCEPTANCE = f"1 + sum({_ACCEPTED}) {_WITH_BOTH} / nullif(sum({_STEPS}) {_WITH_BOTH}, 0)"
"""A run's mean acceptance length as `stats` gives the store's (`side_stats`): 1 + accepted / steps over its samples
that report both, not the mean of each sample's (short samples weighed as much as long ones: another figure under
one key); a sample of an older SGLang build (steps, no accepted count) weighs nothing, as it did not (1.00 over it)."""

_PER_RUN = f"""
SELECT coalesce(run_id, '{NO_RUN}') AS run,
       count(*),
       count(*) FILTER (WHERE status = 'pending'),
       count(*) FILTER (WHERE status = 'approved'),
       count(*) FILTER (WHERE status = 'rejected'),
       count(*) FILTER (WHERE valid),
       quantile_disc(prompt_len, 0.5), quantile_disc(output_len, 0.5), quantile_disc(output_len, 0.9),
       max(output_len), avg(output_len),
       count(acceptance_length), {_RUN_ACCEPTANCE},
       count(mean_nll), avg(mean_nll)
FROM samples GROUP BY 1
"""

_FINDINGS = f"""
SELECT coalesce(s.run_id, '{NO_RUN}'), f.code, count(DISTINCT f.sample_id)
FROM findings f JOIN samples s USING (sample_id) GROUP BY 1, 2 ORDER BY 1, 3 DESC, 2
"""

_FAILURES = f"SELECT coalesce(run_id, '{NO_RUN}'), count(*) FROM failures GROUP BY 1"


def _empty(run: str) -> dict[str, Any]:
    return {
        "run": run,
        "samples": 0,
        "by_status": {"pending": 0, "approved": 0, "rejected": 0},
        "valid": 0,
        "invalid": 0,
        "truncated": 0,
        "failures": 0,
        "prompt_len": {"p50": None},
        "output_len": {"p50": None, "p90": None, "max": None, "mean": None},
        "acceptance": {"samples": 0, "mean_acceptance_length": None},
        "target_nll": {"samples": 0, "mean": None},
        "findings": {},
    }


def run_stats(store: Database) -> list[dict[str, Any]]:
    """One dict per run (samples by status, valid, truncated, failures, lengths, acceptance, target NLL, samples
    per finding code), runs in name order; a run that only failed is listed with its failures."""
    runs: dict[str, dict[str, Any]] = {}
    for row in store.query(_PER_RUN):
        run, n, pending, approved, rejected, valid, p_p50, o_p50, o_p90, o_max, o_mean = row[:11]
        acc_n, acc_mean, nll_n, nll_mean = row[11:]
        entry = runs.setdefault(run, _empty(run))
        entry.update(
            samples=n,
            by_status={"pending": pending, "approved": approved, "rejected": rejected},
            valid=valid,
            invalid=n - valid,
            prompt_len={"p50": p_p50},
            output_len={"p50": o_p50, "p90": o_p90, "max": o_max, "mean": None if o_mean is None else round(o_mean, 1)},
            acceptance={"samples": acc_n, "mean_acceptance_length": acc_mean},
            target_nll={"samples": nll_n, "mean": nll_mean},
        )
    for run, code, n in store.query(_FINDINGS):
        runs.setdefault(run, _empty(run))["findings"][code] = n
    for entry in runs.values():  # flagged truncated (a stop id at the limit is a whole turn, said `length` by SGLang)
        entry["truncated"] = entry["findings"].get("truncated", 0)
    for run, n in store.query(_FAILURES):
        runs.setdefault(run, _empty(run))["failures"] = n
    return [runs[name] for name in sorted(runs)]


def siblings(store: Database, sample_id: str) -> list[tuple[str, str | None]]:
    """(sample_id, run) of the other samples of this sample's prompt and turn: other runs first (what compare is
    for), then other generations of the same run, each in run and id order. The same turn only: every turn of a
    chain or a proxied session shares its prompt id, and turn 1 was compared with turn 0 of its own conversation."""
    rows = store.query(
        "SELECT o.sample_id, o.run_id, o.run_id IS NOT DISTINCT FROM s.run_id AS same_run "
        "FROM samples s JOIN samples o ON o.prompt_id = s.prompt_id AND o.sample_id <> s.sample_id "
        "AND o.turn IS NOT DISTINCT FROM s.turn "
        "WHERE s.sample_id = ? ORDER BY same_run, o.run_id, o.sample_id",
        [sample_id],
    )
    return [(sid, run) for sid, run, _ in rows]
