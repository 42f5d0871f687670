"""The loopback simulator: a real HTTP server that speaks SGLang's and vLLM's token-id surfaces.

`with start_simulator(SimConfig(kind="vllm")) as sim: ...` runs it on 127.0.0.1 in a background
thread; `tokview sim` runs it in the foreground. It backs the demo and the fast test tier, and its
quirk and fault flags reproduce what real deployments do to capture code. With the Kimi-layout
tokenizer its model calls the tools a request declares and both servers answer through their
kimi_k2 tool parser as recorded (`tokview.sim.tools`, `tokview.sim.tool_shapes`).
"""

from tokview.sim.config import FAULTS, QUIRKS, SimConfig, SimConfigError, parse_quirk
from tokview.sim.model import Generation, SimModel
from tokview.sim.server import Simulator, launch, start_simulator

__all__ = [
    "FAULTS",
    "QUIRKS",
    "Generation",
    "SimConfig",
    "SimConfigError",
    "SimModel",
    "Simulator",
    "launch",
    "parse_quirk",
    "start_simulator",
]
