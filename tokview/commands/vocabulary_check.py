"""`--tokenizer` on a reading command (export, show) against the vocabulary the stored runs were made with.

One check for both: `show --tokenizer` of another vocabulary flagged a valid sample INVALID (unknown ids, a
render mismatch, drift) where `export` refused the same folder in one line."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokview.errors import UserError

if TYPE_CHECKING:
    from tokview.core.tokenizer import TokenizerAdapter


def refuse_another_vocabulary(tokenizer: TokenizerAdapter, named: Path | str, runs: list[dict[str, Any]]) -> None:
    """A tokenizer named with `--tokenizer` must have the vocabulary the runs were made with: another one decodes
    their ids as other text, and the text formats (and every finding) would be garbage. Told by the vocabulary
    fingerprint a batch run records; a run without one (the proxy's, an audit's) by its tokenizer's file hash, and
    when that differs, by the vocabulary of the folder it recorded, if that folder is still there."""
    from tokview.batch.identity import vocab_fingerprint
    from tokview.core.tokenizer import load_tokenizer

    def settings(run: dict[str, Any]) -> dict[str, Any]:
        return run["settings"] if isinstance(run.get("settings"), dict) else {}

    recorded = {settings(r)["tokenizer"] for r in runs if isinstance(settings(r).get("tokenizer"), str)}
    looked: set[tuple[str, str]] = set()  # each recorded folder and hash loaded once, however many runs name them
    for r in runs:
        if isinstance(settings(r).get("tokenizer"), str) or not r.get("tokenizer_hash"):
            continue
        if r["tokenizer_hash"] == tokenizer.fingerprint() or not r.get("tokenizer_dir"):
            continue
        if (r["tokenizer_dir"], r["tokenizer_hash"]) in looked:
            continue
        looked.add((r["tokenizer_dir"], r["tokenizer_hash"]))
        try:
            theirs = load_tokenizer(r["tokenizer_dir"])
        except Exception:  # a folder gone or unreadable: nothing to compare with
            continue
        if theirs.fingerprint() == r["tokenizer_hash"]:
            recorded.add(vocab_fingerprint(theirs))
    named_vocabulary = vocab_fingerprint(tokenizer) if recorded else None
    if recorded and named_vocabulary not in recorded:
        raise UserError(
            f"--tokenizer {named} has another vocabulary than the runs were made with (vocabulary "
            f"{named_vocabulary}, the runs recorded {', '.join(sorted(recorded))}): its tokens would read "
            "their ids as other text; name the tokenizer the samples were made with"
        )
