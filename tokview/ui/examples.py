"""Example captures for the UI's tests, screenshots and render benchmark.

Why real ids: the short example is a Kimi-K2.5 chat exchange as a vLLM server returns it (the
pre-filled `<think>` in the prompt, `</think>` and `<|im_end|>` in the output, both hidden by the
reasoning parser), so every pane and finding shows what it shows on real data. The long example
repeats a paragraph of mixed text (CJK, emoji, tabs, newlines) to any length.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

from tokview.core.kimi_layout import KIMI_ID
from tokview.core.record import Capture

if TYPE_CHECKING:
    from tokview.core.tokenizer import TokenizerAdapter

IM_USER, IM_MIDDLE, IM_ASSISTANT = KIMI_ID["<|im_user|>"], KIMI_ID["<|im_middle|>"], KIMI_ID["<|im_assistant|>"]
THINK_OPEN, THINK_CLOSE, IM_END = KIMI_ID["<think>"], KIMI_ID["</think>"], KIMI_ID["<|im_end|>"]
KIMI_PROMPT_IDS = [
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
KIMI_OUTPUT_IDS = [
    *[256, 44, 260, 262, 264, 266, 268, 270, 46],  # Okay, let me think about this carefully.
    THINK_CLOSE,
    *[272, 275, 277, 279, 45, 281, 33],  # The answer is forty-two!
    IM_END,
]
REASONING = "Okay, let me think about this carefully."
CONTENT = "The answer is forty-two!"

_PARAGRAPH = (
    "Let me check the constraint again.\n\tIf x = 3, then 2x + 1 = 7; 中文也可以 🙂 so the "
    "bound holds.\r\nNext, consider the edge case where n is large:  sum(i for i in range(n)).\n\n"
)


def short_capture() -> Capture:
    """The Kimi exchange 'What is 6 times 7?' as a vLLM chat endpoint returns it."""
    return Capture(
        prompt_ids=list(KIMI_PROMPT_IDS),
        output_ids=list(KIMI_OUTPUT_IDS),
        finish_reason="stop",
        matched_stop=IM_END,
        reasoning=REASONING,
        content=CONTENT,
        reasoning_field="reasoning",
        endpoint="vllm-chat",
        server_kind="vllm",
        server_version="0.17.0",
        model="kimi-k2.5",
        settings={"thinking": True, "temperature": 0.6, "max_new_tokens": 64},
        messages=[{"role": "user", "content": "What is 6 times 7?"}],
    )


@lru_cache(maxsize=4)
def _paragraph_ids(tokenizer: TokenizerAdapter) -> tuple[int, ...]:
    return tuple(tokenizer.encode(_PARAGRAPH))


def long_capture(tokenizer: TokenizerAdapter, n_output: int = 32_000) -> Capture:
    """A capture with `n_output` output ids: long reasoning, `</think>`, a short answer, `<|im_end|>`."""
    para = _paragraph_ids(tokenizer)
    answer = tokenizer.encode(CONTENT)
    n_reasoning = max(0, n_output - len(answer) - 2)
    reasoning_ids = [para[i % len(para)] for i in range(n_reasoning)]
    output = reasoning_ids + [THINK_CLOSE] + answer + [IM_END]
    return Capture(
        prompt_ids=list(KIMI_PROMPT_IDS),
        output_ids=output[:n_output] if n_output >= 2 else output,
        finish_reason="stop",
        matched_stop=IM_END,
        reasoning=tokenizer.decode(reasoning_ids),
        content=CONTENT,
        reasoning_field="reasoning",
        endpoint="vllm-chat",
        server_kind="vllm",
        settings={"thinking": True, "max_new_tokens": n_output},
        output_logprobs=[-0.01 * (i % 50) for i in range(len(output))],
    )
