"""Shared by the live tool tests: the tool model's facts (from the info file its builder wrote), its tokenizer,
direct requests to the real server, and what a stored sample must match."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import orjson

from live.make_tiny_kimi import MODEL_INFO, TOOL_RESULT, WEATHER_TOOL, tool_turns
from tokview.core.profiles import get_profile
from tokview.core.tokenizer import load_tokenizer
from tokview.core.tool_calls import parse_tool_calls

MODEL = "tiny-kimi-tools"
BENIGN = {"think_open_in_prompt", "parser_hidden_ids"}
"""The only findings a clean answer of this model may carry (both info: the template's `<think>`, and the
markers the parsers hide by design)."""


@dataclass(frozen=True)
class ToolModel:
    url: str
    dir: str
    info: dict[str, Any]

    @property
    def call_ids(self) -> list[int]:
        return self.info["call_output_ids"]

    @property
    def answer_ids(self) -> list[int]:
        return self.info["answer_output_ids"]

    @property
    def texts(self) -> dict[str, str]:
        return self.info["texts"]

    @property
    def served_call(self) -> dict[str, str]:
        return {"id": self.texts["call_id"], "name": "get_weather", "arguments": self.texts["call_arguments"]}


def tool_model(server: tuple[str, str]) -> ToolModel:
    url, model_dir = server
    return ToolModel(url, model_dir, json.loads((Path(model_dir) / MODEL_INFO).read_text(encoding="utf-8")))


@cache
def tokenizer(model_dir: str) -> Any:
    return load_tokenizer(model_dir)


def profile() -> Any:
    return get_profile("kimi-k2.5")


def ask(url: str, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """A direct greedy chat request with the weather tool and the ids asked for."""
    body = {"model": MODEL, "messages": messages, "tools": [WEATHER_TOOL], "temperature": 0, "max_tokens": 64}
    return httpx.post(url + "/v1/chat/completions", json={**body, "return_token_ids": True, **extra}, timeout=60).json()


def served_ids(answer: dict[str, Any]) -> tuple[list[int], list[int]]:
    return answer["prompt_token_ids"], answer["choices"][0]["token_ids"]


def served_calls(message: dict[str, Any]) -> list[dict[str, str]]:
    return [
        {"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
        for c in message.get("tool_calls") or []
    ]


def calls_on_ids(model_dir: str, output_ids: list[int]) -> list[dict[str, str | None]]:
    """The calls tokview reads off the ids (core.tool_calls), in the server's {id, name, arguments} shape."""
    parsed = parse_tool_calls(output_ids, profile().tool_calls, tokenizer(model_dir))
    assert not parsed.problems, parsed.problems
    return [{"id": c.call_id, "name": c.name, "arguments": c.arguments} for c in parsed.calls]


def tool_turn_ids(model_dir: str, call_id: str, result: str = TOOL_RESULT) -> list[int]:
    """The real template's tool-result turn plus the generation prompt, as ids (recordings/tools README §6)."""
    text = f"<|im_system|>tool<|im_middle|>## Return of {call_id}\n{result}<|im_end|>"
    return tokenizer(model_dir).encode_prompt(
        text + "<|im_assistant|>assistant<|im_middle|><think>", add_special_tokens=False
    )


def body_of(raw_request: Any) -> dict[str, Any]:
    raw = orjson.loads(raw_request) if isinstance(raw_request, (str, bytes)) else raw_request
    return raw["body"]


__all__ = ["BENIGN", "MODEL", "ToolModel", "tool_turns"]
