"""Exports carry per-position logprobs / top-K / target scores where captured; --select thresholds."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import duckdb
import pytest
from builders import kimi, profile, put_foreign

from tokview.batch import BatchConfig, run_batch
from tokview.batch.scoring import ScoreConfig, run_score
from tokview.cli import main
from tokview.export import export
from tokview.sim import SimConfig, start_simulator
from tokview.store import Store

PROMPTS = Path(__file__).resolve().parents[1] / "sample_data" / "plain_prompts.jsonl"


def _config(url: str, **kw) -> BatchConfig:
    """The plain prompts against one simulator, Kimi tokenizer and profile."""
    kw.setdefault("max_new_tokens", 120)
    return BatchConfig(
        servers=[url], prompts_path=PROMPTS, tokenizer=kimi(), model_profile=profile(), timeout=10.0, **kw
    )


@pytest.fixture(scope="module")
def scored_db(tmp_path_factory):
    """3 simulator samples with spec metrics and top-2 logprobs, 1 foreign import; all scored with top-2."""
    db = tmp_path_factory.mktemp("exp") / "s.duckdb"
    with start_simulator(SimConfig(kind="vllm", spec_decode="vllm-detailed")) as sim, Store(db) as store:
        asyncio.run(run_batch(_config(sim.url, logprobs=2, limit=3), store))
        put_foreign(store, "foreign@x_gen0")
        asyncio.run(run_score(ScoreConfig(servers=[sim.url], top_k=2), store))
    return db


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_speculators_rows_gain_aligned_optional_fields(scored_db, tmp_path):
    out = tmp_path / "s.jsonl"
    with Store(scored_db) as store:
        export(store, "speculators", out, select="all", tokenizer=kimi(), profile=profile())
        for row in _rows(out):
            cap = store.load_sample(row["metadata"]["tokview_sample_id"]).capture
            n_out = len(row["input_ids"]) - row["loss_mask"].index(1)
            assert row["input_ids"] == cap.prompt_ids + cap.output_ids  # unchanged: what trainers read
            assert len(row["target_logprobs"]) == len(row["target_top_ids"]) == n_out
            assert row["target_score"]["model"] == "tokview-sim"
            if cap.output_logprobs is not None:
                assert row["output_logprobs"] == pytest.approx(cap.output_logprobs)
                assert row["output_top_ids"] == cap.output_top_ids
                assert len(row["output_top_ids"][0]) == 2
            else:
                assert "output_logprobs" not in row  # only what was captured
    # another pipeline's reader (tokview audit) still reads the rows as plain speculators rows
    assert main(["audit", str(out), "--db", str(tmp_path / "a.duckdb")]) == 0


def test_parquet_columns_when_captured(scored_db, tmp_path):
    out = tmp_path / "p.parquet"
    with Store(scored_db) as store:
        export(store, "parquet", out, select="all", tokenizer=kimi(), profile=profile())
        stored = {
            r[0]: r[1:]
            for r in store.query(
                "SELECT sample_id, output_logprobs, target_logprobs, acceptance_length, mean_nll FROM samples"
            )
        }
    con = duckdb.connect()
    cols = [d[0] for d in con.execute(f"SELECT * FROM read_parquet('{out}') LIMIT 0").description]
    for col in (
        "output_logprobs",
        "output_top_ids",
        "output_top_logprobs",
        "target_logprobs",
        "target_top_ids",
        "target_top_logprobs",
        "acceptance_length",
        "mean_nll",
        "input_ids",
        "loss_mask",
    ):
        assert col in cols
    for sid, olp, tlp, acc, nll in con.execute(
        f"SELECT sample_id, output_logprobs, target_logprobs, acceptance_length, mean_nll FROM read_parquet('{out}')"
    ).fetchall():
        s_olp, s_tlp, s_acc, s_nll = stored[sid]
        assert (olp, acc, nll) == (s_olp, s_acc, s_nll)
        assert tlp == pytest.approx(s_tlp)


def test_no_side_data_no_extra_fields(tmp_path):
    with start_simulator(SimConfig(kind="vllm")) as sim, Store(tmp_path / "plain.duckdb") as store:
        asyncio.run(run_batch(_config(sim.url, limit=2), store))
        export(store, "speculators", tmp_path / "s.jsonl", select="all", tokenizer=kimi(), profile=profile())
        export(store, "parquet", tmp_path / "p.parquet", select="all", tokenizer=kimi(), profile=profile())
    assert all(
        set(r) == {"id", "primary_id", "input_ids", "loss_mask", "text", "metadata"}
        for r in _rows(tmp_path / "s.jsonl")
    )
    cols = [
        d[0]
        for d in duckdb.connect().execute(f"SELECT * FROM read_parquet('{tmp_path / 'p.parquet'}') LIMIT 0").description
    ]
    assert not {"output_logprobs", "target_logprobs", "acceptance_length", "mean_nll"} & set(cols)


def test_select_thresholds_and_manifest(scored_db, tmp_path, capsys):
    with Store(scored_db) as store:
        accs = sorted(
            r[0] for r in store.query("SELECT acceptance_length FROM samples WHERE acceptance_length IS NOT NULL")
        )
    middle = accs[1]
    out = tmp_path / "hard.jsonl"
    assert (
        main(
            [
                "export",
                "--db",
                str(scored_db),
                "--format",
                "speculators",
                "--out",
                str(out),
                "--select",
                "all",
                "--max-acceptance",
                str(middle),
            ]
        )
        == 0
    )
    kept = _rows(out)
    assert len(kept) == sum(1 for a in accs if a <= middle) == 2
    manifest = json.loads((tmp_path / "hard.manifest.json").read_text())
    th = manifest["thresholds"]
    assert th["max_acceptance"] == middle
    assert th["max_nll"] is None
    assert th["left_out_no_spec_decode"] == 1
    assert th["left_out_above_max_acceptance"] == 1  # the import, the easy one

    out = tmp_path / "on.jsonl"
    assert (
        main(
            [
                "export",
                "--db",
                str(scored_db),
                "--format",
                "speculators",
                "--out",
                str(out),
                "--select",
                "all",
                "--max-nll",
                "2.0",
            ]
        )
        == 0
    )
    ids = {r["metadata"]["tokview_sample_id"] for r in _rows(out)}
    assert len(ids) == 3
    assert "foreign@x_gen0" not in ids
    th = json.loads((tmp_path / "on.manifest.json").read_text())["thresholds"]
    assert (th["max_nll"], th["left_out_above_max_nll"], th["left_out_not_scored"], th["left_out"]) == (2.0, 1, 0, 1)
    # the summary says it too (it said only "exported 3 of 3 selected samples")
    assert (
        "the thresholds left out 1 sample of the selection; of the samples before the thresholds: 1 above --max-nll"
        in (capsys.readouterr().err)
    )

    capsys.readouterr()
    assert (
        main(
            [
                "export",
                "--db",
                str(scored_db),
                "--format",
                "speculators",
                "--out",
                str(tmp_path / "x.jsonl"),
                "--select",
                "all",
                "--max-acceptance",
                "0.5",
            ]
        )
        == 1
    )
    assert "no samples match --select all --max-acceptance 0.5" in capsys.readouterr().err


def test_a_logprob_that_is_not_finite_is_written_as_null_never_as_a_token_strict_json_refuses(tmp_path):
    """A server's NaN or -inf logprob is kept as served; the JSONL held Python's `NaN`/`-Infinity`, which `jq`, serde
    and JS readers refuse, losing the whole file over one value."""
    import dataclasses
    import math

    from builders import make_capture, put

    capture = make_capture()
    logprobs = [-0.5] * len(capture.output_ids)
    logprobs[1], logprobs[2] = math.nan, -math.inf
    with Store(tmp_path / "s.duckdb") as store:
        put(store, "odd", dataclasses.replace(capture, output_logprobs=logprobs))
        export(store, "speculators", tmp_path / "s.jsonl", select="all", tokenizer=kimi(), profile=profile())

    def strict(token: str) -> None:
        raise AssertionError(f"not JSON: {token}")

    [row] = [json.loads(line, parse_constant=strict) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert row["output_logprobs"][:4] == [-0.5, None, None, -0.5]
