"""Fixtures of the live tier: the URL of a real vLLM started by .ci/live.sh.

Without `TOKVIEW_LIVE_VLLM_URL` every live test is skipped with a reason that says how to run
them; the default `-m 'not live'` keeps them out of the fast tier altogether.
"""

from __future__ import annotations

import os

import pytest

LIVE_URL_ENV = "TOKVIEW_LIVE_VLLM_URL"


@pytest.fixture(scope="session")
def vllm_surface_url() -> str:
    url = os.environ.get(LIVE_URL_ENV)
    if not url:
        pytest.skip(f"{LIVE_URL_ENV} is not set: run `bash .ci/live.sh` to start a real vLLM and the live tier")
    return url.rstrip("/")
