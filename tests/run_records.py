"""A run record to hand a landing child (`LandingChild.begin_run`) in tests: what a batch would record."""

from __future__ import annotations

from typing import Any

from tokview.batch.run_record import RunRecord


def record(run_id: str, settings: dict[str, Any]) -> RunRecord:
    return RunRecord(
        run_id=run_id,
        settings=settings,
        special={"tokenizer_special": "x", "tokenizer_special_ids": "1-2"},
        tokenizer_name="test",
        profile="generic",
        tokenizer_dir=None,
        tokenizer_hash="h",
        template_hash=None,
        server_info=[],
        source=None,
        profile_def={},
    )
