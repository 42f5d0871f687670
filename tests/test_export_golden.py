"""Golden files for every export format, and the trainers' field names.

Set TOKVIEW_UPDATE_GOLDEN=1 to rewrite tests/golden/ after a deliberate format change (then review
the diff: these files are the contract with SpecForge, speculators, TorchSpec and EAGLE users).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import duckdb
import pytest
from builders import IM_END, kimi, make_capture, profile, put

from tokview.core.prompts import parse_row
from tokview.core.record import Capture
from tokview.export import ExportError, export
from tokview.store import Store

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("TOKVIEW_UPDATE_GOLDEN") == "1"
VOLATILE = ("created_at",)


def _no_thinking() -> Capture:
    tok = kimi()
    messages = [{"role": "user", "content": "hello"}]
    prompt = tok.render(messages, template_kwargs={"thinking": False})
    output = tok.encode("Hello world !") + [IM_END]
    return Capture(
        prompt_ids=prompt,
        output_ids=output,
        finish_reason="stop",
        content="Hello world !",
        settings={"temperature": 0.0, "thinking": False, "max_new_tokens": 64},
        messages=messages,
        endpoint="sglang-generate",
        server_url="http://127.0.0.1:30000",
        server_kind="sglang",
        server_version="0.5.9",
        usage={"prompt_tokens": len(prompt), "completion_tokens": len(output)},
    )


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("golden") / "g.duckdb"
    s = Store(path)
    s.put_run(
        "run1",
        settings={"temperature": 0.0},
        profile="kimi-k2.5",
        tokenizer_hash=kimi().fingerprint(),
        server_info=[{"url": "http://127.0.0.1:8000", "kind": "vllm", "version": "0.16.0"}],
    )
    put(s, "conv-a", make_capture())
    put(s, "conv-a", make_capture(answer="The answer is two"), index=1)
    history = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "Hello world !"}]
    put(s, "conv-b", make_capture(question="why", history=history, answer="because"), turn=1)
    put(s, "conv-c", make_capture(finish_reason="length", stop=False, answer="so"))
    put(s, "conv-d", _no_thinking())
    empty = make_capture()
    empty.output_ids = []
    put(s, "conv-e", empty)
    s.put_failure("conv-f", "conv-f@x_gen0", "run1", "HTTP 500 after 3 retries", server="http://127.0.0.1:8000")
    yield s
    s.close()


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _stable_manifest(path: Path) -> dict:
    m = json.loads(path.read_text())
    for key in VOLATILE:
        m.pop(key)
    # the fingerprint hashes the tokenizer files, which the installed transformers writes: check, then mask
    fingerprint = kimi().fingerprint()
    assert m["tokenizer"]["hash"] == fingerprint
    assert all(r["tokenizer_hash"] == fingerprint for r in m["runs"])
    m["tokenizer"]["hash"] = "<fingerprint>"
    for r in m["runs"]:
        r["tokenizer_hash"] = "<fingerprint>"
    m["data"] = m["data"].replace(".parquet", "").replace(".jsonl", "")
    assert len(m.pop("data_sha256")) == 64
    assert m.pop("data_bytes") > 0  # checked against the file elsewhere
    m["tokenizer"]["source"] = "<source>"
    return m


def _check(name: str, value) -> None:
    golden = GOLDEN / f"{name}.json"
    text = json.dumps(value, indent=1, ensure_ascii=False, sort_keys=True) + "\n"
    if UPDATE:
        golden.write_text(text)
    assert golden.exists(), f"missing golden file {golden}: run with TOKVIEW_UPDATE_GOLDEN=1 and review it"
    assert json.loads(text) == json.loads(golden.read_text())


@pytest.mark.parametrize("fmt", ["speculators", "specforge", "sharegpt"])
def test_jsonl_formats_match_golden(store, tmp_path, fmt):
    out = tmp_path / f"{fmt}.jsonl"
    result = export(store, fmt, out, select="all", tokenizer=kimi(), profile=profile())
    # specforge: one ChatTemplate per file, from the layout most samples were served with (thinking on);
    # the thinking-off sample would be masked wrongly by it, so it is refused, not written
    refused = {"no_supervised_tokens": 1, **({"other_served_layout": 1} if fmt == "specforge" else {})}
    assert result.refused == refused
    assert result.exported == 6 - sum(refused.values())
    assert result.selected == 6
    _check(f"{fmt}.rows", _jsonl(out))
    _check(f"{fmt}.manifest", _stable_manifest(result.manifest_path))
    _check(f"{fmt}.token_freq", json.loads(result.token_freq_path.read_text()))
    if fmt == "specforge":
        _check("specforge.template", json.loads(result.template_path.read_text()))


def test_kimi_inline_is_refused_when_the_template_writes_its_own_think_tags(store, tmp_path):
    # the Kimi-layout template renders <think></think> for an assistant message without reasoning_content,
    # so reasoning inline in content would render as <think></think><think>…: never a silent broken file
    with pytest.raises(ExportError, match="kimi-inline refused: the run's chat template writes its own <think>"):
        export(store, "kimi-inline", tmp_path / "ki.jsonl", select="all", tokenizer=kimi(), profile=profile())
    assert list(tmp_path.iterdir()) == []


def test_parquet_matches_golden(store, tmp_path):
    out = tmp_path / "data.parquet"
    result = export(store, "parquet", out, select="all", tokenizer=kimi(), profile=profile())
    rows = duckdb.connect().execute(f"SELECT * FROM read_parquet('{out}')").fetchall()
    cols = [d[0] for d in duckdb.connect().execute(f"DESCRIBE SELECT * FROM read_parquet('{out}')").fetchall()]
    _check("parquet.rows", [dict(zip(cols, r)) for r in rows])
    _check("parquet.manifest", _stable_manifest(result.manifest_path))
    # sidecars named after the full output name, so data.parquet and data.jsonl never share a manifest
    assert result.manifest_path.name == "data.parquet.manifest.json"
    assert result.token_freq_path.name == "data.parquet.token_freq.json"


def test_speculators_rows_are_token_exact(store, tmp_path):
    out = tmp_path / "s.jsonl"
    export(store, "speculators", out, select="all", tokenizer=kimi(), profile=profile())
    by_id = {r["metadata"]["tokview_sample_id"]: r for r in _jsonl(out)}
    for sid, row in by_id.items():
        cap = store.load_sample(sid).capture
        assert row["input_ids"] == cap.prompt_ids + cap.output_ids
        assert row["loss_mask"] == [0] * len(cap.prompt_ids) + [1] * len(cap.output_ids)
        assert row["text"] == kimi().decode(row["input_ids"], skip_special_tokens=False)
    assert sorted(r["id"] for r in by_id.values()) == [
        "conv-a_gen0",
        "conv-a_gen1",
        "conv-b#turn1_gen0",
        "conv-c_gen0",
        "conv-d_gen0",
    ]
    errors = _jsonl(tmp_path / "s.errors.jsonl")
    assert errors == [
        {
            "id": "conv-f",
            "metadata": {
                "sample_id": "conv-f@x_gen0",
                "error": "HTTP 500 after 3 retries",
                "endpoint": "http://127.0.0.1:8000",
            },
        }
    ]


def test_selection_valid_approved_and_run(store, tmp_path):
    valid = export(store, "speculators", tmp_path / "v.jsonl", tokenizer=kimi(), profile=profile())
    assert valid.selected == 4  # the truncated sample has an error finding; the empty one has too
    with pytest.raises(ExportError):
        export(store, "speculators", tmp_path / "a.jsonl", select="approved", tokenizer=kimi(), profile=profile())
    with pytest.raises(ExportError):
        export(store, "speculators", tmp_path / "r.jsonl", run="nope", tokenizer=kimi(), profile=profile())
    with pytest.raises(ExportError):
        export(store, "csv", tmp_path / "x.csv", tokenizer=kimi(), profile=profile())


# -- each format loads with the field names its trainer reads ---------------------------------------------


def test_speculators_fields_as_prepare_data_reads_them(store, tmp_path):
    out = tmp_path / "s.jsonl"
    export(store, "speculators", out, tokenizer=kimi(), profile=profile())
    for row in _jsonl(out):  # prepare_data.py --data: input_ids + loss_mask of equal length, >0 supervised
        assert isinstance(row["input_ids"], list)
        assert all(isinstance(i, int) for i in row["input_ids"])
        assert len(row["input_ids"]) == len(row["loss_mask"])
        assert sum(row["loss_mask"]) > 0
        turn = row["metadata"]["turn"]
        assert row["id"] == f"{row['primary_id']}{'' if turn is None else f'#turn{turn}'}_gen{row['metadata']['idx']}"
        assert set(row["metadata"]) >= {"idx", "finish_reason", "is_tool_call", "usage", "endpoint", "sampling_params"}


def _specforge_valid(conv: list[dict]) -> None:
    """SpecForge conversation_validation.py's rules."""
    roles = [m["role"] for m in conv]
    assert roles
    assert "user" in roles
    assert roles[-1] == "assistant"
    assert all(r != "system" for r in roles[1:])
    body = roles[1:] if roles[0] == "system" else roles
    assert all(r == ("user" if i % 2 == 0 else "assistant") for i, r in enumerate(body))
    assert all(isinstance(m["content"], str) for m in conv)


def test_specforge_fields_as_regenerate_and_train_read_them(store, tmp_path):
    out = tmp_path / "sf.jsonl"
    export(store, "specforge", out, tokenizer=kimi(), profile=profile())
    rows = _jsonl(out)
    for row in rows:
        assert isinstance(row["id"], str)
        assert row["id"]
        assert row["status"] == "success"
        _specforge_valid(row["conversations"])
        parse_row(row)  # tokview reads it back too
    thinking = [r for r in rows if "reasoning_content" in r["conversations"][-1]]
    assert thinking
    assert all("<think>" not in r["conversations"][-1]["content"] for r in rows)
    multi = [r for r in rows if "#turn" in r["id"]]
    assert multi
    assert multi[0]["source_id"] == "conv-b"
    assert multi[0]["assistant_turn_index"] == 1


def test_sharegpt_fields(store, tmp_path):
    export(store, "sharegpt", tmp_path / "sg.jsonl", tokenizer=kimi(), profile=profile())
    for row in _jsonl(tmp_path / "sg.jsonl"):  # EAGLE's ge_data reads conversations[*].from/value
        assert {t["from"] for t in row["conversations"]} <= {"system", "human", "gpt"}
        assert row["conversations"][-1]["from"] == "gpt"
        assert all("value" in t for t in row["conversations"])
        assert parse_row(row).messages[-1]["role"] == "assistant"
    # kimi-inline's fields are checked on Qwen3, whose template reads inline <think> (test_export_conformance.py)


def test_parquet_loads_with_input_ids_and_loss_mask(store, tmp_path):
    out = tmp_path / "p.parquet"
    export(store, "parquet", out, tokenizer=kimi(), profile=profile())
    types = dict(
        (d[0], d[1]) for d in duckdb.connect().execute(f"DESCRIBE SELECT * FROM read_parquet('{out}')").fetchall()
    )
    assert types["input_ids"] == "INTEGER[]"
    assert types["loss_mask"] == "INTEGER[]"
    assert types["id"] == "VARCHAR"
    n = (
        duckdb.connect()
        .execute(
            f"SELECT count(*) FROM read_parquet('{out}') WHERE len(input_ids) = "
            "len(loss_mask) AND list_sum(loss_mask) > 0"
        )
        .fetchone()[0]
    )
    assert n == 4
