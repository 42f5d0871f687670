"""Do a batch's first answers read, decoded by its tokenizer, as what the server said? Else the run stops.

A server of another model takes the messages (chat mode: its own template renders them), answers, and every sample
is stored flagged: tokview's Kimi-layout default tokenizer on a Qwen3 server stored each answer with
`think_open_missing`, exit 0, and a run of 100,000 prompts would spend its hours on samples no export takes. Its
first answers tell: another vocabulary's ids, decoded locally, hold next to none of the words the server's own text
(text, reasoning, content, tool calls) holds. The test is `tokview score`'s (`answer_words.reads_as`), made on
each answer as it comes in, until `TOLD` of them had words enough to tell; no request is added. `tokview proxy`
makes the same check and says it (it never stops forwarding): its ids are exact whatever the tokenizer, but every
finding and text export reads them with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokview.batch.answer_words import TOLD, read_back
from tokview.batch.config import OTHER_VOCABULARY
from tokview.untrusted_text import printable_line

if TYPE_CHECKING:
    from tokview.core.record import Capture
    from tokview.core.tokenizer import TokenizerAdapter


BATCH_ADVICE = (
    "name the served model's tokenizer folder (--tokenizer DIR; `tokview doctor --server URL --tokenizer DIR` compares "
    "one with the server), or pass --any-vocabulary to go on"
)


class AnswerVocabularyCheck:
    """Counts of the first answers told (agreeing, disagreeing); `see` each answer, `verdict` once the run ends."""

    def __init__(self, tokenizer_name: str, advice: str = BATCH_ADVICE) -> None:
        self.tokenizer_name, self.advice = tokenizer_name, advice
        self.agreed = 0
        self.disagreed: list[tuple[str, str]] = []
        """(the server's text, the local decode) of each answer that read as other text."""

    @property
    def told(self) -> int:
        return self.agreed + len(self.disagreed)

    def see(self, capture: Capture, tokenizer: TokenizerAdapter | None) -> str | None:
        """Why the run stops, once `TOLD` answers were told and more of them read as other text than as their own;
        else None. Answers after that are not looked at (the check costs one decode of `PROBE_IDS` ids each)."""
        if self.told >= TOLD or tokenizer is None:
            return None
        agrees, text, decoded = read_back(capture, tokenizer)
        if agrees is None:
            return None
        if agrees:
            self.agreed += 1
        else:
            self.disagreed.append((text, decoded))
        return self.verdict() if self.told >= TOLD else None

    def verdict(self) -> str | None:
        """Why the run is not what it seems, when more of the answers told read as other text than as their own."""
        if len(self.disagreed) <= self.agreed:
            return None
        text, decoded = self.disagreed[0]
        told = self.told
        return (
            f"{OTHER_VOCABULARY} with {self.tokenizer_name} (another vocabulary?): {len(self.disagreed)} of {told} "
            f"answer{'s' if told != 1 else ''} told differ{'s' if told == 1 else ''}; the server said "
            f"'{_quoted(text)}', its ids decode as '{_quoted(decoded)}': {self.advice}"
        )


def _quoted(text: str) -> str:
    """A text's first words on one line, its control characters escaped (a server's text is untrusted)."""
    return printable_line(" ".join(text.split())[:60])


def tokenizer_name(named: Path | None, loaded: Any = None) -> str:
    """A run's tokenizer as its user named it (`--tokenizer DIR`), else as it was loaded (the app's, the proxy's): the
    built-in Kimi layout is said to be the default a run without `--tokenizer` takes."""
    if named is not None:
        return f"--tokenizer {named}"
    source = getattr(loaded, "source", None)
    if source is None:
        return "the run's tokenizer"
    from tokview.core.json_cache import NoCacheFolder, cache_folder

    try:
        built = Path(source).parent == cache_folder().absolute() and "layout" in Path(source).name
    except NoCacheFolder:
        built = False
    return "tokview's default Kimi-layout tokenizer" if built else f"the tokenizer of {source}"
