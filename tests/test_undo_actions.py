"""Undo across samples: every verdict, note, tag or untag is one action (a bulk one too); `u` and
`tokview review --undo` take back the latest action wherever it was, or a chosen earlier one, as one step."""

from __future__ import annotations

import argparse
import json

import duckdb
import pytest

from tokview.commands import review as review_command
from tokview.errors import UserError
from tokview.store import SampleFilter, Store
from tokview.store import bulk_review as bulk
from tokview.store.errors import CannotUndo
from tokview.store.schema import LATEST_VERSION


def review(db, *argv: str, capsys) -> str:
    parser = argparse.ArgumentParser(prog="tokview")
    review_command.add_parser(parser.add_subparsers())
    args = parser.parse_args(["review", "--db", str(db), "--reviewer", "carol", *argv])
    assert args.run(args) == 0
    return capsys.readouterr().out.strip()


@pytest.fixture
def db(tmp_path, put, make_capture):
    path = tmp_path / "u.duckdb"
    with Store(path) as store:
        for i in range(6):
            put(store, f"ok{i}", make_capture(question=f"why is the sky blue, take {i}"))
        for i in range(3):
            put(store, f"cut{i}", make_capture(finish_reason="length", stop=False), run_id="run2")
    return path


def statuses(store) -> dict[str, str]:
    return dict(store.query("SELECT prompt_id, status FROM samples ORDER BY 1"))


def test_a_bulk_action_is_undone_as_one_step_and_an_earlier_one_by_its_id(db):
    with Store(db) as store:
        ids = bulk.select(store, SampleFilter())
        cut = bulk.select(store, SampleFilter(run_id="run2"))
        ok = [i for i in ids if i not in cut]
        rejected = bulk.set_status(store, cut, "rejected", who="ann", reason="cut short")
        tagged = bulk.add_notes(store, ok[:2], who="ann", tags=("Math",))
        store.record_verdict(ok[3], "approved", who="bob")
        approved = bulk.set_status(store, ok, "approved", who="ann")
        assert {rejected.action_id, tagged.action_id, approved.action_id}
        assert rejected.action_id < approved.action_id

        undone = store.undo_action(who="ann")  # the latest: the bulk approve, five samples as one step
        assert undone is not None
        assert undone.kind == "approved"
        assert sorted(undone.sample_ids) == sorted(i for i in ok if i != ok[3])
        assert statuses(store)["ok3"] == "approved"
        assert statuses(store)["ok0"] == "pending"

        undone = store.undo_action(rejected.action_id, who="ann")  # an earlier one, by its id
        assert undone is not None
        assert sorted(undone.sample_ids) == sorted(cut)
        assert {statuses(store)[f"cut{i}"] for i in range(3)} == {"pending"}
        assert store.load_sample(cut[0]).history[-1]["kind"] == "undo"
        assert store.load_sample(ok[0]).tags == ["Math"]  # the tag (between the two) stays

        undone = store.undo_action(who="ann")  # the undone actions are skipped: bob's single approve is next
        assert undone is not None
        assert undone.sample_ids == [ok[3]]
        assert undone.who == "bob"
        assert statuses(store)["ok3"] == "pending"
        with pytest.raises(CannotUndo, match="already undone"):
            store.undo_action(rejected.action_id, who="ann")


def test_untag_takes_a_tag_off_a_verdict_too_and_its_undo_puts_it_back(db):
    with Store(db) as store:
        sid = bulk.select(store, SampleFilter(text="take 1"))[0]
        store.record_verdict(sid, "rejected", reason="dull", tags=["Hard"], who="ann")
        store.add_note(sid, "look again", who="ann", tags=["hard", "math"])
        out = bulk.remove_tag(store, [sid], "HARD", who="ann")
        assert out.changed == [sid]
        assert out.unchanged == {}
        sample = store.load_sample(sid)
        assert sample.tags == ["math"]
        assert sample.status == "rejected"
        assert sample.notes == ["look again"]
        assert sample.history[-1]["reason"] == "untag HARD"
        store.undo_action(who="ann")
        sample = store.load_sample(sid)
        assert sorted(sample.tags, key=str.lower) == ["Hard", "math"]
        assert sample.status == "rejected"


def test_undoing_a_verdict_after_its_tag_was_removed_takes_the_verdict_back_and_leaves_the_tag_off(db):
    """An untag writes the tagged verdict (or note) again without the tag. Undoing the reject afterwards took back
    nothing (its own row was already undone by the untag) and the untag's copy kept the sample rejected; the note's
    copy stayed too. The copies now go with the action they copy."""
    with Store(db) as store:
        sid, other = bulk.select(store, SampleFilter(text="take 1")) + bulk.select(store, SampleFilter(text="take 2"))
        store.record_verdict(other, "approved", who="bob")
        rejected = bulk.set_status(store, [sid, other], "rejected", who="ann", reason="loops")
        tagged = bulk.add_notes(store, [sid], who="ann", note="see turn 3", tags=("Loop", "math"))
        assert (rejected.action_id, tagged.action_id) != (None, None)
        single = store.record_verdict(sid, "rejected", reason="loops", tags=["loop"], who="ann")
        bulk.remove_tag(store, [sid], "loop", who="bob")
        bulk.remove_tag(store, [sid], "math", who="bob")  # a copy of a copy
        store.undo_action(tagged.action_id, who="ann")
        sample = store.load_sample(sid)
        assert (sample.tags, sample.notes, sample.status) == ([], [], "rejected")
        store.undo_action(who="bob")  # the untag of "math" after its note is gone: nothing comes back
        sample = store.load_sample(sid)
        assert (sample.tags, sample.notes, sample.status) == ([], [], "rejected")
        store.undo_action(single, who="ann")  # the reject that carried the tag
        assert store.load_sample(sid).status == "rejected"  # the bulk reject's verdict is the latest live one
        store.undo_action(rejected.action_id, who="ann")
        assert store.load_sample(sid).status == "pending"
        assert store.load_sample(other).status == "approved"
        bulk.set_status(store, [sid], "approved", who="ann")
        store.undo_action(who="ann")
        assert store.load_sample(sid).status == "pending"


def test_tags_are_compared_without_case_in_a_sample_and_in_the_store(db):
    with Store(db) as store:
        sid = bulk.select(store, SampleFilter(text="take 2"))[0]
        store.add_note(sid, "", tags=["Math"], who="ann")
        store.add_note(sid, "", tags=["math", "long"], who="ann")
        assert store.load_sample(sid).tags == ["long", "Math"]
        assert store.tag_counts() == [("long", 1), ("Math", 1)]


def test_review_undo_from_the_shell_says_what_it_touched(db, capsys):
    review(db, "--finding", "truncated", "--reject", "cut short", capsys=capsys)
    review(db, "--status", "valid", "--approve", capsys=capsys)
    listed = review(db, "--history", capsys=capsys).splitlines()
    assert "approved 6 samples" in listed[0]
    assert "carol" in listed[0]
    assert "rejected 3 samples (cut short)" in listed[1]
    reject_id = listed[1].split()[0].lstrip("#")
    said = review(db, "--undo", reject_id, capsys=capsys)
    assert said.startswith(f"undid #{reject_id} rejected 3 samples (cut short) by carol: 3 samples")
    with Store(db) as store:
        assert store.count_samples(SampleFilter(status="rejected")) == 0
        assert store.count_samples(SampleFilter(status="approved")) == 6
    out = json.loads(review(db, "--undo", "last", "--json", capsys=capsys))
    assert out["kind"] == "approved"
    assert len(out["sample_ids"]) == 6
    with pytest.raises(UserError, match="nothing left to undo"):
        review(db, "--undo", "last", capsys=capsys)
    with pytest.raises(UserError, match=r"^--undo takes no --run, --with-tag: an action is listed and undone whole$"):
        review(db, "--undo", "last", "--run", "run2", "--with-tag", "x", capsys=capsys)  # it undid every run's
    with pytest.raises(UserError, match=r"^--history takes no --finding"):
        review(db, "--history", "--finding", "truncated", capsys=capsys)
    review(db, "--search", "take 1", "--tag", "sky", capsys=capsys)
    said = review(db, "--undo", "last", capsys=capsys)  # no status changed: not "back to approved"
    assert said.startswith("undid #") and said.endswith("_gen0), tags as they were"), said
    with pytest.raises(UserError, match="no action #999999"):
        review(db, "--undo", "999999", capsys=capsys)


def test_a_version_7_store_gains_actions_and_keeps_its_verdicts(tmp_path, put, make_capture):
    path = tmp_path / "old.duckdb"
    with Store(path) as store:
        a = put(store, "a", make_capture())
        b = put(store, "b", make_capture())
        store.record_verdict(a, "approved", who="ann")
        store.record_verdict(b, "rejected", reason="x", who="ann")
    conn = duckdb.connect(str(path))  # as version 7 left it: no action columns, no actions table
    conn.execute("DROP TABLE actions")
    conn.execute("DROP INDEX verdicts_sample_idx")  # DuckDB drops no column of an indexed table
    conn.execute("ALTER TABLE verdicts DROP COLUMN undone_by")
    conn.execute("ALTER TABLE verdicts DROP COLUMN action_id")
    conn.execute("CREATE INDEX verdicts_sample_idx ON verdicts(sample_id)")
    conn.execute("DELETE FROM schema_version WHERE version >= 8")
    conn.close()
    with Store(path) as store:
        assert store.query("SELECT max(version) FROM schema_version")[0][0] == LATEST_VERSION
        undone = store.undo_action(who="ann")  # the latest older verdict is an action of its own
        assert undone is not None
        assert undone.sample_ids == [b]
        assert store.load_sample(b).status == "pending"
        assert store.load_sample(a).status == "approved"


def test_done_when_from_a_shell(tmp_path, capsys):
    """Curation at scale end to end, from a shell: filter by finding, reject 200 with a reason, tag 50, approve the
    rest, undo the reject, export --tag with the right counts."""
    from bulk_store import FINDING, fill_500

    from tokview.commands import export as export_command
    from tokview.core.kimi_layout import kimi_tokenizer_dir

    db = tmp_path / "500.duckdb"
    with Store(db) as store:
        fill_500(store)
    said = review(db, "--finding", FINDING, "--run", "r1", "--reject", "loops", capsys=capsys)
    assert said == "rejected 200 of 200 selected samples"
    assert review(db, "--run", "r2", "--tag", "hard", capsys=capsys) == "tagged 50 of 50 selected samples"
    with pytest.raises(UserError, match="50 of the 200 selected samples have error findings"):
        review(db, "--finding", FINDING, "--status", "pending", "--approve", capsys=capsys)
    said = review(db, "--finding", FINDING, "--status", "pending", "--approve", "--override", capsys=capsys)
    assert said == "approved 200 of 200 selected samples"
    history = review(db, "--history", capsys=capsys).splitlines()
    assert [line.split("  ")[3] for line in history] == [
        "approved 200 samples",
        "tagged 50 samples (hard)",
        "rejected 200 samples (loops)",
    ]
    said = review(db, "--undo", history[2].split()[0], capsys=capsys)
    undo_listed = review(db, "--history", capsys=capsys).splitlines()[0]
    assert f"undo of {history[2].split()[0]} rejected 200 samples (loops)" in undo_listed
    assert review(db, "--history", capsys=capsys).splitlines()[3].endswith(f"(undone by {undo_listed.split()[0]})")
    assert said.startswith("undid #")
    assert ": 200 samples (a-000, a-001, a-002 and 197 more) back to pending" in said
    with Store(db) as store:
        counts = dict(store.query("SELECT status, count(*) FROM samples GROUP BY 1"))
    assert counts == {"pending": 300, "approved": 200}

    parser = argparse.ArgumentParser(prog="tokview")
    export_command.add_parser(parser.add_subparsers())
    out = tmp_path / "hard.jsonl"
    args = parser.parse_args(
        ["export", "--db", str(db), "--out", str(out), "--tag", "HARD", "--tokenizer", str(kimi_tokenizer_dir())]
    )
    assert args.run(args) == 0
    err = capsys.readouterr().err
    assert "exported 50 of 50 selected samples" in err
    assert "by tag: 50 hard" in err
    assert len(out.read_text().splitlines()) == 50


def test_an_untag_a_later_untag_wrote_over_is_undone_only_after_it(db):
    """Two untags of one note: undoing the first brought the note back whole, the second untag's tag with it, while
    the second was still listed in force. It is refused until the later one is undone; then each comes back."""
    with Store(db) as store:
        sid = bulk.select(store, SampleFilter(text="take 1"))[0]
        bulk.add_notes(store, [sid], who="ann", note="see turn 3", tags=("loop", "math"))
        first = bulk.remove_tag(store, [sid], "loop", who="bob")
        second = bulk.remove_tag(store, [sid], "math", who="bob")
        with pytest.raises(CannotUndo, match=f"untag #{second.action_id} took a tag off the same notes since"):
            store.undo_action(first.action_id, who="bob")
        assert store.load_sample(sid).tags == []
        store.undo_action(second.action_id, who="bob")
        assert store.load_sample(sid).tags == ["math"]
        store.undo_action(first.action_id, who="bob")
        sample = store.load_sample(sid)
        assert (sorted(sample.tags), sample.notes) == (["loop", "math"], ["see turn 3"])


def test_a_reject_whose_tag_a_merged_copy_removed_is_undone_whole(db, tmp_path):
    """The merge stamps the rows it brings with its own action: an untag's copy made on the copy came across as the
    merge's, so undoing the reject it copied left the sample rejected."""
    import shutil

    with Store(db) as store:
        sid = bulk.select(store, SampleFilter(text="take 1"))[0]
        tagged = store.record_verdict(sid, "rejected", reason="loops", tags=["loop"], who="ann")
    copy = tmp_path / "copy.duckdb"
    shutil.copy(db, copy)
    with Store(copy) as store:
        bulk.remove_tag(store, [sid], "loop", who="bob")
    with Store(db) as store:
        store.merge(copy)
        assert store.load_sample(sid).tags == []
        store.undo_action(tagged, who="ann")
        assert store.load_sample(sid).status == "pending"
