"""Export review fixes: no credentials in any output, temp files cleaned, remote code only when named,
dual endpoints, loss mask and text segments from core."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import duckdb
import pytest
from test_store_fixtures import kimi, make_capture, profile, put

from tokview.cli import main
from tokview.core import segments as seg
from tokview.core.kimi_layout import kimi_tokenizer_dir
from tokview.export import ExportError, export
from tokview.export.formats import JSONL_FORMATS, Texts, endpoint_url, specforge_row, texts_from_ids
from tokview.store import Store


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "x.duckdb") as s:
        s.put_run(
            "run1",
            settings={"temperature": 0.0},
            profile="kimi-k2.5",
            tokenizer_hash=kimi().fingerprint(),
            server_info=[{"url": "http://127.0.0.1:8000", "kind": "vllm"}],
        )
        put(s, "p1", make_capture())
        put(s, "p2", make_capture(answer="two"))
        yield s


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_credentials_an_older_store_kept_never_reach_an_export(store, tmp_path, monkeypatch):
    monkeypatch.setenv("TOKVIEW_API_KEY", "sk-envkey-9")
    secret_url = "http://alice:tok3n@127.0.0.1:8000"
    store.execute("UPDATE samples SET server_url = ?", [secret_url])  # as a tokview before the fix wrote it
    store.execute("UPDATE runs SET server_info = ?", [json.dumps([{"url": secret_url, "kind": "vllm"}])])
    store.execute(
        "INSERT INTO failures VALUES ('p3', 'p3@x_gen0', 'run1', ?, now(), ?)",
        ["HTTP 401: invalid key sk-envkey-9", secret_url],
    )
    out = tmp_path / "s.jsonl"
    result = export(store, "speculators", out, select="all", tokenizer=kimi(), profile=profile())
    texts = [out.read_text(), result.manifest_path.read_text(), (tmp_path / "s.errors.jsonl").read_text()]
    for text in texts:
        assert "tok3n" not in text and "alice" not in text and "sk-envkey-9" not in text
    assert _jsonl(out)[0]["metadata"]["endpoint"] == "http://127.0.0.1:8000/v1/chat/completions"
    assert "127.0.0.1:8000" in texts[1] and "HTTP 401: invalid key [redacted]" in texts[2]


def test_a_failure_later_captured_is_not_in_errors_jsonl(store, tmp_path):
    store.put_failure("p9", "p9@s_gen0", "run1", "HTTP 500 after 3 retries")
    sid = put(store, "p3", make_capture())
    store.put_failure("p3", sid, "run1", "HTTP 500 after 3 retries")
    put(store, "p3", make_capture())  # the resumed run got it
    export(store, "speculators", tmp_path / "s.jsonl", select="all", tokenizer=kimi(), profile=profile())
    assert [e["id"] for e in _jsonl(tmp_path / "s.errors.jsonl")] == ["p9"]


def test_a_failed_export_leaves_no_partial_file(store, tmp_path, monkeypatch):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    rows = []

    def fails_on_the_second_row(item, prof, tok):
        if rows:
            raise OSError("No space left on device")
        rows.append(item.sample_id)
        return specforge_row(item, prof, tok)

    monkeypatch.setitem(JSONL_FORMATS, "specforge", fails_on_the_second_row)
    with pytest.raises(OSError, match="No space left"):  # one row is already in the temp file
        export(store, "specforge", out_dir / "sf.jsonl", select="all", tokenizer=kimi(), profile=profile())
    assert len(rows) == 1 and list(out_dir.iterdir()) == []


def test_exported_data_has_the_mode_of_any_new_file(store, tmp_path):
    old = os.umask(0o022)
    try:
        for fmt, name in (("speculators", "s.jsonl"), ("sharegpt", "g.jsonl"), ("parquet", "p.parquet")):
            result = export(store, fmt, tmp_path / name, select="all", tokenizer=kimi(), profile=profile())
            assert stat.S_IMODE(result.out.stat().st_mode) == 0o644, fmt  # mkstemp alone gives 0600
            assert stat.S_IMODE(result.manifest_path.stat().st_mode) == 0o644
    finally:
        os.umask(old)


def test_out_is_a_directory_or_nothing_is_selected(store, tmp_path, capsys):
    with pytest.raises(ExportError, match="is a directory"):
        export(store, "speculators", tmp_path, tokenizer=kimi(), profile=profile())
    assert not (tmp_path.parent / f"{tmp_path.name}.partial").exists()
    with pytest.raises(ExportError, match="no samples match"):
        export(
            store,
            "speculators",
            tmp_path / "new" / "dir" / "a.jsonl",
            select="approved",
            tokenizer=kimi(),
            profile=profile(),
        )
    assert not (tmp_path / "new").exists()  # nothing selected: no directories made either
    store.close()
    code = main(["export", "--db", str(tmp_path / "x.duckdb"), "--format", "parquet", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 1 and "is a directory" in err and len(err.strip().splitlines()) == 1


def _evil_tokenizer(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the Kimi-layout folder whose config points at shipped code that leaves a marker when run."""
    folder = tmp_path / "evil-tok"
    shutil.copytree(kimi_tokenizer_dir(), folder)
    marker = tmp_path / "code-ran"
    (folder / "tokenization_evil.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
        "from transformers import PreTrainedTokenizerFast\n\n\n"
        "class EvilTokenizer(PreTrainedTokenizerFast):\n    pass\n"
    )
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": [None, "tokenization_evil.EvilTokenizer"]}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder, marker


def test_trust_remote_code_never_runs_a_folder_the_database_names(tmp_path, capsys):
    folder, marker = _evil_tokenizer(tmp_path)
    db = tmp_path / "r.duckdb"
    with Store(db) as s:
        s.put_run("run1", profile="kimi-k2.5", tokenizer_dir=str(folder))
        put(s, "p1", make_capture())
    code = main(["export", "--db", str(db), "--out", str(tmp_path / "o.jsonl"), "--trust-remote-code"])
    err = capsys.readouterr().err
    assert not marker.exists()  # the recorded folder's code did not run
    assert code == 0 and (tmp_path / "o.jsonl").is_file() and "Traceback" not in err  # loaded without its code
    code = main(
        [
            "export",
            "--db",
            str(db),
            "--out",
            str(tmp_path / "o2.jsonl"),
            "--tokenizer",
            str(folder),
            "--trust-remote-code",
        ]
    )
    assert code == 0 and marker.exists()  # named on the command line: the user asked for it


def test_dual_endpoint_is_the_raw_path_the_ids_came_from():
    cap = make_capture()
    cap.endpoint, cap.raw_request = "dual", None
    cap.server_kind, cap.server_url = "vllm", "http://127.0.0.1:8000"
    assert endpoint_url(cap) == "http://127.0.0.1:8000/v1/completions"
    cap.server_kind = "sglang"
    assert endpoint_url(cap) == "http://127.0.0.1:8000/generate"
    cap.raw_request = {"method": "POST", "url": "http://u:pw@127.0.0.1:8000/v1/completions", "parsed": {}}
    assert endpoint_url(cap) == "http://127.0.0.1:8000/v1/completions"


def test_parquet_loss_mask_is_core_loss_mask(store, tmp_path):
    out = tmp_path / "p.parquet"
    export(store, "parquet", out, select="all", tokenizer=kimi(), profile=profile())
    rows = duckdb.connect().execute(f"SELECT sample_id, input_ids, loss_mask FROM read_parquet('{out}')").fetchall()
    assert len(rows) == 2
    for sid, input_ids, mask in rows:
        cap = store.load_sample(sid).capture
        assert input_ids == cap.prompt_ids + cap.output_ids
        assert mask == seg.loss_mask(cap.prompt_ids, cap.output_ids)
    assert not list(tmp_path.glob("*.partial"))


def test_texts_come_from_the_ids_not_the_servers_split():
    # the parser's reasoning field is wrong here; the exported texts follow the ids' </think>
    cap = make_capture(reasoning="Okay , let me think", answer="The answer is two", reasoning_text="garbled")
    texts = texts_from_ids(cap, profile(), kimi())
    assert texts == Texts("Okay , let me think", "The answer is two")
    off = make_capture()
    off.prompt_ids = kimi().render(off.messages, template_kwargs={"thinking": False})
    off.output_ids = kimi().encode("Hi") + [163586]
    assert texts_from_ids(off, profile(), kimi()) == Texts(None, "Hi")


def test_text_exports_never_run_the_full_analysis_per_row(store, tmp_path, monkeypatch):
    import dataclasses

    from tokview.core.findings import RULES

    def no_analysis(ctx):
        raise AssertionError("a finding check ran during an export")

    for code, declared in list(RULES.items()):
        monkeypatch.setitem(RULES, code, dataclasses.replace(declared, check=no_analysis))
    for fmt in ("specforge", "sharegpt"):  # kimi-inline is refused on the Kimi-layout template
        result = export(store, fmt, tmp_path / f"{fmt}.jsonl", select="all", tokenizer=kimi(), profile=profile())
        assert result.exported == 2


def test_each_exported_row_builds_its_loss_mask_once(store, tmp_path, monkeypatch):
    calls = []
    real = seg.loss_mask
    monkeypatch.setattr(seg, "loss_mask", lambda p, o: calls.append(1) or real(p, o))
    export(store, "speculators", tmp_path / "s.jsonl", select="all", tokenizer=kimi(), profile=profile())
    assert len(calls) == 2  # the rows' own loss_mask field, nothing more
    empty = make_capture()
    empty.output_ids = []
    put(store, "p9", empty)
    calls.clear()
    result = export(store, "speculators", tmp_path / "t.jsonl", select="all", tokenizer=kimi(), profile=profile())
    assert result.refused == {"no_supervised_tokens": 1} and len(calls) == 2


def test_prose_survives_a_store_export_round_trip_while_secrets_do_not(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKVIEW_API_KEY", "sk-envkey-7")
    prose = "Explain the basic idea of a bearer token, then fetch https://alice@example.com/x"
    cap = make_capture(question=prose + " with key sk-envkey-7")
    cap.raw_request = {
        "url": "http://127.0.0.1:8000/v1/chat/completions",
        "headers": {"Authorization": "Basic YWxpY2U6cHc="},
        "body": {"messages": cap.messages},
    }
    with Store(tmp_path / "r.duckdb") as s:
        put(s, "p1", cap)
        export(s, "sharegpt", tmp_path / "g.jsonl", select="all", tokenizer=kimi(), profile=profile())
        stored = s.load_sample(s.samples_page()[0].sample_id).capture
    human = _jsonl(tmp_path / "g.jsonl")[0]["conversations"][-2]
    assert human == {"from": "human", "value": prose + " with key [redacted]"}
    assert stored.raw_request["headers"]["Authorization"] == "[redacted]"
    assert "sk-envkey-7" not in (tmp_path / "r.duckdb").read_bytes().decode("latin-1")
