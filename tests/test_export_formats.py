"""What each export format's rows hold, derived from the ids and from core (not re-derived per format):
the endpoint a row names, the loss mask (Parquet's SQL rule against `core.segments.loss_mask`, built
once per row), and the texts split at the ids' own closer rather than at the server's reasoning field."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import duckdb

from tokview.core import segments as seg
from tokview.core.analysis import analyze
from tokview.export import export
from tokview.export.formats import Texts, endpoint_url, texts_from_ids


def test_dual_endpoint_is_the_raw_path_the_ids_came_from(make_capture):
    cap = make_capture()
    cap.endpoint, cap.raw_request = "dual", None
    cap.server_kind, cap.server_url = "vllm", "http://127.0.0.1:8000"
    assert endpoint_url(cap) == "http://127.0.0.1:8000/v1/completions"
    cap.server_kind = "sglang"
    assert endpoint_url(cap) == "http://127.0.0.1:8000/generate"
    cap.raw_request = {"method": "POST", "url": "http://u:pw@127.0.0.1:8000/v1/completions", "parsed": {}}
    assert endpoint_url(cap) == "http://127.0.0.1:8000/v1/completions"


def test_parquet_loss_mask_is_core_loss_mask(sample_store, tmp_path, kimi_tok, kimi_profile):
    out = tmp_path / "p.parquet"
    export(sample_store, "parquet", out, select="all", tokenizer=kimi_tok, profile=kimi_profile)
    rows = duckdb.connect().execute(f"SELECT sample_id, input_ids, loss_mask FROM read_parquet('{out}')").fetchall()
    assert len(rows) == 2
    for sid, input_ids, mask in rows:
        cap = sample_store.load_sample(sid).capture
        assert input_ids == cap.prompt_ids + cap.output_ids
        assert mask == seg.loss_mask(cap.prompt_ids, cap.output_ids)
        assert mask.count(1) == len(cap.output_ids) > 0
    assert not list(tmp_path.glob("*.partial"))


def test_texts_come_from_the_ids_not_the_servers_split(make_capture, kimi_tok, kimi_profile):
    # the parser's reasoning field is wrong here; the exported texts follow the ids' </think>
    cap = make_capture(reasoning="Okay , let me think", answer="The answer is two", reasoning_text="garbled")
    assert texts_from_ids(cap, kimi_profile, kimi_tok) == Texts("Okay , let me think", "The answer is two")
    off = make_capture()
    off.prompt_ids = kimi_tok.render(off.messages, template_kwargs={"thinking": False})
    off.output_ids = kimi_tok.encode("Hi") + [163586]
    assert texts_from_ids(off, kimi_profile, kimi_tok) == Texts(None, "Hi")


@contextmanager
def calls_of(function: Callable[..., Any]) -> Iterator[list[str]]:
    """Record every call of `function` in this thread (by its code object, so however the caller
    imported it), through the interpreter's profiling hook."""
    seen: list[str] = []
    code = function.__code__

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code is code:
            seen.append(frame.f_back.f_code.co_name if frame.f_back else "?")

    previous = sys.getprofile()
    sys.setprofile(hook)
    try:
        yield seen
    finally:
        sys.setprofile(previous)


def test_text_exports_never_run_the_full_analysis_per_row(sample_store, tmp_path, kimi_tok, kimi_profile, make_capture):
    with calls_of(analyze) as seen:  # the detector sees a call, wherever it comes from
        analyze(make_capture(), kimi_profile, kimi_tok)
    assert seen == ["test_text_exports_never_run_the_full_analysis_per_row"]
    for fmt in ("specforge", "sharegpt"):  # kimi-inline is refused on the Kimi-layout template
        out = tmp_path / f"{fmt}.jsonl"
        with calls_of(analyze) as seen:
            result = export(sample_store, fmt, out, select="all", tokenizer=kimi_tok, profile=kimi_profile)
        assert seen == []
        assert result.exported == 2
        assert len(out.read_text().splitlines()) == 2


def test_each_exported_row_builds_its_loss_mask_once(sample_store, tmp_path, monkeypatch, kimi_tok, make_capture, put):
    calls = []
    real = seg.loss_mask
    monkeypatch.setattr(seg, "loss_mask", lambda p, o: calls.append(1) or real(p, o))
    opts = {"select": "all", "tokenizer": kimi_tok}
    export(sample_store, "speculators", tmp_path / "s.jsonl", **opts)
    assert len(calls) == 2  # the rows' own loss_mask field, nothing more
    empty = make_capture()
    empty.output_ids = []
    put(sample_store, "p9", empty)
    calls.clear()
    result = export(sample_store, "speculators", tmp_path / "t.jsonl", **opts)
    assert result.refused == {"no_supervised_tokens": 1}
    assert len(calls) == 2
