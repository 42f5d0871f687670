"""A command-line flag that takes one value and refuses a second one.

argparse keeps the last value of a repeated flag: `export --select approved --select all` exported everything and
`merge --into a --into b` wrote only `b`, without a word. A flag given twice is refused, in argparse's one line.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

GIVEN = "_flags_given_once"
"""The namespace attribute holding the destinations already set (a default is not a given value)."""


class GivenOnce(argparse.Action):
    """`action=GivenOnce` on a flag that takes one value; `why` (a class attribute of a subclass) says why."""

    why = "it takes one value"

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        given: set[str] = getattr(namespace, GIVEN, set())
        if self.dest in given:
            parser.error(f"{option_string} given twice: {self.why}")
        setattr(namespace, GIVEN, given | {self.dest})
        setattr(namespace, self.dest, values)
