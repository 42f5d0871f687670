"""Regeneration as a chain against the simulated vLLM and SGLang over real sockets: a trace
with parallel calls, a 3-round loop, a final answer and a second user turn with its own loop, regenerated end
to end; every stored id is what the server served; each turn's prompt extends the previous turn's prompt +
output ids inside a tool loop, and the break after a finished loop is a finding; a chain whose served calls
the file's results do not answer stops there, counted with its reason; `--history file` keeps today's turns."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import httpx
import pytest

from tokview.cli import main
from tokview.core.record import sample_id_for
from tokview.errors import ExitCode
from tokview.sim import SimConfig, start_simulator
from tokview.store import Store
from tokview.store.merge import SPECIAL_IDS_KEY, SPECIAL_KEY

SAMPLES = Path(__file__).resolve().parents[1] / "sample_data"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    },
    {
        "type": "function",
        "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}},
    },
]


def _round(n: int) -> list[dict]:
    """One round of the file's loop: two parallel calls and their results (the file's own ids and words)."""
    calls = [
        {"id": f"w{n}", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": f"t{n}", "type": "function", "function": {"name": "get_time", "arguments": '{"zone": "CET"}'}},
    ]
    return [
        {"role": "assistant", "content": "", "reasoning_content": "file reasoning", "tool_calls": calls},
        {"role": "tool", "tool_call_id": f"w{n}", "content": f"sunny {n}"},
        {"role": "tool", "tool_call_id": f"t{n}", "content": "error: zone unknown" if n == 2 else f"1{n}:00"},
    ]


LOOP_TRACE = {
    "id": "agent",
    "tools": TOOLS,
    "messages": [
        {"role": "user", "content": "Weather and time in Paris?"},
        *_round(0),
        *_round(1),
        *_round(2),
        {"role": "assistant", "content": "Sunny.", "reasoning_content": "done"},
        {"role": "user", "content": "And again?"},
        *_round(3),
        *_round(4),
        *_round(5),
        {"role": "assistant", "content": "Still sunny."},
    ],
}
EXTENDS = [None, True, True, True, False, True, True, True]
"""Turn 4 follows a finished loop and a new user turn: the template drops the loop's reasoning there."""


_OPENED: list[Store] = []


@pytest.fixture(autouse=True)
def _close_stores():
    """Each store `_batch` opened, closed when its test ends. Left open, DuckDB's cache of open databases (by path)
    handed the next test whose tmp_path got the same name (pytest cuts a name to 30 characters and removes a passed
    test's folder) the earlier test's database: `[file]` found `[served]`'s samples beside its own."""
    yield
    while _OPENED:
        _OPENED.pop().close()


def _batch(tmp_path: Path, url: str, rows: list[dict], *extra: str) -> tuple[int, dict, Store]:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    db = tmp_path / "s.duckdb"
    args = ["batch", str(prompts), "--server", url, "--db", str(db), "--mode", "chat", "--workers", "1"]
    args += ["--temperature", "0", "--max-new-tokens", "400", "--summary-json", *extra]
    code = main(args)
    _OPENED.append(Store(str(db)))
    return code, {}, _OPENED[-1]


def _chain(store: Store, prompt_id: str) -> list:
    ids = [r[0] for r in store.query("SELECT sample_id FROM samples WHERE prompt_id = ? ORDER BY turn", [prompt_id])]
    return [store.load_sample(i) for i in ids]


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_a_tool_loop_trace_is_regenerated_as_a_chain_token_exact(tmp_path, kind, capsys):
    cfg = SimConfig(kind=kind, quirks={"tool-calls": "each", "tool-rounds": 3})
    with start_simulator(cfg) as sim:
        code, _, store = _batch(tmp_path, sim.url, [LOOP_TRACE])
        summary = json.loads(capsys.readouterr().out)
        assert code == ExitCode.OK, summary
        assert summary["ok"] == 8, summary
        assert summary["chain_stopped"] == 0, summary
        turns = _chain(store, "agent")
        for s in turns:  # what the server served, asked again with the stored request body
            body = {k: v for k, v in s.capture.raw_request["body"].items()}
            again = httpx.post(sim.url + "/v1/chat/completions", json=body, timeout=30).json()
            choice = again["choices"][0]
            served_prompt = choice.get("prompt_token_ids") or again.get("prompt_token_ids")
            served_out = choice.get("token_ids") or choice.get("response_token_ids")
            assert s.capture.prompt_ids == served_prompt
            assert s.capture.output_ids == served_out
    chain = [s.capture.settings["chain"] for s in turns]
    assert [c["turn"] for c in chain] == list(range(8))
    assert {c["history"] for c in chain} == {"served"}
    assert [c["extends"] for c in chain] == EXTENDS
    assert [c["parent"] for c in chain[1:]] == [s.sample_id for s in turns[:-1]]
    for previous, s in itertools.pairwise(turns):
        if s.capture.settings["chain"]["extends"]:
            n = len(previous.capture.prompt_ids) + len(previous.capture.output_ids)
            assert s.capture.prompt_ids[:n] == previous.capture.prompt_ids + previous.capture.output_ids
    codes = [{f.code for f in s.findings} for s in turns]
    assert ["session_prefix_break" in c for c in codes] == [e is False for e in EXTENDS]
    assert all("prompt_render_mismatch" not in c for c in codes)  # SGLang too: its tools rendered as it renders them
    served_calls = turns[0].capture.tool_calls
    assert [c["name"] for c in served_calls] == ["get_weather", "get_time"], "two parallel calls served"
    sent = turns[1].capture.messages
    assert [m.get("tool_call_id") for m in sent if m["role"] == "tool"] == [c["id"] for c in served_calls]
    assert [m["content"] for m in sent if m["role"] == "tool"] == ["sunny 0", "10:00"], "the file's results"
    assert sent[1]["reasoning_content"] == turns[0].capture.reasoning, "served reasoning goes back"
    assert turns[3].capture.tool_calls in (None, [])
    assert turns[3].capture.content


def test_a_chain_whose_calls_the_file_does_not_answer_stops_there_counted(tmp_path, capsys):
    one_result = {
        "id": "short",
        "tools": TOOLS,
        "messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "", "tool_calls": [_round(0)[0]["tool_calls"][0]]},
            {"role": "tool", "tool_call_id": "w0", "content": "sunny"},
            {"role": "assistant", "content": "Sunny."},
            {"role": "user", "content": "Thanks"},
        ],
    }
    with start_simulator(SimConfig(kind="vllm", quirks={"tool-calls": "each"})) as sim:
        code, _, store = _batch(tmp_path, sim.url, [one_result, {"id": "plain", "prompt": "hi"}])
        said = capsys.readouterr()
        summary = json.loads(said.out)
        again_code, _, _ = _batch(tmp_path, sim.url, [one_result, {"id": "plain", "prompt": "hi"}])
    again = json.loads(capsys.readouterr().out)
    assert again_code == ExitCode.OK
    assert again["ok"] == 0
    assert again["resumed"] == 2
    assert again["balanced"]
    assert again["chain_stopped"] == 2
    assert "stopped in an earlier run" in next(iter(again["chain_stops"]))
    assert code == ExitCode.OK
    assert summary["ok"] == 2
    assert summary["chain_stopped"] == 2
    assert summary["balanced"]
    (why,) = summary["chain_stops"]
    assert "turn 0 called 2 tool(s) (get_weather, get_time) where the file has 1 result(s) (get_weather)" in why
    assert summary["chains_stopped"] == {why: 1}  # chains and their turns told apart (two chains read as one)
    assert f"  1 chain stopped, 2 later turns not generated: {why}" in said.err, said.err
    (kept,) = _chain(store, "short")
    stop = next(f for f in kept.findings if f.code == "chain_stopped")
    assert "called 2 tool(s)" in stop.detail
    assert kept.capture.settings["chain"]["stopped"]


def test_a_stop_the_tool_parser_made_says_the_calls_the_ids_hold(tmp_path, capsys):
    """ "turn 0 called 1 tool(s) (get_weather) where the file has 2" read as the model's doing: its ids held 2 calls,
    the server's parser returned one (`tool_calls_field_mismatch` on the same sample)."""
    with start_simulator(SimConfig(kind="vllm", quirks={"tool-calls": "each", "parser-drops-call": True})) as sim:
        code, _, store = _batch(tmp_path, sim.url, [LOOP_TRACE])
    summary = json.loads(capsys.readouterr().out)
    assert code == ExitCode.OK, summary
    (why,) = summary["chain_stops"]
    assert why.startswith("turn 0 called 1 tool(s) (get_weather) where the file has 2 result(s)"), why
    assert why.endswith("; its ids hold 2 call(s): the server's tool parser returned 1"), why
    (kept,) = _chain(store, "agent")
    assert {"chain_stopped", "tool_calls_field_mismatch"} <= {f.code for f in kept.findings}


def test_history_file_keeps_independent_turns_and_their_ids(tmp_path, capsys):
    row = {
        "id": "m",
        "messages": [
            {"role": "user", "content": "6 times 7?"},
            {"role": "assistant", "content": "42.", "reasoning_content": "6*7"},
            {"role": "user", "content": "And 6 times 8?"},
        ],
    }
    with start_simulator(SimConfig(kind="vllm")) as sim:
        code, _, store = _batch(tmp_path, sim.url, [row], "--history", "file")
    capsys.readouterr()
    assert code == ExitCode.OK
    turns = _chain(store, "m")
    assert [s.turn for s in turns] == [0, 1]
    settings = turns[0].capture.settings
    assert "chain" not in settings
    run = store.runs()[0]
    beside = (SPECIAL_KEY, SPECIAL_IDS_KEY, "history", "history_reasoning")  # the record's, never in sample ids
    assert run["settings"]["history"] == "file"
    sample_settings = {k: v for k, v in run["settings"].items() if k not in beside}
    assert turns[1].sample_id == sample_id_for("m", sample_settings, 0, 1), "today's ids"
    assert turns[1].capture.messages[1] == {"role": "assistant", "content": "42."}, "the file's answer, no reasoning"


def test_plain_multi_turn_rows_chain_on_the_raw_path_split_on_ids(tmp_path, capsys):
    """The raw path returns no reasoning/answer split: the served ids are split at the profile's closer and
    decoded, and the next prompt (rendered locally) extends the served turn's ids."""
    rows = [json.loads(line) for line in (SAMPLES / "multiturn.jsonl").read_text().splitlines()[:3]]
    with start_simulator(SimConfig(kind="sglang")) as sim:
        prompts = tmp_path / "p.jsonl"
        prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
        db = tmp_path / "s.duckdb"
        code = main(["batch", str(prompts), "--server", sim.url, "--db", str(db), "--workers", "1"])
    capsys.readouterr()
    assert code == ExitCode.OK
    store = Store(str(db))
    for row in rows:
        turns = _chain(store, row["id"])
        assert len(turns) > 1
        assert [t.capture.endpoint for t in turns] == ["sglang-generate"] * len(turns)
        assert [t.capture.settings["chain"]["extends"] for t in turns] == [None] + [True] * (len(turns) - 1)
        served = next(m for m in turns[1].capture.messages if m["role"] == "assistant")
        assert served["reasoning_content"]
        assert served["content"]
        assert served["content"] not in json.dumps(row), "the served answer, not the file's"


def test_chains_run_side_by_side_and_each_one_in_order(tmp_path, capsys):
    """Turns of one conversation are sequential, conversations are not: 8 two-turn chains at 0.25 s a request
    take about two requests' time at --concurrency 8, not sixteen."""
    rows = [
        {
            "id": f"c{i}",
            "messages": [
                {"role": "user", "content": f"Question {i}?"},
                {"role": "assistant", "content": "A."},
                {"role": "user", "content": "And?"},
            ],
        }
        for i in range(8)
    ]
    with start_simulator(SimConfig(kind="vllm", latency_s=0.25)) as sim:
        code, _, _store = _batch(tmp_path, sim.url, rows, "--concurrency", "8")
    summary = json.loads(capsys.readouterr().out)
    assert code == ExitCode.OK
    assert summary["ok"] == 16
    assert summary["elapsed_s"] < 8 * 0.25, f"chains ran one after another: {summary['elapsed_s']:.1f}s"


def test_the_sample_agent_traces_read_without_a_bad_row():
    from tokview.batch import read_prompts

    for name, expected in (("agent_traces.jsonl", 6), ("agent_traces_sharegpt.jsonl", 3)):
        rows, bad = read_prompts(SAMPLES / name)
        assert bad == []
        assert len(rows) == expected
        assert all(r.tools for r in rows)


def _loop_of(rounds: int) -> dict:
    messages: list[dict] = [{"role": "user", "content": "Weather and time in Paris?"}]
    for n in range(rounds):
        messages += _round(n)
    return {"id": f"loop{rounds}", "tools": TOOLS, "messages": [*messages, {"role": "assistant", "content": "Ok."}]}


@pytest.mark.parametrize(("mode", "extends"), [("none", False), ("all", True)])
def test_history_reasoning_none_breaks_the_loop_and_all_asks_to_preserve_thinking(tmp_path, capsys, mode, extends):
    """Without its reasoning a served tool-calling turn renders as `<think></think>` + calls: the next prompt no
    longer extends its ids (speculators #864). `all` sends it and asks the template to keep every turn's (Kimi-K2.6:
    K2.5's template reads no such kwarg, and `all` is refused there)."""
    profile = "kimi-k2.6" if mode == "all" else None
    quirks = {"tool-calls": "each", "tool-rounds": 2}
    with start_simulator(SimConfig(kind="sglang", quirks=quirks, profile=profile)) as sim:
        extra = ["--profile", profile] if profile else []
        code, _, store = _batch(tmp_path, sim.url, [_loop_of(2)], "--history-reasoning", mode, *extra)
    capsys.readouterr()
    assert code == ExitCode.OK
    turns = _chain(store, "loop2")
    assert [t.capture.settings["chain"]["extends"] for t in turns] == [None, extends, extends]
    assert [t.capture.settings["chain"]["history_reasoning"] for t in turns] == [mode] * 3
    sent = [m for m in turns[1].capture.messages if m["role"] == "assistant"]
    assert ("reasoning_content" in sent[0]) is (mode == "all")
    kwargs = turns[1].capture.raw_request["body"]["chat_template_kwargs"]
    assert kwargs.get("preserve_thinking") is (True if mode == "all" else None)


def test_progress_counts_a_stopped_chain_s_turns_as_done(tmp_path):
    import asyncio

    from tokview.batch import run_batch
    from tokview.batch.config import BatchConfig

    row = {"id": "short", "tools": TOOLS, "messages": [*_loop_of(1)["messages"][:2], *_round(0)[1:2]]}
    row["messages"][1] = {**row["messages"][1], "tool_calls": row["messages"][1]["tool_calls"][:1]}
    row["messages"] += [{"role": "assistant", "content": "Ok."}]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps(row) + "\n")
    seen = []
    with start_simulator(SimConfig(kind="vllm", quirks={"tool-calls": "each"})) as sim:
        config = BatchConfig(servers=[sim.url], prompts_path=prompts, mode="chat", workers=1, temperature=0)
        with Store(str(tmp_path / "s.duckdb")) as store:
            summary = asyncio.run(run_batch(config, store, on_progress=seen.append))
    assert summary.chain_stopped == 1
    assert summary.balanced
    assert (seen[-1].done, seen[-1].total) == (2, 2), "the stopped turn is done, not pending"


@pytest.mark.parametrize("history", ["served", "file"])
def test_a_greeting_first_row_and_a_row_named_like_a_turn_are_each_stored(tmp_path, capsys, history):
    """Two rows the batch lost: one opening with the assistant's greeting stopped the run (internal error, nothing
    stored), and a one-turn row `x#turn1` took the sample id of turn 1 of row `x`, one replacing the other in the
    store while the summary counted both."""
    greeting = {"role": "assistant", "content": "Hello, how can I help?"}
    rows = [
        {"id": "hello", "messages": [greeting, {"role": "user", "content": "What is 2+2?"}]},
        {
            "id": "x",
            "messages": [
                {"role": "user", "content": "first question"},
                {"role": "assistant", "content": "a"},
                {"role": "user", "content": "second question"},
            ],
        },
        {"id": "x#turn1", "messages": [{"role": "user", "content": "a different question"}]},
        {"id": "x#turn1#", "messages": [{"role": "user", "content": "yet another question"}]},
    ]
    with start_simulator(SimConfig(kind="vllm")) as sim:
        code, _, store = _batch(tmp_path, sim.url, rows, "--history", history)
        summary = json.loads(capsys.readouterr().out)
        again, _, _ = _batch(tmp_path, sim.url, rows, "--history", history)
    assert (code, summary["ok"], summary["balanced"]) == (ExitCode.OK, 5, True)
    stored = dict(store.query("SELECT prompt_id, count(*) FROM samples GROUP BY 1"))
    assert stored == {"hello": 1, "x": 2, "x#turn1": 1, "x#turn1#": 1}
    [lone] = _chain(store, "x#turn1")
    assert "a different question" in json.dumps(lone.capture.messages)
    assert json.loads(capsys.readouterr().out)["resumed"] == 5 and again == ExitCode.OK


def test_a_vllm_tool_turn_without_thinking_goes_back_with_empty_content_not_its_ids_decoded(tmp_path, capsys):
    """vLLM with thinking off answers a turn of calls alone with null content and null reasoning (as the recorded
    `rec/vllm_t1_nothink.json`). The chain took that for a raw capture and decoded the ids into the next history's
    content: the call section as text (Kimi: `functions.get_weather:0{…}`), a prompt the model never saw."""
    row = {
        "id": "nothink",
        "tools": TOOLS[:1],
        "messages": [
            {"role": "user", "content": "Weather?"},
            *_round(0)[:2],
            {"role": "assistant", "content": "Rain."},
        ],
    }
    row["messages"][1] = {**row["messages"][1], "tool_calls": row["messages"][1]["tool_calls"][:1]}
    with start_simulator(SimConfig(kind="vllm", quirks={"tool-calls": "each"})) as sim:
        code, _, store = _batch(tmp_path, sim.url, [row], "--no-thinking")
    assert code == ExitCode.OK, capsys.readouterr()
    first, second = _chain(store, "nothink")
    assert (first.capture.content, first.capture.reasoning) == (None, None) and first.capture.tool_calls
    (history,) = [m for m in second.capture.messages if m["role"] == "assistant"]
    assert history["content"] == "" and "reasoning_content" not in history
    assert second.capture.settings["chain"]["extends"] is True
    assert "session_prefix_break" not in {f.code for f in second.findings}
