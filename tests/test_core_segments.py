"""Property tests on the segmenter and unit tests on display pieces, profiles and prompt shapes."""

from __future__ import annotations

import pytest
from facts import IM_END, THINK_CLOSE, THINK_OPEN
from hypothesis import given, settings
from hypothesis import strategies as st

from tokview.core import segments as seg
from tokview.core.profiles import BUILTIN_PROFILES, ProfileError, detect_profile, get_profile, load_profile_toml
from tokview.core.prompts import PromptError, generation_points, parse_row, prompt_id_for

KIMI = BUILTIN_PROFILES["kimi-k2.5"]
SPECIAL = [THINK_OPEN, THINK_CLOSE, IM_END]
ids_strategy = st.lists(st.one_of(st.sampled_from(SPECIAL), st.integers(0, 163839)), max_size=80)


@settings(max_examples=300, deadline=None)
@given(prompt=ids_strategy, output=ids_strategy, profile=st.sampled_from(list(BUILTIN_PROFILES.values())))
def test_segments_partition_the_ids(prompt, output, profile):
    segments = seg.segment(prompt, output, profile)
    total = len(prompt) + len(output)
    covered = [i for s in segments for i in range(s.start, s.end)]
    assert covered == list(range(total))
    assert all(s.end > s.start for s in segments)
    assert all(not (s.start < len(prompt) < s.end) for s in segments)  # none straddles the boundary
    assert all(s.kind in seg.SEGMENT_KINDS for s in segments)


def _kinds_id_by_id(prompt, output, profile):
    """The rule stated one id at a time: the reference `token_kinds` must agree with."""
    kinds = [seg.PROMPT] * len(prompt)
    prefill = seg.prefilled_opener_position(prompt, profile)
    if prefill is not None:
        kinds[prefill] = seg.PREFILLED_OPENER
    in_reasoning = prefill is not None
    for i, tid in enumerate(output):
        if tid == profile.think_open_id:
            kinds.append(seg.OPENER)
            in_reasoning = True
        elif tid == profile.think_close_id:
            kinds.append(seg.CLOSER)
            in_reasoning = False
        elif i == len(output) - 1 and tid in profile.stop_ids:
            kinds.append(seg.STOP)
        else:
            kinds.append(seg.REASONING if in_reasoning else seg.ANSWER)
    return kinds


def _runs_id_by_id(kinds, n_prompt):
    runs, start = [], 0
    for pos in range(1, len(kinds) + 1):
        if pos == len(kinds) or kinds[pos] != kinds[start] or pos == n_prompt:
            runs.append((kinds[start], start, pos))
            start = pos
    return runs


TIED = KIMI.with_overrides(think_close_id=KIMI.think_open_id)  # one id as both delimiters: the opener wins


@settings(max_examples=500, deadline=None)
@given(
    prompt=ids_strategy,
    output=ids_strategy,
    profile=st.sampled_from([*(p for p in BUILTIN_PROFILES.values() if p.format != "harmony"), TIED]),
    as_tuple=st.booleans(),
)
def test_kinds_and_runs_found_in_bulk_match_the_id_by_id_rule(prompt, output, profile, as_tuple):
    expected = _kinds_id_by_id(prompt, output, profile)
    kinds = seg.token_kinds(prompt, tuple(output) if as_tuple else output, profile)
    assert kinds == expected
    # analyze finds the delimiters once and hands them over: the kinds must not change
    found = seg.delimiter_positions(output, profile)
    assert seg.token_kinds(prompt, output, profile, found) == expected
    assert found.openers == tuple(i for i, t in enumerate(output) if t == profile.think_open_id)
    assert found.closers == tuple(i for i, t in enumerate(output) if t == profile.think_close_id)
    runs = [(s.kind, s.start, s.end) for s in seg.segments_from_kinds(tuple(kinds), len(prompt))]
    assert runs == _runs_id_by_id(expected, len(prompt))
    # read off the few positions where a run may start (what analyze does): the same runs
    starts = seg.run_starts(prompt, len(output), profile, found)
    at_starts = [(s.kind, s.start, s.end) for s in seg.segments_from_kinds(tuple(kinds), len(prompt), starts)]
    assert at_starts == runs


@settings(max_examples=300, deadline=None)
@given(prompt=ids_strategy, output=ids_strategy)
def test_loss_mask_matches_input(prompt, output):
    mask = seg.loss_mask(prompt, output)
    assert len(mask) == len(prompt) + len(output)
    assert sum(mask) == len(output)
    assert mask[: len(prompt)] == [0] * len(prompt)


def test_prompt_opened_vs_closed():
    assert seg.prompt_opens_reasoning([1, THINK_OPEN], KIMI)
    assert not seg.prompt_opens_reasoning([1, THINK_OPEN, THINK_CLOSE], KIMI)
    assert not seg.prompt_opens_reasoning([1, 2], KIMI)
    kinds = seg.token_kinds([1, THINK_OPEN, THINK_CLOSE], [5, IM_END], KIMI)
    assert kinds[3:] == ["answer", "stop"]


def test_pieces_multibyte_and_special(qwen_tok, kimi_tok):
    ids = qwen_tok.encode("你好 🙂 ok")
    pieces = qwen_tok.pieces(ids)
    assert "".join(p for p in pieces if not p.startswith("‹")) == "你好 🙂 ok"
    # Kimi layout: byte-level tokens; "é" is two byte tokens → one partial piece, one completing piece.
    e_ids = kimi_tok.encode("é")
    assert len(e_ids) == 2
    assert kimi_tok.pieces(e_ids) == ["‹c3›", "é"]
    assert kimi_tok.pieces([THINK_OPEN, 256, THINK_CLOSE]) == ["<think>", "Okay", "</think>"]


def test_detect_profiles(qwen_tok, kimi_tok):
    q = detect_profile(qwen_tok)
    assert (q.name, q.think_open_id, q.think_close_id, q.prefills_opener, q.thinking_kwarg) == (
        "qwen3",
        151667,
        151668,
        False,
        "enable_thinking",
    )
    assert 151645 in q.stop_ids
    k = detect_profile(kimi_tok)
    assert (k.name, k.think_open_id, k.think_close_id, k.prefills_opener, k.thinking_kwarg) == (
        "kimi-k2.5",
        THINK_OPEN,
        THINK_CLOSE,
        True,
        "thinking",
    )
    assert k.stop_ids[0] == IM_END


def test_profile_toml(tmp_path):
    f = tmp_path / "glm.toml"
    f.write_text('base = "qwen3"\nname = "glm-4.5"\nthink_open_id = 151350\nthink_close_id = 151351\n')
    p = load_profile_toml(f)
    assert (p.name, p.think_open_id, p.thinking_kwarg) == ("glm-4.5", 151350, "enable_thinking")
    assert get_profile(str(f)) == p
    bad = tmp_path / "bad.toml"
    bad.write_text("name = [")
    with pytest.raises(ProfileError, match="not valid TOML"):
        load_profile_toml(bad)
    with pytest.raises(ProfileError, match="unknown profile"):
        get_profile("nope")


def test_prompt_shapes_and_ids():
    a = parse_row({"id": "x1", "messages": [{"role": "user", "content": "hi"}]})
    b = parse_row({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]})
    c = parse_row({"prompt": "hi"})
    assert a.prompt_id == "x1"
    assert a.messages == [{"role": "user", "content": "hi"}]
    assert b.prompt_id.startswith("hash_")
    assert len(b.prompt_id) == 5 + 64
    assert b.prompt_id == prompt_id_for(
        {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}
    )
    assert c.messages == [{"role": "user", "content": "hi"}]
    for bad in ([1], {"foo": 1}, {"messages": [{"role": "wizard", "content": "x"}]}, {"messages": []}):
        with pytest.raises(PromptError):
            parse_row(bad, line=3)


def test_multiturn_points_drop_history_reasoning():
    row = parse_row(
        {
            "id": "m",
            "messages": [
                {"role": "user", "content": "q1"},
                {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
                {"role": "user", "content": "q2"},
            ],
        }
    )
    points = generation_points(row)
    assert [p.turn for p in points] == [0, 1]
    assert points[0].history == [{"role": "user", "content": "q1"}]
    assert points[1].history[1] == {"role": "assistant", "content": "a1"}
    single = generation_points(parse_row({"prompt": "x"}))
    assert [p.turn for p in single] == [None]


def test_sample_data_files_parse():
    from pathlib import Path

    from tokview.core.prompts import iter_jsonl

    root = Path(__file__).resolve().parents[1] / "sample_data"
    counts = {}
    for f in sorted(root.glob("*.jsonl")):
        rows = [parse_row(obj, n) for n, obj in iter_jsonl(f)]
        counts[f.name] = sum(len(generation_points(r)) for r in rows)
    assert counts["openai_messages.jsonl"] == 30
    assert counts["multiturn.jsonl"] > 6


def test_profile_toml_rejects_bad_files(tmp_path):
    cases = {
        "self.toml": 'base = "self.toml"\n',
        "types.toml": 'base = "qwen3"\nthink_open_id = "151667"\n',
        "stops.toml": 'base = "qwen3"\nstop_ids = ["x"]\n',
        "flag.toml": 'base = "qwen3"\nprefills_opener = "yes"\n',
    }
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(ProfileError):
            load_profile_toml(tmp_path / name)
    with pytest.raises(ProfileError, match="cannot read"):
        load_profile_toml(tmp_path)  # a directory


def test_builtin_name_is_not_shadowed_by_a_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "qwen3").write_text("not toml [")
    assert get_profile("qwen3").think_open_id == 151667


@pytest.mark.parametrize("seed", range(30))
def test_a_packed_prompt_finds_the_prefilled_opener_where_the_list_does(seed: int) -> None:
    """The proxy's long prompts are searched in their packing (`prefix_memo.known_packing`): the same answer as
    the search over the list, whatever follows the last opener."""
    import random

    from tokview.core import prefix_memo

    rng = random.Random(seed)
    profile = get_profile("kimi-k2.5")
    specials = [THINK_OPEN, THINK_CLOSE, IM_END, THINK_OPEN << 8 & 0x7FFFFFFF, THINK_OPEN >> 8]
    prompt = [rng.randrange(0, 160_000) for _ in range(5000)]
    for _ in range(rng.randrange(0, 6)):
        prompt[rng.randrange(len(prompt))] = rng.choice(specials)
    if rng.random() < 0.5:
        prompt[-rng.randrange(1, 4)] = THINK_OPEN
    as_list = seg.prefilled_opener_position(list(prompt), profile)  # another list: searched id by id
    assert prefix_memo.pack_int32(prompt) is not None and prefix_memo.known_packing(prompt) is not None
    assert seg.prefilled_opener_position(prompt, profile) == as_list
