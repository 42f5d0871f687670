"""Spec-decode metrics, logprobs and scoring end to end: the simulator over real sockets, the store, the CLI."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest
from builders import kimi, make_capture, profile, put_foreign

from tokview.batch import BatchConfig, run_batch
from tokview.batch.scoring import ScoreConfig, run_score
from tokview.cli import main
from tokview.core import spec_decode as sd
from tokview.core.analysis import analyze
from tokview.servers import CaptureRequest, ServerPool
from tokview.servers.errors import CaptureFailed
from tokview.sim import SimConfig, start_simulator
from tokview.sim.config import SimConfigError
from tokview.store import Store

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ROOT / "sample_data" / "plain_prompts.jsonl"
MESSAGES = [{"role": "user", "content": "What is 6 times 7?"}]


def _config(url: str, **kw) -> BatchConfig:
    return BatchConfig(
        servers=[url],
        prompts_path=PROMPTS,
        tokenizer=kimi(),
        model_profile=profile(),
        max_new_tokens=kw.pop("max_new_tokens", 120),
        timeout=10.0,
        limit=kw.pop("limit", 4),
        **kw,
    )


def _pool(url: str) -> ServerPool:
    return ServerPool(url, tokenizer=kimi(), profile=profile(), timeout=10.0, retries=1, backoff=0.01)


@pytest.fixture(scope="module")
def vllm_detailed():
    with start_simulator(SimConfig(kind="vllm", spec_decode="vllm-detailed")) as sim:
        yield sim


async def test_vllm_detailed_batch_stores_placed_steps_and_logprobs(vllm_detailed, tmp_path):
    with Store(tmp_path / "s.duckdb") as store:
        summary = await run_batch(_config(vllm_detailed.url, logprobs=2), store)
        assert summary.ok == 4
        assert summary.failed == 0
        for row in store.samples_page():
            cap = store.load_sample(row.sample_id).capture
            assert cap.settings["logprobs"] == 2
            n = len(cap.output_ids)
            assert len(cap.output_logprobs) == n
            assert all(len(t) == 2 for t in cap.output_top_ids)
            assert all(top[0] == tid for top, tid in zip(cap.output_top_ids, cap.output_ids))  # sampled = most likely
            spec = sd.SpecDecode.from_dict(cap.spec_decode)
            assert spec.steps == len(spec.per_step_accepted) > 0
            out = sd.summary(cap.spec_decode, cap.prompt_ids, cap.output_ids, cap.finish_reason, profile())
            assert out["placed"]
            assert len(out["runs"]) == n
            segs = out["segments"]
            assert segs["reasoning"]["steps"] + segs["answer"]["steps"] == spec.steps
            assert segs["reasoning"]["tokens"] + segs["answer"]["tokens"] == n
            acceptance = store.query("SELECT acceptance_length FROM samples WHERE sample_id = ?", [row.sample_id])[0][0]
            assert acceptance == pytest.approx(spec.mean_acceptance_length)


async def test_sample_ids_unchanged_without_logprobs(vllm_detailed, tmp_path):
    """--logprobs enters the settings (and ids) only when given: older stores still resume."""
    assert "logprobs" not in _config(vllm_detailed.url).generation_settings()
    assert _config(vllm_detailed.url, logprobs=0).generation_settings()["logprobs"] == 0


@pytest.mark.parametrize("mode", ["vllm-summary", "vllm-detailed"])
async def test_vllm_chat_streamed_and_not(mode):
    with start_simulator(SimConfig(kind="vllm", spec_decode=mode)) as sim:
        async with _pool(sim.url) as pool:
            plain = await pool.capture(CaptureRequest(messages=MESSAGES, mode="chat", settings={"logprobs": 1}))
            streamed = await pool.capture(
                CaptureRequest(messages=MESSAGES, mode="chat", stream=True, settings={"logprobs": 1})
            )
    assert plain.output_ids == streamed.output_ids
    assert plain.spec_decode == streamed.spec_decode
    assert plain.spec_decode["schema"] == "vllm"
    assert plain.output_logprobs == streamed.output_logprobs
    assert len(plain.output_logprobs) == len(plain.output_ids)
    placed = sd.place_steps(sd.SpecDecode.from_dict(plain.spec_decode), len(plain.output_ids), plain.finish_reason)
    assert (placed is not None) == (mode == "vllm-detailed")


@pytest.mark.parametrize("mode", ["sglang-0.5.10", "sglang-0.5.11", "sglang-0.5.12"])
@pytest.mark.parametrize("quirks", [{}, {"incremental-streaming": True}])
async def test_sglang_every_schema_streamed_and_not(mode, quirks):
    with start_simulator(SimConfig(kind="sglang", spec_decode=mode, quirks=quirks)) as sim:
        async with _pool(sim.url) as pool:
            plain = await pool.capture(CaptureRequest(messages=MESSAGES, settings={"logprobs": 3}))
            streamed = await pool.capture(CaptureRequest(messages=MESSAGES, stream=True, settings={"logprobs": 3}))
    assert plain.output_ids == streamed.output_ids
    assert plain.spec_decode == streamed.spec_decode
    assert plain.spec_decode["schema"] == mode
    assert plain.output_top_ids == streamed.output_top_ids
    assert len(plain.output_top_ids[0]) == 3
    spec = sd.SpecDecode.from_dict(plain.spec_decode)
    assert spec.accepted is not None
    assert spec.drafted == 3 * spec.steps
    assert spec.histogram is not None
    assert sum(spec.histogram) == spec.steps  # 0.5.10.post1 sends it too
    assert sd.place_steps(spec, len(plain.output_ids), plain.finish_reason) is None  # totals only


def test_spec_decode_mode_must_fit_the_kind():
    with pytest.raises(SimConfigError, match="not for a vllm"):
        SimConfig(kind="vllm", spec_decode="sglang-0.5.11")
    with pytest.raises(SimConfigError, match="unknown --spec-decode"):
        SimConfig(kind="sglang", spec_decode="eagle")


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
async def test_score_agrees_with_generation_flags_foreign_samples_and_resumes(kind, tmp_path):
    with start_simulator(SimConfig(kind=kind)) as sim, Store(tmp_path / "s.duckdb") as store:
        await run_batch(_config(sim.url, logprobs=2, limit=3), store)
        put_foreign(store, "foreign@x_gen0")
        first = await run_score(ScoreConfig(servers=[sim.url], top_k=2), store)
        assert (first.input, first.ok, first.failed, first.off_policy) == (4, 4, 0, 1)
        for row in store.samples_page():
            stored = store.load_sample(row.sample_id)
            cap = stored.capture
            assert len(cap.target_logprobs) == len(cap.output_ids)
            assert cap.target_score["top_k"] == 2
            if row.sample_id == "foreign@x_gen0":
                assert cap.target_score["off_policy"]
                assert cap.target_score["mean_nll"] > 2.0
                assert "off_policy" in row.codes
                assert row.valid == stored.valid
                finding = next(f for f in stored.findings if f.code == "off_policy")
                assert finding.severity == "warn"
                assert finding.positions[0] == len(cap.prompt_ids)
            else:  # the simulator's own output: the target agrees with what generation said
                assert cap.target_logprobs == pytest.approx(cap.output_logprobs, abs=1e-6)
                assert cap.target_top_ids == cap.output_top_ids
                assert "off_policy" not in row.codes
                assert cap.target_score["mean_nll"] < 0.5
                # the same rule runs when the sample is analysed again
                assert "off_policy" not in analyze(cap, profile(), kimi()).codes
        again = await run_score(ScoreConfig(servers=[sim.url], top_k=2), store)
        assert (again.ok, again.skipped, again.other_thresholds) == (0, 4, 0)
        # another threshold, not asked to rescore: nothing is asked again, and the summary says the stored scores keep
        # theirs (it said "off_policy 0" as if the new threshold had found none)
        other = await run_score(ScoreConfig(servers=[sim.url], top_k=2, off_policy_nll=0.01), store)
        assert (other.ok, other.skipped, other.other_thresholds) == (0, 4, 4)
        assert "keep the --off-policy-nll and --low-prob they were scored with" in other.render()
        more = await run_score(ScoreConfig(servers=[sim.url], top_k=3, off_policy_nll=100.0), store)
        assert more.ok == 4
        assert more.off_policy == 0  # more alternatives asked: scored again
        rescored = store.load_sample("foreign@x_gen0").capture.target_score
        assert rescored["off_policy"] is False
        assert rescored["off_policy_nll"] == 100.0
        assert rescored["top_k"] == 3
        assert all("off_policy" not in r.codes for r in store.samples_page())
        assert store.query("SELECT count(*) FROM findings WHERE code = 'off_policy'") == [(0,)]


def test_score_cli_exit_codes_and_json(tmp_path, capsys):
    db = tmp_path / "s.duckdb"
    with start_simulator(SimConfig(kind="sglang")) as sim:
        with Store(db) as store:
            asyncio.run(run_batch(_config(sim.url, limit=2), store))
            put_foreign(store, "foreign@x_gen0")
        code = main(["score", "--db", str(db), "--server", sim.url, "--summary-json"])
        out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert code == 0
        assert out["ok"] == 3
        assert out["off_policy"] == 1
        assert out["exit_code"] == 0
        assert math.isfinite(out["mean_nll"])
        capsys.readouterr()
        code = main(["score", "--db", str(db), "--server", sim.url, "--run", "nope"])  # a typo: not "0 scored"
        err = capsys.readouterr().err.strip()
        assert code == 1, err
        assert err.startswith("tokview: error: no run 'nope' in"), err
        assert "(runs: " in err, err
        code = main(["score", "--db", str(db), "--server", sim.url, "--select", "approved"])  # none approved
        err = capsys.readouterr().err.strip()
        assert code == 1, err  # as `export` exits on it: not "scored 0 of 0", exit 0
        assert err.startswith("tokview: error: no samples match --select approved in"), err
    assert main(["score", "--db", str(tmp_path / "missing.duckdb"), "--server", "http://127.0.0.1:9"]) == 1
    assert "database not found" in capsys.readouterr().err
    assert main(["score", "--db", str(db), "--server", "http://127.0.0.1:9", "--top-k", "50"]) == 1
    assert main(["score", "--db", str(db), "--server", "http://127.0.0.1:9", "--retries", "0", "--timeout", "1"]) == 2


async def test_score_failures_are_counted_not_fatal(tmp_path):
    """A target with another vocabulary (here: a sample with ids the simulator rejects) fails that sample only."""
    with start_simulator(SimConfig(kind="vllm")) as sim, Store(tmp_path / "s.duckdb") as store:
        await run_batch(_config(sim.url, limit=2), store)
        cap = make_capture()
        cap.output_ids = [10**7] + cap.output_ids
        store.put_sample("bad@x_gen0", "bad", "imported", cap, analyze(cap, profile(), kimi()))
        summary = await run_score(ScoreConfig(servers=[sim.url], retries=0), store)
        assert (summary.ok, summary.failed, summary.exit_code) == (2, 1, 3)
        assert store.load_sample("bad@x_gen0").capture.target_score is None
        assert store.stats()["failures"]["total"] == 0  # not a generation failure


def test_stats_and_show_json_carry_spec_decode_logprobs_and_target(tmp_path, capsys):
    db = tmp_path / "s.duckdb"
    with start_simulator(SimConfig(kind="vllm", spec_decode="vllm-detailed")) as sim, Store(db) as store:
        asyncio.run(run_batch(_config(sim.url, logprobs=2, limit=3), store))
        put_foreign(store, "foreign@x_gen0")
        asyncio.run(run_score(ScoreConfig(servers=[sim.url], top_k=1), store))
        sid = next(r.sample_id for r in store.samples_page() if r.sample_id != "foreign@x_gen0")
    capsys.readouterr()
    assert main(["stats", "--db", str(db), "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    spec = st["spec_decode"]
    assert spec["samples"] == 3
    assert spec["placed_samples"] == 3
    assert spec["schemas"] == {"vllm": 3}
    assert spec["segments"]["reasoning"]["steps"] + spec["segments"]["answer"]["steps"] == spec["steps"]
    assert spec["mean_acceptance_length"] == pytest.approx(1 + spec["accepted"] / spec["steps"])
    assert st["logprobs"]["samples"] == 3
    assert st["logprobs"]["samples_with_top_k"] == 3
    target = st["target_logprobs"]
    assert target["samples"] == 4
    assert target["off_policy"] == 1
    assert target["models"] == ["tokview-sim"]
    counts = target["nll_histogram"]["counts"]
    assert sum(counts) == 4
    assert counts[0] + counts[1] == 3
    assert sum(counts[4:]) == 1  # own ≤ 0.5, foreign > 4

    assert main(["stats", "--db", str(db)]) == 0
    text = capsys.readouterr().out
    assert "spec-decode 3 samples, mean acceptance length" in text
    assert "per segment (3 samples placed)" in text
    assert "target      4 scored" in text
    assert "off_policy 1" in text

    assert main(["show", sid, "--db", str(db), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["spec_decode"]["placed"]
    assert set(shown["spec_decode"]["segments"]) == {"reasoning", "answer"}
    assert len(shown["spec_decode"]["runs"]) == len(shown["capture"]["output_ids"])
    assert len(shown["logprobs"]["sampled"]) == len(shown["capture"]["output_ids"])
    assert shown["target_logprobs"]["mean_nll"] < 0.5
    assert len(shown["target_logprobs"]["top_ids"][0]) == 1
    assert main(["show", "foreign@x_gen0", "--db", str(db), "--json"]) == 0
    foreign = json.loads(capsys.readouterr().out)
    assert foreign["spec_decode"] is None
    assert foreign["logprobs"] is None
    assert foreign["target_logprobs"]["off_policy"] is True
    assert "off_policy" in [f["code"] for f in foreign["findings"]]


def test_stats_json_keys_are_null_without_side_data(tmp_path, capsys):
    db = tmp_path / "e.duckdb"
    with Store(db) as store:
        cap = make_capture()
        store.put_sample("a@x_gen0", "a", "r", cap, analyze(cap, profile(), kimi()))
    capsys.readouterr()
    assert main(["stats", "--db", str(db), "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert (st["spec_decode"], st["logprobs"], st["target_logprobs"]) == (None, None, None)


def test_summary_mode_store_has_no_segments(tmp_path, capsys):
    db = tmp_path / "m.duckdb"
    with start_simulator(SimConfig(kind="vllm", spec_decode="vllm-summary")) as sim, Store(db) as store:
        asyncio.run(run_batch(_config(sim.url, limit=2), store))
        sid = store.samples_page()[0].sample_id
    capsys.readouterr()
    main(["stats", "--db", str(db), "--json"])
    st = json.loads(capsys.readouterr().out)
    assert st["spec_decode"]["samples"] == 2
    assert st["spec_decode"]["segments"] is None
    main(["show", sid, "--db", str(db), "--json"])
    shown = json.loads(capsys.readouterr().out)
    assert shown["spec_decode"]["segments"] is None
    assert "totals only" in shown["spec_decode"]["segments_unavailable"]


def test_score_a_dataset_imported_with_audit(tmp_path, capsys):
    """Another pipeline's speculators rows, imported with `tokview audit`, scored against the target."""
    tok = kimi()
    prompt = tok.render(MESSAGES, template_kwargs={"thinking": True})
    own = tok.encode("Okay, let me think about this carefully.") + [163607] + tok.encode("The answer is forty two!")
    # the simulator writes only its own sentences: digits and symbols are unlikely under it
    foreign = tok.encode("ZQX 7319 %$# {}[] <> | jqz 0815") + [163607] + tok.encode("XYZ 42!")
    rows = [
        {"id": f"r{k}", "input_ids": prompt + out + [163586], "loss_mask": [0] * len(prompt) + [1] * (len(out) + 1)}
        for k, out in enumerate((own, foreign))
    ]
    data = tmp_path / "other.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    db = tmp_path / "audit.duckdb"
    assert main(["audit", str(data), "--db", str(db)]) == 0
    with start_simulator(SimConfig(kind="vllm")) as sim:
        capsys.readouterr()
        assert main(["score", "--db", str(db), "--server", sim.url, "--summary-json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["ok"] == 2
    assert out["off_policy"] == 1
    with Store(db) as store:
        flagged = {r.prompt_id: "off_policy" in r.codes for r in store.samples_page()}
    assert sorted(flagged.values()) == [False, True]


async def test_score_interrupted_keeps_what_it_scored_and_resumes(tmp_path):
    with start_simulator(SimConfig(kind="sglang", quirks={"latency": 0.05})) as sim:
        with Store(tmp_path / "s.duckdb") as store:
            await run_batch(_config(sim.url, limit=6), store)
            cancel = asyncio.Event()

            def progress(p):
                if p.ok >= 2:
                    cancel.set()

            first = await run_score(
                ScoreConfig(servers=[sim.url], concurrency=1), store, on_progress=progress, cancel=cancel
            )
            assert first.interrupted
            assert first.exit_code == 130
            assert 2 <= first.ok < 6
            stored = store.query("SELECT count(*) FROM samples WHERE target_score IS NOT NULL")[0][0]
            assert stored == first.ok  # every score counted was written, none half-written
            rest = await run_score(ScoreConfig(servers=[sim.url]), store)
            assert (rest.skipped, rest.ok, rest.interrupted) == (first.ok, 6 - first.ok, False)


def test_sim_command_refuses_a_spec_decode_mode_of_the_other_kind(capsys):
    assert main(["sim", "--kind", "vllm", "--spec-decode", "sglang-0.5.12", "--port", "0"]) == 1
    assert "not for a vllm simulator" in capsys.readouterr().err


async def test_a_sample_that_fills_the_context_fails_scoring_with_the_reason(tmp_path):
    """Both servers refuse an input of max_model_len ids (vLLM also generates one token to score): a
    sample cut at the context limit came back as a bare HTTP 400."""
    store_path = tmp_path / "s.duckdb"
    with start_simulator(SimConfig(kind="vllm", max_model_len=60)) as sim, Store(store_path) as store:
        await run_batch(_config(sim.url, limit=4, max_new_tokens=1000), store)
        full = [r.sample_id for r in store.samples_page() if r.prompt_len + r.output_len >= 60]
        assert full  # cut at the context limit
        summary = await run_score(ScoreConfig(servers=[sim.url], retries=0), store)
        assert summary.failed == len(full)
        reason = "the server scores only inputs shorter than its max_model_len 60"
        assert all(reason in r for r in summary.failures_by_reason)
    with start_simulator(SimConfig(kind="sglang", max_model_len=60)) as sim, Store(store_path) as store:
        again = await run_score(ScoreConfig(servers=[sim.url], retries=0), store)
        assert again.failed == len(full)
        assert all(reason in r for r in again.failures_by_reason)


async def test_logprobs_on_sglangs_chat_endpoint_fail_saying_why_and_dual_mode_keeps_them():
    """SGLang's chat endpoint names a logprob's token by text: `--mode chat --logprobs` stored none, silently, in a
    run that looked like a logprob run. Each capture fails saying why; dual mode takes them from /generate."""
    with start_simulator(SimConfig(kind="sglang")) as sim:
        async with _pool(sim.url) as pool:
            with pytest.raises(CaptureFailed, match="--mode raw or dual"):
                await pool.capture(CaptureRequest(messages=MESSAGES, mode="chat", settings={"logprobs": 2}))
            dual = await pool.capture(CaptureRequest(messages=MESSAGES, mode="dual", settings={"logprobs": 2}))
            plain = await pool.capture(CaptureRequest(messages=MESSAGES, mode="chat"))
    assert len(dual.output_logprobs) == len(dual.output_ids) > 0
    assert plain.output_ids and plain.output_logprobs is None
