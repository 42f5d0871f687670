"""The run a batch writes to, when the store holds a run an older tokview named otherwise.

Until 2026-12-02 a multi-turn row was always sent on the prompts file's history (what `--history file` does now);
until 2026-12-05 a run's default name held its sample settings only, whatever its history. Both changed what a
default-named run holds, not the sample ids of a file-history turn, so the same command on an old store went wrong:
- the default (`--history served`) chained the rows of a run whose turns were sent on the file's history, and wrote
  a second copy of every turn into the same run (the trajectory export then joined the two as branches);
- `--history file` (or a `--history-reasoning` other than template) resumed under a new name: one run split in two.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tokview.batch.inputs import InputError
from tokview.core.record import settings_key

if TYPE_CHECKING:
    from tokview.batch.config import BatchConfig
    from tokview.batch.worklist import WorkList
    from tokview.store.query_repo import QueryRepository


def run_id_for(config: BatchConfig, identity: dict[str, Any], work: WorkList, reads: QueryRepository | None) -> str:
    """`config.run_id(identity)`, or the older default name of the same run when the store holds it (`reads`: None
    for a store made by this batch). InputError when the default name holds turns this run would send otherwise."""
    run_id = config.run_id(identity)
    if config.run or reads is None:
        return run_id
    older = f"batch-{settings_key(config.sample_settings(identity))}"  # a run's default name before 2026-12-05
    if older == run_id:  # the default history: chained, reasoning as the template keeps it
        if work.chain_key is not None and reads.run_holds(run_id, f"@{work.key}_gen", turns_only=True):
            raise InputError(
                f"run {run_id} was made by an older tokview, which sent each turn on the prompts file's history: "
                "resume it with --history file, or give --run NAME to regenerate the rows as chains in a run of "
                "their own"
            )
        return run_id
    own = f"@{work.chain_key}_gen" if work.chain_key is not None else f"@{work.key}_gen"
    if reads.run_holds(older, own, turns_only=True):
        return older  # the same command resumes the run it made
    return run_id
