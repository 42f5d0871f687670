"""The two ways servers split reasoning from the answer, reproduced.

SGLang's kimi_k2 detector works on *decoded text*: a special `</think>` that decoding skipped is
invisible to it, so everything lands in `reasoning_content` (recordings sgl_chat.json vs
sgl_chat_ns.json). vLLM 0.32's kimi_k2 parser finds the delimiter *ids*, so it splits correctly
either way (vllm_chat_kimi_k2.json). Both leave the delimiter ids in the id fields.
"""

from __future__ import annotations

from collections.abc import Sequence

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def sglang_text_split(text: str, thinking: bool) -> tuple[str | None, str]:
    """SGLang `BaseReasoningFormatDetector.detect_and_parse`: (reasoning or None, content)."""
    if not (thinking or THINK_OPEN in text):
        return None, text
    processed = text.replace(THINK_OPEN, "").strip()
    if THINK_CLOSE not in processed:
        return processed or None, ""
    reasoning, normal = processed.split(THINK_CLOSE, 1)
    return reasoning or None, normal.strip()


def sglang_stream_regions(pieces: Sequence[str], thinking: bool) -> list[str]:
    """Per token: `reasoning`, `content` or `hidden` (a delimiter string the parser swallows)."""
    regions: list[str] = []
    state = "reasoning" if thinking else "content"
    for piece in pieces:
        if piece == THINK_OPEN and not any(r != "hidden" for r in regions):
            state = "reasoning"
            regions.append("hidden")
        elif piece == THINK_CLOSE and state == "reasoning":
            state = "content"
            regions.append("hidden")
        else:
            regions.append(state)
    return regions


def vllm_id_regions(
    output_ids: Sequence[int], open_id: int | None, close_id: int | None, thinking: bool, all_reasoning: bool = False
) -> list[str]:
    """Per id: `reasoning`, `content` or `delim`, split on the delimiter ids (vLLM kimi_k2)."""
    if not thinking:
        return ["content"] * len(output_ids)
    regions: list[str] = []
    state = "reasoning"
    for k, tid in enumerate(output_ids):
        if k == 0 and tid == open_id:
            regions.append("delim")
        elif tid == close_id and state == "reasoning" and not all_reasoning:
            regions.append("delim")
            state = "content"
        elif tid == close_id and all_reasoning:
            regions.append("delim")
        else:
            regions.append(state)
    return regions
