"""What both server surfaces share: the simulator's state, text from ids, SSE, fault handling.

A generation handler builds its complete answer first (a JSON body or a list of SSE events) and
then `deliver` sends it — normally, or broken the way the active fault says. That keeps every
fault identical across endpoints and both server kinds.
"""

from __future__ import annotations

import codecs
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Unpack

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from tokview.core.json_value import JsonValue
from tokview.core.profiles import HARMONY, ModelProfile
from tokview.core.served_messages import messages_as_served
from tokview.core.tokenizer import TokenizerError
from tokview.sim import faults, glm_tools, hermes_tools, tools
from tokview.sim.config import SimConfig
from tokview.sim.model import Generation, Sampling, SimModel, request_seed
from tokview.sim.spec import SimDistribution

if TYPE_CHECKING:
    from tokview.core.tokenizer import TokenizerAdapter

DONE = "data: [DONE]\n\n"


@dataclass
class SimStats:
    """Request counts, for tests and the demo (read from other threads; ints only)."""

    requests: Counter[str] = field(default_factory=Counter)
    """Per path."""
    generation: int = 0
    faults: Counter[str] = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.requests.values())


class SimState:
    """The tokenizer, profile, model and counters one simulator instance answers with."""

    def __init__(self, cfg: SimConfig, tokenizer: TokenizerAdapter, profile: ModelProfile) -> None:
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.profile = profile
        self.model = SimModel(tokenizer, profile, output_tokens=cfg.output_tokens, base_seed=cfg.seed)
        self._dist: SimDistribution | None = None
        self.stats = SimStats()
        self.faults = faults.FaultBook(cfg.quirks)
        self.released = threading.Event()
        self._piece_cache: dict[tuple[int, bool], str] = {}

    @property
    def dist(self) -> SimDistribution:
        """The token distribution behind logprobs and scoring (built on first use)."""
        if self._dist is None:
            self._dist = SimDistribution(
                self.tokenizer, [self.profile.think_open_id, self.profile.think_close_id, *self.profile.stop_ids]
            )
        return self._dist

    @property
    def spec_decode(self) -> str | None:
        return getattr(self.cfg, "spec_decode", None)

    # -- text ------------------------------------------------------------------------------
    def piece(self, token_id: int, skip_special: bool) -> str:
        key = (token_id, skip_special)
        text = self._piece_cache.get(key)
        if text is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=skip_special)
            self._piece_cache[key] = text
        return text

    def pieces(self, ids: Sequence[int], skip_special: bool) -> list[str]:
        return [self.piece(i, skip_special) for i in ids]

    def stream_pieces(self, ids: Sequence[int], skip_special: bool) -> list[str]:
        """Each id's text as a server's incremental detokenizer streams it: the bytes of a character split over ids
        are held back until the id that completes it, so the pieces join to the whole text; a character the ids
        never complete is never sent. (Each id decoded alone sent U+FFFD for every part of an emoji or a CJK
        character, and a client joining the deltas had text the server never writes.)"""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        out: list[str] = []
        held = False
        for tid in ids:
            text = self.piece(tid, skip_special)
            if not held and "\ufffd" not in text:
                out.append(text)
                continue
            out.append(decoder.decode(self.tokenizer.piece_bytes(tid) if "\ufffd" in text else text.encode()))
            held = bool(decoder.getstate()[0])
        return out

    def decode(self, ids: Sequence[int], skip_special: bool) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special)

    def thinking(self, template_kwargs: dict[str, Any] | None) -> bool:
        """Whether the request left thinking on (Kimi reads `thinking`, Qwen3 `enable_thinking`).

        A model without think delimiters is served as a real server serves it, without a reasoning
        parser (the answer is `content`), unless the `parser-all-reasoning` quirk says a parser runs."""
        if not self.profile.has_reasoning:
            return bool(self.cfg.quirk("parser-all-reasoning"))
        kwargs = template_kwargs or {}
        key = self.profile.thinking_kwarg
        return not (key and kwargs.get(key) is False)

    def count_quirk(self, name: str) -> int:
        """`tool-calls` / `tool-rounds`: the count given, 1 when absent or a bare flag, 0 for `each`."""
        value = self.cfg.quirk(name)
        if value == "each":
            return 0
        return 1 if value is None or value is True else int(value)

    def generate(self, prompt: list[int], body: dict[str, Any], **sampling: Unpack[Sampling]) -> Generation:
        """The model's answer to `prompt`, calling tools when the prompt declares them (`tokview.sim.tools`);
        a Harmony model's (gpt-oss) Harmony messages (`tokview.sim.harmony`)."""
        if self.profile.format == HARMONY:
            from tokview.sim import harmony

            return harmony.generate(self, prompt, body, **sampling)
        seed = (
            body.get("seed")
            if "sampling_params" not in body
            else (body.get("sampling_params") or {}).get("sampling_seed", body.get("seed"))
        )
        if glm_tools.is_glm(self):  # GLM's <tool_call> layout, not Kimi's section
            planned = glm_tools.plan_calls(self, prompt, request_seed(prompt, seed, self.cfg.seed), body)
            calls = glm_tools.calls_ids(self.tokenizer, planned, closed=not self.cfg.quirk("unclosed-section"))
            return self.model.generate(
                prompt, seed=seed, tool_section=calls or None, tool_stop=glm_tools.OBSERVATION, **sampling
            )
        if hermes_tools.is_hermes(self):  # Qwen3's <tool_call> JSON spans
            planned = hermes_tools.plan_calls(self, prompt, request_seed(prompt, seed, self.cfg.seed), body)
            closed, xml = not self.cfg.quirk("unclosed-section"), hermes_tools.is_xml(self)
            calls = hermes_tools.calls_ids(self.tokenizer, planned, closed=closed, xml=xml)
            return self.model.generate(prompt, seed=seed, tool_section=calls or None, **sampling)
        choice, named = tools.tool_choice(body)
        planned = tools.plan_calls(
            self.tokenizer,
            prompt,
            request_seed(prompt, seed, self.cfg.seed),
            calls=self.count_quirk("tool-calls"),
            rounds=self.count_quirk("tool-rounds"),
            forced=choice in ("required", "named"),
            named=named,
            restart_ids=bool(self.cfg.quirk("call-ids-restart")),
        )
        section = tools.section_ids(self.tokenizer, planned, closed=not self.cfg.quirk("unclosed-section"))
        return self.model.generate(
            prompt,
            seed=seed,
            tool_section=section if planned else None,
            section_in_reasoning=bool(self.cfg.quirk("section-in-reasoning")),
            **sampling,
        )

    def render(
        self,
        messages: list[dict[str, Any]],
        template_kwargs: dict[str, Any] | None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
    ) -> list[int]:
        messages = messages_as_served(messages, self.cfg.kind, self.tokenizer.chat_template)  # parts, nulls
        try:
            return self.tokenizer.render(
                messages,
                add_generation_prompt=add_generation_prompt and not continue_final_message,
                template_kwargs=template_kwargs or {},
                continue_final_message=continue_final_message,
            )
        except TokenizerError as exc:  # a template that cannot render these messages: the request's fault (400)
            raise ValueError(str(exc)) from None


def now() -> int:
    return int(time.time())


def new_id(prefix: str = "") -> str:
    return prefix + uuid.uuid4().hex[: 16 if prefix else 32]


def sse(payload: JsonValue) -> str:
    return "data: " + json.dumps(payload, ensure_ascii=False, separators=(",", ":")) + "\n\n"


async def read_json(request: Request, kind: str) -> dict[str, Any] | JSONResponse:
    """The request body as a dict, or the error response a real server would give."""
    raw = await request.body()
    try:
        body = json.loads(raw or b"null")
        if (
            b"\\u" in raw
        ):  # an escape may spell a lone surrogate, which no tokenizer takes (it raised a TypeError: a 500)
            json.dumps(body, ensure_ascii=False).encode()
    except (ValueError, UnicodeError) as exc:  # UnicodeEncodeError: a lone surrogate
        return faults.error_response(kind, 400, f"invalid JSON body: {exc}"[:300], "BadRequest")
    if not isinstance(body, dict):
        return faults.error_response(kind, 400, "the request body must be a JSON object", "BadRequest")
    return body


async def admit(state: SimState, request: Request, streaming: bool) -> tuple[str | None, Response | None]:
    """Count a generation request and pick its fault; returns (fault, early response or None)."""
    state.stats.generation += 1
    fault = state.faults.take(streaming)
    if fault:
        state.stats.faults[fault] += 1
    latency = state.cfg.total_latency_s
    if latency > 0 and not await faults.wait_unless_released(latency, state.released):
        return fault, faults.error_response(state.cfg.kind, 503, "the simulator is stopping", "ServiceUnavailable")
    if fault == "stall":
        await faults.stall(request, state.released)
        return fault, faults.error_response(state.cfg.kind, 503, "stalled request released", "ServiceUnavailable")
    early = faults.http_fault_response(state.cfg.kind, fault) if fault else None
    return fault, early


def deliver_json(payload: JsonValue, fault: str | None) -> Response:
    body = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
    if fault == "drop-connection":
        return faults.DroppedResponse(body)
    if fault == "malformed-json":
        return Response(faults.malformed(body), media_type="application/json")
    return Response(body, media_type="application/json")


def deliver_stream(events: Iterable[str], fault: str | None, error_chunk: JsonValue = None) -> Response:
    """Send SSE events (each already `data: …\\n\\n`), broken as the fault says."""
    events = list(events)
    if fault == "drop-connection":
        return faults.DroppedResponse("".join(events).encode(), media_type="text/event-stream")
    if fault == "malformed-json":
        events[0] = faults.malformed(events[0].encode()).decode(errors="ignore").rstrip("\n") + "\n\n"
    if fault == "stream-error":
        keep = max(1, min(3, len(events) - 2))
        events = events[:keep] + [sse(error_chunk), DONE]

    async def gen() -> AsyncIterator[str]:
        for event in events:
            yield event

    return StreamingResponse(gen(), media_type="text/event-stream")


def with_stop(sampling: Sampling, stop: tuple[str, ...], params: dict[str, Any]) -> Sampling:
    """`sampling` with the stop strings its generation is cut at, if any, and how its text is decoded for them
    (`params`: where the request keeps `skip_special_tokens`)."""
    if stop:
        sampling["stop"], sampling["skip_special"] = stop, bool(params.get("skip_special_tokens", True))
    return sampling


def stop_drop(gen: Generation, include: bool) -> int:
    """How many characters a stop string's cut takes off the end of the output's text (`include`: the request keeps
    the stop string: vLLM's `include_stop_str_in_output`, SGLang's `no_stop_trim`)."""
    return 0 if gen.text_drop is None else gen.text_drop[1 if include else 0]


def cut_texts(texts: Sequence[str], drop: int) -> list[str]:
    """`texts` (in order: they join to the output's text, e.g. its reasoning then its answer, or its stream's pieces)
    without their last `drop` characters."""
    out = list(texts)
    k = len(out) - 1
    while drop > 0 and k >= 0:
        take = min(drop, len(out[k]))
        out[k] = out[k][: len(out[k]) - take]
        drop -= take
        k -= 1
    return out


def context_room(state: SimState, prompt: list[int], wanted: int | None) -> int | Response:
    """The output tokens to generate by SGLang's rule (TokenizerManager's request check): a prompt that fills the
    context is a 400, and so is a `wanted` that reaches it with the prompt (`>=`: one id short of the limit is the
    most one can ask for); without one, all the room. (vLLM's rule, refusing max_tokens past the limit, is in
    `vllm._sampling`.)"""
    limit = state.cfg.max_model_len
    if len(prompt) >= limit:
        return faults.error_response(
            "sglang",
            400,
            f"The input ({len(prompt)} tokens) is longer than the model's context length ({limit} tokens).",
            "BadRequest",
        )
    if wanted is not None and wanted + len(prompt) >= limit:
        return faults.error_response(
            "sglang",
            400,
            f"Requested token count exceeds the model's maximum context length of {limit} tokens. You requested "
            f"a total of {wanted + len(prompt)} tokens: {len(prompt)} tokens from the input messages and {wanted} "
            "tokens for the completion. Please reduce the number of tokens in the input messages or the completion "
            "to fit within the limit.",
            "BadRequest",
        )
    return limit - len(prompt) if wanted is None else wanted
