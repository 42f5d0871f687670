"""The size limit of one prompt's text (`TOKVIEW_MAX_PROMPT_MB`), read apart from `limits` so that the batch's
checks of its inputs read it before anything runs without importing the servers layer `limits` needs (~45 ms of
start-up)."""

from __future__ import annotations

from tokview.env_size import bytes_from_mib

MAX_PROMPT_ENV = "TOKVIEW_MAX_PROMPT_MB"
DEFAULT_MAX_PROMPT_BYTES = 8 << 20


def max_prompt_bytes() -> int:
    """The most bytes of text one prompt may hold: `TOKVIEW_MAX_PROMPT_MB` MiB, else 8 MiB. InputError for a value
    that is not a number of MiB above 0 (`BatchConfig.validate` asks first, before anything runs): a typo such as
    `TOKVIEW_MAX_PROMPT_MB=64MB` silently kept the 8 MiB default, and the long prompts it was set for failed."""
    try:
        return bytes_from_mib(MAX_PROMPT_ENV, DEFAULT_MAX_PROMPT_BYTES)
    except ValueError as exc:
        from tokview.batch.inputs import InputError

        raise InputError(str(exc)) from None
