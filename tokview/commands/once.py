"""A command-line flag that takes one value and refuses a second one.

argparse keeps the last value of a repeated flag: `export --select approved --select all` exported everything and
`merge --into a --into b` wrote only `b`, without a word. A flag given twice is refused, in argparse's one line:
every command's one-value flags (`every_flag_once`), not only those declared `action=GivenOnce` (`proxy --db a
--db b` recorded into `b`, `batch --temperature 1 --temperature 0` ran at 0).
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


def every_flag_once(parser: argparse.ArgumentParser) -> None:
    """Make each plain one-value flag of `parser` and its subcommands a GivenOnce (repeatable flags are `append`
    actions, and switches take no value: both stay as they are)."""
    for action in parser._actions:
        if type(action) is argparse._StoreAction and action.option_strings:
            action.__class__ = GivenOnce  # type: ignore[assignment]  # same fields, one more check
        elif isinstance(action, argparse._SubParsersAction):
            for sub in set(action.choices.values()):
                every_flag_once(sub)
