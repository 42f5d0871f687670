"""A JSONL export whose rows differ in shape loads in `datasets.load_dataset("json")`, the loader speculators'
`prepare_data.py` and SpecForge call: it fixes every column's type from its first read (10 MiB), so a key or a
non-null type first seen past it failed the whole load ("Couldn't cast array of type int64 to null"). Here the
loader's read is made small (`chunksize`) and the export's idea of it with it, so a small store is "large"."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from tokview.cli import main
from tokview.export import row_shapes
from tokview.export.row_shapes import RowShapes, move_exemplars_first, shape_pairs
from tokview.sim import SimConfig, start_simulator

READ = 64 << 10
"""The loader's read in these tests: a few rows (of ids; the text formats' rows are smaller: `READ_OF`)."""
READ_OF = {"specforge": 8 << 10, "sharegpt": 8 << 10}

SAMPLE_DATA = Path(__file__).resolve().parents[1] / "sample_data"


def test_shape_pairs_name_every_non_null_value_and_a_list_of_numbers_by_its_first() -> None:
    row = {"a": None, "b": [1, 2], "c": [], "d": {"e": 1.5, "f": None}, "g": [{"h": "x"}, {"i": True}]}
    assert set(shape_pairs(row)) == {
        ("", "object"),
        (".b", "list"),
        (".b[]", "int"),
        (".c", "list"),
        (".d", "object"),
        (".d.e", "float"),
        (".g", "list"),
        (".g[]", "object"),
        (".g[].h", "str"),
        (".g[].i", "bool"),
    }


def test_exemplars_move_first_and_the_rest_keep_their_order(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(row_shapes, "LOADER_CHUNK_BYTES", 40)
    rows = [{"n": k, "t": None} for k in range(5)] + [{"n": 5, "t": 3}, {"n": 6, "t": 4}, {"n": 7, "x": [1.0]}]
    path = tmp_path / ".f.jsonl.1.abc.partial"
    shapes = RowShapes()
    with open(path, "wb") as fh:
        for row in rows:
            line = (json.dumps(row) + "\n").encode()
            fh.write(line)
            shapes.note(row, len(line))
    assert shapes.late_exemplars()
    assert move_exemplars_first(path, shapes) == 2  # {"t": int} and {"x": [float]}, both past the first 40 bytes
    assert [json.loads(line)["n"] for line in path.read_text().splitlines()] == [0, 5, 7, 1, 2, 3, 4, 6]
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # its own temp file renamed over it


@pytest.fixture(scope="module")
def mixed_store(tmp_path_factory) -> Path:
    """Single-turn chat samples (turn null, no tools) first, then agent traces (turn numbers, tool calls), then
    samples with logprobs (columns the others do not have)."""
    folder = tmp_path_factory.mktemp("shapes")
    prompts = folder / "plain.jsonl"
    words = " ".join(f"word{i}" for i in range(60))
    prompts.write_text(
        "".join(json.dumps({"id": f"a-{i:03d}", "prompt": f"Sum up {i}: {words}"}) + "\n" for i in range(40))
    )
    db = folder / "s.duckdb"
    with start_simulator(SimConfig(kind="vllm")) as sim:
        base = ["--server", sim.url, "--db", str(db), "--mode", "chat", "--workers", "1", "--max-new-tokens", "120"]
        assert main(["batch", str(prompts), "--run", "a-plain", *base]) == 0
        assert main(["batch", str(SAMPLE_DATA / "agent_traces.jsonl"), "--run", "b-agents", *base]) in (0, 4)
        assert main(["batch", str(prompts), "--run", "c-logprobs", "--limit", "3", "--logprobs", "2", *base]) == 0
    return db


def _load(path: Path, cache: Path, read: int = READ) -> list[dict]:
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    data = datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=str(cache), chunksize=read)
    return data.to_list()


@pytest.mark.parametrize("fmt", ["speculators", "specforge", "sharegpt", "trajectory"])
def test_a_mixed_export_loads_in_the_trainers_json_loader_every_row_as_written(
    mixed_store, fmt, tmp_path, monkeypatch, capsys
) -> None:
    read = READ_OF.get(fmt, READ)
    monkeypatch.setattr(row_shapes, "LOADER_CHUNK_BYTES", read)
    out = tmp_path / f"{fmt}.jsonl"
    assert main(["export", "--db", str(mixed_store), "--format", fmt, "--select", "all", "--out", str(out)]) == 0
    manifest = json.loads(out.with_name(f"{fmt}.manifest.json").read_text())
    assert manifest["row_shapes"]["moved_first"] >= 1  # a shape first seen past the first read: moved ahead
    assert manifest["row_shapes"]["fits"] is True
    assert out.stat().st_size > 2 * read
    written = [json.loads(line) for line in out.read_text().splitlines()]
    loaded = _load(out, tmp_path / "hf", read)
    assert [r["id"] for r in loaded] == [r["id"] for r in written]
    for got, want in zip(loaded, written):
        for key in ("input_ids", "loss_mask"):
            if key in want:
                assert got[key] == want[key], (got["id"], key)
        if "conversations" in want:  # the loader adds the keys other messages have, as null
            assert [{k: v for k, v in m.items() if v is not None} for m in got["conversations"]] == [
                {k: v for k, v in m.items() if v is not None} for m in want["conversations"]
            ], got["id"]


def test_without_the_move_the_same_export_fails_to_load(mixed_store, tmp_path, monkeypatch) -> None:
    """What the move is for: the same rows in their own order, the way the loader failed on them."""
    monkeypatch.setattr(row_shapes, "LOADER_CHUNK_BYTES", READ)
    monkeypatch.setattr(RowShapes, "late_exemplars", lambda self: False)
    out = tmp_path / "s.jsonl"
    assert (
        main(["export", "--db", str(mixed_store), "--format", "speculators", "--select", "all", "--out", str(out)]) == 0
    )
    with pytest.raises(Exception) as failed:
        _load(out, tmp_path / "hf")
    assert "cast" in str(failed.value.__cause__ or failed.value)


def test_an_export_within_one_read_is_written_in_its_own_order(mixed_store, tmp_path) -> None:
    out = tmp_path / "s.jsonl"
    assert (
        main(["export", "--db", str(mixed_store), "--format", "speculators", "--select", "all", "--out", str(out)]) == 0
    )
    assert "row_shapes" not in json.loads(out.with_name("s.manifest.json").read_text())
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert ids[0].startswith("a-000")


@pytest.mark.parametrize("fmt", ["speculators", "trajectory"])
def test_a_streamed_export_that_cannot_be_reordered_says_the_loader_fails_on_it(
    mixed_store, fmt, tmp_path, monkeypatch, capsys
) -> None:
    """`--out -` cannot move rows ahead: its rows went out in their own order with no word, and the file they landed
    in failed in the loader. The summary now says how many rows the first read lacks, and that a file export helps."""
    monkeypatch.setattr(row_shapes, "LOADER_CHUNK_BYTES", READ)
    fifo = tmp_path / "rows.fifo"  # a stream, as `--out -` is (in this process: the loader's read made small)
    os.mkfifo(fifo)
    landed = tmp_path / "landed.jsonl"
    reader = threading.Thread(target=lambda: landed.write_bytes(fifo.read_bytes()))
    reader.start()
    try:
        code = main(["export", "--db", str(mixed_store), "--format", fmt, "--select", "all", "--out", str(fifo)])
    finally:
        reader.join(timeout=60)
    assert code == 0
    err = capsys.readouterr().err
    warning = [line for line in err.splitlines() if "load_dataset" in line]
    assert len(warning) == 1 and warning[0].startswith("WARNING: "), err
    assert "--out PATH" in warning[0]
    with pytest.raises(Exception) as failed:  # what it warns of
        _load(landed, tmp_path / "hf")
    why = str(failed.value.__cause__ or failed.value)
    assert "cast" in why or "match" in why, why
    out = tmp_path / f"{fmt}.jsonl"  # the same to a file: moved, no warning
    assert main(["export", "--db", str(mixed_store), "--format", fmt, "--select", "all", "--out", str(out)]) == 0
    assert "load_dataset" not in capsys.readouterr().err
