"""A size limit read from the environment in MiB: `TOKVIEW_MAX_RESPONSE_MB` and `TOKVIEW_MAX_PROMPT_MB` read theirs
alike, in one leaf module (each caller's own module must not import a layer for it: the batch checks its inputs
before the servers layer loads, and the proxy decodes every answer with the limit)."""

from __future__ import annotations

import os

from tokview.untrusted_text import printable_line


def bytes_from_mib(name: str, default: int) -> int:
    """The environment variable `name` in MiB, as bytes; `default` when it is unset or blank. ValueError, worded for
    the user, for anything but a number of MiB above 0 (NaN and inf too): a typo such as `512M` silently kept the
    default, and what the limit was raised for then failed."""
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        mib = float(value)
    except ValueError:
        mib = 0.0
    if not 0 < mib < 1 << 40:
        raise ValueError(f"{name} must be a number of MiB above 0, not {printable_line(value)[:40]!r}")
    return max(1, int(mib * (1 << 20)))
