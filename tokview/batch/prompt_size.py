"""The size limit of one prompt's text (`TOKVIEW_MAX_PROMPT_MB`), read apart from `limits` so that the batch's
checks of its inputs read it before anything runs without importing the servers layer `limits` needs (~45 ms of
start-up)."""

from __future__ import annotations

import os

from tokview.untrusted_text import printable_line

MAX_PROMPT_ENV = "TOKVIEW_MAX_PROMPT_MB"
DEFAULT_MAX_PROMPT_BYTES = 8 << 20


def max_prompt_bytes() -> int:
    """The most bytes of text one prompt may hold: `TOKVIEW_MAX_PROMPT_MB` MiB, else 8 MiB. InputError for a value
    that is not a number of MiB above 0 (`BatchConfig.validate` asks first, before anything runs): a typo such as
    `TOKVIEW_MAX_PROMPT_MB=64MB` silently kept the 8 MiB default, and the long prompts it was set for failed."""
    value = os.environ.get(MAX_PROMPT_ENV, "").strip()
    if not value:
        return DEFAULT_MAX_PROMPT_BYTES
    try:
        mib = float(value)
    except ValueError:
        mib = 0.0
    if not 0 < mib < 1 << 40:  # NaN and inf too
        from tokview.batch.inputs import InputError

        raise InputError(f"{MAX_PROMPT_ENV} must be a number of MiB above 0, not {printable_line(value)[:40]!r}")
    return max(1, int(mib * (1 << 20)))
