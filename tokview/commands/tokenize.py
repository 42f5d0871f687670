"""`tokview tokenize --tokenizer DIR TEXT…`: the quickest check of a tokenizer folder.

Prints each text's ids and pieces, special ids marked, and how the folder was loaded; `-` reads one
text per line from stdin. `--chat FILE.json` renders a conversation through the folder's chat template
(with the profile's thinking kwarg, as `batch` does) and prints the prompt ids tokview would send, one
block per generation point. `--json` prints one object per line: {"text", "ids", "pieces"}.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from tokview.errors import UserError
from tokview.untrusted_text import stdout_json

if TYPE_CHECKING:
    from tokview.core.tokenizer import TokenizerAdapter


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from tokview.core.resolve import add_tokenizer_arguments

    p = sub.add_parser(
        "tokenize",
        help="print the ids and pieces a tokenizer folder makes of texts or a chat",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("texts", nargs="*", metavar="TEXT", help="texts to encode; - reads one text per line from stdin")
    p.add_argument(
        "--chat",
        type=Path,
        metavar="FILE.json",
        help="a messages list (or a prompts row) to render through the chat template",
    )
    p.add_argument(
        "--thinking",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="--chat: render with thinking on (default) or off, as batch does",
    )
    p.add_argument("--json", action="store_true", help='one JSON object per line: {"text", "ids", "pieces"}')
    add_tokenizer_arguments(
        p,
        tokenizer_default="tokview's Kimi-layout tokenizer (K2.6's with --profile kimi-k2.6)",
        profile_default="detected from the tokenizer",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if not args.texts and args.chat is None:
        raise UserError("nothing to tokenize: give TEXT…, - to read lines from stdin, or --chat FILE.json")
    if args.thinking is not None and args.chat is None:  # texts are encoded as they are: it changed nothing
        raise UserError("--thinking and --no-thinking go with --chat only (a text is encoded as it is)")
    if args.profile:  # read only with --chat, but a profile that does not exist is a mistake either way
        from tokview.core.profiles import get_profile

        get_profile(args.profile)
    points = _read_chat(args.chat) if args.chat is not None else []
    texts = list(_texts(args.texts))
    from tokview.core.tokenizer import load_tokenizer

    tokenizer = (
        load_tokenizer(args.tokenizer, trust_remote_code=args.trust_remote_code)
        if args.tokenizer
        else _default_tokenizer(args.profile)
    )
    if not args.json:
        print(
            f"tokenizer {tokenizer.name} (loaded from {tokenizer.loaded_by}), {tokenizer.vocab_size} ids; "
            f"* marks special ids"
        )
    for text in texts:
        _emit(args.json, text, tokenizer.encode(text), tokenizer)
    if points:
        kwargs = _template_kwargs(tokenizer, args.profile, args.thinking is not False)
        for label, messages, tools in points:
            # the row's tools as vLLM renders them (SGLang adds `"defer_loading": null` to each: core.served_tools)
            rendered = {**kwargs, "tools": tools} if tools else kwargs
            text = tokenizer.render_text(messages, add_generation_prompt=True, template_kwargs=rendered)
            _emit(
                args.json,
                text,
                tokenizer.render(messages, add_generation_prompt=True, template_kwargs=rendered),
                tokenizer,
                label=f"chat prompt{label} {json.dumps(kwargs)}" + (f" + {len(tools)} tools" if tools else ""),
            )
    return 0


def _default_tokenizer(profile: str | None) -> TokenizerAdapter:
    from tokview.core.profiles import default_tokenizer_dir
    from tokview.core.tokenizer import load_tokenizer

    return load_tokenizer(default_tokenizer_dir(profile))


READ_LIMIT = 256 << 20
"""Bytes `tokenize` reads of a conversation or of stdin: one conversation, or texts to look at, not a dataset."""


def _bounded(stream: BinaryIO, what: str) -> bytes:
    """All of `stream` up to READ_LIMIT; a one-line UserError past it (`tokenize --chat /dev/zero` read until the
    process ran out of memory, then exited 70)."""
    data = stream.read(READ_LIMIT + 1)
    if len(data) > READ_LIMIT:
        raise UserError(
            f"{what} holds more than {READ_LIMIT / (1 << 20):g} MiB: tokenize reads one conversation or a few texts"
        )
    return data


def _texts(items: list[str]) -> Iterator[str]:
    for n, item in enumerate(items, 1):
        if item == "-":
            data = _bounded(sys.stdin.buffer, "stdin") if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode()
            try:
                decoded = data.decode("utf-8-sig")
            except UnicodeDecodeError as exc:
                raise UserError(f"stdin is not UTF-8 text (byte {exc.start})") from None
            lines = decoded.split("\n")  # one text per line: `splitlines` also cut at \f, \v, \x1c-\x1e, U+2028 …
            if lines[-1] == "":
                lines.pop()
            yield from (line.removesuffix("\r") for line in lines)
            continue
        try:
            item.encode("utf-8")
        except UnicodeEncodeError:
            raise UserError(f"TEXT {n} is not valid UTF-8") from None
        yield item


def _read_chat(path: Path) -> list[tuple[str, list[dict[str, Any]], list[dict[str, Any]] | None]]:
    """(label, messages, the row's tools) for each generation point batch would send for this conversation."""
    from tokview.batch.inputs import check_row
    from tokview.core.agent_traces import PromptError
    from tokview.core.prompts import generation_points, parse_row
    from tokview.export.audit import readable_dataset

    if path.is_dir():
        raise UserError(f"chat file is a directory: {path}")
    if not readable_dataset(path):  # a file, or a pipe: `--chat /dev/stdin`, `--chat <(…)`
        raise UserError(f"chat file not found: {path}")
    try:
        with path.open("rb") as f:
            data = json.loads(_bounded(f, str(path)).decode("utf-8-sig"))
    except UnicodeDecodeError:
        raise UserError(f"{path} is not UTF-8 text") from None
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise UserError(f"{path} is not valid JSON: {exc}") from None
    except RecursionError:
        raise UserError(f"{path} is not valid JSON: nested too deeply") from None
    row = {"messages": data} if isinstance(data, list) else data
    try:
        if isinstance(row, dict):
            check_row(row, "chat")  # what `tokview batch` checks first: a field of the wrong type, named
        parsed = parse_row(row)
        points = generation_points(parsed)
    except PromptError as exc:
        raise UserError(f"{path}: {str(exc).removeprefix('row: ').removeprefix('chat: ')}") from None
    many = len(points) > 1
    return [(f" (assistant turn {p.turn})" if many else "", p.history, parsed.tools) for p in points]


def _template_kwargs(tokenizer: TokenizerAdapter, profile_name: str | None, thinking: bool) -> dict[str, Any]:
    from tokview.core.profiles import ProfileError, detect_profile, get_profile
    from tokview.core.thinking_switch import thinking_off_refusal

    try:
        profile = get_profile(profile_name) if profile_name else detect_profile(tokenizer)
    except ProfileError:
        if profile_name:
            raise
        return {}  # no think tokens: nothing to switch, the template renders as it is
    if profile_name:  # as every other command refuses it: its kwargs and ids are another model's
        from tokview.core.profiles import check_tool_layout_fits
        from tokview.core.resolve import check_profile_fits

        check_profile_fits(profile, tokenizer, profile_name)
        check_tool_layout_fits(profile, tokenizer, profile_name)
    refusal = None if thinking else thinking_off_refusal(profile, tokenizer, profile.template_kwargs(False))
    if refusal is not None:
        raise UserError(f"--no-thinking: {refusal}")
    return profile.template_kwargs(thinking)


def _emit(as_json: bool, text: str, ids: list[int], tokenizer: TokenizerAdapter, label: str | None = None) -> None:
    pieces = tokenizer.pieces(ids)
    if as_json:
        print(stdout_json({"text": text, "ids": ids, "pieces": pieces}))
        return
    print()
    print(f"{label or 'text'} {_short(text)}: {len(ids)} ids")
    print("  " + " ".join(f"{i}*" if tokenizer.is_special(i) else str(i) for i in ids))
    for pos, (tid, piece) in enumerate(zip(ids, pieces)):
        mark = "*" if tokenizer.is_special(tid) else " "
        print(f"  {pos:>5}  {tid:>7}{mark} {piece!r}")


def _short(text: str, limit: int = 100) -> str:
    shown = repr(text)
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"
