"""Score a stored sample against a live target: the target's logprob of every output token.

Nothing is generated (protocols: recordings `sgl_generate_score_stored_sample.json`,
`vllm_completions_score_stored_sample.json`):
- SGLang `/generate` with `input_ids` = prompt + output, `max_new_tokens: 0`, `logprob_start_len: 0`:
  `meta_info.input_token_logprobs` has one `[logprob, id, text]` per input id (the first null);
- vLLM `/v1/completions` with the ids as prompt, `max_tokens: 1`, `prompt_logprobs: K`: one
  `{id: {logprob, rank, decoded_token}}` per prompt position (the first null). vLLM always names the
  prompt token itself next to the top K; K = 0 is sent as 1 and the alternatives dropped.
The ids each answer names are checked against the ids sent: a target with another vocabulary (or
a server that re-tokenized) is refused, never scored against the wrong tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokview.core import logprobs as lp
from tokview.servers.errors import CaptureFailed, RetryElsewhere
from tokview.servers.http import ServerClient
from tokview.servers.info import ServerInfo
from tokview.servers.registry import choose


@dataclass
class TargetScore:
    """The target's view of one sample's output positions, and who said it."""

    logprobs: lp.TokenLogprobs
    server_url: str
    server_kind: str
    model: str | None


async def score_on(
    client: ServerClient,
    info: ServerInfo,
    *,
    backend: str,
    prompt_ids: list[int],
    output_ids: list[int],
    top_k: int = 0,
) -> TargetScore:
    """One scoring request on one server, by its raw endpoint family (retries are the pool's business)."""
    if not output_ids:
        raise CaptureFailed("the sample has no output ids to score")
    ids, start = list(prompt_ids) + list(output_ids), len(prompt_ids)
    choice = choose(backend, info)
    try:
        found = await choice.raw.score(client, info, ids, start, top_k)
    except lp.MalformedLogprob as exc:  # a broken answer: failed, so a later run scores the sample again
        raise RetryElsewhere(f"malformed response from {client.url}: {exc}") from None
    except lp.LogprobShapeError as exc:
        # another server may read it (a replica answering garbage failed samples a healthy one could score); the
        # same one answers the same again, so with no other the sample fails at once (`RetryElsewhere`)
        raise RetryElsewhere(f"cannot score on {client.url}: {exc}") from None
    return TargetScore(found, client.url, choice.name, info.model)


async def detokenize_on(client: ServerClient, info: ServerInfo, *, backend: str, ids: list[int]) -> str:
    """The target's own text of these ids (`/detokenize`: vLLM answers it as `prompt`, SGLang as `text`): how `tokview score`
    tells that the target reads the samples' ids as the server that made them did."""
    key = choose(backend, info).raw.detokenized_key
    if key is None:
        raise CaptureFailed(f"{client.url} has no /detokenize", url=client.url)
    body: dict[str, object] = {"tokens": ids}
    if info.model:
        body["model"] = info.model
    data = await client.post_json("/detokenize", body)
    text = data.get(key) if isinstance(data, dict) else None
    if not isinstance(text, str):
        raise CaptureFailed(f"malformed response from {client.url}: /detokenize gave no text", url=client.url)
    return text
