"""Per-token log-probabilities with ids: what the servers return, folded into parallel arrays.

Why ids and not token text: two tokens can print the same (vLLM's OpenAI-style logprobs carry
only strings), so top-K alternatives are kept as ids (`return_tokens_as_token_ids` on vLLM makes
its strings `token_id:N`; SGLang's `[logprob, id, text]` triples carry ids already). A sample keeps
three arrays aligned to its output positions: the sampled token's logprob, and the top-K ids and
logprobs. Scoring a stored sample against a target fills the same shape on the target side.

The off-policy rule: the target's mean negative log-likelihood (NLL, nats per output token). A
sample drawn from the target at temperature 1 has an expected mean NLL equal to the target's
per-token entropy on its own text, which for chat models is usually well under 1 nat; text another
model or pipeline wrote usually scores 2 nats and more. DEFAULT_OFF_POLICY_NLL = 2.0 (perplexity
about 7.4) sits between: a rule of thumb to flag samples worth a look, not a measured constant —
set it per model (`tokview score --off-policy-nll X`) after looking at your run's NLL distribution.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tokview.errors import TokviewError

DEFAULT_OFF_POLICY_NLL = 2.0
FLOOR = -9999.0
"""What a -inf logprob is stored as (vLLM's own convention), so JSON stays valid. A NaN or +inf is no
probability at all: `MalformedLogprob`, never stored (as -9999 it read "mean NLL 9999", off-policy, and
a resumed `score` skipped the sample as scored)."""
MAX_TOKEN_ID = 2**31 - 1
"""No tokenizer has a larger id, and the store keeps ids as 32-bit integers: a larger one is a broken answer
(an alternative named `token_id:2199023255552` once made its whole part unlandable)."""
DEFAULT_LOW_PROB = 0.01
"""A token the target gives less than 1% is "unlikely"; the score reports the share of such tokens."""


class LogprobShapeError(TokviewError):
    """The server's logprob fields do not have the documented shape (or do not match the ids)."""

    title = "logprobs"


class MalformedLogprob(LogprobShapeError):
    """A logprob that is no log-probability (NaN, +inf): the answer is broken, not the sample."""


@dataclass
class TokenLogprobs:
    """Per output position: the token's logprob and, when asked, the top-K alternatives."""

    logprobs: list[float | None]
    top_ids: list[list[int]] | None = None
    top_logprobs: list[list[float]] | None = None

    def extend(self, other: TokenLogprobs) -> None:
        self.logprobs.extend(other.logprobs)
        if other.top_ids is not None:
            self.top_ids = (self.top_ids or []) + other.top_ids
            self.top_logprobs = (self.top_logprobs or []) + (other.top_logprobs or [])


POSITIVE_SLACK = 1e-4
"""How far above 0 a logprob may round (a sure token's log-softmax in float32) and still be a log-probability:
`tokview score` refuses an answer holding a larger one (`above_zero`)."""


def _lp(value: object) -> float | None:
    """A served logprob as stored: -inf and anything below FLOOR (-1e39 does not fit the store's FLOAT) as FLOOR;
    MalformedLogprob for NaN and +inf. A value above 0 is kept as served (a capture's side data, never its ids: a
    server that returns logits there loses no sample); `tokview score` refuses it (`above_zero`)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise LogprobShapeError(f"a logprob is not a number ({type(value).__name__})")
    if math.isfinite(value):
        return max(float(value), FLOOR)
    if value == -math.inf:
        return FLOOR
    raise MalformedLogprob(f"a logprob is {'NaN' if math.isnan(value) else value}, not a log-probability")


def sampled_only(values: object, output_ids: Sequence[int]) -> TokenLogprobs | None:
    """The sampled tokens' logprobs alone, one per output id (None when they are not a list of that length): what is
    kept of alternatives named by their text, which two tokens can share (a client that did not ask for
    `return_tokens_as_token_ids`)."""
    if not isinstance(values, list) or len(values) != len(output_ids):
        return None
    return TokenLogprobs([_lp(v) for v in values])


def above_zero(logprobs: Sequence[float | None]) -> float | None:
    """The first logprob above 0 (beyond float rounding), None when there is none: no probability is above 1, and a
    score of such values read as a mean NLL below 0."""
    return next((v for v in logprobs if v is not None and v > POSITIVE_SLACK), None)


def _alt_lp(value: object) -> float:
    """An alternative's logprob: a missing one is FLOOR. Not `_lp(v) or FLOOR`: a sure token's 0.0 is
    falsy, and it became "impossible" (-9999) in every top-K list where the model was certain."""
    lp = _lp(value)
    return FLOOR if lp is None else lp


def token_id_of(token: object) -> int:
    """vLLM's `token_id:123` (return_tokens_as_token_ids) → 123."""
    if isinstance(token, str) and token.startswith("token_id:"):
        try:
            return checked_id(int(token[len("token_id:") :]))
        except ValueError:
            pass
    raise LogprobShapeError(
        f"a logprob token is not `token_id:N` ({str(token)[:40]!r}): send return_tokens_as_token_ids"
    )


def checked_id(value: int) -> int:
    """`value` when a tokenizer could have it (0 to MAX_TOKEN_ID); else MalformedLogprob."""
    if 0 <= value <= MAX_TOKEN_ID:
        return value
    raise MalformedLogprob(f"a logprob names id {value}, which no vocabulary has (ids are 0 to {MAX_TOKEN_ID})")


def _one_per_position(tops: object, n: int, what: str) -> list[Any] | None:
    """A list of alternatives per position, or None when the server sent none. A list of another length was
    skipped: a run with `--logprobs K` then stored no alternatives at all, and nothing said so."""
    if tops is None:
        return None
    if not isinstance(tops, list) or len(tops) != n:
        had = f"{len(tops)} entries" if isinstance(tops, list) else f"a {type(tops).__name__}"
        raise LogprobShapeError(f"{what} has {had} for {n} token ids")
    return tops


# -- SGLang: [logprob, id, text|null] triples --------------------------------------------------
def _triple(entry: object) -> tuple[float | None, int]:
    if not isinstance(entry, (list, tuple)) or len(entry) < 2 or not isinstance(entry[1], int):
        raise LogprobShapeError("a logprob entry is not [logprob, id, text]")
    return _lp(entry[0]), checked_id(entry[1])


def _top_of(entries: object) -> tuple[list[int], list[float]]:
    if entries is None:
        return [], []
    if not isinstance(entries, list):
        raise LogprobShapeError("a top-logprobs entry is not a list")
    pairs = [_triple(e) for e in entries]
    return [i for _, i in pairs], [lp if lp is not None else FLOOR for lp, _ in pairs]


def from_sglang_output(
    meta: dict[str, Any], output_ids: Sequence[int], prompt_ids: Sequence[int] = ()
) -> TokenLogprobs | None:
    """`meta_info.output_token_logprobs` (+ `output_top_logprobs`) for these output ids.

    SGLang's prompt-prefix bug (#17240) puts the prompt's last ids before the generated ones in `output_ids`, not in
    the logprobs: the entries then name the ids after that echo, which get no logprob (None, no alternatives). The
    sample is stored with its `output_prefix_overlap` finding, as it is without logprobs; refused as malformed, it
    was retried and lost."""
    entries = meta.get("output_token_logprobs")
    if entries is None:
        return None
    if not isinstance(entries, list):
        raise LogprobShapeError("output_token_logprobs is not a list")
    pairs = [_triple(e) for e in entries]
    named, served = [i for _, i in pairs], list(output_ids)
    echo = len(served) - len(named)
    if named != served and not (
        0 < echo <= len(prompt_ids) and served[echo:] == named and _echoed(prompt_ids, served[:echo])
    ):
        raise LogprobShapeError(
            f"output_token_logprobs name other ids than output_ids ({len(pairs)} entries for {len(output_ids)} ids)"
        )
    echo = max(echo, 0)
    unscored: list[float | None] = [None] * echo
    out = TokenLogprobs(unscored + [lp for lp, _ in pairs])
    # a scoring request generates nothing, yet SGLang names one position's alternatives (the next token's)
    tops = _one_per_position(meta.get("output_top_logprobs"), len(pairs), "output_top_logprobs") if pairs else None
    if tops is not None:
        ids_lps = [_top_of(t) for t in tops]
        out.top_ids = [[] for _ in range(echo)] + [i for i, _ in ids_lps]
        out.top_logprobs = [[] for _ in range(echo)] + [lp for _, lp in ids_lps]
    return out


def _echoed(prompt_ids: Sequence[int], head: list[int]) -> bool:
    """Whether `head` is the prompt's tail (what SGLang's prompt-prefix bug puts before the generated ids)."""
    return list(prompt_ids[len(prompt_ids) - len(head) :]) == head


def from_sglang_input(meta: dict[str, Any], ids: Sequence[int], start: int) -> TokenLogprobs:
    """Scoring: `input_token_logprobs` / `input_top_logprobs` (logprob_start_len 0) from position `start`."""
    entries = meta.get("input_token_logprobs")
    if not isinstance(entries, list) or len(entries) != len(ids):
        raise LogprobShapeError(
            f"input_token_logprobs has {len(entries) if isinstance(entries, list) else 'no'} "
            f"entries for {len(ids)} input ids (was logprob_start_len 0 honoured?)"
        )
    pairs = [_triple(e) for e in entries]
    if [i for _, i in pairs] != list(ids):
        raise LogprobShapeError("input_token_logprobs name other ids than were sent")
    out = TokenLogprobs([lp for lp, _ in pairs[start:]])
    _every_position_scored(out.logprobs, max(start, 1) - start, start, "input_token_logprobs")
    tops = _one_per_position(meta.get("input_top_logprobs"), len(ids), "input_top_logprobs")
    if tops is not None:
        ids_lps = [_top_of(t) for t in tops[start:]]
        out.top_ids, out.top_logprobs = [i for i, _ in ids_lps], [lp for _, lp in ids_lps]
    return out


# -- vLLM ---------------------------------------------------------------------------------------
def from_vllm_chat(logprobs: object, output_ids: Sequence[int]) -> TokenLogprobs | None:
    """`choices[].logprobs.content[]` ({token, logprob, top_logprobs[]}), positions aligned to the ids."""
    if not isinstance(logprobs, dict) or logprobs.get("content") is None:
        return None
    content = logprobs["content"]
    if not isinstance(content, list) or len(content) != len(output_ids):
        raise LogprobShapeError(
            f"logprobs.content has {len(content) if isinstance(content, list) else 'no'} "
            f"entries for {len(output_ids)} token ids"
        )
    out = TokenLogprobs([], [], [])
    for entry in content:
        if not isinstance(entry, dict):
            raise LogprobShapeError("a logprobs.content entry is not an object")
        out.logprobs.append(_lp(entry.get("logprob")))
        alts = entry.get("top_logprobs") or []
        if not isinstance(alts, list) or not all(isinstance(a, dict) for a in alts):
            raise LogprobShapeError("a logprobs.content entry's top_logprobs is not a list of objects")
        out.top_ids.append([token_id_of(a.get("token")) for a in alts])  # type: ignore[union-attr]
        out.top_logprobs.append([_alt_lp(a.get("logprob")) for a in alts])  # type: ignore[union-attr]
    if not any(out.top_ids or []):
        out.top_ids = out.top_logprobs = None
    return out


def from_vllm_completion(logprobs: object, output_ids: Sequence[int], k: int | None = None) -> TokenLogprobs | None:
    """Completions: `{token_logprobs[], top_logprobs[{"token_id:N": lp}], tokens[]}`.

    Each `top_logprobs` entry holds the sampled token as well as the top `k` (k + 1 entries when the
    sampled one is not among them): cut to the `k` most likely, as the chat endpoint and SGLang give
    them, so `--logprobs 0` stores no alternatives on every endpoint."""
    if not isinstance(logprobs, dict) or logprobs.get("token_logprobs") is None:
        return None
    values = logprobs["token_logprobs"]
    if not isinstance(values, list) or len(values) != len(output_ids):
        raise LogprobShapeError("token_logprobs does not have one entry per token id")
    out = TokenLogprobs([_lp(v) for v in values])
    tops = _one_per_position(logprobs.get("top_logprobs"), len(values), "top_logprobs")
    if tops is not None:
        out.top_ids, out.top_logprobs = [], []
        for top in tops:
            if top is not None and not isinstance(top, dict):
                raise LogprobShapeError(f"a top_logprobs entry is not an object ({type(top).__name__})")
            read = [(key, _alt_lp(v)) for key, v in (top or {}).items()]  # a logprob that is no number: refused
            items = sorted(read, key=lambda kv: -kv[1])
            if k is not None:
                items = items[: max(k, 0)]
            out.top_ids.append([token_id_of(key) for key, _ in items])
            out.top_logprobs.append([lp for _, lp in items])
        if k is not None and k <= 0:
            out.top_ids = out.top_logprobs = None
    return out


def from_vllm_prompt(prompt_logprobs: object, ids: Sequence[int], start: int, k: int) -> TokenLogprobs:
    """Scoring: `prompt_logprobs` ([null, {"<id>": {logprob, rank, decoded_token}}, …]) from `start`.

    Each position names the prompt token itself plus the top-k; the token's own entry gives the
    target logprob, and the alternatives are the entries ranked 1..k."""
    if not isinstance(prompt_logprobs, list) or len(prompt_logprobs) != len(ids):
        raise LogprobShapeError(
            f"prompt_logprobs has {len(prompt_logprobs) if isinstance(prompt_logprobs, list) else 'no'}"
            f" entries for {len(ids)} prompt ids"
        )
    out = TokenLogprobs([], [] if k > 0 else None, [] if k > 0 else None)
    for pos in range(start, len(ids)):
        entry = prompt_logprobs[pos]
        if entry is None and pos == 0:  # nothing predicts the first token
            out.logprobs.append(None)
            if k > 0:
                out.top_ids.append([])  # type: ignore[union-attr]
                out.top_logprobs.append([])  # type: ignore[union-attr]
            continue
        if not isinstance(entry, dict) or str(ids[pos]) not in entry:
            raise LogprobShapeError(f"prompt_logprobs[{pos}] does not name the prompt token {ids[pos]}")
        own = entry[str(ids[pos])]
        out.logprobs.append(_lp(own.get("logprob") if isinstance(own, dict) else None))
        if k > 0:
            ranked = sorted(
                (
                    (_rank(v.get("rank")), _prompt_key(key), _lp(v.get("logprob")))
                    for key, v in entry.items()
                    if isinstance(v, dict)
                ),
                key=lambda t: t[0],
            )
            ranked = [r for r in ranked if r[0] <= k][:k]
            out.top_ids.append([i for _, i, _ in ranked])  # type: ignore[union-attr]
            out.top_logprobs.append([lp if lp is not None else FLOOR for _, _, lp in ranked])  # type: ignore[union-attr]
    _every_position_scored(out.logprobs, max(start, 1) - start, start, "prompt_logprobs")
    return out


def _every_position_scored(logprobs: list[float | None], first: int, start: int, what: str) -> None:
    """A scoring answer gives every position after the first a logprob: a null one was stored as a whole score
    (counted scored, never asked again; the NLL over fewer tokens, exported as null)."""
    for at in range(first, len(logprobs)):
        if logprobs[at] is None:
            raise LogprobShapeError(f"{what}[{start + at}] gives the token no logprob (null)")


def _rank(value: object) -> int:
    """A prompt logprob's rank (1 the most likely); none ranks last. A rank that is no integer is malformed."""
    if value is None:
        return 10**9
    if isinstance(value, bool) or not isinstance(value, int):
        raise LogprobShapeError(f"a prompt logprob's rank is not an integer ({str(value)[:20]!r})")
    return value or 10**9


def _prompt_key(key: object) -> int:
    """A prompt logprob's key: the id as a decimal string."""
    try:
        return checked_id(int(str(key)))
    except ValueError:
        raise LogprobShapeError(f"a prompt logprob's key is not an id ({str(key)[:20]!r})") from None


# -- the numbers a person reads ---------------------------------------------------------------------
def mean_nll(logprobs: Sequence[float | None]) -> float | None:
    values = [lp for lp in logprobs if lp is not None]
    if not values:
        return None
    return -sum(values) / len(values) + 0.0  # + 0.0: a sure sample's NLL is 0.0, not -0.0


def low_share(logprobs: Sequence[float | None], low_prob: float = DEFAULT_LOW_PROB) -> float | None:
    values = [lp for lp in logprobs if lp is not None]
    if not values:
        return None
    cut = math.log(low_prob)
    return sum(1 for lp in values if lp < cut) / len(values)


def score_summary(
    logprobs: Sequence[float | None],
    *,
    off_policy_nll: float = DEFAULT_OFF_POLICY_NLL,
    low_prob: float = DEFAULT_LOW_PROB,
) -> dict[str, Any]:
    """mean NLL, share of unlikely tokens, and whether the sample reads as off-policy."""
    nll = mean_nll(logprobs)
    return {
        "mean_nll": nll,
        "low_prob": low_prob,
        "low_prob_share": low_share(logprobs, low_prob),
        "off_policy_nll": off_policy_nll,
        "off_policy": nll is not None and nll > off_policy_nll,
        "tokens": sum(1 for lp in logprobs if lp is not None),
    }
