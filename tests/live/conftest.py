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


TOOLS_URL_ENV, TOOLS_DIR_ENV = "TOKVIEW_LIVE_TOOLS_URL", "TOKVIEW_LIVE_TOOLS_DIR"


@pytest.fixture(scope="session")
def tools_server() -> tuple[str, str]:
    """(URL, model dir) of the real vLLM serving the tiny tool model, started by .ci/live_tools.sh."""
    url, model_dir = os.environ.get(TOOLS_URL_ENV), os.environ.get(TOOLS_DIR_ENV)
    if not url or not model_dir:
        pytest.skip(
            f"{TOOLS_URL_ENV}/{TOOLS_DIR_ENV} are not set: run `bash .ci/live_tools.sh` (or .ci/live.sh) to start "
            "a real vLLM with the tool model and the live tool tier"
        )
    return url.rstrip("/"), model_dir


AGENT_URL_ENV, AGENT_DIR_ENV = "TOKVIEW_LIVE_AGENT_URL", "TOKVIEW_LIVE_AGENT_DIR"


@pytest.fixture(scope="session")
def agent_server() -> tuple[str, str]:
    """(URL, model dir) of the real vLLM serving the tiny agent model (two tool rounds), from .ci/live_tools.sh."""
    url, model_dir = os.environ.get(AGENT_URL_ENV), os.environ.get(AGENT_DIR_ENV)
    if not url or not model_dir:
        pytest.skip(f"{AGENT_URL_ENV}/{AGENT_DIR_ENV} are not set: run `bash .ci/live_tools.sh` (or .ci/live.sh)")
    return url.rstrip("/"), model_dir
