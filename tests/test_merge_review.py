"""Review done on a copy comes back with `tokview merge`: two reviewers each take a copy (or half the samples), and
merging their copies into the original brings their verdicts, notes and undos, unless both stores reviewed a sample
since the copy (then the target's review stands and the merge counts it)."""

from __future__ import annotations

import argparse
import shutil

import pytest

from tokview.commands import merge as merge_command
from tokview.store import SampleFilter, Store


@pytest.fixture
def original(tmp_path, put, make_capture):
    path = tmp_path / "orig.duckdb"
    with Store(path) as store:
        for i in range(6):
            put(store, f"s{i}", make_capture(question=f"question {i}"))
    return path


def ids(path) -> list[str]:
    with Store(path) as store:
        return sorted(s.sample_id for s in store.samples_page(SampleFilter()))


def state(path) -> dict[str, tuple[str, list[tuple]]]:
    """sample id -> (status, its history: kind, status, who, reason, note, undone)."""
    with Store(path) as store:
        out = {}
        for sample_id in ids(path):
            sample = store.load_sample(sample_id)
            events = [
                (h["kind"], h.get("status"), h.get("who"), h.get("reason"), h.get("note"), h.get("undone"))
                for h in sample.history
            ]
            out[sample_id] = (sample.status, events)
        return out


def merge(src, into, capsys) -> str:
    parser = argparse.ArgumentParser(prog="tokview")
    merge_command.add_parser(parser.add_subparsers())
    args = parser.parse_args(["merge", str(src), "--into", str(into)])
    assert args.run(args) == 0
    return capsys.readouterr().err


def test_two_reviewers_on_two_copies_both_come_back(tmp_path, original, capsys):
    a, b = tmp_path / "alice.duckdb", tmp_path / "bob.duckdb"
    shutil.copy(original, a)
    shutil.copy(original, b)
    sample_ids = ids(original)
    with Store(a) as store:
        for sid in sample_ids[:3]:
            store.record_verdict(sid, "approved", who="alice")
        store.add_note(sample_ids[0], "nice one", who="alice")
    with Store(b) as store:
        for sid in sample_ids[3:]:
            store.record_verdict(sid, "rejected", reason="wrong", who="bob")
        store.undo_verdict(sample_ids[5], who="bob")  # taken back: pending again, the verdict marked undone
    said = merge(a, original, capsys)
    assert "+0 samples" in said and f"merged the review of 3 samples already in {original}" in said, said
    said = merge(b, original, capsys)
    assert f"merged the review of 3 samples already in {original}" in said and "note" not in said, said
    merged = state(original)
    assert [merged[s][0] for s in sample_ids] == ["approved"] * 3 + ["rejected", "rejected", "pending"]
    # each sample's history is the reviewer's, event for event (the copy's undo flag included)
    assert merged == {**state(a), **{s: state(b)[s] for s in sample_ids[3:]}}
    assert merged[sample_ids[5]][1][0][-1] is True  # bob's undone verdict
    # merging again adds nothing and says nothing about review
    said = merge(b, original, capsys)
    assert "merged the review" not in said and "note" not in said, said
    assert state(original) == merged
    # and a merged verdict can be taken back here, per sample
    with Store(original) as store:
        assert store.undo_verdict(sample_ids[3], who="carol") == "pending"


def test_review_continued_on_a_copy_extends_the_history_here(tmp_path, original, capsys):
    sample_id = ids(original)[0]
    with Store(original) as store:
        store.record_verdict(sample_id, "approved", who="carol")
    copy = tmp_path / "copy.duckdb"
    shutil.copy(original, copy)
    with Store(copy) as store:
        store.undo_verdict(sample_id, who="dave")  # marks carol's verdict undone
        store.record_verdict(sample_id, "rejected", reason="on second look", who="dave")
    said = merge(copy, original, capsys)
    assert "merged the review of 1 samples" in said, said
    assert state(original)[sample_id] == state(copy)[sample_id]
    assert state(original)[sample_id][0] == "rejected"


def test_diverged_review_keeps_the_targets_and_says_so(tmp_path, original, capsys):
    sample_ids = ids(original)
    copy = tmp_path / "copy.duckdb"
    shutil.copy(original, copy)
    with Store(copy) as store:
        store.record_verdict(sample_ids[0], "rejected", reason="bad", who="dave")
        store.record_verdict(sample_ids[1], "approved", who="dave")
    with Store(original) as store:
        store.record_verdict(sample_ids[0], "approved", who="carol")  # reviewed here too since the copy
    before = state(original)[sample_ids[0]]
    said = merge(copy, original, capsys)
    assert f"1 samples already in {original} have another status in {copy}" in said, said
    assert "merged the review of 1 samples" in said, said
    after = state(original)
    assert after[sample_ids[0]] == before  # carol's review stands, untouched
    assert after[sample_ids[1]][0] == "approved"


def test_notes_and_tags_of_a_diverged_review_come_across_beside_the_targets_review(tmp_path, original, capsys):
    """Two reviewers noted and tagged the same samples on their copies: the second one's note and tag were dropped
    and nothing said so (only another status was). They are added beside the review here, once, as the merge's
    action; the target's verdict still stands."""
    sample_ids = ids(original)
    alice, bob = tmp_path / "alice.duckdb", tmp_path / "bob.duckdb"
    shutil.copy(original, alice)
    shutil.copy(original, bob)
    with Store(alice) as store:
        store.add_note(sample_ids[0], "note from alice", who="alice")
        store.add_note(sample_ids[1], "", who="alice", tags=["hard"])
        store.record_verdict(sample_ids[2], "approved", who="alice")
    with Store(bob) as store:
        store.add_note(sample_ids[0], "note from bob", who="bob")
        store.add_note(sample_ids[1], "", who="bob", tags=["math"])
        store.record_verdict(sample_ids[2], "rejected", reason="x", who="bob")
        store.add_note(sample_ids[2], "why rejected", who="bob")
    merge(alice, original, capsys)
    said = merge(bob, original, capsys)
    assert f"merged the notes and tags {bob} added to 3 samples" in said, said
    assert f"1 samples already in {original} have another status in {bob}" in said, said
    with Store(original) as store:
        first, second, third = (store.load_sample(s) for s in sample_ids[:3])
        assert sorted(first.notes) == ["note from alice", "note from bob"]
        assert sorted(second.tags) == ["hard", "math"]
        assert third.status == "approved" and third.notes == ["why rejected"]
        [action] = [a for a in store.actions() if a.kind == "merge" and a.detail == "bob.duckdb"]
    assert "notes and tags" not in merge(bob, original, capsys)  # again: nothing more
    with Store(original) as store:
        assert len(store.load_sample(sample_ids[0]).notes) == 2
        store.undo_action(action.action_id, who="carol")
        assert store.load_sample(sample_ids[0]).notes == ["note from alice"]
        assert store.load_sample(sample_ids[1]).tags == ["hard"]


def test_an_untag_on_a_copy_adds_no_second_note_and_a_verdicts_note_comes_across(tmp_path, original, capsys):
    """An untag writes its note row again, same time, a tag fewer: merged after a review here, that rewrite was
    added as a second copy of the note. A verdict written with a note and tags on the copy lost both."""
    from tokview.store import bulk_review

    sample_ids = ids(original)
    with Store(original) as store:
        store.add_note(sample_ids[0], "keep an eye on this", who="alice", tags=["hard", "math"])
    copy = tmp_path / "bob.duckdb"
    shutil.copy(original, copy)
    with Store(copy) as store:
        bulk_review.remove_tag(store, [sample_ids[0]], "hard", who="bob")
        store.record_verdict(sample_ids[1], "rejected", reason="off", note="see the tool call", tags=["tools"])
    with Store(original) as store:
        store.record_verdict(sample_ids[0], "approved", who="alice")
        store.record_verdict(sample_ids[1], "approved", who="alice")
    said = merge(copy, original, capsys)
    assert f"merged the notes and tags {copy} added to 1 samples" in said, said
    with Store(original) as store:
        first, second = store.load_sample(sample_ids[0]), store.load_sample(sample_ids[1])
    assert first.notes == ["keep an eye on this"] and sorted(first.tags) == ["hard", "math"]  # the review here stands
    assert second.status == "approved" and second.notes == ["see the tool call"] and second.tags == ["tools"]


def test_tags_a_later_verdict_replaced_on_the_copy_stay_gone(tmp_path, original, capsys):
    """The copy rejected a sample tagged `tools`, then approved it without: its tags were []. Brought as a note,
    the replaced verdict's tag came back for good."""
    sample_id = ids(original)[0]
    copy = tmp_path / "bob.duckdb"
    shutil.copy(original, copy)
    with Store(copy) as store:
        store.record_verdict(sample_id, "rejected", who="bob", tags=["tools"])
        store.record_verdict(sample_id, "approved", who="bob")
        assert store.load_sample(sample_id).tags == []
    with Store(original) as store:
        store.record_verdict(sample_id, "approved", who="alice")
    said = merge(copy, original, capsys)
    assert "notes and tags" not in said, said
    with Store(original) as store:
        assert store.load_sample(sample_id).tags == []


def test_an_older_copy_never_takes_back_review_done_here(tmp_path, original, capsys):
    sample_id = ids(original)[0]
    copy = tmp_path / "copy.duckdb"
    shutil.copy(original, copy)
    with Store(original) as store:
        store.record_verdict(sample_id, "rejected", reason="bad", who="carol")
    said = merge(copy, original, capsys)
    assert "merged the review" not in said and "note" not in said, said
    assert state(original)[sample_id][0] == "rejected"


def test_a_review_of_other_ids_under_the_same_sample_id_never_comes_across(tmp_path, put, make_capture, capsys):
    """Sample ids come from the prompt and the settings: two runs of one prompt (shards, a re-run) share an id for
    other answers. The other store's approval was taken for ids nobody reviewed."""
    mine, theirs = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    with Store(mine) as store:
        sid = put(store, "p1", make_capture(answer="The answer is forty - two"))
    with Store(theirs) as store:
        assert put(store, "p1", make_capture(answer="No idea at all")) == sid
        store.record_verdict(sid, "approved", who="bob")
    said = merge(theirs, mine, capsys)
    assert "merged the review" not in said, said
    assert f"1 samples already in {mine} have another status in {theirs}" in said, said
    assert state(mine)[sid][0] == "pending"


def test_the_same_review_in_both_stores_is_not_reported_as_another(tmp_path, original, capsys):
    sample_id = ids(original)[0]
    copy = tmp_path / "copy.duckdb"
    shutil.copy(original, copy)
    for path in (original, copy):
        with Store(path) as store:
            store.record_verdict(sample_id, "approved", who="carol")
    said = merge(copy, original, capsys)
    assert "another status" not in said and "merged the review" not in said, said


def test_the_review_a_merge_brings_is_one_action_undone_as_one_step(tmp_path, original, put, make_capture, capsys):
    """A merge that brought the wrong copy's review was taken back sample by sample (its rows had no action). The rows
    it adds, and the earlier ones it marks undone, are now one action: undone, every sample is as before the merge."""
    sample_ids = ids(original)
    with Store(original) as store:
        store.record_verdict(sample_ids[0], "approved", who="carol")
    copy = tmp_path / "copy.duckdb"
    shutil.copy(original, copy)
    with Store(copy) as store:
        store.undo_verdict(sample_ids[0], who="alice")
        store.record_verdict(sample_ids[1], "approved", who="alice")
        store.record_verdict(sample_ids[2], "rejected", reason="wrong", who="alice")
        store.add_note(sample_ids[3], "look again", who="alice", tags=["math"])
        new = put(store, "new one", make_capture(question="a question only the copy has"))
        store.record_verdict(new, "rejected", reason="dull", who="alice")
    before = state(original)
    said = merge(copy, original, capsys)
    with Store(original) as store:
        [action] = [a for a in store.actions() if a.kind == "merge"]
        assert f"action #{action.action_id}: `tokview review --undo {action.action_id}` takes it back" in said, said
        assert action.described == "merged the review of 5 samples (copy.duckdb)"
        statuses = {sid: store.load_sample(sid).status for sid in [*sample_ids[:4], new]}
        assert statuses == dict(zip([*sample_ids[:4], new], ["pending", "approved", "rejected", "pending", "rejected"]))
        undone = store.undo_action(who="carol")
        assert undone is not None and undone.action.action_id == action.action_id
        assert sorted(undone.sample_ids) == sorted([*sample_ids[:4], new])
        assert store.load_sample(new).status == "pending" and not store.load_sample(new).notes
        assert store.load_sample(sample_ids[3]).tags == []
    after = state(original)
    assert {sid: after[sid][0] for sid in before} == {sid: before[sid][0] for sid in before}
    assert after[sample_ids[0]][0] == "approved"


def test_other_ids_under_a_shared_sample_id_are_said_even_unreviewed(tmp_path, put, make_capture, capsys):
    """A shard run again against another seed: every sample id shared, the answers other. The merge said "+0 samples"
    and nothing else unless the samples had been reviewed."""
    mine, theirs = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    with Store(mine) as store:
        first = put(store, "p1", make_capture(answer="The answer is forty - two"))
        same = put(store, "p2", make_capture(question="Same?", answer="Yes."))
    with Store(theirs) as store:
        assert put(store, "p1", make_capture(answer="No idea at all")) == first
        assert put(store, "p2", make_capture(question="Same?", answer="Yes.")) == same
    said = merge(theirs, mine, capsys)
    assert "+0 samples" in said
    assert f"1 samples already in {mine} hold other ids in {theirs}" in said, said
    assert state(mine)[first][0] == "pending"


def test_a_store_from_before_failure_counts_merges_one_failure_with_its_attempts(tmp_path, capsys):
    """A schema-3 store holds a row per failed attempt; opened, its migration keeps the latest with the count. Merged,
    every row came across (three failures of one sample, no attempts)."""
    import duckdb

    from tokview.store.schema import _SCHEMA_VERSION_TABLE, MIGRATIONS, _version_row

    old, into = tmp_path / "old.duckdb", tmp_path / "into.duckdb"
    statements = [_SCHEMA_VERSION_TABLE] + [
        s for version, name, ddl in MIGRATIONS if version <= 3 for s in (*ddl, _version_row(version, name))
    ]
    conn = duckdb.connect(str(old))
    conn.execute(";\n".join(statements))
    for minutes in range(3):
        conn.execute(
            "INSERT INTO failures VALUES ('pX', 'sX', 'r', 'HTTP 500', now() - INTERVAL (?) MINUTE, 'http://x')",
            [minutes],
        )
    conn.close()
    with Store(into):
        pass
    said = merge(old, into, capsys)
    assert "+1 failures" in said, said
    with Store(into) as store:
        assert store.query("SELECT sample_id FROM failures") == [("sX",)]
        assert store.query("SELECT sample_id, attempts FROM failure_attempts") == [("sX", 3)]


def test_merging_again_a_review_undone_here_says_why_it_takes_nothing(tmp_path, original, capsys):
    """A user pass undid a merged review one step too many, merged the copy again and got `+0`, every sample still
    pending, and not a word of why (this store's history already holds the copy's, undone since)."""
    sample_ids = ids(original)
    copy = tmp_path / "copy.duckdb"
    shutil.copy(original, copy)
    with Store(copy) as store:
        for sid in sample_ids[:3]:
            store.record_verdict(sid, "approved", who="alice")
    assert "merged the review of 3 samples" in merge(copy, original, capsys)
    with Store(original) as store:
        assert store.undo_action(who="carol") is not None  # the merge's review, taken back
    said = merge(copy, original, capsys)
    assert "note: 3 samples already in" in said and "undone here since" in said and "not merged again" in said, said
    with Store(original) as store:
        assert {store.load_sample(sid).status for sid in sample_ids[:3]} == {"pending"}
    # a copy that simply holds less than this store (reviewed here since, nothing undone) is no such case
    with Store(original) as store:
        store.record_verdict(sample_ids[4], "rejected", reason="dull", who="carol")
    assert "note: 3 samples already in" in merge(copy, original, capsys)  # not 4


def test_merging_again_a_tag_review_undone_here_says_why_too(tmp_path, original, capsys):
    """The count asked for a status of the copy's other than this store's: a review of tags alone, merged and undone
    here, left both stores `pending`, so merging it again said `+0` and nothing else."""
    sample_ids = ids(original)
    copy = tmp_path / "copy.duckdb"
    shutil.copy(original, copy)
    with Store(copy) as store:
        for sid in sample_ids[:2]:
            store.add_note(sid, "", tags=["xx"], who="alice")
    merge(copy, original, capsys)
    with Store(original) as store:
        assert store.undo_action(who="carol") is not None
    said = merge(copy, original, capsys)
    assert "note: 2 samples already in" in said and "undone here since" in said, said
