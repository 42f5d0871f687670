"""The checks that read every prompt id read a prompt extending one read before only past it (`core.prefix_memo`),
and judge it exactly as a whole read does: an agent's growing conversation, branches from its earlier turns, a
marker spelled across the point where the earlier prompt ended, unknown ids on either side."""

from __future__ import annotations

import random
import struct
from dataclasses import replace

import pytest

from tokview.core import prefix_memo
from tokview.core.analysis import analyze
from tokview.core.prefix_memo import MIN_IDS, REPLACE_SLACK, PrefixMemo, packed_ids, stands_for


def _packed(ids: list[int]) -> bytes:
    packed = packed_ids(ids)
    assert packed is not None
    return packed


def _found(memo: PrefixMemo[object], ids: list[int]) -> tuple[int, object] | None:
    """(how many ids, value) of what the memo finds for `ids`."""
    found = memo.longest(_packed(ids))
    return None if found is None else (found[0], found[2])


def test_the_longest_remembered_prefix_is_found_and_a_session_keeps_one_entry():
    memo: PrefixMemo[object] = PrefixMemo()
    base = list(range(MIN_IDS))
    turn1, turn2, other = base + [7, 8], base + [7, 8, 9, 10], [5, *base]
    memo.remember(_packed(base), "base")
    memo.remember(_packed(other), "other")
    assert memo.longest(_packed(turn1)) == (MIN_IDS, _packed(base), "base")
    memo.remember(_packed(turn1), "turn1", replaces=_packed(base))  # stands for `base` now
    assert len(memo) == 2
    assert _found(memo, turn2) == (MIN_IDS + 2, "turn1")
    assert _found(memo, turn1) == (MIN_IDS + 2, "turn1")
    assert memo.longest(_packed(base + [9])) is None  # `base` was dropped for its extension
    assert memo.longest(_packed([1, *base])) is None


def test_a_sequence_is_found_by_its_checkpoints_when_the_next_one_rewrites_its_end():
    """A harness's next prompt renders the previous one's generation prompt otherwise: the part up to one of the
    remembered checkpoints is what it starts with."""
    memo: PrefixMemo[object] = PrefixMemo()
    prompt = [*range(MIN_IDS + 100), 1, 2, 3]
    memo.remember(_packed(prompt), "p", (MIN_IDS + 10, MIN_IDS + 50))
    assert _found(memo, [*prompt[: MIN_IDS + 50], 9, 9]) == (MIN_IDS + 50, "p")
    assert _found(memo, [*prompt[: MIN_IDS + 40], 9]) == (MIN_IDS + 10, "p")
    assert _found(memo, [*prompt[: MIN_IDS + 5], 9, *range(30)]) is None


def test_a_turn_replaces_its_previous_turn_and_not_another_session_that_shares_its_start():
    memo: PrefixMemo[object] = PrefixMemo()
    system = list(range(MIN_IDS))
    turn = [*system, *range(10)]
    other = [*system, *range(100, 100 + REPLACE_SLACK + 1)]  # another session: past the shared start, its own ids
    memo.remember(_packed(turn), "turn", (MIN_IDS,))
    memo.remember(_packed(other), "other", (MIN_IDS,))
    next_turn = [*turn[:-3], 7, 7]  # the previous turn but its last ids (a generation prompt re-rendered)
    found = memo.longest(_packed(next_turn))
    assert found is not None and found[2] == "turn" and stands_for(found, _packed(next_turn)) == _packed(turn)
    third = [*system, 5]  # a new session of the same system prompt: found at the shared checkpoint
    found = memo.longest(_packed(third))
    assert found is not None and found[0] == MIN_IDS
    assert stands_for(found, _packed(third)) is None  # what it found holds more than a generation prompt past it
    assert stands_for(found, packed=found[1]) is None  # the same sequence again replaces nothing


def test_lengths_and_checkpoints_of_any_size_are_compared_exactly():
    """The gate (the bytes just before an entry's shortest length) at its edges: sequences of a few ids, a checkpoint
    at the full length, checkpoints outside 1 … the length (not kept), a lookup shorter than the gate."""
    memo: PrefixMemo[object] = PrefixMemo()
    packed = struct.pack("=3i", 7, 8, 9)  # as `packed_ids` packs, which keeps only longer ones
    memo.remember(packed, "v", (0, 1, 3, 9))
    assert memo.longest(packed) == (3, packed, "v")
    assert memo.longest(packed[:4] + b"\xff" * 8) == (1, packed, "v")
    assert memo.longest(packed[:2]) is None  # shorter than any length it can be read at
    assert memo.longest(b"\x00" * 12) is None  # no checkpoint 0: it would have matched anything


def test_the_memo_is_bounded_by_bytes_and_entries_dropping_the_least_recently_used():
    size = MIN_IDS * 4
    memo: PrefixMemo[object] = PrefixMemo(max_bytes=3 * size, max_entries=10)
    prompts = [[k, *range(MIN_IDS - 1)] for k in range(4)]
    for k in range(3):
        memo.remember(_packed(prompts[k]), k)
    assert _found(memo, prompts[0]) == (MIN_IDS, 0)  # used: now the most recent
    memo.remember(_packed(prompts[3]), 3)
    assert len(memo) == 3 and memo.longest(_packed(prompts[1])) is None
    few: PrefixMemo[int] = PrefixMemo(max_entries=2)
    for k in range(3):
        few.remember(_packed(prompts[k]), k)
    assert len(few) == 2 and few.longest(_packed(prompts[0])) is None


def test_what_a_value_holds_counts_towards_the_bound():
    """A scan of a prompt of unknown or special ids holds nine times its packed ids: `value_bytes` counts it."""
    size = MIN_IDS * 4
    memo: PrefixMemo[object] = PrefixMemo(max_bytes=3 * size)
    prompts = [[k, *range(MIN_IDS - 1)] for k in range(3)]
    memo.remember(_packed(prompts[0]), 0, value_bytes=size)
    memo.remember(_packed(prompts[1]), 1, value_bytes=size)
    assert len(memo) == 1 and _found(memo, prompts[1]) == (MIN_IDS, 1)
    memo.remember(_packed(prompts[2]), 2, value_bytes=3 * size)  # more than the whole bound: not kept
    assert len(memo) == 1 and _found(memo, prompts[2]) is None
    memo.remember(_packed(prompts[1]), 1)  # remembered again, counted once
    memo.remember(_packed(prompts[0]), 0)
    assert len(memo) == 2


def test_short_prompts_and_ids_past_32_bits_are_not_kept():
    assert packed_ids(list(range(MIN_IDS - 1))) is None
    assert packed_ids([2**31, *range(MIN_IDS)]) is None
    assert packed_ids([1.0, *range(MIN_IDS)]) is None
    assert packed_ids(list(range(MIN_IDS))) is not None


def _findings(capture, profile, tok) -> list[tuple[str, str, str, tuple[int, ...]]]:
    return [(f.code, f.severity, f.detail, tuple(f.positions)) for f in analyze(capture, profile, tok).findings]


@pytest.mark.parametrize("family", ["kimi", "qwen"])  # Qwen3's delimiters are added ids, not special ones
def test_a_growing_conversation_is_judged_as_a_whole_read_judges_it(family, request, make_capture, monkeypatch):
    """Sessions of long prompts, each turn the previous prompt + output + new ids, some turns branching from an
    earlier one: every finding (code, severity, detail, positions) equals the one a whole read gives."""
    tok, p = request.getfixturevalue(f"{family}_tok"), request.getfixturevalue(f"{family}_profile")
    spelled = [[i for ch in text for i in tok.encode(ch)] for text in ("<think>", "</think>", "<thi", "nk>")]
    plain = [tok.encode(t) for t in ("hello", " world", "a b c", "<", "th")]  # never a marker, however mixed
    spelled += [tok.encode(t) for t in ("think", ">", "</", "ink")]
    specials = [p.think_open_id, p.think_close_id, p.stop_ids[0]]
    unknown = [tok.vocab_size + 7]
    rng = random.Random(5)

    def ids(k: int, rare: bool = True) -> list[int]:
        out: list[int] = []
        for _ in range(k):
            roll = rng.random()
            if roll < 0.1:
                out += [rng.choice(specials)]
            elif rare and roll < 0.13:
                out += rng.choice(spelled)
            elif rare and roll < 0.16:
                out += unknown
            else:
                out += rng.choice(plain)
        return out

    judged = {"literal_think_text": 0, "unknown_token_id": 0, "clean": 0}
    found: list[object] = []
    real = PrefixMemo.longest
    monkeypatch.setattr(PrefixMemo, "longest", lambda memo, packed: found.append(real(memo, packed)) or found[-1])
    for session in range(12):
        base = ids(MIN_IDS, rare=False)  # a long system prompt: clean unless a turn spells a marker
        turns = [base]
        for turn in range(6):
            parent = rng.choice(turns) if rng.random() < 0.25 else turns[-1]  # a branch from an earlier turn
            output = ids(rng.randrange(1, 6), rare=rng.random() < 0.5)
            if rng.random() < 0.4:  # the harness re-renders the end: the parent up to one of its last specials
                ends = [i + 1 for i, t in enumerate(parent) if tok.is_special(t) or t in p.delimiter_ids][-5:]
                parent = parent[: rng.choice(ends)] if ends else parent
            prompt = [*parent, *ids(rng.randrange(0, 4), rare=rng.random() < 0.4)]
            if rng.random() < 0.2:
                prompt += spelled[2]  # "<thi" at the end of the prompt, "nk>" next turn
                output = [*spelled[3], *output]
            capture = replace(make_capture(), prompt_ids=prompt, output_ids=output, messages=None, usage={})
            remembered = _findings(capture, p, tok)
            with monkeypatch.context() as whole:
                whole.setattr(prefix_memo, "MIN_IDS", 10**9)  # nothing kept, nothing found: every id read
                assert remembered == _findings(replace(capture), p, tok), (session, turn)
            codes = {code for code, *_ in remembered}
            judged["clean"] += not codes & {"literal_think_text", "unknown_token_id"}
            for code in codes & set(judged):
                judged[code] += 1
            turns.append([*prompt, *output])
    assert min(judged.values()) >= 5, judged  # every outcome was exercised
    assert sum(f is not None for f in found) >= 40  # and most turns were read past a remembered prompt


def test_a_marker_spelled_across_where_the_earlier_prompt_ended_is_found(kimi_tok, kimi_profile, make_capture):
    tok, p = kimi_tok, kimi_profile
    text_ids = tok.encode("hello world ") * (MIN_IDS // 2)
    start, end = [i for ch in "<thi" for i in tok.encode(ch)], [i for ch in "nk>" for i in tok.encode(ch)]
    first = [p.stop_ids[0], *text_ids, *start]
    capture = replace(make_capture(), prompt_ids=first, output_ids=tok.encode("fine"), messages=None, usage={})
    assert "literal_think_text" not in [code for code, *_ in _findings(capture, p, tok)]
    second = replace(capture, prompt_ids=[*first, *end, p.stop_ids[0], *tok.encode("more")])
    (hit,) = [f for f in _findings(second, p, tok) if f[0] == "literal_think_text"]
    assert hit[3] == tuple(range(len(first) - len(start), len(first) + len(end)))


# -- a long list packed once ----------------------------------------------------------------------------------------
def test_a_long_list_packed_lately_is_known_by_its_identity_only() -> None:
    ids = list(range(5000))
    packed = prefix_memo.pack_int32(ids)
    assert packed == struct.pack(f"={len(ids)}i", *ids)
    assert prefix_memo.known_packing(ids) is packed
    assert prefix_memo.known_packing(list(ids)) is None  # equal, but another list: never trusted by value
    ids.append(7)  # a list that changed length is packed again
    assert prefix_memo.known_packing(ids) is None
    assert prefix_memo.pack_int32(ids) == struct.pack(f"={len(ids)}i", *ids)


def test_short_lists_and_other_sequences_are_not_remembered() -> None:
    short = list(range(100))
    prefix_memo.pack_int32(short)
    assert prefix_memo.known_packing(short) is None
    as_tuple = tuple(range(5000))
    prefix_memo.pack_int32(as_tuple)
    assert prefix_memo.known_packing(as_tuple) is None


def test_only_the_newest_few_packings_are_kept() -> None:
    lists = [[k] * 5000 for k in range(prefix_memo._RECENT + 1)]
    for ids in lists:
        prefix_memo.pack_int32(ids)
    assert prefix_memo.known_packing(lists[0]) is None
    assert all(prefix_memo.known_packing(ids) is not None for ids in lists[1:])


def test_a_list_that_cannot_be_packed_is_not_remembered() -> None:
    ids = [*range(5000), 1 << 40]
    assert prefix_memo.pack_int32(ids) is None
    assert prefix_memo.known_packing(ids) is None


@pytest.mark.parametrize("seed", range(40))
def test_the_last_aligned_id_is_the_last_one_a_python_search_finds(seed: int) -> None:
    """Ids whose bytes make the needle across two ids (misaligned matches) are skipped, near and far."""
    rng = random.Random(seed)
    needle = rng.choice([1, 256, 65536, 163606, 0x01010101, (1 << 31) - 1])
    pool = [needle, needle >> 8, (needle << 8) & 0x7FFFFFFF, needle >> 16, (needle << 16) & 0x7FFFFFFF, 0, 1, 7]
    ids = [rng.choice(pool) for _ in range(rng.randrange(0, 60))]
    packed = struct.pack(f"={len(ids)}i", *ids)
    for start in (0, 1, len(ids) // 2, len(ids), len(ids) + 3):
        expected = max((k for k in range(start, len(ids)) if ids[k] == needle), default=None)
        assert prefix_memo.last_aligned(packed, needle, start) == expected
    assert prefix_memo.last_aligned(packed, 1 << 40) is None  # no id of packed int32s


def test_the_lists_kept_hold_a_bounded_number_of_ids(monkeypatch) -> None:
    monkeypatch.setattr(prefix_memo, "_RECENT_MAX_IDS", 12_000)
    huge = list(range(13_000))
    prefix_memo.pack_int32(huge)
    assert prefix_memo.known_packing(huge) is None  # alone past the bound: packed every time
    lists = [[k] * 5000 for k in range(3)]
    for ids in lists:
        prefix_memo.pack_int32(ids)
    assert [prefix_memo.known_packing(ids) is not None for ids in lists] == [False, True, True]
