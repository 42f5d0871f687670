"""Curation at scale: at 80x24 the list shows rows that can be told apart (long ids sharing their start and
end keep the part that differs), with marks and a tags column."""

from __future__ import annotations

from ui.helpers import NARROW, run_before

LONG_IDS = (
    "UPDATE samples SET sample_id = 'typed-conversation-' || prompt_id || '-of-0030@qwen3-8b-nightly-run_gen0', "
    "run_id = 'nightly-2026-12-01-' || run_id"
)


def test_samples_80x24_long_ids_marks_and_tags(snap_compare, make_app, store):
    store.execute(LONG_IDS)
    store.add_note("typed-conversation-p002-of-0030@qwen3-8b-nightly-run_gen0", "", tags=["hard"], who="ann")
    assert snap_compare(make_app(), terminal_size=NARROW, run_before=run_before("space", "space", "down"))
