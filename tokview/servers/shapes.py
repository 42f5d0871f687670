"""The checks every answer goes through before a field of it is trusted, whatever the endpoint.

A field with a shape no server sends (ids that are not integers, a text that is not a string, a
finish reason that is a number) is a malformed answer: `Retryable`, retried like garbage, never a
TypeError deep in the analysis.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeGuard

from tokview.core import logprobs as lp
from tokview.core.json_value import is_int_list
from tokview.core.prefix_memo import pack_int32
from tokview.servers.errors import CaptureFailed, Retryable
from tokview.servers.request import normalize_finish
from tokview.untrusted_text import has_lone_surrogate, lone_surrogates

if TYPE_CHECKING:
    from tokview.servers.info import ServerInfo

MAX_ID = lp.MAX_TOKEN_ID
"""No tokenizer has a larger id, and the store keeps ids as 32-bit integers: a larger one is malformed."""


def ids_of(value: object, where: str, what: str = "output ids") -> list[int]:
    """`value` when it is a list of token ids: ints from 0 to MAX_ID (no tokenizer has a negative id, and an
    id of 2**41 is not an id but a broken answer, said as one instead of an OverflowError deep inside)."""
    if isinstance(value, list) and _plain_ids(value):
        return value
    if not _all_ints(value):
        raise Retryable(f"malformed response from {where}: {what} are not a list of integers")
    if value and min(value) < 0:
        raise Retryable(f"malformed response from {where}: {what} hold a negative id ({min(value)})")
    if value and max(value) > MAX_ID:
        raise Retryable(
            f"malformed response from {where}: {what} hold id {max(value)}, beyond any vocabulary (ids stop at "
            f"{MAX_ID})"
        )
    return value


def _plain_ids(value: list[object]) -> bool:
    """Whether every element is an int from 0 to MAX_ID, in two C passes (~0.75 ms for an agent's 45,000-id prompt,
    where the type, min and max passes below took 2.2): its JSON holds only digits, commas and brackets (no minus
    sign, no float, no `true`), and it packs as signed 32-bit integers (MAX_ID is the largest). False sends the
    list to the checks below, which say what is wrong with it."""
    return is_int_list(value, negative=False) and pack_int32(value) is not None


def _all_ints(value: object) -> TypeGuard[list[int]]:
    """A list of ints (bools are not ids); what JSON gives is checked in one C-level pass."""
    if isinstance(value, list) and set(map(type, value)) <= {int}:
        return True
    return isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value)


def optional_ids_of(value: object, where: str, what: str) -> list[int] | None:
    return None if value is None else ids_of(value, where, what)


def object_of(value: object, where: str, what: str) -> dict[str, Any]:
    """`value` as a dict (None → {}); anything else is a malformed answer, retried like garbage."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise Retryable(f"malformed response from {where}: {what} is not an object ({type(value).__name__})")
    return value


def text_of(value: object, where: str, what: str) -> str | None:
    """`value` when it is a string a model could have generated: not another type, and no lone surrogate
    (a JSON `\\ud800` escape decodes to one; no tokenizer decodes to it and no store or file holds it)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise Retryable(f"malformed response from {where}: {what} is not a string ({type(value).__name__})")
    if value and has_lone_surrogate(value):
        raise Retryable(f"malformed response from {where}: {what} holds a lone surrogate ({lone_surrogates(value)})")
    return value


def finish_of(value: object, where: str) -> tuple[str | None, int | str | None]:
    """normalize_finish, refusing shapes no server sends (a number, a list)."""
    if value is not None and not isinstance(value, (str, dict)):
        raise Retryable(f"malformed response from {where}: finish_reason is a {type(value).__name__}")
    finish, matched = normalize_finish(value)
    for name, text in (("finish_reason", finish), ("matched stop", matched)):
        if isinstance(text, str) and has_lone_surrogate(text):  # no server's reason or stop string holds one
            raise Retryable(f"malformed response from {where}: {name} holds a lone surrogate ({lone_surrogates(text)})")
    return finish, matched


def logprob_fields(found: lp.TokenLogprobs | None) -> dict[str, Any]:
    """Capture fields for the sampled logprobs and top-K alternatives (all None when none came back)."""
    if found is None:
        return {"output_logprobs": None, "output_top_ids": None, "output_top_logprobs": None}
    return {
        "output_logprobs": found.logprobs,
        "output_top_ids": found.top_ids,
        "output_top_logprobs": found.top_logprobs,
    }


def first_choice(answer: object) -> dict[str, Any]:
    """`answer["choices"][0]` when the answer has that shape, else {} (a probe never trusts garbage)."""
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    return {}


def check_prompt_echo(where: str, sent: list[int], echoed: object = None, count: object = None) -> None:
    """Refuse an answer whose server says it read another prompt than the ids sent: the ids it echoed
    (`prompt_token_ids`) or the count it reports (SGLang's `meta_info.prompt_tokens`). A gateway in between that
    rewrote the prompt made the output a continuation of ids the sample would not hold, and the raw path stored the
    sent ids as the prompt with no finding. Asking again gets the same answer: CaptureFailed, not Retryable."""
    if type(echoed) is list and echoed != sent:
        at = next((k for k, (a, b) in enumerate(zip(sent, echoed)) if a != b), min(len(sent), len(echoed)))
        raise CaptureFailed(
            f"{where} echoed other prompt ids than were sent (first at position {at} of {len(sent)}; "
            f"{len(echoed)} echoed): something changed the prompt on its way, and nothing was recorded"
        )
    if type(count) is int and count != len(sent):
        raise CaptureFailed(
            f"{where} says it read {count} prompt ids where {len(sent)} were sent: something changed the prompt on "
            "its way, and nothing was recorded"
        )


def int_list(value: object) -> list[int] | None:
    """`value` when it is a list of ints (bools are not ids), else None: for probes, which never raise."""
    return value if _all_ints(value) else None


def too_long_to_score(where: str, info: ServerInfo, ids: list[int], url: str) -> None:
    """A sample that fills the server's context cannot be scored there: vLLM and SGLang both refuse an
    input of max_model_len ids or more (vLLM also needs room for the one token it generates). Said in
    one line instead of the server's HTTP 400."""
    limit = info.max_model_len
    if limit and len(ids) >= limit:
        raise CaptureFailed(
            f"{where}: prompt + output are {len(ids)} ids, and the server scores only inputs shorter than its "
            f"max_model_len {limit}: serve the target with a larger context length to score this sample",
            url=url,
        )
