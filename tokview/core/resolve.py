"""Pick the tokenizer and profile a command works with, the same way in every command.

No `--tokenizer`: tokview's own Kimi-layout tokenizer (real Kimi special ids, built offline and
cached). No `--profile`: detected from the tokenizer (think tokens + a rendered generation prompt).
"""

from __future__ import annotations

from pathlib import Path

from tokview.core.profiles import ModelProfile, detect_profile, get_profile
from tokview.core.tokenizer import TokenizerAdapter, load_tokenizer


def resolve_tokenizer_and_profile(tokenizer_dir: str | Path | None = None, profile: str | None = None, *,
                                  trust_remote_code: bool = False, tokenizer: TokenizerAdapter | None = None,
                                  model_profile: ModelProfile | None = None) -> tuple[TokenizerAdapter, ModelProfile]:
    """Already-loaded objects win (the app holds them); otherwise load and detect by name."""
    if tokenizer is None:
        if tokenizer_dir is None:
            from tokview.core.kimi_layout import kimi_tokenizer_dir

            tokenizer_dir = kimi_tokenizer_dir()
        tokenizer = load_tokenizer(tokenizer_dir, trust_remote_code=trust_remote_code)
    if model_profile is None:
        model_profile = get_profile(profile) if profile else detect_profile(tokenizer)
    return tokenizer, model_profile


def add_tokenizer_arguments(parser) -> None:
    """--tokenizer / --profile / --trust-remote-code, worded the same in every command."""
    parser.add_argument("--tokenizer", metavar="DIR", type=Path, default=None,
                        help="local tokenizer/model folder (default: tokview's Kimi-layout tokenizer)")
    parser.add_argument("--profile", metavar="NAME|FILE.toml", default=None,
                        help="kimi-k2.5, kimi-k2-thinking, qwen3, deepseek-r1 or a .toml (default: detected)")
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="run the tokenizer code shipped in the model folder (Kimi's tokenization_kimi.py)")
