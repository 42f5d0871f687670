"""The simulator's deterministic "model": reasoning, closer, answer, stop — seeded per request.

It writes real sentences encoded with the real tokenizer, so decoding its ids and encoding the
text again gives the same ids, and every piece of tokview (segments, parsers, alignment) sees the
same structure a reasoning model produces. Where it starts depends on the prompt, as with a real
model: a prompt that ends inside reasoning (Kimi-K2.5's pre-filled `<think>`) gets reasoning
first; a prompt whose reasoning is closed (thinking off) gets only an answer; otherwise (Qwen3
thinking on) the model opens reasoning itself.
"""

from __future__ import annotations

import codecs
import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

from tokview.core.profiles import BUILTIN_PROFILES, ModelProfile

if TYPE_CHECKING:
    from tokview.core.tokenizer import TokenizerAdapter

REASONING_SENTENCES = (
    "Okay, let me think about this carefully.",
    "First I should read the question again.",
    "The user wants a short and clear answer.",
    "Let me check the numbers step by step.",
    "Six groups of seven make forty two.",
    "I could also count it the other way around.",
    "That gives the same result, so it seems right.",
    "Wait, I should make sure nothing is missing.",
    "The question does not ask for anything else.",
    "So the reasoning is done and I can answer.",
    "Maybe an example would make it easier to follow.",
    "Hmm, the simplest way is usually the best one.",
)
ANSWER_SENTENCES = (
    "The answer is forty two!",
    "Here is a short answer.",
    "It works out to forty two in the end.",
    "I hope this helps.",
    "Let me know if you want more detail.",
    "In short, the result is correct.",
)

QWEN_THINK_OPEN_ID = BUILTIN_PROFILES["qwen3"].think_open_id
"""Qwen's `<think>` id: a profile of a Qwen model has it whatever its name."""


TOOL_REASONING = ("Okay, let me think.", "Okay, let me think about this.", "Let me think about this carefully.")
"""Short on purpose: a tool-calling turn fits the recordings' `max_tokens: 64` with its call."""
TOOL_LEAD = "I will call a tool"
"""What the model writes as content before its section when thinking is off and it opens the section
where its reasoning would be (the recordings' model B)."""


@dataclass(frozen=True)
class Generation:
    """One generated output and why it ended."""

    output_ids: list[int]
    finish_reason: str
    """`stop` or `length`."""
    matched: int | str | None
    """The stop id (or the request's stop string) that ended it (None for `length`)."""
    eos_stop: bool
    """True when the model's own stop id ended it (vLLM reports stop_reason null then)."""
    text_drop: tuple[int, int] | None = None
    """A stop string ended it (`matched` is the string): how many characters to drop from the end of the output ids'
    text (decoded as the request asked) without the stop string, and with it (`include_stop_str_in_output`,
    SGLang's `no_stop_trim`). The ids keep the id that completed it, as both servers' do."""


class Sampling(TypedDict, total=False):
    """The sampling settings a request gives its generation (each server reads them from its own fields)."""

    max_tokens: int | None
    stop_token_ids: Sequence[int]
    ignore_eos: bool
    stop: Sequence[str]
    """The request's stop strings (only where the simulator cuts the text at one: no tools, no Harmony)."""
    skip_special: bool
    """How the text a stop string is looked for in is decoded (`skip_special_tokens`)."""


def request_seed(prompt_ids: Sequence[int], seed: object, base_seed: int = 0) -> int:
    """The request's `seed` if it sent one (a number, or text of one), else a stable hash of the prompt ids."""
    if isinstance(seed, (int, float, str)) and not isinstance(seed, bool):
        try:
            return int(seed) + base_seed
        except (TypeError, ValueError):
            pass
    digest = hashlib.sha256(",".join(map(str, prompt_ids)).encode()).digest()
    return int.from_bytes(digest[:8], "big") + base_seed


class SimModel:
    """Produces output ids for prompt ids, for one tokenizer and profile."""

    def __init__(
        self,
        tokenizer: TokenizerAdapter,
        profile: ModelProfile,
        *,
        output_tokens: int | None = None,
        base_seed: int = 0,
    ) -> None:
        self.tokenizer = tokenizer
        self.profile = profile
        self.output_tokens = output_tokens
        self.base_seed = base_seed
        self.open_id = profile.think_open_id
        self.close_id = profile.think_close_id
        self.stop_id = profile.stop_ids[0]
        # Qwen3 writes "<think>\n…\n</think>\n\n…": a Qwen model by its name or its think id (a profile file
        # `base = "qwen3"` names itself: served without the newlines, its every SpecForge row was inexact)
        self.newlines = profile.name.startswith("qwen") or profile.think_open_id == QWEN_THINK_OPEN_ID
        self._encode = lru_cache(maxsize=4096)(self._encode_uncached)

    def _encode_uncached(self, text: str) -> tuple[int, ...]:
        return tuple(self.tokenizer.encode(text))

    # -- where the model starts ------------------------------------------------------------
    def mode(self, prompt_ids: Sequence[int]) -> str:
        """`in-reasoning`, `closed` (thinking off) or `open` (the model opens reasoning itself)."""
        for pos in range(len(prompt_ids) - 1, -1, -1):
            tid = prompt_ids[pos]
            if tid == self.open_id:
                return "in-reasoning"
            if tid == self.close_id:
                return "closed" if len(prompt_ids) - pos <= 3 else "open"
        return "open"

    def opens_with_newline(self, prompt_ids: Sequence[int], mode: str) -> bool:
        """Whether the model writes the newline after `<think>` itself (Qwen3): not when the template pre-filled it
        (Qwen3-2507 Thinking's prompt ends `<think>\n`: a second one is no output such a model writes)."""
        return self.newlines and not (mode == "in-reasoning" and bool(prompt_ids) and prompt_ids[-1] != self.open_id)

    # -- text ------------------------------------------------------------------------------
    def _sentences_ids(
        self,
        rng: random.Random,
        bank: tuple[str, ...],
        *,
        n_sentences: int,
        target: int | None,
        prefix: str,
        suffix: str,
    ) -> list[int]:
        """Encode a few seeded sentences; with `target`, exactly that many ids."""
        if target is None:
            chosen = [bank[rng.randrange(len(bank))] for _ in range(n_sentences)]
            return list(self._encode(prefix + " ".join(chosen) + suffix))
        ids: list[int] = list(self._encode(prefix + bank[rng.randrange(len(bank))]))
        while len(ids) < target:
            ids.extend(self._encode(" " + bank[rng.randrange(len(bank))]))
        if suffix:
            ids.extend(self._encode(suffix))
        return ids[:target] if len(ids) > target else ids

    def natural_output(self, prompt_ids: Sequence[int], seed: int) -> list[int]:
        """The full output the model wants to write, ending with the stop id."""
        rng = random.Random(seed)
        mode = self.mode(prompt_ids)
        total = self.output_tokens
        nl = self.newlines
        if mode == "closed":
            answer = self._sentences_ids(
                rng,
                ANSWER_SENTENCES,
                n_sentences=rng.randint(1, 2),
                target=None if total is None else total - 1,
                prefix="",
                suffix="",
            )
            return answer + [self.stop_id]
        head = [self.open_id] if mode == "open" and self.open_id is not None else []
        answer_target = reasoning_target = None
        if total is not None:
            answer_target = max(1, min(64, total // 8))
            reasoning_target = max(1, total - answer_target - 2 - len(head))
        reasoning = self._sentences_ids(
            rng,
            REASONING_SENTENCES,
            n_sentences=rng.randint(2, 4),
            target=reasoning_target,
            prefix="\n" if self.opens_with_newline(prompt_ids, mode) else "",
            suffix="\n" if nl else "",
        )
        answer = self._sentences_ids(
            rng,
            ANSWER_SENTENCES,
            n_sentences=rng.randint(1, 2),
            target=answer_target,
            prefix="\n\n" if nl else "",
            suffix="",
        )
        closer = [self.close_id] if self.close_id is not None else []
        return head + reasoning + closer + answer + [self.stop_id]

    def tool_output(
        self, prompt_ids: Sequence[int], seed: int, section: list[int], in_reasoning: bool, stop_id: int | None = None
    ) -> list[int]:
        """A tool-calling turn (tools README §2): reasoning, `</think>`, the section, the stop id.

        `in_reasoning` (Kimi opening the section inside its reasoning, model B of the recordings): no
        `</think>`; with thinking off the model then writes a sentence of content before the section. `stop_id`:
        the id the family ends a tool-calling turn with, when not its usual stop (GLM: `<|observation|>`)."""
        stop = self.stop_id if stop_id is None else stop_id
        rng = random.Random(seed)
        mode = self.mode(prompt_ids)
        if mode == "closed":
            lead = list(self._encode(TOOL_LEAD)) if in_reasoning else []
            return lead + section + [stop]
        head = [self.open_id] if mode == "open" and self.open_id is not None else []
        sentence = TOOL_REASONING[rng.randrange(len(TOOL_REASONING))]
        first = "\n" if self.opens_with_newline(prompt_ids, mode) else ""
        reasoning = list(self._encode(f"{first}{sentence}\n" if self.newlines else sentence))
        closer = [] if in_reasoning or self.close_id is None else [self.close_id]
        gap = list(self._encode("\n\n")) if self.newlines and closer else []  # Qwen3: "</think>\n\n<tool_call>"
        return head + reasoning + closer + gap + section + [stop]

    def generate(
        self,
        prompt_ids: Sequence[int],
        *,
        seed: object = None,
        max_tokens: int | None = None,
        stop_token_ids: Sequence[int] = (),
        ignore_eos: bool = False,
        stop: Sequence[str] = (),
        skip_special: bool = True,
        tool_section: list[int] | None = None,
        section_in_reasoning: bool = False,
        tool_stop: int | None = None,
    ) -> Generation:
        """Generate like a server would: stop at the first stop id or stop string, or cut at `max_tokens`.

        With `tool_section` (the calls `tokview.sim.tools` planned for this prompt) the turn calls tools."""
        gen = self._generate_ids(
            prompt_ids,
            s=request_seed(prompt_ids, seed, self.base_seed),
            max_tokens=max_tokens,
            stop_token_ids=stop_token_ids,
            ignore_eos=ignore_eos,
            tool_section=tool_section,
            section_in_reasoning=section_in_reasoning,
            tool_stop=tool_stop,
        )
        return self._cut_at_stop_string(gen, stop, skip_special) if stop else gen

    def _cut_at_stop_string(self, gen: Generation, stop: Sequence[str], skip_special: bool) -> Generation:
        """`gen` ended earlier, where its text first holds one of `stop` (vLLM's check: after each id, each stop
        string in the request's order, in the text that id added and the stop string's length before it); a stop id
        at that id ends it first."""
        ids, text = gen.output_ids, ""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        longest = max(len(s) for s in stop)
        for pos, tid in enumerate(ids):
            if gen.matched is not None and pos == len(ids) - 1:
                break  # the id that ended it by id: a stop id is checked before the stop strings
            if skip_special and self.tokenizer.is_special(tid):
                continue
            added = decoder.decode(self.tokenizer.piece_bytes(tid))
            text += added
            for s in stop:
                at = text.find(s, max(0, len(text) - len(added) - longest))
                if at >= 0:
                    whole = self.tokenizer.decode(ids[: pos + 1], skip_special_tokens=skip_special)
                    start = whole.find(s)  # where the whole decode has it (the first: no earlier id completed it)
                    start = at if start < 0 else start
                    return Generation(
                        ids[: pos + 1],
                        "stop",
                        s,
                        eos_stop=False,
                        text_drop=(len(whole) - start, len(whole) - start - len(s)),
                    )
        return gen

    def _generate_ids(
        self,
        prompt_ids: Sequence[int],
        *,
        s: int,
        max_tokens: int | None,
        stop_token_ids: Sequence[int],
        ignore_eos: bool,
        tool_section: list[int] | None,
        section_in_reasoning: bool,
        tool_stop: int | None,
    ) -> Generation:
        if tool_section:
            out = self.tool_output(prompt_ids, s, tool_section, section_in_reasoning, tool_stop)
        else:
            out = self.natural_output(prompt_ids, s)
        if ignore_eos and max_tokens:
            while len(out) < max_tokens:  # keep writing answers, as a model ignoring EOS does
                s += 1
                out = out + self.natural_output(list(prompt_ids) + out, s)[-8:]
        stops = set(int(i) for i in stop_token_ids or ())
        if not ignore_eos:
            stops.add(self.stop_id)
            stops.update([tool_stop] if tool_stop is not None and tool_section else [])
        for pos, tid in enumerate(out):
            if tid in stops and (max_tokens is None or pos < max_tokens):
                return Generation(out[: pos + 1], "stop", tid, eos_stop=tid in (self.stop_id, tool_stop))
        if max_tokens is not None and len(out) > max_tokens:
            return Generation(out[:max_tokens], "length", None, eos_stop=False)
        return Generation(out, "length" if ignore_eos else "stop", None, eos_stop=False)


class Quirks(Protocol):
    """What those models read of the simulator's configuration (`config.SimConfig` is one)."""

    seed: int
    kind: str
    """The server simulated: "vllm" or "sglang"."""

    def quirk(self, name: str) -> Any: ...


class ModelState(Protocol):
    """What a model other than the think-tag one (Harmony's, GLM's tool calls) reads of the simulator's state;
    `common.SimState` is one. A protocol, so those modules, which `common` imports, need nothing of `common`
    back, not even for their types."""

    @property
    def cfg(self) -> Quirks: ...

    @property
    def tokenizer(self) -> TokenizerAdapter: ...

    @property
    def profile(self) -> ModelProfile: ...

    @property
    def model(self) -> SimModel: ...

    def count_quirk(self, name: str) -> int: ...

    def decode(self, ids: Sequence[int], skip_special: bool) -> str: ...
