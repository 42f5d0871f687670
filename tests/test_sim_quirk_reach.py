"""`tokview sim --quirk`: a value on a switch quirk, and a quirk that never acts on the simulator's server kind or
tokenizer, are refused in one line (they were taken silently, and a run looked like a test of a failure that never
happened)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from tokview.core.profiles import get_profile
from tokview.sim import SimConfig, SimConfigError, parse_quirk, start_simulator
from tokview.sim.config import FAULTS, HARMONY_QUIRKS, KINDS, QUIRKS

TOKVIEW = [sys.executable, "-c", "import sys; from tokview.cli import main; sys.exit(main())"]
SWITCHES = [
    "vllm-pre-0.16",
    "no-id-fields",
    "parser-all-reasoning",
    "no-reasoning-parser",
    "incremental-streaming",
    "section-in-reasoning",
    "unclosed-section",
    "call-ids-restart",
    "uuid-call-ids",
    "parser-drops-call",
    "no-tool-parser",
    "stream-misses-ids",
    *(name for name in HARMONY_QUIRKS if name != "server-date"),
]
"""The quirks the simulator only reads as on or off (`if cfg.quirk(NAME)`)."""
ONE_SERVER = {
    "vllm-pre-0.16": "vllm",  # vllm.py: the reasoning field's name
    "uuid-call-ids": "vllm",  # SGLang's kimi_k2 parser always rebuilds functions.NAME:IDX
    "no-tool-parser": "vllm",  # vLLM's HTTP 400 for tools without --enable-auto-tool-choice
    "prompt-prefix-bug": "sglang",  # sglang.py: /generate's output_ids
    "sglang-chat-ids": "sglang",  # sglang_chat.py
    "incremental-streaming": "sglang",  # sglang.py: /generate's stream
}
"""The quirks that act on one server kind only."""
VALUE_FOR = {  # a value each quirk that takes one accepts
    "prompt-prefix-bug": 3,
    "sglang-chat-ids": "token_ids",
    "latency": 0.01,
    "tool-calls": 2,
    "tool-rounds": "each",
    "server-date": "2025-08-05",
    **dict.fromkeys(FAULTS, 1),
}


def _value(name: str) -> Any:
    return VALUE_FOR.get(name, True)


def test_every_quirk_says_what_it_takes_and_where_it_acts():
    from tokview.sim.config import NEVER, QUIRK_REACH

    assert set(QUIRK_REACH) == set(QUIRKS)
    assert sorted(name for name, reach in QUIRK_REACH.items() if reach.value is None) == sorted(SWITCHES)
    assert set(VALUE_FOR) == set(QUIRKS) - set(SWITCHES)
    only = {name: [k for k in KINDS if QUIRK_REACH[name].tokenizers(k) != NEVER] for name in QUIRKS}
    assert {name: kinds[0] for name, kinds in only.items() if len(kinds) == 1} == ONE_SERVER
    assert all(only.values())


@pytest.mark.parametrize("name", SWITCHES)
def test_a_switch_quirk_refuses_a_value(name):
    kind = ONE_SERVER.get(name, "vllm")
    for spec in (f"{name}=3", f"{name}=0.5", f"{name}=yes please"):
        with pytest.raises(SimConfigError, match=f"^quirk {name} is a switch and takes no value"):
            SimConfig(kind=kind, quirks=dict([parse_quirk(spec)]))
    for spec, on in ((name, True), (f"{name}=on", True), (f"{name}=off", False)):
        assert SimConfig(kind=kind, quirks=dict([parse_quirk(spec)])).quirk(name) is on


@pytest.mark.parametrize(("name", "kind"), [(name, k) for name, own in ONE_SERVER.items() for k in KINDS if k != own])
def test_a_quirk_of_the_other_server_is_refused(name, kind):
    other = ONE_SERVER[name]
    with pytest.raises(SimConfigError, match=f"^--quirk {name} acts only on an? \\S+ simulator \\(--kind {other}\\)"):
        SimConfig(kind=kind, quirks={name: _value(name)})
    SimConfig(kind=other, quirks={name: _value(name)})  # where it acts it is taken
    if name in SWITCHES or name == "prompt-prefix-bug":  # switched off it does nothing anywhere: not refused
        SimConfig(kind=kind, quirks={name: False})


class NoKimiIds:
    """A tokenizer without Kimi's ids, as gpt-oss's, DeepSeek's or a plain model's is to these checks (the gpt-oss
    one is built from ranks not every machine has; its profile alone decides)."""

    def token_to_id(self, text: str) -> int | None:
        return None


@pytest.fixture(scope="module")
def tokenizers(kimi_tok, qwen_tok, coder_tok, glm_tok_dir) -> dict[str, Any]:
    from tokview.core.tokenizer import load_tokenizer

    return {
        "kimi": kimi_tok,
        "qwen": qwen_tok,
        "coder": coder_tok,
        "glm": load_tokenizer(glm_tok_dir),
        "-": NoKimiIds(),
    }


TOOLS_WRITTEN = "a tokenizer whose tool calls the simulated model writes"
REFUSED = [  # (kind, profile, tokenizer, quirk, what the refusal says it needs, what it says is served)
    ("vllm", "kimi-k2.5", "kimi", "harmony-json-garbage", "a gpt-oss tokenizer", "think tags, kimi_k2 tool calls"),
    ("sglang", "kimi-k2.5", "kimi", "harmony-no-final", "a gpt-oss tokenizer", "think tags, kimi_k2 tool calls"),
    ("vllm", "qwen3", "qwen", "server-date", "a gpt-oss tokenizer", "think tags, hermes tool calls"),
    ("vllm", "gpt-oss", "-", "tool-calls", TOOLS_WRITTEN, "Harmony"),
    ("sglang", "gpt-oss", "-", "unclosed-section", TOOLS_WRITTEN, "Harmony"),
    ("vllm", "gpt-oss", "-", "parser-drops-call", TOOLS_WRITTEN, "Harmony"),
    ("vllm", "gpt-oss", "-", "call-ids-restart", "a Kimi tokenizer", "Harmony"),
    ("vllm", "gpt-oss", "-", "no-reasoning-parser", "a tokenizer with think tags", "Harmony"),
    ("sglang", "gpt-oss", "-", "no-reasoning-parser", "a tokenizer with think tags", "Harmony"),
    ("sglang", "gpt-oss", "-", "stream-misses-ids", f"{TOOLS_WRITTEN} .* on an SGLang simulator", "Harmony"),
    ("vllm", "glm-4.7", "glm", "section-in-reasoning", "a Kimi tokenizer with think tags", "think tags, glm47"),
    ("sglang", "qwen3", "qwen", "call-ids-restart", "a Kimi tokenizer", "think tags, hermes tool calls"),
    ("vllm", "qwen3-coder", "coder", "uuid-call-ids", "a Kimi tokenizer", "no think tags, qwen3_coder tool calls"),
    ("vllm", "qwen3-coder", "coder", "no-reasoning-parser", "a tokenizer with think tags", "no think tags, qwen3_"),
    ("vllm", "deepseek-r1", "-", "tool-rounds", TOOLS_WRITTEN, "think tags, no tool calls"),
    ("sglang", "plain", "-", "tool-calls", TOOLS_WRITTEN, "no think tags, no tool calls"),
    ("vllm", "plain", "kimi", "section-in-reasoning", "a Kimi tokenizer with think tags", "no think tags, kimi_k2"),
    ("sglang", "plain", "kimi", "no-reasoning-parser", "a tokenizer with think tags", "no think tags, kimi_k2"),
]


@pytest.mark.parametrize(("kind", "profile", "tok", "name", "needs", "served"), REFUSED)
def test_a_quirk_that_never_acts_on_the_tokenizer_is_refused(tokenizers, kind, profile, tok, name, needs, served):
    cfg = SimConfig(kind=kind, quirks={name: _value(name)})
    said = f"^--quirk {name} acts only on {needs}.*; this simulator serves {profile}'s \\({served}"
    with pytest.raises(SimConfigError, match=said):
        cfg.check_tokenizer(get_profile(profile), tokenizers[tok])
    if name in SWITCHES:  # switched off it does nothing anywhere: not refused
        SimConfig(kind=kind, quirks={name: False}).check_tokenizer(get_profile(profile), tokenizers[tok])


TAKEN = [  # combinations the simulator's code acts on (and tests use)
    ("vllm", "gpt-oss", "-", ["parser-all-reasoning", "server-date", "stream-misses-ids", "no-id-fields", "latency"]),
    ("sglang", "gpt-oss", "-", ["harmony-json-garbage", "sglang-chat-ids", "prompt-prefix-bug", "stall"]),
    ("vllm", "kimi-k2.5", "kimi", ["section-in-reasoning", "call-ids-restart", "uuid-call-ids", "tool-calls"]),
    ("sglang", "kimi-k2.5", "kimi", ["stream-misses-ids", "unclosed-section", "parser-drops-call", "tool-rounds"]),
    ("sglang", "kimi-k2.5", "kimi", ["no-reasoning-parser", "incremental-streaming", "section-in-reasoning"]),
    ("sglang", "glm-4.7", "glm", ["stream-misses-ids", "unclosed-section", "parser-drops-call", "tool-calls"]),
    ("vllm", "qwen3", "qwen", ["unclosed-section", "parser-drops-call", "stream-misses-ids", "no-reasoning-parser"]),
    ("sglang", "qwen3-coder", "coder", ["tool-calls", "tool-rounds", "unclosed-section"]),
    ("vllm", "plain", "-", ["parser-all-reasoning", "no-id-fields", "http-503", "vllm-pre-0.16"]),
    ("vllm", "plain", "kimi", ["tool-calls", "call-ids-restart", "uuid-call-ids", "stream-misses-ids"]),
]


@pytest.mark.parametrize(("kind", "profile", "tok", "names"), TAKEN)
def test_a_quirk_that_acts_on_the_tokenizer_is_taken(tokenizers, kind, profile, tok, names):
    for name in names:
        SimConfig(kind=kind, quirks={name: _value(name)}).check_tokenizer(get_profile(profile), tokenizers[tok])


def test_the_simulator_refuses_a_harmony_quirk_on_its_kimi_tokenizer_before_it_listens():
    with pytest.raises(SimConfigError, match="harmony-json-garbage acts only on a gpt-oss tokenizer"):
        with start_simulator(SimConfig(kind="vllm", quirks={"harmony-json-garbage": True})):
            pass  # served: the refusal never came
    with start_simulator(SimConfig(kind="sglang", quirks={"stream-misses-ids": True, "tool-calls": 2})) as sim:
        assert sim.profile.tool_calls is not None and sim.profile.tool_calls.parser == "kimi_k2"


def _sim_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`tokview sim` with these flags on a free port (one that starts is stopped by the timeout: a failure)."""
    return subprocess.run([*TOKVIEW, "sim", "--port", "0", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--quirk", "no-id-fields=3"], "quirk no-id-fields is a switch and takes no value"),
        (
            ["--quirk", "prompt-prefix-bug"],
            "--quirk prompt-prefix-bug acts only on an SGLang simulator (--kind sglang)",
        ),
        (["--kind", "sglang", "--quirk", "uuid-call-ids"], "--quirk uuid-call-ids acts only on a vLLM simulator"),
        (
            ["--quirk", "harmony-json-garbage"],
            "--quirk harmony-json-garbage acts only on a gpt-oss tokenizer (Harmony); "
            "this simulator serves kimi-k2.5's (think tags, kimi_k2 tool calls)",
        ),
    ],
)
def test_cli_refuses_in_one_line_with_the_usage_exit_code(args, said):
    proc = _sim_cli(*args)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert said in proc.stderr
    assert "SIMULATOR" not in proc.stdout
