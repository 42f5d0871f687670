"""The simulator refuses a `tools` the server's request model refuses, with a 400: it answered them (with tool calls,
for the lists), so a harness tested on it learned nothing of what a real server sends. vLLM's model is the stricter
(`type` must be "function", `parameters` an object); SGLang's takes any `type` string and any `parameters` JSON."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tokview.sim import SimConfig, start_simulator

FUNCTION = {"name": "add", "parameters": {"type": "object", "properties": {}}}


@pytest.fixture(scope="module", params=["vllm", "sglang"])
def sim(request) -> Iterator[Any]:
    with start_simulator(SimConfig(kind=request.param)) as running:
        yield running


@pytest.mark.parametrize(
    "tools, said",
    [
        ({"type": "function", "function": FUNCTION}, "tools must be a list of tools, not dict"),
        ([{"type": "function"}], "tools[0] must be an object with a function object"),
        (["add"], "tools[0] must be an object with a function object"),
        ([{"type": "function", "function": {"parameters": {}}}], "tools[0].function.name must be a string"),
        ([{"type": "function", "function": {"name": 7}}], "tools[0].function.name must be a string"),
    ],
)
def test_a_malformed_tools_array_is_a_400(sim, tools, said) -> None:
    body = {"model": sim.cfg.model_name, "messages": [{"role": "user", "content": "2+3?"}], "tools": tools}
    got = httpx.post(f"{sim.url}/v1/chat/completions", json=body, timeout=30)
    assert got.status_code == 400, got.text
    assert said in got.text


@pytest.mark.parametrize(
    "tool, said",
    [
        ({"type": "function", "function": {**FUNCTION, "parameters": "oops"}}, "parameters must be an object"),
        ({"type": "retrieval", "function": FUNCTION}, "tools[0].type must be 'function'"),
    ],
)
def test_what_only_vllms_model_refuses_is_a_400_on_vllm_alone(sim, tool, said) -> None:
    body = {"model": sim.cfg.model_name, "messages": [{"role": "user", "content": "2+3?"}], "tools": [tool]}
    got = httpx.post(f"{sim.url}/v1/chat/completions", json=body, timeout=30)
    if sim.cfg.kind == "vllm":
        assert got.status_code == 400 and said in got.text, got.text
    else:
        assert got.status_code == 200, got.text


def test_declared_tools_are_still_served(sim) -> None:
    body = {
        "model": sim.cfg.model_name,
        "messages": [{"role": "user", "content": "2+3?"}],
        "tools": [{"type": "function", "function": FUNCTION}, {"function": {"name": "mul"}}],  # type defaults
    }
    assert httpx.post(f"{sim.url}/v1/chat/completions", json=body, timeout=30).status_code == 200
