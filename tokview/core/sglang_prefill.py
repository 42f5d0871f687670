"""How SGLang renders a chat request whose last message is the assistant's (`_handle_last_assistant_message` in its
`serving_chat.py`): with `continue_final_message` the message is taken out, the rest rendered with the generation
prompt, and the ids of its text appended (a prefill); without it the message is sent as the user's. vLLM renders the
first open (`continue_final_message`) and the second as a closed assistant turn, so one request is two prompts."""

from __future__ import annotations

from typing import Any


def last_assistant(messages: list[dict[str, Any]], continued: bool) -> tuple[list[dict[str, Any]], str | None]:
    """(the messages SGLang renders, the prefix whose ids it appends or None). Only a text content is handled, as
    SGLang does (a list of parts is rendered as it is)."""
    if not messages or messages[-1].get("role") != "assistant" or not isinstance(messages[-1].get("content"), str):
        return messages, None
    text = messages[-1]["content"]
    if continued:
        return messages[:-1], text
    return [*messages[:-1], {"role": "user", "content": text}], None
