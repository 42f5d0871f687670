"""`tokview export --trajectory`: one row per conversation of served ids, on a session
`tokview proxy` recorded against the simulator: mask 1 on exactly every served output, the ids between them
mask 0, split where a turn's prompt does not extend the previous turn's prompt + output ids, and the manifest
says where (turn, position) and why."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from export_tool_sessions import SESSION, record_tool_session, stored_turns

from tokview.cli import main
from tokview.sim import SimConfig, start_simulator
from tokview.store import Store


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, kimi_tok, kimi_profile):
    db = tmp_path_factory.mktemp("trajectory") / "p.duckdb"
    record_tool_session(db, kimi_tok, kimi_profile)
    return db, stored_turns(db)


def _first_difference(a: list[int], b: list[int]) -> int:
    return next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)


def test_a_session_is_one_row_of_served_ids_until_its_prompt_breaks_then_split_there(recorded, tmp_path) -> None:
    db, (t0, t1, t2) = recorded
    out = tmp_path / "t.jsonl"
    assert main(["export", "--db", str(db), "--trajectory", "--select", "all", "--out", str(out)]) == 0
    first, second = [json.loads(line) for line in out.read_text().splitlines()]
    served0 = t0["prompt_ids"] + t0["output_ids"]
    assert t1["prompt_ids"][: len(served0)] == served0  # the loop's reasoning was sent back: turn 1 extends
    assert first["input_ids"] == t1["prompt_ids"] + t1["output_ids"]
    added = len(t1["prompt_ids"]) - len(served0)
    assert first["loss_mask"] == (
        [0] * len(t0["prompt_ids"]) + [1] * len(t0["output_ids"]) + [0] * added + [1] * len(t1["output_ids"])
    )
    assert [t["output_span"] for t in first["metadata"]["turns"]] == [
        [len(t0["prompt_ids"]), len(served0)],
        [len(t1["prompt_ids"]), len(first["input_ids"])],
    ]
    assert second["input_ids"] == t2["prompt_ids"] + t2["output_ids"]
    assert second["loss_mask"] == [0] * len(t2["prompt_ids"]) + [1] * len(t2["output_ids"])
    at = _first_difference(t2["prompt_ids"], t1["prompt_ids"] + t1["output_ids"])
    split = {"conversation": f"session:{SESSION}_gen0", "turn": 2, "position": at, "reason": "prompt_does_not_extend"}
    assert {k: second["metadata"]["split_from"][k] for k in split} == split
    assert (first["id"], second["id"]) == (f"session:{SESSION}_gen0", f"session:{SESSION}_gen0_from_turn2")
    manifest = json.loads((tmp_path / "t.manifest.json").read_text())["trajectory"]
    assert (manifest["conversations"], manifest["rows"], manifest["turns"], manifest["breaks"]) == (1, 2, 3, 1)
    assert manifest["split_conversations"] == 1
    assert manifest["first_breaks"][0]["position"] == at


def test_a_session_a_restarted_proxy_went_on_with_is_one_conversation(tmp_path, kimi_tok, kimi_profile) -> None:
    """The restarted proxy restores the session and stores its next turn in a run of its own: keyed by run, the
    export split it there as `turn_missing`, with the turns before it in another row."""
    db = tmp_path / "r.duckdb"
    record_tool_session(db, kimi_tok, kimi_profile, restart_before=1)
    t0, t1, _ = stored_turns(db)
    with Store(db) as store:
        assert len({r[0] for r in store.query("SELECT run_id FROM samples")}) == 2
    out = tmp_path / "t.jsonl"
    assert main(["export", "--db", str(db), "--trajectory", "--select", "all", "--out", str(out)]) == 0
    first, second = [json.loads(line) for line in out.read_text().splitlines()]
    assert first["input_ids"] == t1["prompt_ids"] + t1["output_ids"]
    assert [t["sample_id"] for t in first["metadata"]["turns"]] == [t0["sample_id"], t1["sample_id"]]
    assert second["metadata"]["split_from"]["reason"] == "prompt_does_not_extend"  # as without the restart
    manifest = json.loads((tmp_path / "t.manifest.json").read_text())["trajectory"]
    assert (manifest["conversations"], manifest["rows"], manifest["breaks_by_reason"]) == (
        1,
        2,
        {"prompt_does_not_extend": 1},
    )


def test_inspect_walks_a_session_a_restarted_proxy_went_on_with_as_one_conversation(
    tmp_path, kimi_tok, kimi_profile
) -> None:
    """The app's w / W walk stopped at the run boundary (keyed by run), where the export now joins the session."""
    from tokview.store.conversation_turns import conversation_turns

    db = tmp_path / "r.duckdb"
    record_tool_session(db, kimi_tok, kimi_profile, restart_before=1)
    t0, t1, t2 = stored_turns(db)
    with Store(db) as store:
        for turn in (t0, t1, t2):
            walked = conversation_turns(store, turn["sample_id"])
            assert [t.sample_id for t in walked] == [t0["sample_id"], t1["sample_id"], t2["sample_id"]]


def test_a_turn_left_out_of_the_selection_splits_the_conversation_there(recorded, tmp_path) -> None:
    db, (t0, t1, t2) = recorded
    with Store(db) as store:
        store.record_verdict(t1["sample_id"], "rejected", reason="test")
    out = tmp_path / "v.jsonl"
    assert main(["export", "--db", str(db), "--trajectory", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["input_ids"] for r in rows] == [t0["prompt_ids"] + t0["output_ids"], t2["prompt_ids"] + t2["output_ids"]]
    assert rows[1]["metadata"]["split_from"]["reason"] == "turn_missing"
    # not 0: the first id turn 2's prompt does not share with the row so far (turn 0's prompt + output)
    at = _first_difference(t2["prompt_ids"], t0["prompt_ids"] + t0["output_ids"])
    assert rows[1]["metadata"]["split_from"]["position"] == at > 0


def test_a_conversation_whose_first_turn_is_left_out_says_so(recorded, tmp_path) -> None:
    """Its row starts at turn 1: exact, but a manifest without a break said the conversation was whole."""
    import shutil

    shared, (t0, t1, _) = recorded
    db = tmp_path / "own.duckdb"  # the module's store holds the other tests' verdicts
    shutil.copy(shared, db)
    with Store(db) as store:
        store.record_verdict(t0["sample_id"], "rejected", reason="test")
        store.record_verdict(t1["sample_id"], "approved", reason="test")
    out = tmp_path / "v.jsonl"
    assert main(["export", "--db", str(db), "--trajectory", "--out", str(out)]) == 0
    first = json.loads(out.read_text().splitlines()[0])
    assert first["metadata"]["first_turn"] == 1 and first["input_ids"][: len(t1["prompt_ids"])] == t1["prompt_ids"]
    assert {k: first["metadata"]["split_from"][k] for k in ("turn", "position", "reason")} == {
        "turn": 1,
        "position": 0,
        "reason": "turn_missing",
    }
    manifest = json.loads((tmp_path / "v.manifest.json").read_text())["trajectory"]
    assert (manifest["split_conversations"], manifest["breaks"]) == (1, 2)  # and turn 2's re-rendered prompt
    assert manifest["late_starts"] == 1


def test_the_summary_tells_a_late_start_from_a_split_and_names_a_manifest_only_when_written(
    recorded, tmp_path, capsys
) -> None:
    """ "5 split at 6 breaks" read as five conversations in pieces where four only started at turn 1; and with
    `--out -` the line sent the reader to a manifest that was never written."""
    import shutil

    shared, (t0, _, _) = recorded
    db = tmp_path / "late.duckdb"
    shutil.copy(shared, db)
    with Store(db) as store:
        store.record_verdict(t0["sample_id"], "rejected", reason="test")
    capsys.readouterr()
    assert (
        main(["export", "--db", str(db), "--trajectory", "--select", "valid", "--out", str(tmp_path / "l.jsonl")]) == 0
    )
    captured = capsys.readouterr()
    said = captured.err + captured.out
    assert "1 of them only start after turn 0" in said and "where: the manifest's" in said
    import subprocess
    import sys

    argv = [sys.executable, "-m", "tokview", "export", "--db", str(db), "--trajectory", "--select", "valid"]
    streamed = subprocess.run([*argv, "--out", "-"], capture_output=True, text=True, check=True)
    assert "1 of them only start after turn 0" in streamed.stderr and "manifest" not in streamed.stderr


@pytest.mark.parametrize("fmt", ["sharegpt", "speculators"])  # speculators, the default, was taken for no --format
def test_trajectory_cannot_be_combined_with_another_format(recorded, tmp_path, capsys, fmt) -> None:
    db, _ = recorded
    code = main(["export", "--db", str(db), "--trajectory", "--format", fmt, "--out", str(tmp_path / "x.jsonl")])
    assert code != 0
    assert (
        f"--trajectory writes --format trajectory: it cannot be combined with --format {fmt}" in capsys.readouterr().err
    )
    assert not (tmp_path / "x.jsonl").exists()


def _round(n: int) -> list[dict]:
    """Two parallel calls and their results, as a prompts file writes them."""
    calls = [
        {"id": f"w{n}", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": f"t{n}", "type": "function", "function": {"name": "get_time", "arguments": '{"zone": "CET"}'}},
    ]
    return [
        {"role": "assistant", "content": "", "reasoning_content": "file reasoning", "tool_calls": calls},
        {"role": "tool", "tool_call_id": f"w{n}", "content": f"sunny {n}"},
        {"role": "tool", "tool_call_id": f"t{n}", "content": f"1{n}:00"},
    ]


CHAIN_TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}
    for name in ("get_weather", "get_time")
]
CHAIN_TRACE = {
    "id": "agent",
    "tools": CHAIN_TOOLS,
    "messages": [
        {"role": "user", "content": "Weather and time in Paris?"},
        *_round(0),
        *_round(1),
        {"role": "assistant", "content": "Sunny, 10:00."},
        {"role": "user", "content": "And again?"},
        *_round(2),
        {"role": "assistant", "content": "Still sunny."},
    ],
}


def test_a_batch_chain_is_one_row_per_unbroken_stretch_with_parallel_calls_supervised(tmp_path, capsys) -> None:
    """`tokview batch --history served` stores a chain as turns of one prompt (`{prompt}#turn{t}`): the same
    entry makes its rows; the break after the finished loop (the template drops its reasoning) splits it."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps(CHAIN_TRACE) + "\n")
    db = tmp_path / "s.duckdb"
    cfg = SimConfig(kind="vllm", quirks={"tool-calls": "each", "tool-rounds": 2})
    with start_simulator(cfg) as sim:
        args = ["batch", str(prompts), "--server", sim.url, "--db", str(db), "--mode", "chat", "--workers", "1"]
        assert main([*args, "--temperature", "0", "--max-new-tokens", "400"]) == 0
    with Store(db) as store:
        turns = store.query("SELECT turn, prompt_ids, output_ids FROM samples WHERE prompt_id = 'agent' ORDER BY turn")
    assert [t[0] for t in turns] == [0, 1, 2, 3, 4]
    out = tmp_path / "t.jsonl"
    capsys.readouterr()
    assert main(["export", "--db", str(db), "--trajectory", "--select", "all", "--out", str(out)]) == 0
    said = capsys.readouterr().err
    assert "trajectory: 1 conversations (5 turns) as 2 rows; 1 split at 1 breaks (1 prompt_does_not_extend" in said
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [[t["turn"] for t in r["metadata"]["turns"]] for r in rows] == [[0, 1, 2], [3, 4]]
    for row, stretch in zip(rows, (turns[:3], turns[3:])):
        last = stretch[-1]
        assert row["input_ids"] == list(last[1]) + list(last[2])
        supervised = [i for i, m in enumerate(row["loss_mask"]) if m]
        spans = [range(*t["output_span"]) for t in row["metadata"]["turns"]]
        assert supervised == [i for span in spans for i in span]
        for span, (_, _, output) in zip(spans, stretch):
            assert [row["input_ids"][i] for i in span] == list(output)
    assert rows[0]["metadata"]["tool_calls"] == 4  # two rounds of two parallel calls
    manifest = json.loads((tmp_path / "t.manifest.json").read_text())["trajectory"]
    assert manifest["breaks_by_reason"] == {"prompt_does_not_extend": 1}
    assert manifest["first_breaks"][0]["turn"] == 3


def test_rows_are_read_a_few_at_a_time_as_conversations_are_written(recorded, tmp_path, monkeypatch) -> None:
    """The same rows with one stored row read at a time (the build held every selected row before writing one)."""
    import tokview.export.trajectory as trajectory

    db, _ = recorded
    whole, one_by_one = tmp_path / "whole.jsonl", tmp_path / "one.jsonl"
    assert main(["export", "--db", str(db), "--trajectory", "--out", str(whole)]) == 0
    reads: list[int] = []
    rows_for = Store.rows_for

    def counted(self: Store, ids: list[str], where: Any = None) -> list[dict]:
        reads.append(len(ids))
        return rows_for(self, ids, where)

    monkeypatch.setattr(Store, "rows_for", counted)
    monkeypatch.setattr(trajectory, "ROWS_READ_AT_ONCE", 1)
    assert main(["export", "--db", str(db), "--trajectory", "--out", str(one_by_one)]) == 0
    assert one_by_one.read_text() == whole.read_text()
    turns = sum(len(json.loads(line)["metadata"]["turns"]) for line in whole.read_text().splitlines())
    assert turns >= 2 and reads[-turns:] == [1] * turns  # one at a time (the read before: the per-sample checks)


def test_two_samples_of_one_turn_give_rows_of_distinct_ids(tmp_path) -> None:
    """A side request kept in the main loop's session shares a turn number with the loop's turn: both split there,
    and both rows were named `…_from_turn1` (a trainer keying rows by id keeps one)."""
    from builders import kimi, make_capture, profile

    from tokview.core.analysis import analyze

    db = tmp_path / "t.duckdb"
    with Store(db) as store:
        for n, (turn, question) in enumerate([(0, "q0"), (1, "q1"), (1, "q1 side")]):
            cap = make_capture(question)
            analysis = analyze(cap, profile(), kimi())
            store.put_sample(f"p:{n}", "session:x", "r", cap, analysis, gen_index=0, turn=turn, profile="kimi-k2.5")
    out = tmp_path / "t.jsonl"
    assert main(["export", "--db", str(db), "--trajectory", "--select", "all", "--out", str(out)]) == 0
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert ids == ["session:x_gen0", "session:x_gen0_from_turn1", "session:x_gen0_from_turn1_2"]


def test_a_batch_chains_later_turns_in_another_run_stay_a_conversation_of_their_own(tmp_path) -> None:
    """Only a proxy session goes on across runs: a chain prompts file run again (other settings) whose turn 2 is the
    one selected is not joined after the first run's turns 0-1 as if one conversation."""
    import dataclasses

    from builders import kimi, make_capture, profile

    from tokview.core.analysis import analyze

    db, history = tmp_path / "t.duckdb", list[dict[str, str]]()
    with Store(db) as store:
        for turn, run in enumerate(("run1", "run1", "run2")):
            cap = dataclasses.replace(make_capture(f"q{turn}", answer=f"a{turn}", history=history), settings={})
            analysis = analyze(cap, profile(), kimi())
            store.put_sample(
                f"c#{turn}@{run}", "chainA", run, cap, analysis, gen_index=0, turn=turn, profile="kimi-k2.5"
            )
            history = [*history, {"role": "user", "content": f"q{turn}"}, {"role": "assistant", "content": f"a{turn}"}]
    out = tmp_path / "t.jsonl"
    assert main(["export", "--db", str(db), "--trajectory", "--select", "all", "--out", str(out)]) == 0
    manifest = json.loads((tmp_path / "t.manifest.json").read_text())["trajectory"]
    assert manifest["conversations"] == 2
    assert manifest["breaks_by_reason"]["turn_missing"] == 1  # run2's conversation has no turns 0-1


def _answer(before: list[int], question: str, said: str) -> Any:
    """A turn whose prompt extends the served ids before it (`before`; none: a first turn)."""
    import dataclasses

    from builders import kimi, make_capture

    base = make_capture(question, answer=said)
    prompt = [*before, *kimi().encode(question)] if before else base.prompt_ids
    return dataclasses.replace(base, prompt_ids=prompt)


def _served(cap: Any) -> list[int]:
    return [*cap.prompt_ids, *cap.output_ids]


def _store_turns(db: Path, session: str, turns: list[tuple[str, int, int, Any]]) -> None:
    """(sample id, turn, generation index, capture) of one session, stored as the proxy stores them."""
    from builders import kimi, profile

    from tokview.core.analysis import analyze

    with Store(db) as store:
        for sample_id, turn, gen, cap in turns:
            store.put_sample(
                sample_id, session, "r", cap, analyze(cap, profile(), kimi()), gen_index=gen, turn=turn,
                profile="kimi-k2.5",
            )  # fmt: skip


def _trajectory_rows(db: Path, out: Path) -> list[dict[str, Any]]:
    assert main(["export", "--db", str(db), "--trajectory", "--select", "all", "--out", str(out)]) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_a_branch_is_a_row_of_its_own_and_each_branch_goes_on_with_its_own_row(tmp_path) -> None:
    """Turn 0, then two turns 1 (the harness went on twice), each continued by its own turn 2. Each turn was compared
    with the newest row only: `left2` was split off as `prompt_does_not_extend` though it extends `left1`, and the right
    branch's turns were `turn_missing`, none being. Now: [0, left1, left2] and [right1, right2] (a `branch`)."""
    first = _answer([], "q0", "a0")
    left1, right1 = _answer(_served(first), "left?", "L"), _answer(_served(first), "right?", "R")
    left2, right2 = _answer(_served(left1), "more left?", "LL"), _answer(_served(right1), "more right?", "RR")
    db = tmp_path / "t.duckdb"
    turns = [("t0", 0, first), ("left1", 1, left1), ("right1", 1, right1), ("left2", 2, left2), ("right2", 2, right2)]
    _store_turns(db, "session:b", [(sample_id, turn, 0, cap) for sample_id, turn, cap in turns])
    rows = _trajectory_rows(db, tmp_path / "t.jsonl")
    assert [[t["sample_id"] for t in r["metadata"]["turns"]] for r in rows] == [
        ["t0", "left1", "left2"],
        ["right1", "right2"],
    ]
    assert rows[1]["metadata"]["split_from"]["reason"] == "branch"
    section = json.loads((tmp_path / "t.manifest.json").read_text())["trajectory"]
    assert section["breaks_by_reason"] == {"branch": 1}
    by_id = {sample_id: cap for sample_id, _, cap in turns}
    for row in rows:  # every row is served ids: each turn's output supervised, nothing else
        supervised = [i for i, m in zip(row["input_ids"], row["loss_mask"]) if m]
        assert supervised == [i for t in row["metadata"]["turns"] for i in by_id[t["sample_id"]].output_ids]


def test_a_harness_going_on_from_choice_1_of_an_n_request_goes_on_with_that_choices_row(tmp_path) -> None:
    """A proxy request with `n` = 2 stores choice 1 as generation 1 of the same turn; the harness went on from it.
    Keyed by generation, the next turn was split from choice 0's row (`prompt_does_not_extend`) and choice 1 stood
    alone (`turn_missing`). A session's generations are one conversation: choice 1 is a branch, and the next turn goes
    on with it."""
    import dataclasses

    from builders import make_capture

    first = _answer([], "q0", "a0")
    choice0 = _answer(_served(first), "pick?", "seven")
    choice1 = dataclasses.replace(choice0, output_ids=make_capture("pick?", answer="forty-two").output_ids)
    after1 = _answer(_served(choice1), "why that one?", "because")
    db = tmp_path / "n.duckdb"
    _store_turns(
        db,
        "session:n",
        [
            ("proxy:r:0000001", 0, 0, first),
            ("proxy:r:0000002", 1, 0, choice0),
            ("proxy:r:0000002.c1", 1, 1, choice1),
            ("proxy:r:0000003", 2, 0, after1),
        ],
    )
    rows = _trajectory_rows(db, tmp_path / "n.jsonl")
    assert [[t["sample_id"] for t in r["metadata"]["turns"]] for r in rows] == [
        ["proxy:r:0000001", "proxy:r:0000002"],
        ["proxy:r:0000002.c1", "proxy:r:0000003"],
    ]
    assert rows[1]["metadata"]["split_from"]["reason"] == "branch"
    assert rows[1]["input_ids"] == _served(after1)
    from tokview.store.conversation_turns import conversation_turns

    with Store(db) as store:  # inspect's w / W: choice 1 and the turn after it were not in the walk from turn 0
        walked = [t.sample_id for t in conversation_turns(store, "proxy:r:0000001")]
    assert walked == ["proxy:r:0000001", "proxy:r:0000002", "proxy:r:0000002.c1", "proxy:r:0000003"]


def test_a_second_answer_to_turn_0_is_a_branch_not_a_missing_turn(tmp_path) -> None:
    """An `n` = 2 request (or a retry kept) at turn 0, the harness going on from choice 1: choice 1's row was split
    as `turn_missing`, which reads as samples left out of the selection; none was."""
    import dataclasses

    from builders import make_capture

    choice0 = make_capture("pick?", answer="seven")
    choice1 = dataclasses.replace(choice0, output_ids=make_capture("pick?", answer="forty-two").output_ids)
    after1 = dataclasses.replace(make_capture("why?", answer="because"), prompt_ids=[*_served(choice1), 7, 8])
    db = tmp_path / "b.duckdb"
    _store_turns(
        db,
        "session:b",
        [
            ("proxy:r:0000001", 0, 0, choice0),
            ("proxy:r:0000001.c1", 0, 1, choice1),
            ("proxy:r:0000002", 1, 0, after1),
        ],
    )
    rows = _trajectory_rows(db, tmp_path / "b.jsonl")
    assert [[t["sample_id"] for t in r["metadata"]["turns"]] for r in rows] == [
        ["proxy:r:0000001"],
        ["proxy:r:0000001.c1", "proxy:r:0000002"],
    ]
    assert rows[1]["metadata"]["split_from"]["reason"] == "branch"
    assert rows[1]["metadata"]["split_from"]["position"] == len(choice0.prompt_ids)  # where the other answer starts


def test_a_side_request_whose_prompt_re_renders_an_earlier_turn_does_not_extend_it(tmp_path) -> None:
    """Turn 0, turn 1 extending it, then a side request built on turn 0 but rendered otherwise (a title request sent
    without the tools, so its prompt differs inside turn 0's): no turn was left out, yet it was split as
    `turn_missing`. It is `prompt_does_not_extend`, where its ids leave turn 0's."""
    first = _answer([], "q0", "a0")
    main_turn = _answer(_served(first), "go on", "ok")
    rendered_otherwise = [*first.prompt_ids[:3], 5, *first.prompt_ids[4:], *first.output_ids]
    side = _answer(rendered_otherwise, "title?", "Trip")
    db = tmp_path / "s.duckdb"
    _store_turns(db, "session:s", [("t0", 0, 0, first), ("t1", 1, 0, main_turn), ("t2-side", 1, 0, side)])
    rows = _trajectory_rows(db, tmp_path / "s.jsonl")
    assert [[t["sample_id"] for t in r["metadata"]["turns"]] for r in rows] == [["t0", "t1"], ["t2-side"]]
    assert rows[1]["metadata"]["split_from"]["reason"] == "prompt_does_not_extend"
    assert rows[1]["metadata"]["split_from"]["position"] == 3


def test_a_retry_of_a_later_turn_is_a_branch_where_an_earlier_retry_made_one(tmp_path) -> None:
    """Turn 1 asked twice (a retry, the same answer), the loop going on from the retry's row, then turn 3 asked twice:
    the second turn 3 extended the first row (turns 0-1) best, was not its next turn, and was said `turn_missing`
    though every turn was selected. It answers the prompt the other row's turn 3 answered: a `branch` there."""
    t0 = _answer([], "q0", "a0")
    t1 = _answer(_served(t0), "q1", "a1")
    t2 = _answer(_served(t1), "q2", "a2")
    t3 = _answer(_served(t2), "q3", "a3")
    t4 = _answer(_served(t3), "q4", "a4")
    turns = [("t0", 0, t0), ("t1", 1, t1), ("t1r", 1, t1), ("t2", 2, t2), ("t3", 3, t3), ("t3r", 3, t3), ("t4", 4, t4)]
    db = tmp_path / "r.duckdb"
    _store_turns(db, "session:r", [(sample_id, turn, 0, cap) for sample_id, turn, cap in turns])
    rows = _trajectory_rows(db, tmp_path / "r.jsonl")
    reasons = [r["metadata"]["split_from"]["reason"] for r in rows if r["metadata"].get("split_from")]
    assert reasons == ["branch", "branch"]
    assert sorted(t["sample_id"] for r in rows for t in r["metadata"]["turns"]) == sorted(s for s, _, _ in turns)


def test_a_later_conversation_under_a_session_id_reused_stays_apart_from_a_restarted_run(tmp_path) -> None:
    """Run r1 holds turns 0-1, r2 (its proxy restarted) turns 2-3, r3 a day later a new conversation under the same
    session id (a `user` field a harness reuses), turns 0-1. Ordered by first turn, r3 came between r1 and r2: r2 was
    split off the conversation it continues."""
    from builders import kimi, profile

    from tokview.core.analysis import analyze

    first = [_answer([], "q0", "a0")]
    for k in range(1, 4):
        first.append(_answer(_served(first[-1]), f"q{k}", f"a{k}"))
    other = [_answer([], "other q0", "b0")]
    other.append(_answer(_served(other[0]), "other q1", "b1"))
    db = tmp_path / "u.duckdb"
    with Store(db) as store:
        for run, when in (("r1", "10:00"), ("r2", "11:00"), ("r3", "23:00")):
            store.put_run(run, settings={"mode": "proxy"})
            store.query(f"UPDATE runs SET started = TIMESTAMP '2026-10-25 {when}:00' WHERE run_id = '{run}'")
        placed = [("r1", 0, first[0]), ("r1", 1, first[1]), ("r2", 2, first[2]), ("r2", 3, first[3])]
        placed += [("r3", 0, other[0]), ("r3", 1, other[1])]
        for run, turn, cap in placed:
            store.put_sample(
                f"proxy:{run}:{turn}",
                "user:u",
                run,
                cap,
                analyze(cap, profile(), kimi()),
                turn=turn,
                profile="kimi-k2.5",
            )
    rows = _trajectory_rows(db, tmp_path / "u.jsonl")
    assert sorted([t["sample_id"] for t in r["metadata"]["turns"]] for r in rows) == [
        ["proxy:r1:0", "proxy:r1:1", "proxy:r2:2", "proxy:r2:3"],
        ["proxy:r3:0", "proxy:r3:1"],
    ]


def test_a_session_a_proxy_went_on_with_after_the_clock_went_back_is_still_one_row(tmp_path) -> None:
    """Runs were put side by side by their start time, a local wall-clock time: a proxy restarted under another TZ
    (or after a daylight-saving fall-back) started "before" the run it continued, and the session was split there
    as `turn_missing`. The run that holds the later turns comes after, whatever its time."""
    from builders import kimi, profile

    from tokview.core.analysis import analyze

    caps = [_answer([], "q0", "a0")]
    for k in range(1, 4):
        caps.append(_answer(_served(caps[-1]), f"q{k}", f"a{k}"))
    db = tmp_path / "c.duckdb"
    with Store(db) as store:
        store.put_run("late", settings={"mode": "proxy"})  # started first by the clock, holds turns 0-1
        store.put_run("early", settings={"mode": "proxy"})
        store.query("UPDATE runs SET started = TIMESTAMP '2026-10-25 02:30:00' WHERE run_id = 'late'")
        store.query("UPDATE runs SET started = TIMESTAMP '2026-10-25 02:10:00' WHERE run_id = 'early'")
        for k, cap in enumerate(caps):
            run = "late" if k < 2 else "early"
            store.put_sample(
                f"proxy:{run}:{k}", "session:c", run, cap, analyze(cap, profile(), kimi()), turn=k, profile="kimi-k2.5"
            )
    rows = _trajectory_rows(db, tmp_path / "c.jsonl")
    assert [[t["sample_id"] for t in r["metadata"]["turns"]] for r in rows] == [
        ["proxy:late:0", "proxy:late:1", "proxy:early:2", "proxy:early:3"]
    ]


def test_inspect_walks_a_session_a_proxy_went_on_with_after_the_clock_went_back(tmp_path) -> None:
    """The app's w / W walk ordered a session's runs by their samples' times (local wall-clock): the run that went on
    after the clock went back came first, and the walk stopped at its boundary (two conversations of two turns)."""
    from builders import kimi, profile

    from tokview.core.analysis import analyze
    from tokview.store.conversation_turns import conversation_turns

    caps = [_answer([], "q0", "a0")]
    for k in range(1, 4):
        caps.append(_answer(_served(caps[-1]), f"q{k}", f"a{k}"))
    with Store(tmp_path / "w.duckdb") as store:
        for k, cap in enumerate(caps):
            run = "late" if k < 2 else "early"
            store.put_sample(
                f"proxy:{run}:{k}", "session:w", run, cap, analyze(cap, profile(), kimi()), turn=k, profile="kimi-k2.5"
            )
        store.query("UPDATE samples SET created_at = created_at - INTERVAL 1 HOUR WHERE run_id = 'early'")
        walked = [
            [t.sample_id for t in conversation_turns(store, f"proxy:{run}:{k}")]
            for k, run in enumerate(["late", "late", "early", "early"])
        ]
    whole = ["proxy:late:0", "proxy:late:1", "proxy:early:2", "proxy:early:3"]
    assert walked == [whole] * 4


def test_show_names_the_turns_of_a_trajectory_row_it_is_given(recorded, tmp_path, capsys) -> None:
    """`tokview show` takes an exported row's id; a trajectory row's (`session:…_gen0`, `…_from_turn2`) said "no
    sample": the row is a conversation, and the error now names its turns' samples."""
    db, (t0, t1, t2) = recorded
    out = tmp_path / "t.jsonl"
    assert main(["export", "--db", str(db), "--trajectory", "--select", "all", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    capsys.readouterr()
    for row, turns, first in zip(rows, ([t0, t1, t2], [t2]), (0, 2)):
        assert main(["show", row["id"], "--db", str(db)]) == 1
        err = capsys.readouterr().err.strip()
        assert "is a trajectory row: each of its turns is a sample" in err and len(err.splitlines()) == 1
        assert f"the conversation's from turn {first}: " in err
        assert [t["sample_id"] in err for t in (t0, t1, t2)] == [t in turns for t in (t0, t1, t2)]
        assert all(t["sample_id"] in err for t in row["metadata"]["turns"])
    assert main(["show", rows[0]["metadata"]["turns"][0]["sample_id"], "--db", str(db), "--count", "1"]) == 0
