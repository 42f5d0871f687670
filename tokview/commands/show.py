"""`tokview show SAMPLE_ID`: one stored sample as plain text — ids, pieces, segments, findings.

The headless twin of the inspect screen, for terminals without the app, for logs and for scripts.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import TYPE_CHECKING, Any

from tokview.commands.store_arg import add_db_argument, existing_store
from tokview.commands.vocabulary_check import refuse_another_vocabulary
from tokview.core.json_value import strict_json
from tokview.errors import UserError
from tokview.untrusted_text import from_printed, has_lone_surrogate, printable, printable_line
from tokview.wording import first_of

if TYPE_CHECKING:
    from tokview.core.alignment import Alignment
    from tokview.core.analysis import Analysis
    from tokview.core.tokenizer import TokenizerAdapter
    from tokview.store import Store
    from tokview.store.sample_rows import StoredSample

MARK = {"kept": " ", "partial": "~", "hidden": "✗", "drift": "≠"}


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from tokview.core.resolve import add_tokenizer_arguments

    p = sub.add_parser("show", help="print one sample's ids, segments and findings")
    p.add_argument("sample_id", help="a sample id (`tokview stats --samples` and the app list them)")
    add_db_argument(p, "DuckDB file")
    p.add_argument(
        "--from", dest="start", type=int, default=None, help="first position to list (default: output start)"
    )
    p.add_argument("--count", type=int, default=80, help="how many positions to list (default 80)")
    p.add_argument("--json", action="store_true", help="print the sample and its analysis as JSON")
    add_tokenizer_arguments(p)
    p.set_defaults(run=run)


def _stored(store: Store, given: str, db: object) -> StoredSample:
    """The sample `given` names: as typed, else as `stats --samples` printed it, its control characters escaped (a
    read-back holding a lone surrogate names no stored id: `storable` escaped them all)."""
    from tokview.store import UnknownSample

    candidates = [given]
    read_back = from_printed(given)
    if read_back != given and not has_lone_surrogate(read_back):
        candidates.append(read_back)
    for sample_id in candidates:
        try:
            return store.load_sample(sample_id)
        except UnknownSample:
            pass
    named = _by_row_id(store, given)
    if len(named) == 1:
        return store.load_sample(named[0])
    if named:
        raise UserError(f"{len(named)} samples have the export row id {given!r}: {_which(store, given, named)}")
    of_prompt = [
        r[0] for r in store.query("SELECT sample_id FROM samples WHERE prompt_id = ? ORDER BY sample_id", [given])
    ]
    if len(of_prompt) == 1:  # one sample holds the prompt id (a chain's only turn): it is the one meant
        return store.load_sample(of_prompt[0])
    if of_prompt:  # a conversation's prompt id names its turns, none of them alone
        raise UserError(
            f"{given!r} is a prompt id with {len(of_prompt)} samples (turns, generations or runs): give one of "
            f"{_first_few(of_prompt)}"
        )
    first, turns = _trajectory_turns(store, given)
    if turns:  # a `--format trajectory` row is a conversation: each of its turns is a sample
        raise UserError(
            f"{given!r} is a trajectory row: each of its turns is a sample (the row's metadata.turns[].sample_id "
            f"names those it holds); the conversation's from turn {first}: {_first_few(turns)}"
        )
    raise UserError(f"no sample {given!r} in {db} (`tokview stats --samples --db {db}` lists them)")


def _trajectory_parses(given: str) -> list[tuple[str, int, str | None, int]]:
    """Every (prompt id, generation, run, first turn) a `--format trajectory` row id may stand for: `{prompt}_gen{g}`,
    `@run` for a run other than the first by name, `_from_turnN` (or `_split`) where a conversation's ids broke, `_2`…
    for a turn stored twice (`export.trajectory.write_trajectories`); the most suffixes read first, as a run's name may
    end in `_2` or hold `_gen1`, and a prompt id `@`."""
    out: list[tuple[str, int, str | None, int]] = []
    for rest in dict.fromkeys([re.sub(r"_\d+$", "", given), given]):
        splits = [(rest, 0)]
        if (cut := re.search(r"_from_turn(\d+)$", rest)) is not None:
            splits.insert(0, (rest[: cut.start()], int(cut.group(1))))
        elif rest.endswith("_split"):
            splits.insert(0, (rest[: -len("_split")], 0))
        for head, turn in splits:
            runs: list[tuple[str, str | None]] = [(head[:at], head[at + 1 :]) for at in _ats(head)] + [(head, None)]
            for conversation, run in runs:
                if (gen := re.fullmatch(r"(.+)_gen(\d+)", conversation, re.S)) is not None:
                    out.append((gen.group(1), int(gen.group(2)), run, turn))
    return out


def _ats(text: str) -> list[int]:
    """Where `@` is in `text`, the last first."""
    return [m.start() for m in re.finditer("@", text)][::-1]


def _trajectory_turns(store: Store, given: str) -> tuple[int, list[str]]:
    """(first turn, the sample ids of the conversation's turns from there) for the first reading of the trajectory row
    id `given` that names stored turns, in turn order: of the run it names, else of the first run by name that has the
    conversation (the one a bare id is given to); (0, []) when none does."""
    for prompt, gen, run, turn in _trajectory_parses(given)[:32]:
        sql = "SELECT run_id, sample_id FROM samples WHERE prompt_id = ? AND coalesce(gen_index, 0) = ? AND turn >= ?"
        params: list[object] = [prompt, gen, turn]
        if run is not None:
            sql += " AND run_id = ?"
            params.append(run)
        rows = store.query(sql + " ORDER BY run_id NULLS FIRST, turn, sample_id", params)
        if rows:
            return turn, [sample_id for run_id, sample_id in rows if run_id == rows[0][0]]
    return 0, []


def _which(store: Store, given: str, named: list[str]) -> str:
    """How to name one of them: an export gave the bare id to the first run by name among the samples it wrote (which
    `show` cannot know: a `--run`, tag or threshold left others out), `@RUN` to the others, `@SAMPLE_ID` to samples of
    one run that share it (a session's branches)."""
    found = store.query(
        "SELECT run_id, sample_id FROM samples WHERE list_contains(?, sample_id) ORDER BY 1 NULLS FIRST", [named]
    )
    if len({run for run, _ in found}) == len(named):  # one a run: `@RUN` names each (a sample of no run, its id)
        ids = [printable_line(f"{given}@{run}" if run else sample_id) for run, sample_id in found]
        listed = ", ".join(ids[:5]) + (", …" if len(ids) > 5 else "")
        return f"one in each of {len(ids)} runs (an export gives the bare id to the first of its own by name): give {listed}"
    return f"give `{printable_line(given)}@SAMPLE_ID` (branches of one conversation), one of {_first_few(named)}"


def _first_few(sample_ids: list[str]) -> str:
    """The first five ids, printable, then `…` when there are more."""
    return first_of([printable_line(n) for n in sample_ids])


def _place(stored: StoredSample) -> str:
    """`prompt P  turn 2  generation 0  run R`: where the sample sits (a proxied sample's prompt id is its session)."""
    turn = "" if stored.turn is None else f"  turn {stored.turn}"
    return (
        f"prompt {printable_line(stored.prompt_id)}{turn}  generation {stored.gen_index or 0}  "
        f"run {printable_line(stored.run_id or '?')}"
    )


def _row_id_parses(given: str) -> list[tuple[str, int | None, int, str | None]]:
    """Every (prompt id, turn, generation index, run) an exported row id `{prompt}[#turn{t}][_gen{g}][@{run}[.N]]`
    (`export.formats.row_ids`; `@{sample id}` in the run's place) may stand for, the most suffixes read first: a
    prompt id may hold `@`, `#turn` or `_gen` itself, and a run name may end in `.digits` (`exp-v1.3`)."""
    runs: list[tuple[str, str | None]] = []
    for at in [m.start() for m in re.finditer("@", given)][::-1]:
        named = given[at + 1 :]
        runs.append((given[:at], named))
        if (numbered := re.fullmatch(r"(.+)\.\d+", named, re.S)) is not None:
            runs.append((given[:at], numbered.group(1)))
    runs.append((given, None))
    out: list[tuple[str, int | None, int, str | None]] = []
    for base, run in runs:
        gens: list[tuple[str, int | None]] = [(base, None)]
        if (g := re.search(r"_gen(\d+)$", base)) is not None:
            gens.insert(0, (base[: g.start()], int(g.group(1))))
        for head, gen in gens:
            turns: list[tuple[str, int | None]] = [(head, None)]
            if (t := re.search(r"#turn(\d+)$", head)) is not None:
                turns.insert(0, (head[: t.start()], int(t.group(1))))
            out += [(prompt, turn, gen or 0, run) for prompt, turn in turns if prompt]
    return out


def _by_row_id(store: Store, given: str) -> list[str]:
    """The sample ids an exported row's id names (`my-task#turn1_gen0`, as a training file carries it): a row found
    wrong in a trainer's file is shown without looking its sample id up. The first reading that names a stored
    sample is taken."""
    for prompt, turn, gen, run in _row_id_parses(given)[:32]:
        sql = "SELECT sample_id FROM samples WHERE prompt_id = ? AND coalesce(gen_index, 0) = ?"
        params: list[object] = [prompt, gen]
        sql += " AND turn IS NULL" if turn is None else " AND turn = ?"
        params += [] if turn is None else [turn]
        if run is not None:  # `@run`, or `@sample_id` (samples of one run that share the rest: `row_ids`)
            sql += " AND (run_id = ? OR sample_id = ?)"
            params += [run, run]
        found = [r[0] for r in store.query(sql + " ORDER BY sample_id", params)]
        if found:
            return found
    return []


def run(args: argparse.Namespace) -> int:
    from tokview.core.analysis import analyze
    from tokview.core.resolve import recorded_vocabulary, resolve_for_stored
    from tokview.store import Store
    from tokview.store.side_stats import sample_side_json

    existing_store(args.db)
    if args.count < 1:
        raise UserError("--count must be at least 1")
    with Store(args.db) as store:
        stored = _stored(store, args.sample_id, args.db)
        run = store.run(stored.run_id) or {}
    tokenizer, profile = resolve_for_stored(
        args.tokenizer,
        args.profile,
        recorded_tokenizer_dir=run.get("tokenizer_dir"),
        recorded_profile=stored.profile or run.get("profile"),
        trust_remote_code=args.trust_remote_code,
        recorded_tokenizer_hash=run.get("tokenizer_hash"),
        recorded_profile_def=run.get("profile_def"),
        recorded_vocabulary=recorded_vocabulary(run),
    )
    if args.tokenizer is not None:
        refuse_another_vocabulary(tokenizer, args.tokenizer, [run])
    analysis = analyze(stored.capture, profile, tokenizer).with_recorded(stored.findings)
    if args.json:
        out = {
            "sample_id": stored.sample_id,
            "prompt_id": stored.prompt_id,  # a proxied sample's session, a chain's conversation
            "turn": stored.turn,
            "gen_index": stored.gen_index,
            "run_id": stored.run_id,
            "status": stored.status,
            "valid": analysis.valid,
            "tokenizer": {"source": tokenizer.name, "loaded_by": tokenizer.loaded_by},
            "notes": stored.notes,
            "tags": stored.tags,
            "review": review_history(stored.history),
            "capture": stored.capture.to_dict(),
            "segments": [s.__dict__ for s in analysis.segments],
            "findings": [f.__dict__ for f in analysis.findings],
            **sample_side_json(stored.capture, profile),
        }  # spec_decode, logprobs, target_logprobs
        sys.stdout.write(strict_json(out, default=str))
        print()
        return 0
    # the text and model name came from a server: an escape sequence in them is shown, never run
    parser = profile.tool_calls.parser if profile.tool_calls else None
    positions = len(stored.capture.input_ids)
    if args.start is not None and not 0 <= args.start < positions:  # it was clamped without a word
        raise UserError(f"--from {args.start} is outside the sample's positions 0..{positions - 1}")
    print(printable(render(stored, analysis, tokenizer=tokenizer, start=args.start, count=args.count, parser=parser)))
    return 0


def review_history(history: list[dict[str, Any]]) -> list[dict[str, object]]:
    """Every verdict, note and undo: who, when, status, reason, note, tags, whether undone or an override."""
    keys = ("at", "who", "kind", "status", "reason", "note", "tags", "undone", "override")
    return [{k: (h[k].isoformat() if k == "at" and h.get(k) is not None else h.get(k)) for k in keys} for h in history]


def review_lines(stored: StoredSample) -> list[str]:
    """The review as text: each live verdict with who/when/why, then the notes and tags."""
    lines = []
    for h in stored.history:
        if h["kind"] != "verdict" or h.get("undone"):
            continue
        at = f" at {h['at']:%Y-%m-%d %H:%M}" if h.get("at") else ""
        why = f": {h['reason']}" if h.get("reason") else ""
        lines.append(
            f"  {h['status']} by {h.get('who') or 'unknown'}{at}{why}"
            + ("  (override: approved despite error findings)" if h.get("override") else "")
        )
    lines += [f"  note: {n}" for n in stored.notes]
    if stored.tags:
        lines.append("  tags: " + ", ".join(stored.tags))
    return ["review:", *lines] if lines else ["review: none yet"]


def text_field_column(al: Alignment, out_pos: int, kind: str, parser: str | None) -> str:
    """What became of one output id: kept, partial, drift (naming the `tool_calls[k]` field it landed in, when
    a tool parser put it there), or hidden (a tool-call marker: by the tool parser)."""
    from tokview.core import segments as seg
    from tokview.core.tool_calls import field_name

    status = al.statuses[out_pos]
    text = MARK.get(status, "?") + " " + status
    if status == "hidden":
        return text + (" (tool parser)" if kind == seg.TOOL_MARKER else "")
    field = al.fields[out_pos] if out_pos < len(al.fields) else None
    landed = (
        field_name(field, parser) if field is not None and field >= 2 else ""
    )  # reasoning/content: the segment says
    return f"{text} {landed}" if landed else text


def render(
    stored: StoredSample,
    analysis: Analysis,
    *,
    tokenizer: TokenizerAdapter,
    start: int | None,
    count: int,
    parser: str | None = None,
) -> str:
    """`parser`: the profile's tool-call layout (names the field a hermes call's name lands in)."""
    from rich.cells import cell_len  # only where a sample is printed

    cap = stored.capture
    n_prompt = len(cap.prompt_ids)
    lines = [
        f"sample {printable_line(stored.sample_id)}  [{stored.status}, {'valid' if analysis.valid else 'INVALID'}]",
        f"  endpoint {cap.endpoint}  server {cap.server_kind or '?'} {cap.server_version or ''}  "
        f"finish {cap.finish_reason}  prompt {n_prompt} ids  output {len(cap.output_ids)} ids",
        f"  tokenizer {tokenizer.name} (loaded from {tokenizer.loaded_by})",
        f"  {_place(stored)}",
        *review_lines(stored),
        "segments:",
    ]
    ids = cap.input_ids
    for s in analysis.segments:
        preview = tokenizer.decode(ids[s.start : s.end][:24])
        lines.append(f"  {s.kind:<17} [{s.start:>6}, {s.end:>6})  {len(s):>6} ids  {preview!r:.70}")
    lines.append("findings:" if analysis.findings else "findings: none")
    for f in analysis.findings:
        lines.append(f"  {f.severity.upper():<5} {f.code}: {f.detail}")
    first = n_prompt if start is None else max(0, min(start, len(cap.input_ids) - 1))
    pieces = tokenizer.pieces(ids[max(0, first - 8) : first + count])[min(8, first) :]
    al = analysis.alignment
    last = min(len(ids), first + count) - 1
    if last < first:  # nothing from here: a sample with no output ids shows from its prompt's end
        lines.append(f"ids: none from {first} (the sample holds {len(ids)} ids, {len(ids) - n_prompt} of them output)")
    else:
        lines.append(f"ids {first}..{last}  (pos  id  piece  segment  mask  text-field)")
    for offset, piece in enumerate(pieces):
        pos = first + offset
        status = ""
        # the statuses are of the aligned ids: the output's own unless a dual capture's two paths diverged
        same_ids = not cap.parsed_output_ids or not cap.paths_diverge
        if al is not None and pos >= n_prompt and pos - n_prompt < len(al.statuses) and same_ids:
            status = text_field_column(al, pos - n_prompt, analysis.kinds[pos], parser)
        shown = repr(piece)
        shown += " " * max(0, 24 - cell_len(shown))  # by cells: a CJK character or an emoji takes two
        lines.append(
            f"  {pos:>6}  {ids[pos]:>7}  {shown} {analysis.kinds[pos]:<17} {analysis.loss_mask[pos]}  {status}"
        )
    return "\n".join(lines)
