"""Pick the tokenizer and profile a command works with, the same way in every command.

No `--tokenizer`: tokview's own Kimi-layout tokenizer (real Kimi special ids, built offline and
cached). No `--profile`: detected from the tokenizer (think tokens + a rendered generation prompt).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tokview.core.profiles import (
    BUILTIN_PROFILES,
    ModelProfile,
    ProfileError,
    check_tool_layout_fits,
    default_tokenizer_dir,
    detect_profile,
    get_profile,
    profile_from_fields,
    with_tokenizer_stops,
)
from tokview.core.tokenizer import TokenizerAdapter, TokenizerError, load_tokenizer


def load_tokenizer_and_profile(
    tokenizer_dir: str | Path | None = None,
    profile: str | None = None,
    *,
    trust_remote_code: bool = False,
    tokenizer: TokenizerAdapter | None = None,
    model_profile: ModelProfile | None = None,
    sliced: bool = False,
) -> tuple[TokenizerAdapter, ModelProfile]:
    """Already-loaded objects win (the app holds them); otherwise load and detect by name. `sliced`: see
    `load_tokenizer`."""
    if tokenizer is None:
        if tokenizer_dir is None:
            tokenizer_dir = default_tokenizer_dir(profile)
        tokenizer = load_tokenizer(tokenizer_dir, trust_remote_code=trust_remote_code, sliced=sliced)
    if model_profile is None:
        if profile:
            model_profile = get_profile(profile)
            check_profile_fits(model_profile, tokenizer, profile)
            check_tool_layout_fits(model_profile, tokenizer, profile)
        else:
            model_profile = detect_profile(tokenizer)
    return tokenizer, with_tokenizer_stops(model_profile, tokenizer)


def check_profile_fits(profile: ModelProfile, tokenizer: TokenizerAdapter, given: str) -> None:
    """A named profile whose ids this tokenizer does not have, or has as other tokens, is refused in one line.

    `--profile deepseek-r1` with a Qwen3 tokenizer would otherwise split every sample on ' того' and ' thủ';
    a .toml id past the vocabulary, or an opener equal to the closer, would do worse quietly."""
    named: dict[str, int | None] = {"think_open_id": profile.think_open_id, "think_close_id": profile.think_close_id}
    for i, stop in enumerate(profile.stop_ids):
        named[f"stop_ids[{i}]"] = stop
    for key, value in named.items():  # an id the tokenizer does not know reads as its placeholder "<id N>"
        if value is not None and (value < 0 or tokenizer.piece_text(value) == f"<id {value}>"):
            raise ProfileError(f"profile {given}: {key} = {value} is not an id of this tokenizer")
    if profile.has_reasoning:
        if profile.think_open_id == profile.think_close_id:
            raise ProfileError(
                f"profile {given}: the think opener and closer are the same id ({profile.think_open_id})"
            )
        clash = sorted(set(profile.stop_ids) & profile.delimiter_ids)
        if clash:
            raise ProfileError(f"profile {given}: stop id {clash[0]} is also a think delimiter")
        for key, delimiter, text in (
            ("think_open_id", profile.think_open_id, profile.think_open),
            ("think_close_id", profile.think_close_id, profile.think_close),
        ):
            assert delimiter is not None  # has_reasoning
            piece = tokenizer.piece_text(delimiter)
            if piece.strip() != text.strip():
                raise ProfileError(
                    f"profile {given}: {key} {delimiter} is {piece!r} in this tokenizer, not {text!r}: "
                    "the profile is another model's (or set think_open / think_close to this one's)"
                )


RECORDED_TOKENIZER = "the one the run recorded, else tokview's Kimi-layout tokenizer"
RECORDED_PROFILE = "the run's, else detected from the tokenizer"


def add_tokenizer_arguments(
    parser: argparse.ArgumentParser,
    *,
    tokenizer_default: str = RECORDED_TOKENIZER,
    profile_default: str = RECORDED_PROFILE,
) -> None:
    """--tokenizer / --profile / --trust-remote-code, defined here for every command; each command says only
    what no flag means for it (a command over stored samples uses what the run recorded)."""
    parser.add_argument(
        "--tokenizer",
        metavar="DIR",
        type=Path,
        default=None,
        help=f"local tokenizer/model folder (default: {tokenizer_default})",
    )
    parser.add_argument(
        "--profile",
        metavar="NAME|FILE.toml",
        default=None,
        help=f"{', '.join(BUILTIN_PROFILES)} or a .toml (default: {profile_default})",
    )
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="run the tokenizer code shipped in the folder named with --tokenizer (not needed for "
        "Kimi's tiktoken tokenizer, which tokview reads itself)",
    )


def recorded_vocabulary(run: dict[str, Any]) -> str | None:
    """The vocabulary fingerprint a batch run recorded in its settings (part of its sample ids), or None."""
    settings = run.get("settings")
    value = settings.get("tokenizer") if isinstance(settings, dict) else None
    return value if isinstance(value, str) else None


def resolve_for_stored(
    tokenizer_dir: str | Path | None,
    profile: str | None,
    *,
    recorded_tokenizer_dir: str | None,
    recorded_profile: str | None,
    trust_remote_code: bool = False,
    tokenizer: TokenizerAdapter | None = None,
    model_profile: ModelProfile | None = None,
    recorded_tokenizer_hash: str | None = None,
    recorded_profile_def: object = None,
    recorded_vocabulary: str | None = None,
) -> tuple[TokenizerAdapter, ModelProfile]:
    """Tokenizer and profile to re-analyse stored samples with: what the user names, else what the run recorded.

    Showing a Qwen3 sample with Kimi's rules would invent findings, so the recorded tokenizer folder
    and profile are used when the user names none. Code shipped in a *recorded* folder never runs:
    `trust_remote_code` applies only to a folder the user names on this command line. Already-loaded
    objects (an app caches one tokenizer per folder) are used as they are. `recorded_tokenizer_hash`
    (the runs table's `tokenizer_hash`) tells a recorded folder whose files changed, or another folder
    now at that path, from the one the run used; `recorded_vocabulary` (the vocabulary fingerprint a batch run
    records in its settings) lets a folder whose other files changed stand for it: the ids read as the same tokens
    (tokview's own Kimi-layout folder is rebuilt in place when its chat template changes between releases, and
    every run an older tokview made with it was refused by `show` and `export`).
    """
    if tokenizer is None and tokenizer_dir is None and recorded_tokenizer_dir:
        if not Path(recorded_tokenizer_dir).is_dir():
            raise TokenizerError(f"the run's tokenizer folder {recorded_tokenizer_dir} is gone: pass --tokenizer DIR")
        try:
            tokenizer = load_tokenizer(recorded_tokenizer_dir, trust_remote_code=False)
        except TokenizerError as exc:
            if not exc.needs_remote_code:
                raise
            given = (
                "--trust-remote-code applies only to a folder named on the command line"
                if trust_remote_code
                else "tokview runs a folder's code only when you name the folder and pass --trust-remote-code"
            )
            raise TokenizerError(
                f"the run's tokenizer folder {recorded_tokenizer_dir} ships its own tokenizer code, "
                f"and {given}: pass --tokenizer {recorded_tokenizer_dir} --trust-remote-code",
                needs_remote_code=True,
            ) from None
        changed = bool(recorded_tokenizer_hash) and tokenizer.fingerprint() != recorded_tokenizer_hash
        if changed and not (recorded_vocabulary and tokenizer.vocab_fingerprint() == recorded_vocabulary):
            raise TokenizerError(
                f"the tokenizer at {recorded_tokenizer_dir} is not the one the run used (file hash "
                f"{tokenizer.fingerprint()}, the run recorded {recorded_tokenizer_hash}): pass "
                f"--tokenizer DIR to name the right one"
            )
    if model_profile is None and profile is None:
        recorded = profile_from_fields(recorded_profile_def)  # the run's whole profile (a .toml one included)
        if recorded is not None and recorded.name == (recorded_profile or recorded.name):
            model_profile = recorded
        elif recorded_profile in BUILTIN_PROFILES:
            model_profile = BUILTIN_PROFILES[recorded_profile]  # an older run's custom profile is detected instead
    return load_tokenizer_and_profile(
        tokenizer_dir, profile, trust_remote_code=trust_remote_code, tokenizer=tokenizer, model_profile=model_profile
    )
