"""The batch's writer thread (`batch/writer_thread.py`): what it lands, and when."""

from __future__ import annotations

import threading

from builders import kimi, make_capture, profile

import tokview.batch.writer_thread as writer_module
from tokview.batch.config import split_flagged
from tokview.batch.worklist import WorkItem
from tokview.batch.writer_thread import GroupWriter
from tokview.store import Store


def item(n: int) -> WorkItem:
    return WorkItem(f"s{n}", f"p{n}", None, 0, [{"role": "user", "content": f"q{n}"}])


def test_closing_lands_the_written_parts_while_the_last_captures_are_still_analysed(tmp_path, monkeypatch):
    """At the end of a run the thread still analyses what is queued; the parts it already wrote are
    landed meanwhile by the closing thread, so the last landing holds only the last part."""
    release, analysing_last = threading.Event(), threading.Event()
    real_analyze = writer_module.analyze

    def analyze(capture, prof, tok, **kw):
        if capture.messages[0]["content"] == "q1":  # the last capture: analysis takes until released
            analysing_last.set()
            assert release.wait(30)
        return real_analyze(capture, prof, tok, **kw)

    monkeypatch.setattr(writer_module, "analyze", analyze)
    with Store(tmp_path / "s.duckdb") as store:
        landed_by: list[str] = []
        real_ingest = store.ingest

        def ingest():
            got = real_ingest()
            if got[0]:
                landed_by.append(threading.current_thread().name)
            return got

        store.ingest = ingest
        writer = GroupWriter(store, profile=profile(), tokenizer=kimi(), run_id="r", group_s=0.01, ingest_s=3600)
        writer.add_sample(item(0), make_capture("q0"))
        for _ in range(3000):
            if writer.ok:  # the first part is on disk
                break
            threading.Event().wait(0.01)
        writer.add_sample(item(1), make_capture("q1"))
        assert analysing_last.wait(30)
        closing = threading.Thread(target=writer.close, name="closing")
        closing.start()
        for _ in range(3000):
            if landed_by:
                break
            threading.Event().wait(0.01)
        assert landed_by == ["closing"]
        assert store.count_samples() == 1  # landed before the last analysis ended
        release.set()
        closing.join(30)
        assert store.count_samples() == 2
        assert writer.ok == 2
        assert writer.error is None
        assert landed_by == ["closing", "tokview-writer"]


def test_an_id_outside_the_32_bit_range_fails_its_sample_and_the_rest_land(tmp_path):
    """DuckDB keeps ids as INTEGER: one id it cannot hold is that sample's failure, named; the largest id
    it can hold, and the other samples, are stored. (A negative id already fails the tokenizer.)"""
    from dataclasses import replace

    base = make_capture("q")
    too_big = replace(base, output_ids=[*base.output_ids[:-1], 2**31, base.output_ids[-1]])
    too_big_prompt = replace(base, prompt_ids=[2**32 - 1, *base.prompt_ids])
    largest = replace(base, output_ids=[*base.output_ids[:-1], 2**31 - 1, base.output_ids[-1]])
    with Store(tmp_path / "s.duckdb") as store:
        writer = GroupWriter(store, profile=profile(), tokenizer=kimi(), run_id="r", group_s=0.01)
        for n, capture in enumerate((too_big, largest, too_big_prompt, base)):
            writer.add_sample(item(n), capture)
        writer.close()
        assert (writer.ok, writer.failed) == (2, 2), writer.reasons
        failures, flagged = split_flagged(writer.reasons)
        assert flagged  # the largest id flags its sample (counted apart from the failures)
        assert sorted(failures) == [
            "unexpected error: ValueError: output_ids hold an id outside the 32-bit range DuckDB stores",
            "unexpected error: ValueError: prompt_ids hold an id outside the 32-bit range DuckDB stores",
        ]
        assert store.count_samples() == 2


def test_the_drift_reencode_runs_ahead_on_its_own_thread_and_the_store_gets_the_same_findings(tmp_path, monkeypatch):
    """Each capture's encode(decode(output)) starts on the `tokview-reencode` thread when it is handed
    over; the analysis takes that result, and what is stored equals an analysis that computed it itself.
    A re-encode that fails is computed again by the analysis; closing the writer ends the thread."""
    from dataclasses import replace

    from tokview.core import finding_context
    from tokview.core.analysis import analyze

    tok, prof = kimi(), profile()
    calls: list[str] = []
    threads: set[threading.Thread] = set()
    real = finding_context.reencode_output

    def reencode(tokenizer, ids):
        calls.append(threading.current_thread().name)
        threads.add(threading.current_thread())
        if ids and ids[0] == 1000 and threading.current_thread().name == "tokview-reencode":
            raise RuntimeError("boom")  # a re-encode that fails on its thread: the analysis retries it
        return real(tokenizer, ids)

    monkeypatch.setattr(writer_module, "reencode_output", reencode)
    monkeypatch.setattr(finding_context, "reencode_output", reencode)
    base = make_capture("q")
    drifting = replace(base, output_ids=[1000, *base.output_ids])  # re-encodes to other ids than were served
    captures = [base, drifting, make_capture("another question")]
    with Store(tmp_path / "s.duckdb") as store:
        writer = GroupWriter(store, profile=prof, tokenizer=tok, run_id="r", group_s=0.01)
        for n, capture in enumerate(captures):
            writer.add_sample(item(n), capture)
        writer.close()
        assert (writer.ok, writer.failed) == (3, 0)
        for n, capture in enumerate(captures):
            stored = store.query("SELECT codes FROM samples WHERE sample_id = ?", [f"s{n}"])[0][0]
            assert list(stored) == analyze(capture, prof, tok).codes
    assert calls.count("tokview-reencode") == 3  # one per capture, on its own thread
    assert calls.count("tokview-writer") == 1  # only the failed one again, by the analysis
    (ahead,) = [t for t in threads if t.name == "tokview-reencode"]
    ahead.join(10)
    assert not ahead.is_alive()


def test_a_float_id_a_capture_made_outside_the_servers_layer_holds_is_range_checked_as_before(tmp_path):
    """The 32-bit check packs ids into an array, which takes only ints: a float id (a capture a script
    built by hand) is checked with min and max, as it always was, not failed for its type."""
    from dataclasses import replace

    base = make_capture("q")
    as_float = replace(base, output_ids=[float(base.output_ids[0]), *base.output_ids[1:]])
    too_big = replace(base, output_ids=[float(2**31), *base.output_ids[1:]])
    with Store(tmp_path / "s.duckdb") as store:
        writer = GroupWriter(store, profile=profile(), tokenizer=kimi(), run_id="r", group_s=0.01)
        writer.add_sample(item(0), as_float)
        writer.add_sample(item(1), too_big)
        writer.close()
        assert list(writer.reasons) == [
            "unexpected error: ValueError: output_ids hold an id outside the 32-bit range DuckDB stores"
        ]
        assert (writer.ok, writer.failed) == (1, 1)


def test_a_part_s_sample_ids_are_named_before_the_part_is_written(tmp_path):
    """`on_part` (a `--workers` child names a part to its parent this way) gets the ids of the part's
    samples and failures, and gets them before the part is on disk."""
    from dataclasses import replace

    from tokview.store import PartSink

    events: list[tuple[str, list[str]]] = []

    class Watched(PartSink):
        def write_part(self, samples, failures=None):
            events.append(("written", []))
            super().write_part(samples, failures or [])

    base = make_capture("q")
    bad = replace(base, output_ids=[*base.output_ids[:-1], 2**31, base.output_ids[-1]])  # fails its sample
    writer = GroupWriter(
        Watched(str(tmp_path / "s.duckdb")),
        profile=profile(),
        tokenizer=kimi(),
        run_id="r",
        ingest=False,
        group_s=60,
        on_part=lambda ids: events.append(("named", ids)),
    )
    writer.add_sample(item(0), base)
    writer.add_sample(item(1), bad)
    writer.add_failure(item(2), "server said no", None)
    writer.close()
    assert events == [("named", ["s0", "s1", "s2"]), ("written", [])]
    assert (writer.ok, writer.failed) == (1, 2)
