"""Batch review fixes: model-aware sample ids, range checks, URL validation, per-sample errors, no credentials."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from test_servers_recordings import OUTPUT, Replay, serve, vllm_routes
from test_store_fixtures import kimi, profile

from tokview.batch import BatchConfig, InputError, run_batch
from tokview.batch.inputs import iter_rows
from tokview.cli import main
from tokview.sim import SimConfig, start_simulator
from tokview.store import Store

SAMPLES = Path(__file__).resolve().parents[1] / "sample_data"
PROMPTS = SAMPLES / "plain_prompts.jsonl"


def _config(url: str, **kw) -> BatchConfig:
    return BatchConfig(
        servers=[url],
        prompts_path=PROMPTS,
        tokenizer=kimi(),
        model_profile=profile(),
        max_new_tokens=kw.pop("max_new_tokens", 60),
        timeout=kw.pop("timeout", 10.0),
        **kw,
    )


async def test_another_model_into_the_same_store_is_not_a_resume(tmp_path):
    with Store(tmp_path / "m.duckdb") as store:
        with start_simulator(SimConfig(kind="vllm", model_name="model-a")) as a:
            first = await run_batch(_config(a.url, limit=3), store)
        with start_simulator(SimConfig(kind="vllm", model_name="model-b")) as b:
            second = await run_batch(_config(b.url, limit=3), store)
        assert (first.ok, second.ok, second.resumed) == (3, 3, 0) and first.run_id != second.run_id
        with start_simulator(SimConfig(kind="vllm", model_name="model-a")) as moved:  # same model, other port
            again = await run_batch(_config(moved.url, limit=3), store)
        assert (again.ok, again.resumed, again.run_id) == (0, 3, first.run_id)
        models = {r["run_id"]: r["settings"]["model"] for r in store.runs()}
        assert models == {first.run_id: "model-a", second.run_id: "model-b"}


async def test_a_named_run_is_not_overwritten_by_another_model(tmp_path):
    with Store(tmp_path / "n.duckdb") as store:
        with start_simulator(SimConfig(kind="vllm", model_name="model-a")) as a:
            await run_batch(_config(a.url, limit=2, run="mine"), store)
        with start_simulator(SimConfig(kind="vllm", model_name="model-b")) as b:
            with pytest.raises(InputError, match="run mine was made with other model"):
                await run_batch(_config(b.url, limit=2, run="mine"), store)
        assert store.runs()[0]["settings"]["model"] == "model-a"


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--retries", "-1"], "--retries must be 0 or more"),
        (["--timeout", "-1"], "--timeout must be more than 0"),
        (["--timeout", "0"], "--timeout must be more than 0"),
        (["--limit", "-1"], "--limit must be at least 1"),
        (["--limit", "0"], "--limit must be at least 1"),
        (["--concurrency", "0"], "--concurrency must be at least 1"),
        (["--samples-per-prompt", "0"], "--samples-per-prompt must be at least 1"),
        (["--max-new-tokens", "0"], "--max-new-tokens must be at least 1"),
        (["--top-p", "1.5"], "--top-p must be between 0 and 1"),
        (["--top-p", "-0.1"], "--top-p must be between 0 and 1"),
        (["--temperature", "-1"], "--temperature must be 0 or more"),
        (["--server", "http://127.0.0.1:99999"], "out of range"),
        (["--server", "http://"], "bad server URL"),
        (["--server", "ftp://127.0.0.1:8000"], "http:// or https://"),
    ],
)
def test_bad_numbers_and_urls_are_one_line_usage_errors(tmp_path, capsys, flags, message):
    db = tmp_path / "never.duckdb"
    server = [] if "--server" in flags else ["--server", "http://127.0.0.1:9"]
    code = main(["batch", str(PROMPTS), "--db", str(db), *server, *flags])
    err = capsys.readouterr().err
    assert code == 1 and message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not db.exists()  # refused before the database file was created


def _routes_with_output(ids: list[int]) -> dict:
    routes = vllm_routes()
    comp = copy.deepcopy(routes["/v1/completions"][0]["json"])
    comp["choices"][0]["token_ids"] = ids
    routes["/v1/completions"] = [{"json": comp}]
    return routes


async def test_an_error_on_one_sample_is_recorded_and_the_run_goes_on(tmp_path):
    """An id no tokenizer (or DuckDB INTEGER) holds: analysing it fails; the batch records why, not crash."""
    with (
        serve(Replay(_routes_with_output(OUTPUT[:3] + [2**40] + OUTPUT[3:]))) as url,
        Store(tmp_path / "e.duckdb") as store,
    ):
        summary = await run_batch(_config(url, limit=2, retries=0), store)
        assert (summary.ok, summary.failed, summary.exit_code) == (0, 2, 3) and summary.balanced
        reasons = [r[0] for r in store.query("SELECT reason FROM failures")]
        assert len(reasons) == 2 and all(r.startswith("unexpected error: ") for r in reasons)


def test_credentials_in_the_server_url_reach_neither_stderr_nor_the_store(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TOKVIEW_API_KEY", "sk-envkey-123")
    db = tmp_path / "c.duckdb"
    with start_simulator(SimConfig(kind="vllm", quirks={"http-500": True})) as sim:
        url = sim.url.replace("http://", "http://alice:tok3n@")
        code = main(
            [
                "batch",
                str(PROMPTS),
                "--server",
                url,
                "--db",
                str(db),
                "--limit",
                "2",
                "--retries",
                "0",
                "--max-new-tokens",
                "20",
                "--summary-json",
            ]
        )
    out = capsys.readouterr()
    assert code == 3
    with Store(db) as store:
        dump = " ".join(
            str(v)
            for table in ("samples", "runs", "failures")
            for row in store.query(f"SELECT * FROM {table}")
            for v in row
        )
    for text in (out.out, out.err, dump):
        assert "tok3n" not in text and "sk-envkey-123" not in text and "alice" not in text


def test_iter_rows_is_the_public_reader_for_jsonl_and_parquet(tmp_path):
    import duckdb

    pq = tmp_path / "p.parquet"
    duckdb.connect().execute(f"COPY (SELECT * FROM read_json_auto('{PROMPTS}') LIMIT 3) TO '{pq}' (FORMAT parquet)")
    from_jsonl = [row for _, row in iter_rows(PROMPTS)][:3]
    from_parquet = [row for _, row in iter_rows(pq)]
    assert [r["id"] for r in from_parquet] == [r["id"] for r in from_jsonl]


def test_audit_reads_a_parquet_dataset_like_its_jsonl(tmp_path):
    import duckdb
    from test_store_fixtures import make_capture, put

    from tokview.export import export
    from tokview.export.audit import audit

    with Store(tmp_path / "src.duckdb") as src:
        put(src, "p1", make_capture())
        put(src, "p2", make_capture(answer="two"))
        export(src, "speculators", tmp_path / "d.jsonl", select="all", tokenizer=kimi(), profile=profile())
    pq = tmp_path / "d.parquet"
    duckdb.connect().execute(
        f"COPY (SELECT * FROM read_json_auto('{tmp_path / 'd.jsonl'}')) TO '{pq}' (FORMAT parquet)"
    )
    with Store(tmp_path / "a.duckdb") as store:
        from_jsonl = audit(store, tmp_path / "d.jsonl", tokenizer=kimi(), profile=profile())
        from_parquet = audit(store, pq, tokenizer=kimi(), profile=profile())
    assert from_jsonl.imported == from_parquet.imported == 2 and from_parquet.by_code == from_jsonl.by_code


async def test_an_edited_tokenizer_config_still_resumes(tmp_path):
    """Sample ids carry the vocabulary's identity, not the tokenizer files' bytes."""
    import json
    import shutil

    from tokview.core.kimi_layout import kimi_tokenizer_dir
    from tokview.core.tokenizer import load_tokenizer

    edited = tmp_path / "tok"
    shutil.copytree(kimi_tokenizer_dir(), edited)
    config = json.loads((edited / "tokenizer_config.json").read_text())
    config["model_max_length"] = 12345  # a config edit that changes no id's meaning
    (edited / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    other = load_tokenizer(edited)
    assert other.fingerprint() != kimi().fingerprint()
    with Store(tmp_path / "v.duckdb") as store, start_simulator(SimConfig(kind="vllm")) as sim:
        first = await run_batch(_config(sim.url, limit=3), store)
        again = await run_batch(
            BatchConfig(
                servers=[sim.url],
                prompts_path=PROMPTS,
                tokenizer=other,
                model_profile=profile(),
                max_new_tokens=60,
                limit=3,
            ),
            store,
        )
        assert (first.ok, again.ok, again.resumed, again.run_id) == (3, 0, 3, first.run_id)
        assert store.runs()[0]["tokenizer_hash"] == kimi().fingerprint()  # the file hash is still recorded


def test_an_unreachable_server_exits_2_and_leaves_no_database(tmp_path, capsys):
    db = tmp_path / "sub" / "never.duckdb"
    code = main(
        ["batch", str(PROMPTS), "--server", "http://127.0.0.1:9", "--db", str(db), "--retries", "0", "--timeout", "2"]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and not db.exists() and not db.parent.exists()
    assert err.startswith("tokview: error: server unreachable: ") and len(err.splitlines()) == 1, err


def test_a_server_that_reports_no_model_adds_no_model_key():
    from tokview.batch.runner import served_identity

    class Reported:
        def __init__(self, *models):
            self.models = models

        def server_info(self):
            return [{"url": "http://127.0.0.1:1", "model": m} for m in self.models]

    assert "model" not in served_identity(Reported(None), kimi(), profile())
    named = served_identity(Reported("kimi"), kimi(), profile())
    assert named == {"model": "kimi", "tokenizer": kimi().vocab_fingerprint(), "profile": profile().name}
