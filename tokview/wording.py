"""How tokview says a count, shared by every layer that words output (the app, commands, the doctor's checks).

Why a module of its own: the UI's `display` is the app's, a command must not import it, and the servers layer may
import neither the UI nor the commands; each had grown its own copy.
"""

from __future__ import annotations


def plural(count: int, noun: str, many: str | None = None) -> str:
    """'1 position', '2 positions', '1,204 samples': the count and the noun that agrees with it."""
    return f"{count:,} {noun if count == 1 else (many or noun + 's')}"


def first_of(items: list[str], shown: int = 5) -> str:
    """`a, b, c, …`: the first `shown` items of a list a message names, and `…` when it has more (a message naming
    every run, table or line of a big store would scroll the one line it has off the screen)."""
    return ", ".join(items[:shown]) + (", …" if len(items) > shown else "")
