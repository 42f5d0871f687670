"""A scripted tool-using agent on the `openai` client: a real harness loop.

It does what an agent harness does: sends the conversation with its tools, runs every tool call the model
makes on this machine (the tools really compute: arithmetic, word counts, a weather table with a computed
temperature), appends the results as `tool` turns (the served reasoning sent back as `reasoning_content`, so
the template keeps it inside the tool loop), and repeats until the model answers in text. The transcript it
returns is everything the agent saw and did, and nothing a server makes new per request (response ids,
timestamps, usage), so the same task run directly and through `tokview proxy` must give the same transcript.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


def _add(a: float, b: float) -> float:
    return a + b


def _multiply(a: float, b: float) -> float:
    return a * b


def _square(n: int) -> int:
    return n * n


def _word_count(text: str) -> int:
    return len(str(text).split())


def _get_weather(city: str) -> str:
    """A local "weather service": the temperature is computed from the city's name, the sky from its length."""
    name = str(city)
    degrees = sum(name.encode()) % 35
    sky = ("sunny", "cloudy", "rainy")[len(name) % 3]
    return f"{sky}, {degrees} degrees"


def _fn(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": list(properties)},
        },
    }


NUMBER = {"type": "integer"}
TOOLS: dict[str, tuple[dict[str, Any], Callable[..., Any]]] = {
    "add": (_fn("add", "Add two integers", {"a": NUMBER, "b": NUMBER}), _add),
    "multiply": (_fn("multiply", "Multiply two integers", {"a": NUMBER, "b": NUMBER}), _multiply),
    "square": (_fn("square", "Square an integer", {"n": NUMBER}), _square),
    "word_count": (_fn("word_count", "Count the words of a text", {"text": {"type": "string"}}), _word_count),
    "get_weather": (_fn("get_weather", "Get the weather for a city", {"city": {"type": "string"}}), _get_weather),
}


@dataclass(frozen=True)
class Task:
    """One job for the agent: a question, the tools it may use, and whether it streams."""

    name: str
    question: str
    tools: tuple[str, ...]
    stream: bool = False


@dataclass
class Transcript:
    """What the agent saw and did, round by round (the comparison key of direct vs proxied runs)."""

    task: str
    rounds: list[dict[str, Any]] = field(default_factory=list)
    requests: int = 0

    @property
    def answer(self) -> str | None:
        return self.rounds[-1]["content"] if self.rounds else None

    @property
    def tool_calls(self) -> int:
        return sum(len(r["tool_calls"]) for r in self.rounds)

    @property
    def parallel_rounds(self) -> int:
        return sum(len(r["tool_calls"]) > 1 for r in self.rounds)


def run_tool(name: str, arguments: str) -> str:
    """Run one call locally; a bad call becomes an error result the model sees, as a harness would send it."""
    if name not in TOOLS:
        return f"error: no tool named {name}"
    try:
        args = json.loads(arguments or "{}")
        return json.dumps(TOOLS[name][1](**args))
    except (ValueError, TypeError) as exc:
        return f"error: {exc}"


def _extra(obj: Any, key: str) -> Any:
    """A field the openai models do not declare (vLLM's `reasoning`, SGLang's `reasoning_content`)."""
    value = getattr(obj, key, None)
    if value is None and getattr(obj, "model_extra", None):
        value = obj.model_extra.get(key)
    return value


def _reasoning(obj: Any) -> str | None:
    return _extra(obj, "reasoning") or _extra(obj, "reasoning_content")


def _ask(client: Any, model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]], stream: bool) -> dict:
    """One chat request; the reply as {content, reasoning, tool_calls, finish_reason}, streamed or not."""
    kwargs: dict[str, Any] = {"model": model, "messages": messages, "temperature": 0, "max_tokens": 300}
    if tools:
        kwargs["tools"] = tools
    if not stream:
        choice = client.chat.completions.create(**kwargs).choices[0]
        calls = [
            {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
            for c in choice.message.tool_calls or []
        ]
        return {
            "content": choice.message.content or None,
            "reasoning": _reasoning(choice.message),
            "tool_calls": calls,
            "finish_reason": choice.finish_reason,
        }
    content, reasoning, finish = [], [], None
    by_index: dict[int, dict[str, Any]] = {}
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        for choice in chunk.choices:
            delta = choice.delta
            content.append(delta.content or "")
            reasoning.append(_reasoning(delta) or "")
            for tc in delta.tool_calls or []:
                call = by_index.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
                call["id"] = tc.id or call["id"]
                if tc.function is not None:
                    call["name"] = tc.function.name or call["name"]
                    call["arguments"] += tc.function.arguments or ""
            finish = choice.finish_reason or finish
    return {
        "content": "".join(content) or None,
        "reasoning": "".join(reasoning) or None,
        "tool_calls": [by_index[k] for k in sorted(by_index)],
        "finish_reason": finish,
    }


def run_agent(client: Any, model: str, task: Task, max_rounds: int = 8) -> Transcript:
    """Run `task` to its text answer (or `max_rounds` model turns), executing every tool call locally."""
    tools = [TOOLS[name][0] for name in task.tools]
    messages: list[dict[str, Any]] = [{"role": "user", "content": task.question}]
    transcript = Transcript(task.name)
    for _ in range(max_rounds):
        reply = _ask(client, model, messages, tools, task.stream)
        transcript.requests += 1
        results = [run_tool(c["name"], c["arguments"]) for c in reply["tool_calls"]]
        transcript.rounds.append({**reply, "results": results})
        if not reply["tool_calls"]:
            break
        assistant: dict[str, Any] = {
            "role": "assistant",
            "content": reply["content"],
            "tool_calls": [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for c in reply["tool_calls"]
            ],
        }
        if reply["reasoning"]:
            assistant["reasoning_content"] = reply["reasoning"]
        messages.append(assistant)
        messages += [
            {"role": "tool", "tool_call_id": c["id"], "content": result}
            for c, result in zip(reply["tool_calls"], results, strict=True)
        ]
    return transcript


def run_tasks(base_url: str, model: str, tasks: list[Task], api_key: str = "none") -> list[Transcript]:
    """Every task in order with one `openai.OpenAI` client on `base_url` (…/v1); no retries, so each is one request."""
    import openai

    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120)
    try:
        return [run_agent(client, model, task) for task in tasks]
    finally:
        client.close()
