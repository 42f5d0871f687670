"""Schema version 5: spec-decode metrics, top-K logprobs and target scores stored with the sample."""

from __future__ import annotations

import duckdb
from builders import kimi, make_capture, profile

from tokview.core.analysis import analyze
from tokview.core.spec_decode import SpecDecode
from tokview.store import SampleFilter, Store
from tokview.store.schema import MIGRATIONS
from tokview.store.token_data import put_target_score


def _put(store, sid, **fields):
    cap = make_capture()
    for k, v in fields.items():
        setattr(cap, k, v)
    store.put_sample(sid, sid.split("@")[0], "r", cap, analyze(cap, profile(), kimi()))
    return cap


def test_side_data_round_trips(tmp_path):
    spec = SpecDecode(
        "vllm",
        2,
        6,
        3,
        histogram=[0, 1, 1, 0],
        per_step_accepted=[1, 2],
        per_step_drafted=[3, 3],
        num_spec_tokens=3,
        reported={"mean_acceptance_length": 2.5},
    ).to_dict()
    with Store(tmp_path / "s.duckdb") as store:
        cap = _put(
            store,
            "a@x_gen0",
            spec_decode=spec,
            output_logprobs=[-0.5] * 3,
            output_top_ids=[[1, 2]] * 3,
            output_top_logprobs=[[-0.5, -1.5]] * 3,
        )
        got = store.load_sample("a@x_gen0").capture
        assert got.spec_decode == spec
        assert got.output_top_ids == [[1, 2]] * 3
        assert got.output_top_logprobs == [[-0.5, -1.5]] * 3
        assert got.output_logprobs == [-0.5] * 3
        assert got.target_logprobs is None
        assert got.target_score is None
        assert store.query("SELECT acceptance_length FROM samples") == [(2.5,)]
        assert len(cap.output_ids) > 0


def test_target_score_update_keeps_everything_else(tmp_path):
    with Store(tmp_path / "s.duckdb") as store:
        cut = make_capture(stop=False)
        cap = _put(store, "a@x_gen0", finish_reason="length", output_ids=cut.output_ids, matched_stop=None)  # truncated
        store.record_verdict("a@x_gen0", "approved")
        before = store.load_sample("a@x_gen0")
        cap.target_logprobs = [-3.0] * len(cap.output_ids)
        cap.target_score = {"model": "m", "mean_nll": 3.0, "off_policy_nll": 2.0, "low_prob": 0.01}
        from tokview.batch.scoring import off_policy_finding

        finding = off_policy_finding(cap)
        put_target_score(store, "a@x_gen0", cap, finding)
        put_target_score(store, "a@x_gen0", cap, finding)  # twice: one finding, one code
        after = store.load_sample("a@x_gen0")
        assert after.status == "approved"
        assert after.valid == before.valid
        assert after.n_errors == before.n_errors
        assert [f.code for f in after.findings].count("off_policy") == 1
        row = store.samples_page()[0]
        assert row.codes.count("off_policy") == 1
        assert set(row.codes) == {f.code for f in before.findings} | {"off_policy"}
        assert "truncated" in row.codes
        assert row.mean_nll == 3.0
        assert after.capture.output_ids == before.capture.output_ids
        cap.target_score = {**cap.target_score, "off_policy_nll": 5.0}
        put_target_score(store, "a@x_gen0", cap, off_policy_finding(cap))  # a looser threshold clears it
        assert "off_policy" not in store.samples_page()[0].codes
        assert "off_policy" not in [f.code for f in store.load_sample("a@x_gen0").findings]


def test_sort_and_filter_by_acceptance_length_and_mean_nll(tmp_path):
    with Store(tmp_path / "s.duckdb") as store:
        for sid, acc, nll in (("a@x_gen0", 1.5, 0.2), ("b@x_gen0", 3.0, 2.5), ("c@x_gen0", None, None)):
            spec = None if acc is None else SpecDecode("vllm", 2, 6, int((acc - 1) * 2)).to_dict()
            cap = _put(store, sid, spec_decode=spec)
            if nll is not None:
                cap.target_logprobs, cap.target_score = [-nll], {"mean_nll": nll}
                put_target_score(store, sid, cap, None)
        assert [r.sample_id for r in store.samples_page(order_by="acceptance_length")] == [
            "a@x_gen0",
            "b@x_gen0",
            "c@x_gen0",
        ]
        assert [r.sample_id for r in store.samples_page(order_by="-mean_nll")][:2] == ["b@x_gen0", "a@x_gen0"]
        assert [r.sample_id for r in store.samples_page(SampleFilter(max_acceptance=2.0))] == ["a@x_gen0"]
        assert store.count_samples(SampleFilter(max_nll=1.0)) == 1
        row = store.samples_page(SampleFilter(max_nll=1.0))[0]
        assert (row.acceptance_length, row.mean_nll) == (1.5, 0.2)


def test_a_version_2_file_gains_the_columns_with_its_data(tmp_path):
    path = tmp_path / "v2.duckdb"
    conn = duckdb.connect(str(path))
    conn.execute("CREATE TABLE schema_version (version INTEGER, name VARCHAR, applied_at TIMESTAMP)")
    for version, name, statements in MIGRATIONS:
        if version > 2:
            break
        for sql in statements:
            conn.execute(sql)
        conn.execute("INSERT INTO schema_version VALUES (?, ?, now())", [version, name])
    conn.close()
    with Store(path) as store:
        _put(store, "old@x_gen0")
    with Store(path) as store:  # reopening: nothing re-applied
        got = store.load_sample("old@x_gen0").capture
        assert got.spec_decode is None
        assert got.output_top_ids is None
        assert got.target_score is None
        assert store.query("SELECT max(version) FROM schema_version")[0][0] >= 5
