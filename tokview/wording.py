"""How tokview says a count, shared by every layer that words output (the app, commands, the doctor's checks).

Why a module of its own: the UI's `display` is the app's, a command must not import it, and the servers layer may
import neither the UI nor the commands; each had grown its own copy.
"""

from __future__ import annotations


def plural(count: int, noun: str, many: str | None = None) -> str:
    """'1 position', '2 positions', '1,204 samples': the count and the noun that agrees with it."""
    return f"{count:,} {noun if count == 1 else (many or noun + 's')}"
