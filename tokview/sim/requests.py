"""The request bodies the simulator takes, read and validated in one place for both server surfaces.

SGLang `/generate` (`input_ids` or `text`, one or a batch), the chat bodies of both servers (messages,
`max_tokens`, `reasoning_effort`), vLLM completions (a token-id or text prompt) and `/tokenize`. Each
reader raises ValueError with the words the real server would use; the handler turns it into that
server's 400 answer.
"""

from __future__ import annotations

from typing import Any

from tokview.core.json_value import as_pydantic_bool
from tokview.core.tokenizer import TokenizerAdapter


def positive_int(value: object, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return value


def valid_ids(tokenizer: TokenizerAdapter, ids: object) -> list[int]:
    """`ids` when it is a non-empty list of ids of this vocabulary."""
    vocab = tokenizer.vocab_size
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and 0 <= i < vocab for i in ids):
        raise ValueError(f"input_ids must be a non-empty list of token ids in [0, {vocab})")
    return ids


def generate_prompts(tokenizer: TokenizerAdapter, body: dict[str, Any]) -> tuple[list[list[int]], bool]:
    """SGLang /generate: (the prompts' ids, whether the body was a batch)."""
    if body.get("input_ids") is not None and body.get("text") is not None:
        raise ValueError("Either text or input_ids should be provided, not both")
    ids = body.get("input_ids")
    if ids is not None:
        if isinstance(ids, list) and ids and isinstance(ids[0], list):
            return [valid_ids(tokenizer, p) for p in ids], True
        return [valid_ids(tokenizer, ids)], False
    text = body.get("text")
    if isinstance(text, str):
        return [tokenizer.encode(text)], False
    if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
        return [tokenizer.encode(t) for t in text], True
    raise ValueError("Either text or input_ids should be provided")


def chat_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    return messages


def chat_max_tokens(body: dict[str, Any], default: int | None = None) -> int | None:
    """`max_completion_tokens`, else `max_tokens`, else the endpoint's default."""
    return positive_int(body.get("max_completion_tokens", body.get("max_tokens", default)), "max_tokens")


def sglang_template_kwargs(body: dict[str, Any]) -> dict[str, Any]:
    """SGLang's normalize_reasoning_inputs: `reasoning_effort` sets both thinking toggles unless given."""
    kwargs = dict(body.get("chat_template_kwargs") or {})
    effort = body.get("reasoning_effort")
    if effort is not None:
        kwargs.setdefault("thinking", effort != "none")
        kwargs.setdefault("enable_thinking", effort != "none")
    return kwargs


def vllm_template_kwargs(body: dict[str, Any]) -> dict[str, Any]:
    """vLLM sets `enable_thinking` only from `reasoning_effort` (Kimi's template ignores it)."""
    kwargs = dict(body.get("chat_template_kwargs") or {})
    effort = body.get("reasoning_effort")
    if effort is not None and "enable_thinking" not in kwargs:
        kwargs["enable_thinking"] = effort != "none"
    return kwargs


def completion_prompt(tokenizer: TokenizerAdapter, prompt: object) -> list[int]:
    """vLLM completions: a text or one token-id prompt (a one-element list of either is unwrapped)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (list, str)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tokenizer.encode_prompt(prompt)
    vocab = tokenizer.vocab_size
    if isinstance(prompt, list) and prompt and all(isinstance(i, int) and 0 <= i < vocab for i in prompt):
        return prompt
    raise ValueError(f"prompt must be a string or one non-empty list of token ids in [0, {vocab})")


def tokenize_text(tokenizer: TokenizerAdapter, body: dict[str, Any]) -> list[int]:
    """`/tokenize` with a text `prompt` (both servers): the tokenizer's added ids unless told not to."""
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise ValueError("give prompt (a string) or messages")
    return tokenizer.encode_prompt(prompt, add_special_tokens=bool(body.get("add_special_tokens", True)))


def stop_strings(value: object) -> tuple[str, ...]:
    """A request's `stop`: a string or a list of strings (both servers' type); empty strings match nothing."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError("stop must be a string or a list of strings")
    return tuple(v for v in value if v)


def include_usage(body: dict[str, Any]) -> bool:
    """`stream_options.include_usage` as pydantic reads it ("false" is false); ValueError (a 400) when
    `stream_options` is not an object or a flag in it is not a boolean, as both servers' request models refuse
    them (the simulator answered a 500 and logged a traceback)."""
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise ValueError("stream_options: Input should be a valid dictionary or object")
    flags = {}
    for key in ("include_usage", "continuous_usage_stats"):
        value = options.get(key)
        flags[key] = False if value is None else as_pydantic_bool(value)
        if flags[key] is None:
            raise ValueError(f"stream_options.{key}: Input should be a valid boolean")
    return bool(flags["include_usage"])


def top_p_in_range(params: dict[str, Any]) -> None:
    """ValueError (a 400) for a `top_p` outside (0, 1], as both servers' sampling params refuse it (vLLM: "top_p must
    be in (0, 1]"): the simulator took 0, so a run with `--top-p 0` passed every test and failed on a real server."""
    top_p = params.get("top_p")
    if top_p is None or isinstance(top_p, bool) or not isinstance(top_p, (int, float)):
        return
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}.")


def one_choice(body: dict[str, Any]) -> None:
    """The simulator answers one choice a request: ValueError (a 400) for an `n` other than 1, which a real server
    answers with n choices. Before, `n` was ignored: a harness that asked for three got one, and nothing said so.
    What the servers' request models (pydantic, lax) read as 1 is 1: `1.0`, `true`, `"1"`."""
    top_p_in_range(body)
    n = body.get("n")
    if n is None or _lax_int(n) == 1:
        return
    shown = repr(n)[:20]
    raise ValueError(f"n must be 1 here: the simulator answers one choice a request (n={shown} asked)")


def declared_tools(body: dict[str, Any], kind: str) -> None:
    """ValueError (a 400) for a `tools` the server's request model refuses: not a list, an entry that is not an
    object, a `function` without a string `name`; on vLLM also a `type` other than "function" and `parameters` that
    are not an object (SGLang's `Tool.type` is any string and `Function.parameters` any JSON). The simulator answered
    them (with tool calls, for the lists), so a harness tested on it learned nothing of the 400 a real server sends."""
    tools = body.get("tools")
    if tools is None:
        return
    if not isinstance(tools, list):
        raise ValueError(f"tools must be a list of tools, not {type(tools).__name__}")
    for n, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict):
            raise ValueError(f"tools[{n}] must be an object with a function object")
        if not isinstance(function.get("name"), str):
            raise ValueError(f"tools[{n}].function.name must be a string")
        if kind != "vllm":
            continue
        if tool.get("type", "function") != "function":
            raise ValueError(f"tools[{n}].type must be 'function'")
        if function.get("parameters") is not None and not isinstance(function["parameters"], dict):
            raise ValueError(f"tools[{n}].function.parameters must be an object")


def _lax_int(value: object) -> int | None:
    """`value` as pydantic's lax int reads it (a bool, an integral float, a string of digits), else None."""
    if isinstance(value, int):  # a bool too
        return int(value)
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return None
    return None
