"""Plain-model samples through the rest of tokview: `stats` (with its retokenize-drift count), every
export format read back by tokview's own reader, `audit` of those exports, and the app.

The store is filled the way a batch run fills it (a run row naming the plain tokenizer folder and
the `plain` profile, samples analysed with them); the commands then find tokenizer and profile
from the run, as they would for a user who passes neither.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from plain_tokenizer import IM_END, build_plain_tokenizer_dir

from tokview.batch.inputs import iter_rows
from tokview.cli import main
from tokview.core import segments as seg
from tokview.core.analysis import analyze
from tokview.core.profiles import detect_profile
from tokview.core.record import Capture
from tokview.core.tokenizer import load_tokenizer
from tokview.export import FORMATS
from tokview.store import SampleFilter, Store

ANSWERS = {
    "ok": "The answer is forty-two.",
    "drift": "The capital of France is Paris.",
    "cut": "Once upon a time there was a little robot",
    "hello": "Hello there! How can I help you today?",
}


@pytest.fixture(scope="module")
def plain_dir(tmp_path_factory) -> Path:
    return build_plain_tokenizer_dir(tmp_path_factory.mktemp("plain-tok"))


@pytest.fixture(scope="module")
def tok(plain_dir):
    return load_tokenizer(plain_dir)


def _capture(tok, key: str) -> Capture:
    messages = [{"role": "user", "content": f"Say something ({key})."}]
    prompt = tok.render(messages)
    text = ANSWERS[key]
    answer = [i for ch in text for i in tok.encode(ch)] if key == "drift" else tok.encode(text)
    cut = key == "cut"
    output = answer + ([] if cut else [IM_END])
    return Capture(
        prompt_ids=prompt,
        output_ids=output,
        finish_reason="length" if cut else "stop",
        settings={"temperature": 1.0, "max_new_tokens": 64, "thinking": None},
        messages=messages,
        endpoint="vllm-completions",
        text=tok.decode(output),
        usage={"prompt_tokens": len(prompt), "completion_tokens": len(output)},
    )


@pytest.fixture
def db(tmp_path, plain_dir, tok) -> Path:
    path = tmp_path / "plain.duckdb"
    profile = detect_profile(tok)
    with Store(path) as store:
        store.put_run("run-plain", profile="plain", tokenizer_dir=str(plain_dir), tokenizer_hash=tok.fingerprint())
        for key in ANSWERS:
            cap = _capture(tok, key)
            store.put_sample(
                f"{key}@0", key, "run-plain", cap, analyze(cap, profile, tok), gen_index=0, profile="plain"
            )
    return path


def _run(capsys, *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def test_stats_says_how_many_samples_drift(db, capsys):
    data = json.loads(_run(capsys, "stats", "--db", str(db), "--json"))
    assert data["retokenize_drift"] == 1
    assert data["samples"] == 4
    assert data["valid"] == 3  # the cut one is truncated; the drifted one is valid (a warning)
    assert "retokenize drift 1 samples" in _run(capsys, "stats", "--db", str(db))


def test_stats_says_zero_drift_out_loud(tmp_path, capsys):
    with Store(tmp_path / "empty.duckdb"):
        pass
    assert json.loads(_run(capsys, "stats", "--db", str(tmp_path / "empty.duckdb"), "--json"))["retokenize_drift"] == 0
    assert "retokenize drift 0 samples" in _run(capsys, "stats", "--db", str(tmp_path / "empty.duckdb"))


def test_every_export_of_plain_samples_reads_back_exactly(db, tok, tmp_path, capsys):
    with Store(db) as store:
        caps = {key: store.load_sample(f"{key}@0").capture for key in ANSWERS}
    for fmt in FORMATS:
        out = tmp_path / f"{fmt}.{'parquet' if fmt == 'parquet' else 'jsonl'}"
        _run(capsys, "export", "--db", str(db), "--format", fmt, "--out", str(out), "--select", "all")
        rows = [row for _, row in iter_rows(out)]
        assert len(rows) == len(ANSWERS), fmt
        for row in rows:
            if fmt in ("speculators", "parquet"):
                key = (row["metadata"]["tokview_sample_id"] if fmt == "speculators" else row["sample_id"]).split("@")[0]
                cap = caps[key]
                assert list(row["input_ids"]) == cap.prompt_ids + cap.output_ids
                assert list(row["loss_mask"]) == [0] * len(cap.prompt_ids) + [1] * len(cap.output_ids)
                continue
            if fmt == "trajectory":  # a single-turn sample is a one-turn conversation: its served ids
                (turn,) = row["metadata"]["turns"]
                cap = caps[turn["sample_id"].split("@")[0]]
                assert row["input_ids"] == cap.prompt_ids + cap.output_ids
                assert row["loss_mask"] == [0] * len(cap.prompt_ids) + [1] * len(cap.output_ids)
                continue
            key = row["id"]
            last = row["conversations"][-1]
            said = last.get("content", last.get("value"))
            answer = caps[key].output_ids[:-1] if caps[key].finish_reason == "stop" else caps[key].output_ids
            assert said == tok.decode(answer), (fmt, key)
            assert "reasoning_content" not in last, (fmt, key)
        manifest = (
            json.loads(out.with_name(out.name + ".manifest.json").read_text())
            if out.with_name(out.name + ".manifest.json").exists()
            else None
        )
        if manifest is not None:
            assert manifest["parser"]["reasoning_parser"] == [], manifest["parser"]


def test_audit_reads_plain_exports_back(db, plain_dir, tok, tmp_path, capsys):
    with Store(db) as store:
        caps = {key: store.load_sample(f"{key}@0").capture for key in ANSWERS}
    spec = tmp_path / "spec.jsonl"
    forge = tmp_path / "forge.jsonl"
    _run(capsys, "export", "--db", str(db), "--format", "speculators", "--out", str(spec), "--select", "all")
    _run(capsys, "export", "--db", str(db), "--format", "specforge", "--out", str(forge), "--select", "all")
    audited = tmp_path / "audit.duckdb"
    for path in (spec, forge):  # thinking defaults to on: a plain tokenizer's rows are answers all the same
        _run(capsys, "audit", str(path), "--db", str(audited), "--tokenizer", str(plain_dir))
    with Store(audited) as store:
        ids = {r.prompt_id: r for r in store.samples_page(SampleFilter(run_id="audit-spec"), limit=100)}
        assert set(ids) == set(ANSWERS)
        for key, r in ids.items():  # ids rows: exactly the stored ids, drift still seen
            got = store.load_sample(r.sample_id)
            assert got.profile == "plain"
            assert got.capture.input_ids == caps[key].input_ids
            assert not any(c.startswith("think") or c == "literal_think_text" for c in r.codes)
            assert ("retokenize_drift" in r.codes) == (key == "drift")
        texts = {
            r.prompt_id: store.load_sample(r.sample_id)
            for r in store.samples_page(SampleFilter(run_id="audit-forge"), limit=100)
        }
    assert texts["ok"].capture.input_ids == caps["ok"].input_ids
    assert texts["ok"].valid
    assert texts["ok"].capture.settings["thinking"] is None
    # A text row cannot give the drifted ids back: re-encoding its text yields other (canonical) ids.
    drift = caps["drift"].output_ids
    assert texts["drift"].capture.output_ids != drift
    assert texts["drift"].capture.output_ids[:-1] == tok.encode(tok.decode(drift[:-1]))


async def test_the_app_opens_a_plain_sample(db):
    from ui.helpers import settle

    from tokview.ui import display as d
    from tokview.ui.app import TokviewApp
    from tokview.ui.screens.inspect import InspectScreen
    from tokview.ui.session import Session

    with Store(db) as store:
        app = TokviewApp(Session(store))
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(app, pilot)
            app.open_sample("ok@0")
            await settle(app, pilot)
            screen = app.screen
            assert isinstance(screen, InspectScreen)
            assert screen.profile.name == "plain"
            assert screen.profile.stop_ids == (IM_END, 0)
            seq = screen.served.seq
            assert seq.pieces[-1] == "<|im_end|>"
            n_answer = len(seq.ids) - seq.n_prompt - 1
            assert list(screen.data.analysis.kinds[seq.n_prompt :]) == [seg.ANSWER] * n_answer + [seg.STOP]
            assert d.CLASS_INDEX["delimiter"] not in seq.classes[seq.n_prompt :]
            assert screen.data.analysis.codes == []
            from tokview.ui.screens.stats import StatsScreen

            app.action_stats()  # the stats plots: no closer id to measure reasoning by
            await settle(app, pilot)
            assert isinstance(app.screen, StatsScreen)


def test_doctor_on_a_plain_model_behind_a_reasoning_parser(plain_dir, capsys):
    """A server started with a reasoning parser for a model without think delimiters puts the whole answer
    in `reasoning` (the simulator's parser-all-reasoning quirk): the doctor says so, and what to do, in the
    plain profile's words. Without the quirk the simulator serves it as a real server would: no findings."""
    from tokview.sim import SimConfig, start_simulator

    with start_simulator(SimConfig(kind="vllm", tokenizer_dir=plain_dir)) as sim:
        assert main(["doctor", "--server", sim.url, "--tokenizer", str(plain_dir), "--json"]) == 0
        capsys.readouterr()
        model = httpx.get(f"{sim.url}/v1/models").json()["data"][0]["id"]
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20}
        message = httpx.post(f"{sim.url}/v1/chat/completions", json=body).json()["choices"][0]["message"]
        assert message["content"]
        assert not message.get("reasoning")
    with start_simulator(SimConfig(kind="vllm", tokenizer_dir=plain_dir, quirks={"parser-all-reasoning": True})) as sim:
        assert main(["doctor", "--server", sim.url, "--tokenizer", str(plain_dir), "--json"]) == 3
    data = json.loads(capsys.readouterr().out)
    assert data["profile"] == "plain"
    checks = {c["title"]: c for c in data["checks"]}
    assert checks["Think opener in the prompt"]["ok"] is True
    assert "no think delimiters" in checks["Think opener in the prompt"]["detail"]
    parser = checks["Reasoning parser"]
    assert parser["ok"] is False
    assert "has no think delimiters" in parser["detail"]
    assert parser["recommendation"].startswith("start the server without --reasoning-parser")
    assert all(checks[t]["ok"] is True for t in ("Token-id fields", "output_ids honesty", "Local tokenizer"))


def test_batch_loads_a_plain_tokenizer_without_profile(plain_dir, tmp_path, capsys):
    """`tokview batch … --tokenizer <plain folder>` runs without --profile, on the plain profile."""
    from tokview.sim import SimConfig, start_simulator

    root = Path(__file__).resolve().parents[1]
    db = tmp_path / "batch.duckdb"
    with start_simulator(SimConfig(kind="vllm", tokenizer_dir=plain_dir)) as sim:
        assert (
            main(
                [
                    "batch",
                    str(root / "sample_data" / "openai_messages.jsonl"),
                    "--server",
                    sim.url,
                    "--tokenizer",
                    str(plain_dir),
                    "--db",
                    str(db),
                    "--limit",
                    "3",
                    "--max-new-tokens",
                    "300",
                    "--temperature",
                    "0",
                ]
            )
            == 0
        )
    capsys.readouterr()
    with Store(db) as store:
        assert [r["profile"] for r in store.runs()] == ["plain"]
        rows = store.samples_page(limit=10)
        assert len(rows) == 3
        for row in rows:
            sample = store.load_sample(row.sample_id)
            cap = sample.capture
            assert sample.profile == "plain"
            assert cap.thinking is None  # nothing to switch, nothing recorded
            assert cap.settings["chat_template_kwargs"] == {}
            assert cap.output_ids[-1] == IM_END
            assert sample.valid, row.codes
            assert not [c for c in row.codes if c.startswith("think")], row.codes
