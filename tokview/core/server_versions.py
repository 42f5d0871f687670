"""Server behaviours that changed at a known release: the proxy reads an upstream by its probed version, and the
simulator imitates the version it says it is, from one table."""

from __future__ import annotations

import re

VLLM_MARKER_LOGPROBS = (0, 31)
"""The first vLLM whose chat stream sends a marker id's empty-delta chunk for its logprobs: serving_chat's
`continue` gained `and logprobs is None` in 0.31.0; 0.30.0 and earlier skipped such a chunk unless asked for ids."""


def at_least(version: object, release: tuple[int, int]) -> bool:
    """Whether `version` ("0.32.0", "v0.31.1+cpu") is `release` or later; one that does not read as a version
    (absent, a build hash) is taken as a current release."""
    if not isinstance(version, str):
        return True
    m = re.match(r"v?(\d+)\.(\d+)", version.strip())
    return m is None or (int(m[1]), int(m[2])) >= release
