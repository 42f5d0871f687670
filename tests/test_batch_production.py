"""Production runs: --workers, --shard + merge, early stop, a full disk, and a store shared live."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from builders import kimi, profile

from tokview.batch import BatchConfig, plan, read_prompts, run_batch
from tokview.sim import SimConfig, start_simulator
from tokview.store import SampleIdentity, Store

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_data"
TOKVIEW = [sys.executable, "-c", "import sys; from tokview.cli import main; sys.exit(main())"]


def many_prompts(path: Path, n: int) -> Path:
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"q{i:04d}", "messages": [{"role": "user", "content": f"question {i}"}]}) + "\n")
    return path


def expected_ids(prompts: Path, max_new_tokens: int) -> set[str]:
    rows, _ = read_prompts(prompts)
    config = BatchConfig(servers=[], max_new_tokens=max_new_tokens)
    identity = {"model": "tokview-sim", "tokenizer": kimi().vocab_fingerprint(), "profile": profile().name}
    return {i.sample_id for i in plan(rows, config, config.sample_settings(identity))[0]}


def stored_ids(db: Path) -> list[str]:
    with Store(db) as store:
        return [r[0] for r in store.query("SELECT sample_id FROM samples")]


async def test_two_workers_store_every_sample_once_with_the_planned_ids(tmp_path):
    prompts = many_prompts(tmp_path / "p.jsonl", 80)
    db = tmp_path / "w.duckdb"
    with start_simulator(SimConfig(kind="vllm")) as sim, Store(db) as store:
        config = BatchConfig(servers=[sim.url], prompts_path=prompts, max_new_tokens=40, concurrency=4, workers=2)
        summary = await run_batch(config, store)
        assert summary.balanced, summary.render()
        assert (summary.ok, summary.failed) == (80, 0), summary.render()
        assert sim.stats.generation >= 80
        again = await run_batch(config, store)  # resume: nothing to do
        assert (again.ok, again.resumed) == (0, 80)
    ids = stored_ids(db)
    assert len(ids) == len(set(ids)) == 80
    assert set(ids) == expected_ids(prompts, 40)


def test_shards_cover_every_id_once_and_merge_is_idempotent(tmp_path):
    prompts = many_prompts(tmp_path / "p.jsonl", 24)
    with start_simulator(SimConfig(kind="vllm")) as sim:
        dbs = []
        for k in (1, 2, 3):
            db = tmp_path / f"shard{k}.duckdb"
            out = subprocess.run(
                [
                    *TOKVIEW,
                    "batch",
                    str(prompts),
                    "--server",
                    sim.url,
                    "--db",
                    str(db),
                    "--max-new-tokens",
                    "40",
                    "--shard",
                    f"{k}/3",
                    "--summary-json",
                ],
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert out.returncode == 0, out.stderr
            summary = json.loads(out.stdout)
            assert summary["balanced"]
            assert summary["ok"] == summary["input"]
            dbs.append(db)
    shard_ids = [set(stored_ids(db)) for db in dbs]
    assert all(shard_ids)
    assert sum(len(s) for s in shard_ids) == 24
    assert set().union(*shard_ids) == expected_ids(prompts, 40)
    into = tmp_path / "all.duckdb"
    for _ in range(2):  # the second merge adds nothing
        out = subprocess.run(
            [*TOKVIEW, "merge", *map(str, dbs), "--into", str(into)], capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr
    assert "+0 samples" in out.stderr
    ids = stored_ids(into)
    assert len(ids) == len(set(ids)) == 24
    with Store(into) as store:
        assert store.query("SELECT count(*) FROM findings")[0][0] > 0
        assert len(store.runs()) == 1


def test_merge_refuses_a_store_of_another_model_in_one_line(tmp_path):
    prompts = many_prompts(tmp_path / "p.jsonl", 2)
    dbs = []
    for name in ("model-a", "model-b"):
        with start_simulator(SimConfig(kind="vllm", model_name=name)) as sim:
            db = tmp_path / f"{name}.duckdb"
            out = subprocess.run(
                [*TOKVIEW, "batch", str(prompts), "--server", sim.url, "--db", str(db), "--max-new-tokens", "30"],
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert out.returncode == 0, out.stderr
            dbs.append(db)
    out = subprocess.run(
        [*TOKVIEW, "merge", str(dbs[1]), "--into", str(dbs[0])], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 1
    assert out.stderr.strip().count("\n") == 0
    assert "model model-b" in out.stderr
    assert "merge refused" in out.stderr
    assert "Traceback" not in out.stderr
    assert len(stored_ids(dbs[0])) == 2


async def test_a_server_that_fails_everything_stops_the_run_with_the_reason(tmp_path):
    prompts = many_prompts(tmp_path / "p.jsonl", 60)
    with (
        start_simulator(SimConfig(kind="vllm", quirks={"http-500": True})) as sim,
        Store(tmp_path / "f.duckdb") as store,
    ):
        config = BatchConfig(
            servers=[sim.url],
            prompts_path=prompts,
            max_new_tokens=30,
            concurrency=2,
            retries=0,
            max_consecutive_failures=5,
        )
        summary = await run_batch(config, store)
    assert summary.stopped
    assert "stopped after 5 consecutive failures" in summary.stopped
    assert "500" in summary.stopped
    assert summary.failed < 60
    assert summary.abandoned > 0
    assert summary.balanced
    assert summary.exit_code == 1
    assert "stopped: stopped after 5" in summary.render()


def _unshare_tmpfs_works(tmp_path: Path) -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {tmp_path}"],
        capture_output=True,
    )
    if probe.returncode == 0:
        return True
    probe = subprocess.run(
        ["unshare", "--mount", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {tmp_path}"], capture_output=True
    )
    return probe.returncode == 0


def test_a_full_disk_stops_taking_work_says_so_and_keeps_what_was_generated(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if not _unshare_tmpfs_works(mnt):
        pytest.skip("cannot mount a small tmpfs here (needs unshare and mount rights)")
    prompts = many_prompts(tmp_path / "p.jsonl", 400)
    # 0.02 s an answer: the run spans several landings, so the 4 MB fill part way through
    with start_simulator(SimConfig(kind="vllm", output_tokens=400, latency_s=0.02)) as sim:
        db = mnt / "full.duckdb"
        keep = tmp_path / "kept"
        # mount a 4 MB tmpfs in a private mount namespace, run the batch there, then copy what is left out
        script = (
            f"mount -t tmpfs -o size=4m tmpfs {mnt} && {' '.join(map(_q, TOKVIEW))} batch {prompts} "
            f"--server {sim.url} --db {db} --max-new-tokens 420 --concurrency 4 --workers 1; "
            f"rc=$?; cp -r {mnt} {keep}; exit $rc"
        )
        unshare = ["unshare", "--mount"] if os.geteuid() == 0 else ["unshare", "--user", "--map-root-user", "--mount"]
        out = subprocess.run([*unshare, "sh", "-c", script], capture_output=True, text=True, timeout=600)
    assert out.returncode == 1, out.stderr[-2000:]
    assert f"no space left on device ({db}" in out.stderr
    assert "Future exception was never retrieved" not in out.stderr
    assert "Traceback" not in out.stderr
    assert "cannot rollback" not in out.stderr
    kept = keep / "full.duckdb"
    with Store(kept) as store:  # parts that reached the disk land now; nothing generated became a failure
        stored = store.count_samples()
        assert stored > 0
        assert store.query("SELECT count(*) FROM failures")[0][0] == 0


def _q(arg: str) -> str:
    return "'" + arg.replace("'", "'\\''") + "'"


def test_stats_show_and_a_second_batch_work_while_a_batch_fills_the_store(tmp_path):
    prompts = many_prompts(tmp_path / "p.jsonl", 60)
    db = tmp_path / "live.duckdb"
    with start_simulator(SimConfig(kind="vllm", quirks={"latency": 0.15})) as sim:
        first = subprocess.Popen(
            [
                *TOKVIEW,
                "batch",
                str(prompts),
                "--server",
                sim.url,
                "--db",
                str(db),
                "--max-new-tokens",
                "40",
                "--concurrency",
                "2",
                "--workers",
                "1",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            seen = 0
            deadline = time.monotonic() + 120
            while seen == 0 and time.monotonic() < deadline:
                time.sleep(0.5)
                if not db.exists():
                    continue
                out = subprocess.run(
                    [*TOKVIEW, "stats", "--db", str(db), "--json"], capture_output=True, text=True, timeout=120
                )
                assert out.returncode == 0, out.stderr
                seen = json.loads(out.stdout)["samples"]
            assert first.poll() is None, "the first batch ended before the store could be read beside it"
            assert 0 < seen < 60
            with Store(db) as store:
                some = store.query("SELECT sample_id FROM samples LIMIT 1")[0][0]
                store.record_verdict(some, "approved", who="live-test")  # a verdict lands mid-run
            out = subprocess.run([*TOKVIEW, "show", some, "--db", str(db)], capture_output=True, text=True, timeout=120)
            assert out.returncode == 0, out.stderr
            assert some in out.stdout, out.stderr
            out = subprocess.run(
                [
                    *TOKVIEW,
                    "export",
                    "--db",
                    str(db),
                    "--format",
                    "sharegpt",
                    "--select",
                    "all",
                    "--out",
                    str(tmp_path / "mid.jsonl"),
                ],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert out.returncode == 0, out.stderr
            assert len((tmp_path / "mid.jsonl").read_text().splitlines()) >= seen
            second = subprocess.run(
                [
                    *TOKVIEW,
                    "batch",
                    str(prompts),
                    "--server",
                    sim.url,
                    "--db",
                    str(db),
                    "--max-new-tokens",
                    "40",
                    "--concurrency",
                    "2",
                    "--workers",
                    "1",
                    "--summary-json",
                ],
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert second.returncode == 0, second.stderr
            assert json.loads(second.stdout)["balanced"]
        finally:
            _, err = first.communicate(timeout=300)
        assert first.returncode == 0, err
    ids = stored_ids(db)
    assert len(ids) == len(set(ids)) == 60
    with Store(db) as store:
        assert store.query("SELECT status FROM samples WHERE sample_id = ?", [some]) == [("approved",)]
        assert store.query("SELECT count(*) FROM findings f ANTI JOIN samples s USING (sample_id)")[0][0] == 0


def test_the_vocabulary_fingerprint_is_cached_by_the_tokenizer_files(tmp_path, monkeypatch, kimi_tok_dir):
    from tokview.batch import identity
    from tokview.core.tokenizer import load_tokenizer

    monkeypatch.setenv("TOKVIEW_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "tok"
    shutil.copytree(kimi_tok_dir, folder)
    tok = load_tokenizer(folder)
    assert identity.vocab_fingerprint(tok) == tok.vocab_fingerprint()
    calls = []
    fresh = load_tokenizer(folder)
    fresh.vocab_fingerprint = lambda: calls.append(1) or "recomputed"
    assert identity.vocab_fingerprint(fresh) == tok.vocab_fingerprint()
    assert not calls  # from the cache
    config = folder / "tokenizer_config.json"
    config.write_text(config.read_text() + " ")  # other files: the cache entry no longer applies
    edited = load_tokenizer(folder)
    edited.vocab_fingerprint = lambda: calls.append(1) or "recomputed"
    assert identity.vocab_fingerprint(edited) == "recomputed"
    assert calls == [1]


async def test_reruns_of_a_failing_prompt_keep_one_failure_and_errors_jsonl_lists_it_once(tmp_path):
    from tokview.export import export

    prompts = many_prompts(tmp_path / "p.jsonl", 3)
    with (
        start_simulator(SimConfig(kind="vllm", quirks={"http-500": True})) as sim,
        Store(tmp_path / "f.duckdb") as store,
    ):
        config = BatchConfig(servers=[sim.url], prompts_path=prompts, max_new_tokens=30, retries=0)
        for _ in range(3):
            summary = await run_batch(config, store)
            assert summary.failed == 3
        assert store.stats()["failures"]["total"] == 3
        assert [f["attempts"] for f in store.failures()] == [3, 3, 3]
        failing = sim.url  # a failure names its server (it was null for a request that gave up after retries)
        assert {f["server"] for f in store.failures()} == {failing}
    with start_simulator(SimConfig(kind="vllm")) as sim, Store(tmp_path / "f.duckdb") as store:
        other = tmp_path / "other.jsonl"
        other.write_text(json.dumps({"id": "ok-1", "messages": [{"role": "user", "content": "fine"}]}) + "\n")
        assert (await run_batch(BatchConfig(servers=[sim.url], prompts_path=other, max_new_tokens=30), store)).ok == 1
        export(store, "speculators", tmp_path / "out.jsonl", select="all", tokenizer=kimi(), profile=profile())
    lines = (tmp_path / "out.errors.jsonl").read_text().splitlines()
    assert len(lines) == 3
    assert len({json.loads(x)["metadata"]["sample_id"] for x in lines}) == 3
    assert {json.loads(x)["metadata"]["endpoint"] for x in lines} == {failing}


def test_two_workers_stop_at_once_when_the_parent_cannot_write_a_part(tmp_path):
    """A store whose parts cannot be written (here: the parts folder's name is taken by a file; in
    life, a full disk) once left a `--workers 2` run spinning at 100% CPU forever with no output."""
    prompts = many_prompts(tmp_path / "p.jsonl", 300)
    db = tmp_path / "ro.duckdb"
    (tmp_path / "ro.duckdb.parts").write_text("not a folder")
    with start_simulator(SimConfig(kind="vllm")) as sim:
        out = subprocess.run(
            [*TOKVIEW, "batch", str(prompts), "--server", sim.url, "--db", str(db), "--max-new-tokens", "30"]
            + ["--workers", "2"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert out.returncode == 1, out.stderr[-1500:]
    assert out.stderr.strip().splitlines()[-1] == f"tokview: error: cannot write to {db}.parts: File exists"


async def _filled(db: Path, prompts: Path, sim_config: SimConfig, **config: Any) -> None:
    with start_simulator(sim_config) as sim, Store(db) as store:
        await run_batch(BatchConfig(servers=[sim.url], prompts_path=prompts, max_new_tokens=30, **config), store)


async def test_merge_takes_the_samples_a_killed_batch_left_in_parts(tmp_path):
    """A shard killed mid-run leaves samples in `<shard>.parts/`: merge lands them too (it once merged
    only the file and said nothing of them)."""
    from tokview.core.analysis import analyze

    prompts = many_prompts(tmp_path / "p.jsonl", 3)
    src, into = tmp_path / "shard.duckdb", tmp_path / "all.duckdb"
    await _filled(src, prompts, SimConfig(kind="vllm"))
    with Store(src) as store:
        run_id = store.runs()[0]["run_id"]
        capture = store.load_sample(stored_ids(src)[0]).capture
        store.write_part(
            [
                store.sample_record(
                    SampleIdentity("extra@x_gen0", "extra", run_id), capture, analyze(capture, profile(), kimi())
                )
            ]
        )
        store.close()
    assert len(os.listdir(str(src) + ".parts")) == 1
    with Store(into) as target:
        assert target.merge(src)["samples"] == 4
        assert sorted(stored_ids(into)) == sorted(stored_ids(src))
        assert "extra@x_gen0" in stored_ids(into)


async def test_merge_waits_for_a_source_another_process_holds(tmp_path):
    prompts = many_prompts(tmp_path / "p.jsonl", 2)
    src = tmp_path / "busy.duckdb"
    await _filled(src, prompts, SimConfig(kind="vllm"))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import duckdb, time; c = duckdb.connect({str(src)!r}); print('held', flush=True); time.sleep(1.5)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        said: list[str] = []
        with Store(tmp_path / "all.duckdb", on_wait=said.append) as target:
            assert target.merge(src)["samples"] == 2  # it failed at once with DuckDB's lock message
    finally:
        holder.wait(timeout=30)
    assert said
    assert said[0].startswith(f"waiting for {src}: in use by")


async def test_merge_refuses_a_store_of_another_model_that_holds_only_failures(tmp_path):
    from tokview.store.merge import MergeRefused

    prompts = many_prompts(tmp_path / "p.jsonl", 3)
    ours, theirs = tmp_path / "ours.duckdb", tmp_path / "theirs.duckdb"
    await _filled(ours, prompts, SimConfig(kind="vllm"))
    await _filled(
        theirs, prompts, SimConfig(kind="vllm", model_name="other-model", quirks={"http-500": True}), retries=0
    )
    with Store(theirs) as store:
        assert store.count_samples() == 0
        assert store.query("SELECT count(*) FROM failures")[0][0] == 3
    with Store(ours) as target:
        with pytest.raises(MergeRefused, match="model other-model"):
            target.merge(theirs)
        assert len(target.runs()) == 1
        assert target.query("SELECT count(*) FROM failures")[0][0] == 0


async def test_a_refused_merge_names_a_model_no_server_answered_for(tmp_path, monkeypatch):
    """A shard run without the server's key holds failures of model unknown: the refusal listed the other keys alone,
    and the two identities read the same. (A batch now stops at such a server's probe; a tokview from before that
    wrote such shards, made here with the probe's check of the key left out.)"""
    from tokview.servers import pool
    from tokview.store.merge import MergeRefused

    monkeypatch.delenv("TOKVIEW_API_KEY", raising=False)
    monkeypatch.setattr(pool, "credentials_refused", lambda info: None)
    prompts = many_prompts(tmp_path / "p.jsonl", 3)
    ours, keyless = tmp_path / "ours.duckdb", tmp_path / "keyless.duckdb"
    await _filled(ours, prompts, SimConfig(kind="vllm"))
    await _filled(keyless, prompts, SimConfig(kind="vllm", api_key="sk-needed-123456"), retries=0)
    with Store(keyless) as store:
        assert store.count_samples() == 0 and store.query("SELECT count(*) FROM failures")[0][0] == 3
    with Store(ours) as target, pytest.raises(MergeRefused, match="model unknown") as refused:
        target.merge(keyless)
    assert "no server answered its run's probe" in str(refused.value)
    assert str(refused.value).endswith("merge refused")
