"""The doctor's checks for agent data: does the tool parser return the calls the ids hold, and does a streamed
answer carry the ids an unstreamed one does.

Both are what decides an agent trace's rows (`tokview batch` on tool rows, `tokview proxy` in front of a harness),
and both fail quietly: a parser that drops a call, or a stream that drops the id-only chunks of a call's markers,
still answers 200. The tool probe goes through the same chat backend `batch` uses and is judged by the same
findings; the stream probe sends one harness request the way the proxy forwards it (`proxy.probe`).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from tokview.core.analysis import tool_calls_of
from tokview.core.record import Capture
from tokview.proxy.probe import ProxiedAnswer, ask_as_proxied
from tokview.servers.doctor_context import QUESTION, TOOL_QUESTION, WEATHER_TOOL, DoctorContext
from tokview.servers.errors import CaptureFailed

TOOLS_TITLE = "Tool-call parser"
STREAM_TITLE = "Streamed ids (tokview proxy)"
LOST_CALL_CODES = ("tool_calls_missing_from_ids", "tool_calls_field_mismatch")
"""The findings that blame the server's parser or its stream, not the model's call."""


async def probe_tools(doc: DoctorContext) -> tuple[Capture | None, list[int] | None, CaptureFailed | None]:
    """TOOL_QUESTION with WEATHER_TOOL on the chat endpoint: (capture, its returned ids, None) or the failure."""
    if doc.choice is None:
        return None, None, CaptureFailed("the server kind is unknown")
    try:
        capture, ids = await doc.policy.run(lambda: doc.chat(tools=True))
    except CaptureFailed as exc:
        return None, None, exc
    return capture, ids, None


def check_tools(
    doc: DoctorContext, tooled: Capture | None, ids: list[int] | None, failure: CaptureFailed | None
) -> None:
    if tooled is None:
        reason = failure.reason if failure is not None else "no answer"
        refused = failure is not None and failure.status is not None and 400 <= failure.status < 500
        doc.add(
            "skip",
            TOOLS_TITLE,
            f"the chat endpoint refused a request with tools: {reason}" if refused else f"skipped: {reason}",
            f"for agent traces and a harness with tools behind tokview proxy, start the server with {_flags(doc)}; "
            "prompts without tools need none"
            if refused
            else "",
        )
        return
    returned = tooled.tool_calls or []
    names = ", ".join(str(call.get("name")) for call in returned) or "no call"
    if ids is None:
        doc.add("skip", TOOLS_TITLE, f"the parser returned {names}; the answer carried no ids to check it against")
        return
    codes = doc.analysis(tooled)
    on_ids = tool_calls_of(ids, doc.profile, doc.tokenizer, [WEATHER_TOOL])
    lost = [codes[code] for code in LOST_CALL_CODES if code in codes]
    if lost:
        dropped = on_ids is not None and len(returned) < len(on_ids.calls)
        doc.add(
            # A call the field lacks is a tool the harness never runs; other differences (a renumbered call id)
            # break only a history rebuilt from the field.
            "fail" if dropped or "tool_calls_missing_from_ids" in codes else "warn",
            TOOLS_TITLE,
            " ".join(lost),
            f"check the server's tool parser ({_flags(doc)}); train on ids, never on `tool_calls`: a history built "
            "from the field re-renders other ids",
        )
        return
    if on_ids is None:
        doc.add(
            "ok" if returned else "skip",
            TOOLS_TITLE,
            f"the parser returned {names}; the {doc.profile.name} profile names no tool-call layout, so the calls "
            "were not checked against the ids",
        )
    elif not on_ids.calls and not returned:
        doc.add(
            "skip",
            TOOLS_TITLE,
            f"the model answered without calling {WEATHER_TOOL['function']['name']}, so the parser had nothing to "
            f"parse ({len(ids)} ids)",
        )
    else:
        start, end = on_ids.sections[0][0], on_ids.sections[-1][1]
        doc.add(
            "ok",
            TOOLS_TITLE,
            f"the parser returned {names}: the {_calls(len(on_ids.calls))} the ids hold at output[{start}:{end}], "
            "which no text field carries (the ids keep them)",
        )


def _flags(doc: DoctorContext) -> str:
    layout = doc.profile.tool_calls
    parser = layout.parser if layout is not None else "<the model's parser>"
    return doc.choice.chat.tool_parser_flags(parser) if doc.choice is not None else f"--tool-call-parser {parser}"


def harness_body(doc: DoctorContext, tools: bool) -> dict[str, Any]:
    """The doctor's question as a harness writes it (OpenAI fields only), greedy so two sends give the same ids."""
    body: dict[str, Any] = {
        "messages": TOOL_QUESTION if tools else QUESTION,
        "max_tokens": doc.settings["max_new_tokens"],
        "temperature": 0.0,
        "seed": 0,
    }
    if doc.info.model:
        body["model"] = doc.info.model
    if doc.settings.get("chat_template_kwargs"):
        body["chat_template_kwargs"] = doc.settings["chat_template_kwargs"]
    if tools:
        body["tools"] = [WEATHER_TOOL]
    return body


async def probe_stream(doc: DoctorContext, tools: bool) -> tuple[ProxiedAnswer | None, ProxiedAnswer | None, str]:
    """The harness body sent whole, then streamed, as the proxy forwards it: (whole, streamed, "") or the failure."""
    if doc.choice is None:
        return None, None, "the server kind is unknown"
    kind, body = doc.choice.name, harness_body(doc, tools)
    try:
        whole = await doc.policy.run(lambda: ask_as_proxied(doc.client, kind, body, stream=False))
        streamed = await doc.policy.run(lambda: ask_as_proxied(doc.client, kind, body, stream=True))
    except CaptureFailed as exc:
        return None, None, exc.reason
    return whole, streamed, ""


def check_stream(
    doc: DoctorContext, whole: ProxiedAnswer | None, streamed: ProxiedAnswer | None, error: str, tools: bool
) -> None:
    what = "a streamed answer with a tool call" if tools and whole and whole.tool_calls else "a streamed answer"
    if whole is None or streamed is None:
        doc.add("skip", STREAM_TITLE, f"skipped: {error}")
        return
    if whole.output_ids is None or streamed.output_ids is None:
        which = "an unstreamed" if whole.output_ids is None else "a streamed"
        doc.add(
            "warn",
            STREAM_TITLE,
            f"{which} chat answer carried no output ids with the fields tokview proxy adds: the proxy records such "
            "requests as failures",
            "upgrade the server (vLLM ≥0.10.2 returns ids on streams; SGLang with the sglext id flags)",
        )
        return
    full, got = whole.output_ids, streamed.output_ids
    if full == got:
        doc.add("ok", STREAM_TITLE, f"{what} carries the same {len(full)} ids as the unstreamed one")
        return
    missing = Counter(full) - Counter(got)
    if not Counter(got) - Counter(full) and _in_order(got, full):
        names = [doc.name(t) for t in sorted(missing, key=lambda t: (not _special(doc, t), t))]
        said = ", ".join(names[:NAMED_MAX]) + (f" and {len(names) - NAMED_MAX} more" if len(names) > NAMED_MAX else "")
        doc.add(
            "fail",
            STREAM_TITLE,
            f"{what} lost {sum(missing.values())} of the {len(full)} ids the unstreamed one holds ({said}): a "
            "streaming harness behind tokview proxy records turns without them",
            "upgrade the server (vLLM before #27482 sent no chunk for an id that gives no text); until then have the "
            "harness call unstreamed (stream: false) on tool turns: the proxy flags streamed ones "
            "tool_calls_missing_from_ids",
        )
        return
    at = next((i for i, (a, b) in enumerate(zip(full, got, strict=False)) if a != b), min(len(full), len(got)))
    doc.add(
        "warn",
        STREAM_TITLE,
        f"{what} gave other ids than the unstreamed one from output[{at}] ({len(got)} vs {len(full)} ids, the "
        "same greedy request)",
        "the server's greedy sampling is not repeatable here: compare a recorded turn's ids with its text",
    )


NAMED_MAX = 6
"""Lost ids named in the stream check's line, special ones (the markers) first."""


def _special(doc: DoctorContext, token_id: int) -> bool:
    return doc.tokenizer is not None and doc.tokenizer.is_special(token_id)


def _in_order(part: list[int], whole: list[int]) -> bool:
    """Whether `part` is `whole` with some ids left out (a subsequence)."""
    rest = iter(whole)
    return all(any(t == w for w in rest) for t in part)


def _calls(n: int) -> str:
    return f"{n} call" if n == 1 else f"{n} calls"
