"""Issue 23's done-when on the real server: a trace with parallel calls, a 3-round loop and a second user turn,
regenerated end to end by `tokview batch --history served` against real vLLM 0.32 serving the tiny *turns* model
(make_tiny_kimi.py `turns`, `--reasoning-parser kimi_k2 --tool-call-parser kimi_k2 --enable-auto-tool-choice`).
Its greedy chain, on this row: turn 1 calls get_weather and square at once, then square again once their
results are in, then answers (3 rounds); the second user turn calls square once more and answers. Every stored
id must be what the server serves for the stored body, each sample's tool_calls the calls on its ids, no turn
stopped, and each prompt extends the previous prompt + output ids inside a loop; after the finished loop and the
second user turn the template drops the loop's reasoning, and the chain records that break where it is."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from live.make_tiny_kimi import MODEL_INFO, SQUARE_TOOL, WEATHER_TOOL
from live.tools_live import BENIGN, body_of, calls_on_ids, served_ids
from tokview.cli import main
from tokview.errors import ExitCode
from tokview.store import Store

pytestmark = pytest.mark.live
URL_ENV, DIR_ENV = "TOKVIEW_LIVE_TURNS_URL", "TOKVIEW_LIVE_TURNS_DIR"
EXTENDS = [None, True, True, False, True]
"""The second user turn's first generation follows a finished loop: its prompt renders the loop's turns as
`<think></think>` (recordings/tools README §6), so it does not extend the answer's prompt + output ids."""


@pytest.fixture(scope="module")
def turns_server() -> tuple[str, str, dict[str, Any]]:
    """(URL, model dir, the builder's info) of the real vLLM serving the turns model, from .ci/live_tools.sh."""
    url, model_dir = os.environ.get(URL_ENV), os.environ.get(DIR_ENV)
    if not url or not model_dir:
        pytest.skip(f"{URL_ENV}/{DIR_ENV} are not set: run `bash .ci/live_tools.sh` (or .ci/live.sh)")
    info = json.loads((Path(model_dir) / MODEL_INFO).read_text(encoding="utf-8"))
    return url.rstrip("/"), model_dir, info


def _call(cid: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": arguments}}


def _row(info: dict[str, Any]) -> dict[str, Any]:
    """The file's trace: its own call ids, reasoning and answers (all replaced by what the server serves), and the
    results the chain splices after the served calls, by position and tool name."""
    texts, results = info["texts"], info["results"]
    return {
        "id": "two-users",
        "tools": [WEATHER_TOOL, SQUARE_TOOL],
        "messages": [
            {"role": "user", "content": texts["question"]},
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "file reasoning",
                "tool_calls": [_call("c1", "get_weather", '{"city":"Paris"}'), _call("c2", "square", '{"n":7}')],
            },
            {"role": "tool", "tool_call_id": "c1", "content": results["0"][0]},
            {"role": "tool", "tool_call_id": "c2", "content": results["0"][1]},
            {"role": "assistant", "content": "", "tool_calls": [_call("c3", "square", '{"n":9}')]},
            {"role": "tool", "tool_call_id": "c3", "content": results["1"][0]},
            {"role": "assistant", "content": "The file's answer.", "reasoning_content": "file reasoning"},
            {"role": "user", "content": texts["question_2"]},
            {"role": "assistant", "content": None, "tool_calls": [_call("c4", "square", '{"n":12}')]},
            {"role": "tool", "tool_call_id": "c4", "content": results["3"][0]},
            {"role": "assistant", "content": "The file's second answer."},
        ],
    }


def _planned_calls(info: dict[str, Any], generation: int) -> list[dict[str, str]]:
    calls = info["calls"].get(str(generation), [])
    return [{"id": cid, "name": cid.split(".")[1].split(":")[0], "arguments": args} for cid, args in calls]


def test_a_two_user_turn_loop_trace_is_regenerated_as_a_chain_token_exact(tmp_path, turns_server, capsys) -> None:
    url, model_dir, info = turns_server
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps(_row(info)) + "\n")
    db = tmp_path / "s.duckdb"
    args = ["batch", str(prompts), "--server", url, "--db", str(db), "--tokenizer", model_dir, "--mode", "chat"]
    args += ["--temperature", "0", "--max-new-tokens", "80", "--workers", "1", "--history", "served"]
    code = main([*args, "--summary-json"])
    summary = json.loads(capsys.readouterr().out)
    assert code == ExitCode.OK and summary["ok"] == 5 and summary["chain_stopped"] == 0, summary
    with Store(str(db)) as store:
        ids = [r[0] for r in store.query("SELECT sample_id FROM samples WHERE prompt_id = 'two-users' ORDER BY turn")]
        turns = [store.load_sample(i) for i in ids]
    assert [s.capture.output_ids for s in turns] == info["turn_output_ids"], "the planned greedy chain, served"
    assert [s.capture.finish_reason for s in turns] == ["tool_calls", "tool_calls", "stop", "tool_calls", "stop"]
    for g, sample in enumerate(turns):
        on_ids = calls_on_ids(model_dir, sample.capture.output_ids)
        assert (sample.capture.tool_calls or []) == on_ids == _planned_calls(info, g), g
    assert len(turns[0].capture.tool_calls or []) == 2, "two parallel calls"
    assert turns[2].capture.content == info["texts"]["answers"]["2"]
    assert turns[3].capture.content == info["texts"]["content"]["3"]
    assert turns[4].capture.content == info["texts"]["answers"]["4"]

    chain = [s.capture.settings["chain"] for s in turns]
    assert [c["turn"] for c in chain] == [0, 1, 2, 3, 4] and not any(c.get("stopped") for c in chain)
    assert [c["extends"] for c in chain] == EXTENDS
    for previous, sample, entry in zip(turns, turns[1:], chain[1:], strict=False):
        before = previous.capture.prompt_ids + previous.capture.output_ids
        if entry["extends"]:
            assert sample.capture.prompt_ids[: len(before)] == before
    # The break: the loop's first turn, re-rendered as history, has `<think></think>` where its reasoning stood.
    break_at = chain[3]["break_at"]
    assert break_at == len(turns[0].capture.prompt_ids)
    assert turns[3].capture.prompt_ids[break_at] == 163607 != turns[0].capture.output_ids[0]
    sent = turns[3].capture.messages
    assert sent is not None
    assert [m["content"] for m in sent if m["role"] == "user"] == [
        info["texts"]["question"],
        info["texts"]["question_2"],
    ]
    assert [m["tool_call_id"] for m in sent if m["role"] == "tool"] == [
        c["id"] for s in turns[:2] for c in s.capture.tool_calls or []
    ], "the file's results follow the served calls, under the served ids"

    for g, sample in enumerate(turns):  # token-exact: the server serves these ids for the stored body again
        body = {**body_of(sample.capture.raw_request), "return_token_ids": True}
        again = httpx.post(url + "/v1/chat/completions", json=body, timeout=120).json()
        assert (sample.capture.prompt_ids, sample.capture.output_ids) == served_ids(again), g
        allowed = BENIGN | ({"session_prefix_break"} if g == 3 else set())
        assert {f.code for f in sample.findings} <= allowed, [(f.code, f.detail) for f in sample.findings]
    assert "session_prefix_break" in {f.code for f in turns[3].findings}
    record = os.environ.get("TOKVIEW_LIVE_TURNS_RECORD")
    if record:  # .ci/live_tools.sh prints it for the closing note
        lines = [
            {"turn": g, "prompt_len": len(s.capture.prompt_ids), "output_len": len(s.capture.output_ids)}
            for g, s in enumerate(turns)
        ]
        Path(record).write_text(json.dumps({"turns": lines, "extends": EXTENDS}) + "\n", encoding="utf-8")
