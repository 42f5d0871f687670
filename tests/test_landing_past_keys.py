"""A part line may propose a key turn its prompt is stored past (`prompt_refs.PAST_KEY`, `PAST_LEN`): the landing
stores the row past the key only when the key is in the store whole and begins with the row's ids, else the row
stays whole. So a proposal can never leave a prompt that cannot be read back."""

from __future__ import annotations

from typing import Any

import pytest

from tokview.core.analysis import analyze
from tokview.store import Store
from tokview.store.prompt_refs import PAST_KEY, PAST_LEN
from tokview.store.sample_rows import SampleIdentity

LONG = "read the whole file and tell me what each function does, please " * 100


@pytest.fixture
def turns(make_capture: Any) -> list[Any]:
    """Three turns of one conversation: each prompt begins with the one before and its answer."""
    history: list[dict[str, Any]] = []
    out = []
    for t in range(3):
        capture = make_capture(LONG if t == 0 else f"and step {t}", answer=f"step {t} done", history=history)
        out.append(capture)
        history = [*capture.messages, {"role": "assistant", "content": capture.content}]
    return out


def record(store: Store, name: str, capture: Any, kimi_tok: Any, kimi_profile: Any, **extra: Any) -> dict[str, Any]:
    row = store.sample_record(
        SampleIdentity(name, f"p-{name}", "r", turn=0), capture, analyze(capture, kimi_profile, kimi_tok)
    )
    row.update(extra)
    return row


def shared(key: Any, turn: Any) -> int:
    ids, head = [*key.prompt_ids, *key.output_ids], turn.prompt_ids
    n = 0
    while n < min(len(ids), len(head)) and ids[n] == head[n]:
        n += 1
    return n


def stored(store: Store) -> dict[str, tuple[Any, Any]]:
    return {r[0]: (r[1], r[2]) for r in store.query("SELECT sample_id, prompt_from, prompt_from_len FROM samples")}


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "k.duckdb") as s:
        s.put_run("r", settings={"mode": "proxy"})
        yield s


def test_a_row_is_stored_past_a_key_landing_with_it_or_before_it(store, turns, kimi_tok, kimi_profile):
    k0, t1, t2 = turns
    n1, n2 = shared(k0, t1), shared(k0, t2)
    assert n1 > 100 and n2 > n1 // 2
    key = record(store, "k0", k0, kimi_tok, kimi_profile)
    store.write_part([key, record(store, "t1", t1, kimi_tok, kimi_profile, **{PAST_KEY: "k0", PAST_LEN: n1})])
    store.ingest()
    store.write_part([record(store, "t2", t2, kimi_tok, kimi_profile, **{PAST_KEY: "k0", PAST_LEN: n2})])
    store.ingest()
    assert stored(store) == {"k0": (None, None), "t1": ("k0", n1), "t2": ("k0", n2)}
    for name, capture in zip(("k0", "t1", "t2"), turns):
        assert store.load_sample(name).capture.prompt_ids == capture.prompt_ids


@pytest.mark.parametrize(
    "case",
    ["key never landed", "key stored past another", "key proposes a key itself", "ids differ", "too many ids"],
)
def test_a_row_whose_key_is_not_stored_whole_with_its_ids_stays_whole(store, turns, kimi_tok, kimi_profile, case):
    k0, t1, t2 = turns
    n1, n2 = shared(k0, t1), shared(k0, t2)
    lines = []
    past, length = "k0", n2
    if case == "key stored past another":  # t1 is a tail (stored past k0): t2 may not be stored past t1
        lines += [record(store, "k0", k0, kimi_tok, kimi_profile)]
        lines += [record(store, "t1", t1, kimi_tok, kimi_profile, **{PAST_KEY: "k0", PAST_LEN: n1})]
        past, length = "t1", shared(t1, t2)
    elif case == "key proposes a key itself":  # k0 proposes a key that never landed: it may be cut, so never a key
        lines += [record(store, "k0", k0, kimi_tok, kimi_profile, **{PAST_KEY: "nowhere", PAST_LEN: 10})]
    elif case == "ids differ":
        lines += [record(store, "k0", k0, kimi_tok, kimi_profile)]
        length = len(t2.prompt_ids)  # past the ids the two share: the key does not begin with them all
    elif case == "too many ids":
        lines += [record(store, "k0", k0, kimi_tok, kimi_profile)]
        length = len(t2.prompt_ids) + 1
    lines += [record(store, "t2", t2, kimi_tok, kimi_profile, **{PAST_KEY: past, PAST_LEN: length})]
    store.write_part(lines)
    store.ingest()
    assert stored(store)["t2"] == (None, None)
    assert store.load_sample("t2").capture.prompt_ids == t2.prompt_ids
    assert store.query("SELECT len(prompt_ids) FROM samples WHERE sample_id = 't2'") == [(len(t2.prompt_ids),)]


def test_a_key_whose_line_is_set_aside_leaves_the_row_whole(store, turns, kimi_tok, kimi_profile):
    """The key's line cannot land (a value that does not fit its column): the part is salvaged line by line, the key
    set aside, and the row proposing it lands whole."""
    k0, t1, _ = turns
    key = record(store, "k0", k0, kimi_tok, kimi_profile)
    key["output_ids"] = "not ids"
    store.write_part(
        [key, record(store, "t1", t1, kimi_tok, kimi_profile, **{PAST_KEY: "k0", PAST_LEN: shared(k0, t1)})]
    )
    store.ingest()
    assert stored(store) == {"t1": (None, None)}
    assert store.load_sample("t1").capture.prompt_ids == t1.prompt_ids
