"""The size limit of one answer (`TOKVIEW_MAX_RESPONSE_MB`), read in a leaf module: the servers layer reads it for
every client it makes, the proxy for every answer it decodes, and a command checks it before it makes anything."""

from __future__ import annotations

from tokview.env_size import bytes_from_mib
from tokview.errors import UserError

MAX_RESPONSE_ENV = "TOKVIEW_MAX_RESPONSE_MB"
"""Environment variable raising (or lowering) the size limit of one answer, in MiB."""
DEFAULT_MAX_RESPONSE_BYTES = 128 << 20


def max_response_bytes() -> int:
    """The most bytes one answer may hold: `TOKVIEW_MAX_RESPONSE_MB` MiB, else 128 MiB.

    Why a limit: an answer is held whole, parsed and stored, at several times its size in memory (a 300 MB body
    took 2.3 GB). The default is far above any real one: a 32k-token generation with 20 logprob alternatives per
    token is ~40 MB, scoring a 64k-token sample with --top-k 20 ~100 MB. UserError for a value that is not a number
    of MiB above 0: a typo such as `512M` silently kept the 128 MiB default, and the answers it was set for failed
    as too large."""
    try:
        return bytes_from_mib(MAX_RESPONSE_ENV, DEFAULT_MAX_RESPONSE_BYTES)
    except ValueError as exc:
        raise UserError(str(exc)) from None
