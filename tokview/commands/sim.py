"""`tokview sim`: run the loopback SGLang/vLLM simulator in the foreground until Ctrl-C.

Useful for trying tokview without a GPU, and for reproducing a server's quirk or fault on demand
(`--quirk http-503=2`, `--quirk vllm-pre-0.16`).
"""

from __future__ import annotations

import argparse
import math
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from tokview.sim.config import SimConfig
    from tokview.sim.server import Simulator

DEFAULT_PORTS = {"vllm": 8000, "sglang": 30000}


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from tokview.sim.config import FAULTS, QUIRKS

    width = max(map(len, QUIRKS)) + 2
    epilog = (
        "quirks (--quirk NAME or NAME=VALUE):\n"
        + "\n".join(f"  {name:<{width}}{text}" for name, text in QUIRKS.items() if name not in FAULTS)
        + "\n\nfaults (--quirk NAME=N fails the first N generation requests, one fault per request in "
        "this order;\n--quirk NAME alone fails every one):\n"
        + "\n".join(f"  {name:<{width}}{text}" for name, text in FAULTS.items())
    )
    p = subparsers.add_parser(
        "sim",
        help="run a loopback SGLang/vLLM simulator (for demos and tests)",
        description="Serve the SGLang or vLLM HTTP surface on 127.0.0.1 from a deterministic fake model "
        "(reasoning -> </think> -> answer -> stop) over a real tokenizer. It is a SIMULATOR: "
        "it says so in /get_model_info, /v1/models and its banner.",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--kind", choices=("vllm", "sglang"), default="vllm", help="which server to imitate (default vllm)")
    p.add_argument(
        "--port",
        type=int,
        default=None,
        help="port on 127.0.0.1 (default 8000 for vllm, 30000 for sglang; 0 = any free port)",
    )
    p.add_argument(
        "--tokenizer",
        metavar="DIR",
        type=Path,
        default=None,
        help="tokenizer directory (default: the built-in Kimi-layout tokenizer; a Qwen3 one also works)",
    )
    p.add_argument(
        "--profile",
        metavar="NAME|FILE",
        default=None,
        help="serve the tokenizer as this profile (a built-in name like glm-4.7 or kimi-k2.6, or a .toml file) "
        "instead of the one detected from it; its think ids must be the tokenizer's",
    )
    p.add_argument(
        "--non-special-think",
        action="store_true",
        help="Kimi-layout tokenizer with a non-special </think> (SGLang's text parser can then split)",
    )
    p.add_argument(
        "--quirk",
        action="append",
        default=[],
        metavar="NAME[=VALUE]",
        help="reproduce a quirk or fault (repeatable; see the lists below)",
    )
    p.add_argument("--latency", type=float, default=0.0, metavar="SECONDS", help="delay before each generation")
    p.add_argument("--output-tokens", type=int, default=None, metavar="N", help="force every output to N ids")
    p.add_argument("--seed", type=int, default=0, help="base seed mixed into every request's seed")
    p.add_argument("--model-name", default="tokview-sim", help="served model name (default tokview-sim)")
    p.add_argument(
        "--spec-decode",
        default=None,
        metavar="MODE",
        help="report speculative-decoding metrics like vllm-summary, vllm-detailed, sglang-0.5.10, "
        "sglang-0.5.11 or sglang-0.5.12",
    )
    p.add_argument("--version", dest="server_version", default=None, help="version string to report")
    p.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        metavar="N",
        help="context length to report (/v1/models, /tokenize, /get_server_info) and enforce (default 32768)",
    )
    p.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help="require this key (Authorization: Bearer KEY) as a server started with --api-key does",
    )
    p.set_defaults(run=run)


def build_config(args: argparse.Namespace) -> SimConfig:
    from tokview.sim.config import SimConfig, SimConfigError, parse_quirk

    quirks = dict(parse_quirk(spec) for spec in args.quirk)
    port = DEFAULT_PORTS[args.kind] if args.port is None else args.port
    if not 0 <= port < 65536:
        raise SimConfigError(f"--port must be between 0 and 65535, got {port}")
    if not math.isfinite(args.latency) or args.latency < 0:
        raise SimConfigError("--latency must be a finite number >= 0")
    if args.max_model_len is not None and args.max_model_len < 2:
        raise SimConfigError("--max-model-len must be at least 2")
    if args.tokenizer is not None:
        from tokview.core.tokenizer_folder import existing_folder

        existing_folder(args.tokenizer)
    return SimConfig(
        kind=args.kind,
        tokenizer_dir=args.tokenizer,
        think_special=not args.non_special_think,
        quirks=quirks,
        latency_s=args.latency,
        output_tokens=args.output_tokens,
        seed=args.seed,
        model_name=args.model_name,
        version=args.server_version,
        port=port,
        spec_decode=args.spec_decode,
        profile=args.profile,
        api_key=args.api_key,
        **({"max_model_len": args.max_model_len} if args.max_model_len else {}),
    )


def banner(sim: Simulator) -> str:
    cfg = sim.cfg
    server = "vLLM" if cfg.kind == "vllm" else "SGLang"
    if cfg.tokenizer_dir is None:
        tok = "Kimi-layout tokenizer, </think> " + ("special" if cfg.think_special else "non-special")
    else:
        tok = f"tokenizer {cfg.tokenizer_dir}"
    lines = [
        f"tokview sim — SIMULATOR of {server} {cfg.server_version} at {sim.url} "
        f"({tok}; profile {sim.profile.name}; model name {cfg.model_name!r})"
    ]
    if cfg.quirks:
        lines.append("quirks: " + ", ".join(k if v is True else f"{k}={v}" for k, v in cfg.quirks.items()))
    lines.append("This is not a real model. Press Ctrl-C to stop.")
    return "\n".join(lines)


def launch_or_explain(cfg: SimConfig, launch: Callable[[SimConfig], Simulator]) -> Simulator:
    """The simulator never runs a tokenizer folder's own code, so a loader hint to pass
    --trust-remote-code (a flag `sim` does not take) is replaced by what does work."""
    from tokview.core.tokenizer import TokenizerError
    from tokview.errors import UserError

    try:
        return launch(cfg)
    except TokenizerError:
        folder = cfg.tokenizer_dir
        code = sorted(p.name for p in Path(folder).expanduser().glob("tokenization_*.py")) if folder else []
        if not code:
            raise
        raise UserError(
            f"cannot load the tokenizer in {folder} without running its own code ({', '.join(code)}), "
            f"and `tokview sim` never runs a folder's code: give a folder whose tokenizer.json loads on "
            f"its own, or leave out --tokenizer for the built-in Kimi-layout tokenizer"
        ) from None


def run(args: argparse.Namespace) -> int:
    from tokview.sim import launch

    cfg = build_config(args)
    sim = launch_or_explain(cfg, launch)
    print(banner(sim), flush=True)

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        threading.Event().wait()  # until Ctrl-C / SIGTERM
    except KeyboardInterrupt:
        pass
    finally:
        sim.stop()
    return 0
