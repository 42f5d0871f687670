"""An answer with far more output ids than the request's `max_tokens` is refused as malformed, before analysis.

A server answering 24 million ids to a 1,024-token request had them stored (flagged, a 200 MB store) after minutes
of analysis during which the batch did not hear SIGTERM."""

from __future__ import annotations

import pytest

from tokview.core.record import Capture
from tokview.servers.capture import OVERRUN_SLACK, _check_output_length
from tokview.servers.errors import CaptureFailed


def _capture(n: int) -> Capture:
    return Capture(prompt_ids=[1, 2], output_ids=list(range(n)), finish_reason="length")


@pytest.mark.parametrize("n", [0, 1024, 1024 + OVERRUN_SLACK])
def test_an_answer_within_max_tokens_passes(n):
    _check_output_length(_capture(n), 1024, "http://s")


@pytest.mark.parametrize("asked", [None, 0, True, "1024"])
def test_no_usable_max_tokens_checks_nothing(asked):
    _check_output_length(_capture(5000), asked, "http://s")


def test_an_answer_far_past_max_tokens_is_a_malformed_response():
    with pytest.raises(CaptureFailed, match="malformed response: 200000 output ids for a request of max_tokens 1024"):
        _check_output_length(_capture(200_000), 1024, "http://s")
