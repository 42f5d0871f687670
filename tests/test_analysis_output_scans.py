"""`analyze` looks through a sample's output for an id only when the output holds it.

Each search for one id (a think delimiter, each of the five Kimi tool-call markers) is a pass over the
whole output (`list.index`); a 2,000-id answer without tool calls paid seven of them per sample in the
batch writer. `analyze` now takes the set of the output's ids once and looks only for the ids in it. These
tests hold the results to those of the full searches and count the searches with an output that counts them.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from facts import IM_END, KIMI_SPECIAL_IDS, THINK_CLOSE, THINK_OPEN

from tokview.core import segments as seg
from tokview.core.alignment import DRIFT, HIDDEN, KEPT, PARTIAL, Alignment, _Run, align
from tokview.core.analysis import analyze, tool_calls_of
from tokview.core.finding_context import vocabulary_of

TOOL_SECTION_BEGIN = KIMI_SPECIAL_IDS["<|tool_calls_section_begin|>"]
TOOL_SECTION_END = KIMI_SPECIAL_IDS["<|tool_calls_section_end|>"]
TOOL_CALL_BEGIN = KIMI_SPECIAL_IDS["<|tool_call_begin|>"]
TOOL_CALL_END = KIMI_SPECIAL_IDS["<|tool_call_end|>"]


class CountedSearches(list):
    """A list of ids that counts the `index` searches made in it (each is a pass over it in C)."""

    searches = 0

    def index(self, *args):
        self.searches += 1
        return super().index(*args)


def test_an_answer_without_tool_calls_is_searched_only_for_the_ids_it_holds(make_capture, kimi_tok, kimi_profile):
    capture = make_capture()
    assert THINK_OPEN not in capture.output_ids and THINK_CLOSE in capture.output_ids
    counted = CountedSearches(capture.output_ids)
    capture.output_ids = counted
    analysis = analyze(capture, kimi_profile, kimi_tok)
    # the closer (found, then not found again): two searches; the stop id, which it holds, once (is there one before
    # its end: `output_past_stop`); the opener and the five markers: none
    assert counted.searches == 3
    assert analysis.findings == analyze(make_capture(), kimi_profile, kimi_tok).findings


@pytest.mark.parametrize(
    "output",
    [
        [],
        [11, 12, THINK_CLOSE, 13, IM_END],
        [THINK_OPEN, 11, THINK_CLOSE, 13, THINK_CLOSE, IM_END],
        [11, THINK_CLOSE, TOOL_SECTION_BEGIN, TOOL_CALL_BEGIN, 14, TOOL_CALL_END, TOOL_SECTION_END, IM_END],
        [11, TOOL_CALL_BEGIN, 12],
    ],
)
def test_searching_only_the_held_ids_finds_what_the_full_searches_find(output, kimi_tok, kimi_profile):
    held = set(output)
    assert seg.delimiter_positions(output, kimi_profile, held) == seg.delimiter_positions(output, kimi_profile)
    fast = tool_calls_of(output, kimi_profile, kimi_tok, None, held)
    assert fast == tool_calls_of(output, kimi_profile, kimi_tok, None)
    assert fast is not None and fast.found == any(t in held for t in kimi_profile.tool_calls.marker_ids)


@pytest.mark.parametrize("ids", [[], [5, 6, 5], [5, 163840, 7, -1, 163840], [2**31 - 1]])
def test_unknown_ids_are_found_from_the_held_ids_as_from_the_list(ids, kimi_tok):
    vocabulary = vocabulary_of(kimi_tok)
    assert vocabulary.unknown_positions(ids, set(ids)) == vocabulary.unknown_positions(ids)


class CountedStatuses(tuple):
    """Statuses that count the `index` searches made in them."""

    searches = 0

    def index(self, *args):
        type(self).searches += 1
        return super().index(*args)


def test_an_alignment_finds_a_status_from_its_recorded_runs_without_searching_its_ids():
    pieces = [b"Hi", b" there", b"<x>", b" and", b" more", b"<y>"]
    special = [False, False, True, False, False, True]
    walked = align(pieces, ["Hi there and more"], special)
    counted = Alignment(CountedStatuses(walked.statuses), walked.unmatched_text, walked.fields)
    counted._with_runs([_Run(status, n) for status, n in walked.status_runs()])
    for status in (KEPT, PARTIAL, HIDDEN, DRIFT):
        assert counted.positions(status) == replace(walked).positions(status)  # a copy keeps no runs: searched
    assert counted.positions(HIDDEN) == [2, 5]
    assert CountedStatuses.searches == 0
