"""The simulator answers one choice a request, and says so: an `n` other than 1 was ignored, so a harness that asked
for three choices got one and nothing told it (a real server answers n). Both kinds, chat and completions."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tokview.sim import SimConfig, start_simulator


@pytest.fixture(scope="module", params=["vllm", "sglang"])
def sim(request: Any) -> Iterator[Any]:
    with start_simulator(SimConfig(kind=request.param)) as running:
        yield running


BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "Hi"}]},
    "/v1/completions": {"prompt": "Hi"},
}


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize("n", [2, 0, -1, 2.0, 1.5, "3", "one", [1]])
def test_an_n_other_than_1_is_a_400_that_says_why(sim: Any, path: str, n: Any) -> None:
    got = httpx.post(sim.url + path, json={"model": sim.cfg.model_name, "max_tokens": 4, "n": n, **BODIES[path]})
    assert got.status_code == 400
    assert "the simulator answers one choice a request" in got.text


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize("n", [1, 1.0, True, "1", None])  # what the servers' request models read as 1
def test_n_of_1_is_served(sim: Any, path: str, n: Any) -> None:
    got = httpx.post(sim.url + path, json={"model": sim.cfg.model_name, "max_tokens": 4, "n": n, **BODIES[path]})
    assert got.status_code == 200 and len(got.json()["choices"]) == 1


@pytest.mark.parametrize("path", [*BODIES, "/generate"])
@pytest.mark.parametrize(("top_p", "status"), [(0, 400), (0.0, 400), (1.5, 400), (-0.1, 400), (1, 200), (0.9, 200)])
def test_a_top_p_outside_0_to_1_is_a_400_as_on_the_real_servers(sim: Any, path: str, top_p: Any, status: int) -> None:
    """vLLM's SamplingParams and SGLang's refuse a `top_p` outside (0, 1]: the simulator took 0, so `--top-p 0` passed
    every test and failed every request on a real server."""
    if path == "/generate":
        if sim.cfg.kind != "sglang":
            pytest.skip("SGLang's native endpoint")
        body: dict[str, Any] = {"text": "Hi", "sampling_params": {"max_new_tokens": 4, "top_p": top_p}}
    else:
        body = {"model": sim.cfg.model_name, "max_tokens": 4, "top_p": top_p, **BODIES[path]}
    got = httpx.post(sim.url + path, json=body)
    assert got.status_code == status, got.text
    if status == 400:
        assert "top_p must be in (0, 1]" in got.text
