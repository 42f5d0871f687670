"""One sentence per finding code: why it matters for a drafter's training data.

The finding's own `detail` says what was seen in this sample (ids, positions); this says what the
code means in general, so the findings list reads as an explanation, not a list of codes.
"""

from __future__ import annotations

WHY: dict[str, str] = {
    "think_open_in_prompt": "The template pre-filled the opener; the output starts inside reasoning. Expected for Kimi-K2.5.",
    "think_open_missing": "Reasoning was asked for but no opener exists in prompt or output: segments cannot be told apart.",
    "think_close_missing": "Reasoning never closed: the answer is missing or glued into the reasoning.",
    "think_close_repeated": "More than one closer: the model looped or the ids were concatenated wrongly.",
    "think_open_in_output_after_prefill": "The model emitted an opener although the template had already opened reasoning.",
    "reasoning_with_thinking_off": "Thinking was off, yet the output reasons: the template kwarg never reached the template.",
    "empty_reasoning": "Reasoning was on but the model reasoned for zero tokens.",
    "empty_answer": "No answer after the closer: a drafter would learn to stop right after reasoning.",
    "truncated": "Cut by max tokens (finish_reason length): the sample never ends as a real turn does.",
    "no_stop_token": "The output does not end with the profile's stop id; the trainer sees no end of turn.",
    "output_prefix_overlap": "Output ids begin with the prompt's tail (an SGLang bug): training would double them.",
    "completion_count_mismatch": "The server's completion_tokens does not match the number of output ids.",
    "parser_hidden_ids": "Ids in the raw output that no text field shows (delimiters, stop): they stay in the training ids.",
    "parser_split_mismatch": "The parser split reasoning/answer elsewhere than the delimiter ids do.",
    "reasoning_field_missing": "The server reasoned but returned no reasoning field (e.g. reasoning_content vs reasoning).",
    "literal_think_text": "'<think>' appears as plain text pieces, not as the special id: the template or parser is wrong.",
    "retokenize_drift": "Re-encoding the decoded text gives other ids: never rebuild training ids from text.",
    "prompt_render_mismatch": "The served prompt ids differ from rendering the messages locally with this tokenizer.",
    "empty_output": "The server returned no output ids: nothing to train on, and usually a failed request.",
    "dual_divergence": "The raw and parsed requests generated different ids: the text fields do not describe the training ids.",
    "over_max_length": "Prompt + output is longer than the trainer's maximum length.",
}


def why(code: str) -> str:
    return WHY.get(code, "")
