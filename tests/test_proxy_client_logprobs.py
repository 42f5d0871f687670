"""The logprobs a harness asked for through the proxy, lined up with the ids or not kept at all
(`proxy/client_logprobs.py`): side data never costs a sample."""

from __future__ import annotations

import math

from tokview.proxy.client_logprobs import client_logprobs


def _chat(entries: list[dict], stream: bool = False) -> object:
    if stream:
        return [{"choices": [{"index": 0, "logprobs": {"content": [e]}}]} for e in entries]
    return {"choices": [{"index": 0, "logprobs": {"content": entries}}]}


def test_entries_that_do_not_line_up_with_the_ids_keep_none() -> None:
    """A vLLM before 0.31 streams no entry for a marker id: 2 entries for 3 ids is no per-id logprob."""
    entries = [{"token": "a", "logprob": -0.5, "top_logprobs": []}, {"token": "b", "logprob": -1.0, "top_logprobs": []}]
    got = client_logprobs(
        chat=True, answer=_chat(entries, True), stream=True, settings={"logprobs": True}, output_ids=[1, 2, 3]
    )
    assert got == {}
    got = client_logprobs(
        chat=True, answer=_chat(entries), stream=False, settings={"logprobs": True}, output_ids=[1, 2]
    )
    assert got["output_logprobs"] == [-0.5, -1.0] and got["output_top_ids"] is None


def test_text_named_alternatives_leave_the_sampled_logprobs_and_ids_named_ones_are_kept() -> None:
    texts = [{"token": "a", "logprob": -0.5, "top_logprobs": [{"token": "a", "logprob": -0.5}]}]
    got = client_logprobs(chat=True, answer=_chat(texts), stream=False, settings={"logprobs": "true"}, output_ids=[7])
    assert got["output_logprobs"] == [-0.5] and got["output_top_ids"] is None
    ids = [{"token": "token_id:7", "logprob": -0.5, "top_logprobs": [{"token": "token_id:7", "logprob": -0.5}]}]
    got = client_logprobs(chat=True, answer=_chat(ids), stream=False, settings={"logprobs": True}, output_ids=[7])
    assert got["output_top_ids"] == [[7]]


def test_nothing_asked_or_a_broken_value_keeps_none() -> None:
    entries = [{"token": "a", "logprob": math.nan, "top_logprobs": []}]
    assert (
        client_logprobs(chat=True, answer=_chat(entries), stream=False, settings={"logprobs": True}, output_ids=[1])
        == {}
    )
    fine = [{"token": "a", "logprob": -1.0, "top_logprobs": []}]
    assert client_logprobs(chat=True, answer=_chat(fine), stream=False, settings={}, output_ids=[1]) == {}
    completion = {"choices": [{"index": 0, "logprobs": {"token_logprobs": [-0.25], "top_logprobs": [{"x": -0.25}]}}]}
    got = client_logprobs(chat=False, answer=completion, stream=False, settings={"logprobs": 1}, output_ids=[4])
    assert got["output_logprobs"] == [-0.25] and got["output_top_ids"] is None
    lax = client_logprobs(chat=False, answer=completion, stream=False, settings={"logprobs": True}, output_ids=[4])
    assert lax["output_logprobs"] == [-0.25]  # `true` is 1 to the servers' pydantic
    zero = client_logprobs(chat=False, answer=completion, stream=False, settings={"logprobs": False}, output_ids=[4])
    assert zero["output_logprobs"] == [-0.25] and zero["output_top_ids"] is None  # `false` is 0: the sampled ones
    assert client_logprobs(chat=False, answer=completion, stream=False, settings={"logprobs": -1}, output_ids=[4]) == {}
