"""A command's messages in the words of the form that ran it: the generate panel and the export dialog run what
`tokview batch` and `tokview export` run, and their errors and summaries name the commands' flags (`--select valid`,
`--include-invalid`, `max_new_tokens`), which a curator who only used the form never typed."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from tokview.errors import TokviewError


def in_words(message: str, names: Mapping[str, str]) -> str:
    """`message` with each flag of `names` said as the form's label. A flag is a word of its own, in no name, path or
    URL (a run named `sweep--run-2`, `/data/--db/`, `x.--out` keep theirs), and a `tokview doctor --server URL` hint
    in backticks is a command: its flags stay flags."""
    pieces = message.split("`")
    for k in range(0, len(pieces), 2):
        for flag, label in sorted(names.items(), key=lambda kv: -len(kv[0])):
            pieces[k] = re.sub(rf"(?<![\w\-/.=?&]){re.escape(flag)}(?![\w\-/.=?&])", label, pieces[k])
    return "`".join(pieces)


def reword(error: BaseException, say: Callable[[str], str]) -> None:
    """The app's notification of a failed worker says the error too: in the form's words as well (`say`: the form's
    wording of a message, the same its own line uses)."""
    if isinstance(error, TokviewError):
        error.message = say(error.message)
        error.args = (error.message,)
