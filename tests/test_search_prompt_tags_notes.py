"""`/` searches the prompt's text, the tags and the notes too, not only ids and the answer."""

from __future__ import annotations

from tokview.store import SampleFilter


def _found(store, text: str) -> list[str]:
    return sorted(r.prompt_id for r in store.samples_page(SampleFilter(text=text)))


def test_search_finds_prompt_text_tags_and_notes(store, put, make_capture):
    sky = put(store, "sky", make_capture(question="Why is the sky blue?"))
    tagged = put(store, "tagged", make_capture(question="what is two plus two"))
    noted = put(store, "noted", make_capture(question="name a prime"))
    put(store, "plain", make_capture(question="what is six times seven"))
    store.add_note(tagged, "", who="ann", tags=("Loop-Suspect",))
    store.add_note(noted, "the reasoning restarts twice", who="ann")
    assert _found(store, "SKY") == ["sky"]
    assert store.count_samples(SampleFilter(text="sky")) == 1
    assert _found(store, "loop-suspect") == ["tagged"]
    assert _found(store, "restarts twice") == ["noted"]
    for structure in ("role", "content", "user"):  # the messages' JSON keys and roles are not prompt text
        assert _found(store, structure) == [], structure
    store.record_verdict(sky, "rejected", reason="off topic", note="asks about colour", tags=("physics",), who="bob")
    assert _found(store, "physics") == _found(store, "about colour") == ["sky"]
    store.undo_latest(sky, who="bob")  # an undone verdict's note and tags are no longer the sample's
    assert _found(store, "physics") == _found(store, "about colour") == []
    store.record_verdict(noted, "approved", tags=("first",), who="bob")
    store.record_verdict(noted, "approved", tags=("second",), who="bob")
    assert _found(store, "second") == ["noted"]
    assert _found(store, "first") == []  # the latest verdict's tags


def test_search_reads_text_parts_and_a_percent_sign_literally(store, put, make_capture):
    cap = make_capture(question="plain")
    cap.messages = [{"role": "user", "content": [{"type": "text", "text": "a 100% cotton shirt"}]}]
    put(store, "parts", cap)
    put(store, "other", make_capture(question="100 percent"))
    assert _found(store, "100% cotton") == ["parts"]
    assert _found(store, "text") == []
    put(store, "quoted", make_capture(question='say "hi" twice\nthen stop'))
    assert _found(store, '"hi" twice\nthen') == ["quoted"]  # matched through the JSON's escapes
