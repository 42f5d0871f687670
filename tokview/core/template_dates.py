"""Dates chat templates stamp into a prompt, and telling two renders apart only by them.

Kept apart from the finding (`prompt_dates`) so `prompt_render_mismatch` can stay quiet on a date-only
difference without importing another module's rules out of their registration order.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokview.core.tokenizer import TokenizerAdapter

_MONTHS = "Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec"
DATE = re.compile(rf"\d{{4}}-\d{{2}}-\d{{2}}|\d{{1,2}} (?:{_MONTHS}) \d{{4}}")
"""The dates templates stamp: gpt-oss's `%Y-%m-%d`, Llama 3's `%d %b %Y`."""


def date_only_difference(local: str, served: str) -> tuple[str, str] | None:
    """(the local date, the served date) of the first date that differs, when the two texts are the same
    but for their dates; None when they are equal or differ anywhere else."""
    if local == served:
        return None
    local_dates, served_dates = DATE.findall(local), DATE.findall(served)
    if len(local_dates) != len(served_dates) or DATE.split(local) != DATE.split(served):
        return None
    return next(((a, b) for a, b in zip(local_dates, served_dates) if a != b), None)


def served_date(tokenizer: TokenizerAdapter, local: list[int], served: list[int]) -> tuple[str, str] | None:
    """(local date, served date) when the served prompt ids differ from `local` only by a stamped date."""
    return date_only_difference(tokenizer.decode(local), tokenizer.decode(served))
