"""Curation at scale: `tokview review` gives every sample a filter selects a verdict, a tag, an
untag or a note in one step, recorded as the app's key press records it, and says what it changed."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pytest

from tokview.commands import review as review_command
from tokview.errors import UserError
from tokview.store import SampleFilter, Store


def review(db, *argv: str, capsys=None) -> str:
    parser = argparse.ArgumentParser(prog="tokview")
    review_command.add_parser(parser.add_subparsers())
    args = parser.parse_args(["review", "--db", str(db), "--reviewer", "carol", *argv])
    assert args.run(args) == 0
    return capsys.readouterr().out.strip() if capsys is not None else ""


@pytest.fixture
def db(tmp_path, put, make_capture):
    path = tmp_path / "r.duckdb"
    with Store(path) as store:
        for i in range(6):
            put(store, f"ok{i}", make_capture(question=f"why is the sky blue, take {i}"))
        for i in range(3):
            put(store, f"cut{i}", make_capture(finish_reason="length", stop=False), run_id="run2")
    return path


def test_reject_approve_tag_untag_and_note_from_the_shell(db, capsys):
    said = review(db, "--finding", "truncated", "--reject", "cut short", capsys=capsys)
    assert said == "rejected 3 of 3 selected samples"
    with Store(db) as store:
        cut = store.load_sample(store.samples_page(SampleFilter(run_id="run2"))[0].sample_id)
        last = cut.history[-1]
        assert (cut.status, last["kind"], last["who"], last["reason"], last["override"]) == (
            "rejected",
            "verdict",
            "carol",
            "cut short",
            False,
        )
    assert review(db, "--finding", "truncated", "--reject", "cut short", capsys=capsys) == (
        "rejected 0 of 3 selected samples (3 already rejected)"
    )
    # A bare --approve would overturn the 3 rejections: --status says whether that is meant.
    with pytest.raises(UserError, match=r"3 of the 9 selected samples are rejected .*overturns that verdict.*--status"):
        review(db, "--approve")
    with pytest.raises(UserError, match="3 of the 3 selected samples have error findings.*--override"):
        review(db, "--status", "rejected", "--approve")
    assert review(db, "--status", "pending", "--approve", capsys=capsys) == "approved 6 of 6 selected samples"
    assert review(db, "--search", "TAKE 1", "--tag", "Sky", capsys=capsys) == "tagged 1 of 1 selected sample"
    assert review(db, "--search", "sky", "--tag", "sky", capsys=capsys) == (
        "tagged 5 of 6 selected samples (1 already tagged)"
    )
    out = json.loads(review(db, "--with-tag", "SKY", "--untag", "sky", "--dry-run", "--json", capsys=capsys))
    assert (out["changed"], out["dry_run"], out["who"]) == (6, True, "carol")
    with Store(db) as store:
        assert store.count_samples(SampleFilter(text="sky")) == 6
        tags = sorted(t for s in out["sample_ids"] for t in store.load_sample(s).tags)
        assert tags == ["Sky"] + ["sky"] * 5  # the dry run wrote nothing
    assert review(db, "--search", "take 2", "--note", "reads well", capsys=capsys) == "noted 1 of 1 selected sample"
    assert review(db, "--with-tag", "SKY", "--untag", "sky", capsys=capsys) == "untagged 6 of 6 selected samples"
    with Store(db) as store:
        noted = store.load_sample(store.samples_page(SampleFilter(text="reads well"))[0].sample_id)
        assert noted.tags == []
        assert noted.notes == ["reads well"]
        assert noted.status == "approved"
        assert noted.history[-1]["kind"] == "undo"
        assert noted.history[-1]["who"] == "carol"
    assert review(db, "--with-tag", "sky", "--approve", capsys=capsys) == "approved 0 of 0 selected samples"


def test_approving_invalid_samples_is_an_override_once_for_the_group(db, capsys):
    assert review(db, "--approve", "--override", capsys=capsys) == "approved 9 of 9 selected samples"
    with Store(db) as store:
        rows = store.query("SELECT count(*) FILTER (WHERE override), count(*) FROM verdicts WHERE kind = 'verdict'")
    assert rows == [(3, 9)]


def test_bad_filters_are_one_line(db):
    with pytest.raises(UserError, match="unknown finding code 'truncatd'"):
        review(db, "--finding", "truncatd", "--approve")
    with pytest.raises(UserError, match="no sample of a run 'nope'"):
        review(db, "--run", "nope", "--approve")
    with pytest.raises(UserError, match="--tag must not be empty"):
        review(db, "--tag", " ")
    with pytest.raises(UserError, match="database not found"):
        review(db.parent / "missing.duckdb", "--approve")
    # searched for as text, `nll>2` matched nothing and approved 0 of 0, exit 0
    with pytest.raises(UserError, match=r"--search 'nll>2': the thresholds read are upper bounds, `nll<=N`"):
        review(db, "--search", "nll>2", "--reject", "off policy")


@pytest.mark.parametrize(
    "argv",
    [
        ["--tag", "a\udc80b"],
        ["--untag", "a\udc80b"],
        ["--note", "a\udc80b"],
        ["--reject", "a\udc80b"],
        ["--with-tag", "a\udc80b", "--approve"],
        ["--search", "a\udc80b", "--approve"],
    ],
    ids=["tag", "untag", "note", "reject", "with-tag", "search"],
)
def test_text_that_is_not_utf8_is_refused_in_the_flags_own_words(db, argv):
    """Bytes a terminal passed that are not UTF-8 arrive as lone surrogates: DuckDB refused them as "cannot read
    STORE: … Python Conversion Failure", which blamed the store."""
    with pytest.raises(UserError, match=f"{argv[0]} holds bytes that are not UTF-8 text"):
        review(db, *argv)
    with Store(db) as store:
        assert store.query("SELECT count(*) FROM actions") == [(0,)]  # nothing done


def test_ten_thousand_samples_take_under_a_second(tmp_path, put, make_capture, capsys):
    path = tmp_path / "big.duckdb"
    with Store(path) as store:
        put(store, "seed", make_capture())
        store.execute(
            "INSERT INTO samples SELECT s.* REPLACE (s.sample_id || '-' || r.i AS sample_id) "
            "FROM samples s, range(9999) r(i)"
        )
        assert store.count_samples() == 10_000
    timings = {}
    for action in (["--reject", "loops"], ["--tag", "batch-7"], ["--untag", "batch-7"], ["--note", "seen"]):
        start = time.perf_counter()
        said = review(path, *action, capsys=capsys)
        timings[action[0]] = time.perf_counter() - start
        assert said.split()[1:4] == ["10000", "of", "10000"], said
    assert max(timings.values()) < 1.0, timings


def test_reasons_and_names_with_terminal_controls_print_as_escapes(db, capsys):
    """A reject reason (anyone's text) holding a window-title sequence and a newline printed raw in --history and
    --undo: the terminal ran it. Shown as escapes, each action on its one line."""
    reason = "bad\x1b]0;PWNED\x07 and\nmore"
    review(db, "--finding", "truncated", "--reject", reason, capsys=capsys)
    history = review(db, "--history", capsys=capsys)
    assert "\x1b" not in history and "\x07" not in history
    assert len(history.splitlines()) == 1 and "bad\\x1b]0;PWNED\\x07 and\\nmore" in history
    undone = review(db, "--undo", "last", capsys=capsys)
    assert "\x1b" not in undone and len(undone.splitlines()) == 1


def test_a_run_name_with_controls_prints_as_escapes_in_the_summary_and_stats(tmp_path, put, make_capture, capsys):
    from tokview.batch.config import BatchSummary
    from tokview.commands import stats as stats_command

    name = "evil\x1b]0;T\x07\nx"
    summary = BatchSummary(run_id=name, input=0)
    rendered = summary.render()
    assert "\x1b" not in rendered and rendered.splitlines()[0].startswith("run evil\\x1b]0;T\\x07\\nx:")
    path = tmp_path / "s.duckdb"
    with Store(path) as store:
        put(store, "a", make_capture(), run_id=name)
    parser = argparse.ArgumentParser(prog="tokview")
    stats_command.add_parser(parser.add_subparsers())
    args = parser.parse_args(["stats", "--db", str(path), "--by", "run"])
    assert args.run(args) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out
    assert len(out.strip().splitlines()) == 3  # its three lines: the newline in its name did not make a fourth


def test_a_review_done_on_a_copy_comes_back_with_the_merge(tmp_path, db, capsys):
    """Review on a copy, merge the copy back: the samples are already here, so nothing of the copy came across, and
    the merge said only "+0 samples" (the reviewer's 3 rejections silently gone). The review now comes across
    (tests/test_merge_review.py holds the cases)."""
    import shutil

    from tokview.commands import merge as merge_command

    copy = tmp_path / "copy.duckdb"
    shutil.copy(db, copy)
    with Store(copy) as store:
        for sample in store.samples_page(SampleFilter(run_id="run2")):
            store.record_verdict(sample.sample_id, "rejected", reason="cut short", who="dave")
    parser = argparse.ArgumentParser(prog="tokview")
    merge_command.add_parser(parser.add_subparsers())
    args = parser.parse_args(["merge", str(copy), "--into", str(db)])
    assert args.run(args) == 0
    said = capsys.readouterr().err
    assert "+0 samples" in said
    assert f"merged the review of 3 samples already in {db} from {copy}" in said, said
    with Store(db) as store:
        assert {s.status for s in store.samples_page(SampleFilter(run_id="run2"))} == {"rejected"}


def test_a_refused_merge_into_a_new_store_leaves_no_file(tmp_path):
    from tokview.commands import merge as merge_command
    from tokview.errors import TokviewError

    bogus = tmp_path / "not-a-store.duckdb"
    bogus.write_text("hello")
    into = tmp_path / "new.duckdb"
    parser = argparse.ArgumentParser(prog="tokview")
    merge_command.add_parser(parser.add_subparsers())
    args = parser.parse_args(["merge", str(bogus), "--into", str(into)])
    with pytest.raises(TokviewError):
        args.run(args)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not-a-store.duckdb"]


def test_a_refused_merge_never_removes_a_store_another_process_made_meanwhile(tmp_path, monkeypatch):
    """The merge decided it made the target before opening it: a batch that created the same file in between (while
    the merge waited for its lock) lost its store when the merge was then refused. It is removed only if empty."""
    import tokview.store as store_package
    from tokview.commands import merge as merge_command
    from tokview.errors import TokviewError

    bogus = tmp_path / "not-a-store.duckdb"
    bogus.write_text("hello")
    into = tmp_path / "all.duckdb"
    opening = store_package.Store.__init__

    made: list[bool] = []

    def made_meanwhile(self, path, *args, **kwargs):
        if Path(path) == into and not made:
            made.append(True)
            with Store(into) as other:  # "another process" makes the store and records a run in it
                other.put_run("batch-of-someone-else", settings={"x": 1})
        opening(self, path, *args, **kwargs)

    monkeypatch.setattr(store_package.Store, "__init__", made_meanwhile)
    parser = argparse.ArgumentParser(prog="tokview")
    merge_command.add_parser(parser.add_subparsers())
    args = parser.parse_args(["merge", str(bogus), "--into", str(into)])
    with pytest.raises(TokviewError):
        args.run(args)
    monkeypatch.undo()
    with Store(into) as store:
        assert [r["run_id"] for r in store.runs()] == ["batch-of-someone-else"]


def test_undoing_an_untag_after_undoing_the_tag_leaves_no_tag(db, capsys):
    """Tag (#a), untag (#b), undo #a, undo #b: both listed as undone, yet every sample carried the tag again (the
    untag's undo brought back the rows it had undone, though their own action was undone since)."""
    review(db, "--run", "run2", "--tag", "hard", capsys=capsys)
    review(db, "--run", "run2", "--untag", "hard", capsys=capsys)
    history = json.loads(review(db, "--history", "--json", capsys=capsys))
    tag = next(a["action_id"] for a in history if a["kind"] == "tag")
    review(db, "--undo", str(tag), capsys=capsys)
    review(db, "--undo", "last", capsys=capsys)
    with Store(db) as store:
        assert [s for s in store.samples_page(SampleFilter(run_id="run2")) if "hard" in (s.tags or [])] == []
        assert all(store.load_sample(s.sample_id).tags == [] for s in store.samples_page(SampleFilter(run_id="run2")))


def test_a_sample_id_with_a_newline_or_a_bidi_override_stays_one_line_and_reads_as_stored(
    tmp_path, put, make_capture, capsys
):
    """`stats --samples` (one tab-separated line per sample) and `show`'s header printed a newline in an id raw, and
    U+202E reversed what the terminal drew after it."""
    from tokview.cli import main

    db = tmp_path / "n.duckdb"
    with Store(db) as store:
        sid = put(store, "line\none\u202eeno", make_capture())
        store._file.write([("UPDATE samples SET sample_id = ? WHERE sample_id = ?", ["odd\nid\u202edi", sid])])
    capsys.readouterr()
    assert main(["stats", "--db", str(db), "--samples"]) == 0
    listed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("odd")]
    assert listed and listed[0].startswith("odd\\nid\\u202edi\t"), listed
    assert main(["show", "odd\nid\u202edi", "--db", str(db)]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert header.startswith("sample odd\\nid\\u202edi  ["), header


def test_undo_of_a_digit_int_refuses_is_a_one_line_error(db, capsys):
    """`--undo ²`: "²" is a digit to str.isdigit and not to int(): an internal error, not the usage line."""
    from tokview.cli import main

    assert main(["review", "--db", str(db), "--undo", "²"]) != 0
    err = capsys.readouterr().err
    assert "--undo takes an action id" in err and "Traceback" not in err and "internal error" not in err


def test_an_empty_search_is_refused_and_approving_what_is_approved_asks_no_override(db, capsys):
    """`--search ""` read as no search (a reject then took the whole store); approving a selection whose invalid
    samples are all approved already asked for --override though nothing would change."""
    for empty in ("", "   "):
        with pytest.raises(UserError, match="--search must not be empty"):
            review(db, "--search", empty, "--reject", "bad")
    with Store(db) as store:
        assert store.query("SELECT count(*) FROM samples WHERE status = 'rejected'") == [(0,)]
    assert review(db, "--run", "run2", "--approve", "--override", capsys=capsys) == "approved 3 of 3 selected samples"
    assert review(db, "--status", "approved", "--approve", capsys=capsys) == (
        "approved 0 of 3 selected samples (3 already approved)"
    )


def test_repeated_tags_are_each_honoured_and_a_repeated_one_value_flag_is_refused(db, capsys):
    """argparse kept the last of a repeated flag: `--tag t1 --tag t2` tagged t2 alone, and `--with-tag a --with-tag b`
    selected b's samples, where `export --tag a --tag b` selects those carrying both."""
    from tokview.cli import main

    assert review(db, "--search", "take 1", "--tag", "t1", "--tag", "t2", "--tag", "T1", capsys=capsys) == (
        "tagged 1 of 1 selected sample"
    )
    assert review(db, "--search", "take 2", "--tag", "t2", capsys=capsys) == "tagged 1 of 1 selected sample"
    with Store(db) as store:
        assert sorted(store.load_sample(store.samples_page(SampleFilter(text="take 1"))[0].sample_id).tags) == [
            "t1",
            "t2",
        ]
    assert review(db, "--search", "take 1", "--tag", "T2", "--tag", "t1", capsys=capsys) == (
        "tagged 0 of 1 selected sample (1 already tagged)"  # twice is once, as with one tag (it wrote a new action)
    )
    said = json.loads(review(db, "--with-tag", "t1", "--with-tag", "T2", "--note", "both", "--json", capsys=capsys))
    assert said["changed"] == 1  # the sample carrying both, not every t2 sample
    for flag, values in (("--run", ("run2", "run2")), ("--untag", ("t1", "t2")), ("--reject", ("a", "b"))):
        argv = ["review", "--db", str(db), flag, values[0], flag, values[1]]
        assert main([*argv, *(["--approve"] if flag == "--run" else [])]) == 1
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1, err
        assert err.startswith(f"tokview: error: review: {flag} given twice: one value per review"), err


def test_a_bare_reject_does_not_overturn_approvals_unless_status_says_so(db, capsys):
    assert review(db, "--status", "valid", "--approve", capsys=capsys) == "approved 6 of 6 selected samples"
    with pytest.raises(UserError, match=r"6 of the 9 selected samples are approved .*--status approved to overturn"):
        review(db, "--reject", "all of it")
    # any --status says what is selected: every invalid sample, whatever its verdict (none is approved here)
    assert review(db, "--status", "invalid", "--reject", "cut", "--dry-run", capsys=capsys).startswith("would have")
    assert review(db, "--status", "pending", "--reject", "cut", capsys=capsys) == "rejected 3 of 3 selected samples"
    # with a rejection in the store, --status valid still approves every valid sample (no loop of refusals)
    assert review(db, "--status", "valid", "--approve", capsys=capsys) == (
        "approved 0 of 6 selected samples (6 already approved)"
    )
    assert review(db, "--status", "approved", "--reject", "redo", capsys=capsys) == "rejected 6 of 6 selected samples"


def test_a_review_whose_report_cannot_be_written_says_it_was_recorded_and_how_to_undo_it(db, tmp_path):
    """`review --tag x > /dev/full` recorded the action and exited 1 with "No space left on device" alone: a script
    took exit 1 for "nothing happened"."""
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "tokview", "review", "--db", str(db), "--tag", "zz"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
        )
    assert done.returncode == 1
    with Store(db) as store:
        [action] = store.actions()
    assert f"the review was recorded as action #{action.action_id}" in done.stderr
    assert f"--undo {action.action_id}` takes it back" in done.stderr


def test_flags_that_do_not_apply_are_refused(db):
    for argv, said in (
        (["--reject", "bad", "--override"], "--override goes with --approve only"),
        (["--tag", "t", "--override"], "--override goes with --approve only"),
        (["--history", "--dry-run"], "--history takes no --dry-run"),
    ):
        with pytest.raises(UserError, match=said):
            review(db, *argv)
