"""`tokview show`: a stored sample printed as text, and its errors as one line each."""

from __future__ import annotations

import json

from facts import KIMI_CHAIN_OUTPUT, KIMI_PROMPT_6X7

from tokview.cli import main
from tokview.core.analysis import analyze
from tokview.core.record import Capture
from tokview.store import Store


def _db_with_sample(tmp_path, kimi_tok, kimi_profile, dual=False):
    db = tmp_path / "t.duckdb"
    cap = Capture(
        parsed_output_ids=list(KIMI_CHAIN_OUTPUT) if dual else None,
        prompt_ids=KIMI_PROMPT_6X7,
        output_ids=KIMI_CHAIN_OUTPUT,
        finish_reason="stop",
        reasoning="Okay, let me think about this carefully.",
        content="The answer is forty-two!",
        reasoning_field="reasoning",
        endpoint="vllm-chat",
        server_kind="vllm",
        server_version="0.32.0",
    )
    with Store(db) as store:
        store.put_sample("s1", "p1", "r1", cap, analyze(cap, kimi_profile, kimi_tok), profile="kimi-k2.5")
    return db


def test_show_prints_segments_findings_and_hidden_ids(tmp_path, capsys, kimi_tok, kimi_profile):
    db = _db_with_sample(tmp_path, kimi_tok, kimi_profile)
    assert main(["show", "s1", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "prefilled_opener" in out
    assert "think_open_in_prompt" in out
    assert "parser_hidden_ids" in out
    closer_line = next(line for line in out.splitlines() if line.split()[:2] == ["37", "163607"])
    assert "closer" in closer_line
    assert "hidden" in closer_line


def test_show_marks_hidden_ids_of_a_dual_capture_whose_paths_agree(tmp_path, capsys, kimi_tok, kimi_profile):
    """`--mode dual` keeps the parsed path's ids too: when they are the raw path's, the text-field column
    is theirs (it was left empty for every dual capture)."""
    db = _db_with_sample(tmp_path, kimi_tok, kimi_profile, dual=True)
    assert main(["show", "s1", "--db", str(db)]) == 0
    closer_line = next(line for line in capsys.readouterr().out.splitlines() if line.split()[:2] == ["37", "163607"])
    assert "hidden" in closer_line


def test_show_json(tmp_path, capsys, kimi_tok, kimi_profile):
    db = _db_with_sample(tmp_path, kimi_tok, kimi_profile)
    assert main(["show", "s1", "--db", str(db), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["valid"] is True
    assert data["capture"]["output_ids"] == KIMI_CHAIN_OUTPUT


def test_show_errors_are_one_line(tmp_path, capsys, kimi_tok, kimi_profile):
    assert main(["show", "nope", "--db", str(tmp_path / "missing.duckdb")]) == 1
    assert capsys.readouterr().err.strip().count("\n") == 0
    db = _db_with_sample(tmp_path, kimi_tok, kimi_profile)
    assert main(["show", "nope", "--db", str(db)]) == 1
    err = capsys.readouterr().err
    assert "no sample 'nope'" in err
    assert err.count("\n") == 1


def test_show_tells_who_reviewed_it_why_and_the_notes(tmp_path, capsys, kimi_tok, kimi_profile):
    db = _db_with_sample(tmp_path, kimi_tok, kimi_profile)
    with Store(db) as store:
        store.record_verdict("s1", "rejected", reason="repetition / degenerate output", who="alice")
        store.add_note("s1", "loops after the closer", who="bob", tags=["loop"])
    assert main(["show", "s1", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "rejected by alice at " in out
    assert ": repetition / degenerate output" in out
    assert "note: loops after the closer" in out
    assert "tags: loop" in out
    assert main(["show", "s1", "--db", str(db), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["notes"] == ["loops after the closer"]
    assert data["tags"] == ["loop"]
    verdict = next(h for h in data["review"] if h["kind"] == "verdict")
    assert (verdict["who"], verdict["reason"], verdict["override"]) == (
        "alice",
        "repetition / degenerate output",
        False,
    )


def test_a_stored_negative_id_is_a_damaged_row_in_one_line(tmp_path, capsys, kimi_tok, kimi_profile):
    """A row edited to hold -5 ended `show` in an internal error (the tokenizer's OverflowError, exit 70); an id past
    the vocabulary was an `unknown_token_id` finding all along."""
    db = _db_with_sample(tmp_path, kimi_tok, kimi_profile)
    with Store(db) as store:
        store._file.write([("UPDATE samples SET output_ids = list_concat(output_ids[1:5], [-5])", [])])
    capsys.readouterr()
    assert main(["show", "s1", "--db", str(db)]) == 1
    err = capsys.readouterr().err
    assert (
        err
        == "tokview: error: sample s1: its stored row is damaged (ValueError: output_ids holds a negative id (-5))\n"
    )


def test_show_keeps_its_columns_by_terminal_cells_past_wide_pieces(tmp_path, capsys, kimi_tok, kimi_profile):
    """A CJK piece or an emoji takes two cells: padded by characters, each pushed the columns after it right."""
    import re

    from rich.cells import cell_len

    answer = kimi_tok.encode("答案是 🎉 forty-two") + [kimi_profile.stop_ids[0]]
    db = tmp_path / "w.duckdb"
    cap = Capture(prompt_ids=KIMI_PROMPT_6X7, output_ids=answer, finish_reason="stop", endpoint="sglang-generate")
    with Store(db) as store:
        store.put_sample("w1", "p1", "r1", cap, analyze(cap, kimi_profile, kimi_tok), profile="kimi-k2.5")
    assert main(["show", "w1", "--db", str(db)]) == 0
    rows = [m for line in capsys.readouterr().out.splitlines() if (m := re.match(r"^ +\d+ +\d+  ('.*?') +\S", line))]
    assert len(rows) == len(answer)
    assert any(cell_len(m.group(1)) > len(m.group(1)) for m in rows)  # a wide piece is among them
    assert {cell_len(m.group(0)) for m in rows} == {cell_len(rows[0].group(0))}, [m.group(0) for m in rows]


def test_show_takes_the_row_id_an_export_wrote(tmp_path, capsys, put, make_capture, kimi_tok, kimi_profile):
    """A row found wrong in a trainer's file (`my-task#turn1_gen0`) was "no sample" to `show`: only the sample id
        `stats --samples` prints was taken. A bare id two runs share is the first run's by name, as exports write it;
    two samples of one run behind one row id are named, not guessed between."""
    db = tmp_path / "rows.duckdb"
    with Store(db) as store:
        chained = [put(store, "my-task", make_capture(question=f"turn {t}"), turn=t) for t in (0, 1)]
        single = put(store, "plain", make_capture(question="once"))
        other = make_capture(question="once")  # the same prompt in a run of other settings: another sample id
        store.put_sample(
            "plain@other_gen0", "plain", "run2", other, analyze(other, kimi_profile, kimi_tok), gen_index=0
        )
    for row_id, sample_id in (("my-task#turn1_gen0", chained[1]), ("my-task#turn0", chained[0])):
        assert main(["show", "--db", str(db), row_id, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["sample_id"] == sample_id
    assert main(["show", "--db", str(db), "plain_gen0@run1", "--json"]) == 0  # a second run's row gets @run
    assert json.loads(capsys.readouterr().out)["sample_id"] == single
    # the bare id: an export gives it to the first run by name among the samples it wrote, which `show` cannot know
    # (a --run or a tag left others out): refused, naming the `@RUN` ids (it named `@SAMPLE_ID`, which no export wrote)
    assert main(["show", "--db", str(db), "plain_gen0"]) == 1
    err = capsys.readouterr().err
    assert "2 samples have the export row id 'plain_gen0': one in each of 2 runs" in err
    assert "give plain_gen0@run1, plain_gen0@run2" in err
    with Store(db) as store:  # a sample of no run: named by its sample id (`plain_gen0@` names nothing)
        loose = make_capture(question="no run")
        store.put_sample("loose@x_gen0", "loose", None, loose, analyze(loose, kimi_profile, kimi_tok), gen_index=0)
        store.put_sample("loose@y_gen0", "loose", "run2", loose, analyze(loose, kimi_profile, kimi_tok), gen_index=0)
    assert main(["show", "--db", str(db), "loose_gen0"]) == 1
    assert "give loose@x_gen0, loose_gen0@run2" in capsys.readouterr().err
    with Store(db) as store:  # two of one run behind one id (a session's branches): each exported `@SAMPLE_ID`
        for k in range(2):
            branch = make_capture(question=f"branch {k}")
            store.put_sample(f"b{k}", "fork", "run1", branch, analyze(branch, kimi_profile, kimi_tok), turn=1)
    assert main(["show", "--db", str(db), "fork#turn1_gen0"]) == 1
    err = capsys.readouterr().err
    assert "2 samples have the export row id 'fork#turn1_gen0': give `fork#turn1_gen0@SAMPLE_ID`" in err and "b0" in err
    assert main(["show", "--db", str(db), "my-task#turn7_gen0"]) == 1
    assert "no sample 'my-task#turn7_gen0'" in capsys.readouterr().err
    assert main(["show", "--db", str(db), "my-task"]) == 1  # a conversation's prompt id: its turns are named
    err = capsys.readouterr().err
    assert "'my-task' is a prompt id with 2 samples" in err and chained[0] in err and chained[1] in err, err
    with Store(db) as store:  # a prompt id holding `@`, a run name ending in `.digits`: read every way it can be
        mailed = put(store, "user@example.com", make_capture(question="mail"))
        versioned = make_capture(question="versioned")
        store.put_sample("v@k_gen0", "task", "exp-v1.3", versioned, analyze(versioned, kimi_profile, kimi_tok))
    for row_id, sample_id in (("user@example.com_gen0", mailed), ("task_gen0@exp-v1.3", "v@k_gen0")):
        assert main(["show", "--db", str(db), row_id, "--json"]) == 0, capsys.readouterr().err
        assert json.loads(capsys.readouterr().out)["sample_id"] == sample_id


def test_show_says_where_the_sample_sits_prompt_turn_generation_run(tmp_path, capsys, put, make_capture):
    """A proxied sample's session and turn (its prompt id and turn) were in neither the text nor the JSON."""
    db = tmp_path / "place.duckdb"
    with Store(db) as store:
        sample_id = put(store, "session:harness-1", make_capture(question="turn 2"), turn=2)
    assert main(["show", sample_id, "--db", str(db), "--count", "1"]) == 0
    assert "  prompt session:harness-1  turn 2  generation 0  run run1\n" in capsys.readouterr().out
    assert main(["show", sample_id, "--db", str(db), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["prompt_id"], shown["turn"], shown["gen_index"], shown["run_id"]) == (
        "session:harness-1",
        2,
        0,
        "run1",
    )


def test_a_trajectory_row_id_is_read_every_way_it_may_be_meant() -> None:
    """A run named `exp_2` lost its `_2` to the duplicate-row suffix, and `run_gen1` its `_gen1` to the generation."""
    from tokview.commands.show import _trajectory_parses

    assert ("p", 0, "exp_2", 0) in _trajectory_parses("p_gen0@exp_2")
    assert _trajectory_parses("task_gen0@run_gen1")[0] == ("task", 0, "run_gen1", 0)
    assert _trajectory_parses("session:x_gen0_from_turn2_2")[0] == ("session:x", 0, None, 2)
    assert ("a@b", 3, None, 0) in _trajectory_parses("a@b_gen3_split")  # a prompt id holding `@`


def test_a_prompt_id_with_one_sample_shows_it(tmp_path, capsys, put, make_capture):
    """A chain's only turn (`agent#turn0@…_gen0`) was refused for its bare prompt id: "a prompt id with 1 samples"."""
    db = tmp_path / "one.duckdb"
    with Store(db) as store:
        sample_id = put(store, "agent-task", make_capture(question="one turn"), turn=0)
    assert main(["show", "agent-task", "--db", str(db), "--count", "1"]) == 0
    assert f"sample {sample_id}" in capsys.readouterr().out
