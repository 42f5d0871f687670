"""A family of findings tests: a tokenizer + profile and the ids of one valid reasoning sample built from them.

Shared by the registry's own tests (test_findings) and the tool-call findings' (test_tool_calls_findings), whose
cases run on each other's families."""

from __future__ import annotations

import dataclasses
from typing import Any

from tokview.core.record import Capture


@dataclasses.dataclass
class Family:
    """A tokenizer + profile and the ids of one valid sample built from them."""

    tok: Any
    profile: Any
    prompt: list[int]
    reasoning: list[int]
    answer: list[int]
    messages: list | None = None
    """The conversation the prompt renders from (None when the prompt was edited after rendering)."""

    @property
    def p(self) -> Any:
        return self.profile

    def output(self, reasoning=None, answer=None, close=True, stop=True) -> list[int]:
        ids = list(self.reasoning if reasoning is None else reasoning)
        if close:
            ids.append(self.p.think_close_id)
        ids += self.answer if answer is None else answer
        if stop:
            ids.append(self.p.stop_ids[0])
        return ids

    def capture(self, **changes: Any) -> Capture:
        out = changes.pop("output_ids") if "output_ids" in changes else self.output()
        base: dict[str, Any] = dict(
            prompt_ids=list(self.prompt),
            output_ids=out,
            finish_reason="stop",
            endpoint="sglang-generate",
            settings={"thinking": True, "max_new_tokens": 256},
            messages=self.messages,
            usage={"prompt_tokens": len(self.prompt), "completion_tokens": len(out)},
        )
        base.update(changes)
        return Capture(**base)
