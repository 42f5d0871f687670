"""How SGLang renders a chat request whose last message is the assistant's (`_handle_last_assistant_message` in its
`serving_chat.py`): with `continue_final_message` the message is taken out, the rest rendered with the generation
prompt, and the ids of its text appended (a prefill); without it the message is sent as the user's. vLLM renders the
first open (`continue_final_message`) and the second as a closed assistant turn, so one request is two prompts.

As the SGLang tokview targets (0.5.23) does; an SGLang from before its PR #16567 (January 2026) rendered a closed last
assistant message as vLLM does. Only a text content is read so; a content given as parts is rendered as it is (SGLang
joins the text parts of a "string"-format template's messages first, which tokview does not tell apart)."""

from __future__ import annotations

from typing import Any


def last_assistant(messages: list[dict[str, Any]], continued: bool) -> tuple[list[dict[str, Any]], str | None]:
    """(the messages SGLang renders, the prefix whose ids it appends or None)."""
    if not messages or messages[-1].get("role") != "assistant" or not isinstance(messages[-1].get("content"), str):
        return messages, None
    text = messages[-1]["content"]
    if continued:
        return messages[:-1], text
    return [*messages[:-1], {"role": "user", "content": text}], None
