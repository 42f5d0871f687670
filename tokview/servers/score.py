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
from typing import Any

from tokview.core import logprobs as lp
from tokview.servers.capture import effective_backend
from tokview.servers.errors import CaptureFailed, Retryable
from tokview.servers.http import ServerClient
from tokview.servers.info import ServerInfo
from tokview.servers.sglang import object_of


@dataclass
class TargetScore:
    """The target's view of one sample's output positions, and who said it."""

    logprobs: lp.TokenLogprobs
    server_url: str
    server_kind: str
    model: str | None


def sglang_score_body(ids: list[int], top_k: int) -> dict[str, Any]:
    return {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": 0, "temperature": 0.0},
        "return_logprob": True,
        "logprob_start_len": 0,
        "top_logprobs_num": top_k,
        "stream": False,
    }


def vllm_score_body(ids: list[int], top_k: int, model: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "prompt": ids,
        "max_tokens": 1,
        "temperature": 0.0,
        "prompt_logprobs": max(1, top_k),
        "return_token_ids": True,
    }
    if model:
        body["model"] = model
    return body


async def score_on(
    client: ServerClient, info: ServerInfo, backend: str, prompt_ids: list[int], output_ids: list[int], top_k: int = 0
) -> TargetScore:
    """One scoring request on one server (retries are the pool's business)."""
    if not output_ids:
        raise CaptureFailed("the sample has no output ids to score")
    ids, start = list(prompt_ids) + list(output_ids), len(prompt_ids)
    kind = effective_backend(backend, info)
    try:
        if kind in ("sglang", "sglang-chat"):
            where = "POST /generate (score)"
            data = await client.post_json("/generate", sglang_score_body(ids, top_k))
            if isinstance(data, list) and len(data) == 1:
                data = data[0]
            if not isinstance(data, dict):
                raise Retryable(f"malformed response from {where}: expected an object with meta_info")
            found = lp.from_sglang_input(object_of(data.get("meta_info"), where, "meta_info"), ids, start)
            if top_k == 0:
                found.top_ids = found.top_logprobs = None
        else:
            where = "POST /v1/completions (score)"
            data = await client.post_json("/v1/completions", vllm_score_body(ids, top_k, info.model))
            choices = data.get("choices") if isinstance(data, dict) else None
            if not isinstance(choices, list) or not choices:
                raise Retryable(f"malformed response from {where}: expected an object with choices")
            choice = object_of(choices[0], where, "choices[0]")
            if choice.get("prompt_logprobs") is None:
                raise CaptureFailed(
                    f"{where} returned no prompt_logprobs: this server cannot score stored samples", url=client.url
                )
            found = lp.from_vllm_prompt(choice["prompt_logprobs"], ids, start, top_k)
    except lp.LogprobShapeError as exc:
        raise CaptureFailed(f"cannot score on {client.url}: {exc}", url=client.url) from None
    return TargetScore(found, client.url, kind, info.model)
