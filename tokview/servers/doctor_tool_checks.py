"""The doctor's checks for agent data: does the tool parser return the calls the ids hold, and does a streamed
answer record what an unstreamed one does.

Both decide an agent trace's rows (`tokview batch` on tool rows, `tokview proxy` in front of a harness), and both fail
quietly: a parser that drops a call, or a stream that drops the id-only chunks of a call's markers, still answers
200. The probes are one harness request, sent whole and streamed and recorded as the proxy records it
(`proxy.probe`); the tool check judges the whole answer as `analyze` judges every sample.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from tokview.core.analysis import tool_calls_of
from tokview.core.finding_rules import ERROR
from tokview.core.record import Capture
from tokview.proxy.probe import Proxied, ask_as_proxied
from tokview.servers.doctor_context import QUESTION, DoctorContext
from tokview.wording import plural

TOOLS_TITLE = "Tool-call parser"
STREAM_TITLE = "Streamed ids (tokview proxy)"
TOOL_QUESTION = [{"role": "user", "content": "What is the weather in Paris right now? Use the get_weather tool."}]
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
"""The tool probe's one tool: the call a tool-using model makes most readily, with one string argument."""
REFUSED_STATUSES = (400, 422)
"""How a server refuses tools it has no parser for (vLLM without --enable-auto-tool-choice: 400). A 401, 404 or 429
says something else (a key, a model name, a load) that no tool flag changes."""
NAMED_MAX = 6
"""Ids named in one line, special ones (the markers) first."""


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


async def probe(doc: DoctorContext, *, tools: bool, stream: bool) -> Proxied:
    """The harness body sent as the proxy forwards it, and what the proxy would record of it."""
    if doc.choice is None:
        return Proxied(None, "the server kind is unknown")
    body = harness_body(doc, tools)
    return await ask_as_proxied(doc.client, doc.policy, doc.choice.name, body, doc.profile, stream=stream)


def refused_tools(whole: Proxied, chat_answered: bool) -> bool:
    """Whether the server refused the tool probe for its tools: a plain chat request went through, this one got the
    status of a refused field, and the server's words name tools (a prompt past the context is a 400 too)."""
    return (
        whole.capture is None and chat_answered and whole.status in REFUSED_STATUSES and "tool" in whole.error.lower()
    )


def check_tools(doc: DoctorContext, whole: Proxied, chat_answered: bool) -> None:
    if whole.capture is None:
        if refused_tools(whole, chat_answered):
            doc.add(
                "skip",
                TOOLS_TITLE,
                f"the chat endpoint refused a request with tools: {whole.error}",
                f"for agent traces, and a harness with tools behind tokview proxy, start the server with "
                f"{_flags(doc)}; prompts without tools need none",
            )
        else:
            doc.add("skip", TOOLS_TITLE, f"skipped: {whole.error}")
        return
    if any(c.title == "Profile" and c.status == "fail" for c in doc.checks):
        doc.add("skip", TOOLS_TITLE, "skipped: --profile names another model's ids (see Profile above)")
        return
    if doc.skip_on_other_vocabulary(TOOLS_TITLE):
        return
    cap = whole.capture
    returned = cap.tool_calls or []
    names = ", ".join(str(call.get("name")) for call in returned) or "no call"
    on_ids = tool_calls_of(cap.output_ids, doc.profile, doc.tokenizer, [WEATHER_TOOL])
    if on_ids is None:
        doc.add(
            "skip",
            TOOLS_TITLE,
            f"the parser returned {names}; the {doc.profile.name} profile names no tool-call layout, so nothing was "
            "compared with the ids",
        )
        return
    n_ids, n_field = len(on_ids.calls), len(returned)
    where = f" at output[{on_ids.sections[0][0]}:{on_ids.sections[-1][1]}]" if on_ids.sections else ""
    cut_in_call = on_ids.found and (not on_ids.calls or not on_ids.calls[-1].closed)
    if cap.finish_reason == "length" and (cut_in_call or not on_ids.found):
        doc.add(
            "skip",
            TOOLS_TITLE,
            f"the answer reached the probe's {doc.settings['max_new_tokens']}-token limit "
            f"{'inside its call' if on_ids.found else 'before any call'}: nothing to judge",
            "a thinking model may reason past it: run doctor with --no-thinking"
            if doc.profile.has_reasoning and doc.settings.get("thinking") is not False
            else "",
        )
    elif not n_ids and not n_field:
        doc.add(
            "skip",
            TOOLS_TITLE,
            f"the model answered without calling {WEATHER_TOOL['function']['name']}, so the parser had nothing to "
            f"parse ({len(cap.output_ids)} ids)",
        )
    elif not n_ids:
        doc.add(
            "fail" if doc.tokenizer is not None else "warn",
            TOOLS_TITLE,
            f"the server returned {plural(n_field, 'call')} ({names}); the output ids hold none in the {doc.profile.name} "
            "layout: the ids that came back lost the calls' markers"
            + ("" if doc.tokenizer is not None else ", or --profile is not the served model's"),
            "train on ids only where they hold the calls; upgrade the server",
        )
    elif not n_field and doc.choice is not None and doc.choice.chat.refuses_unparsed_tools:
        doc.add(  # this server refuses tools it has no parser for: it has one, and that one missed the call
            "fail",
            TOOLS_TITLE,
            f"the parser returned no tool_calls for the {plural(n_ids, 'call')} the ids hold{where}: a harness never runs "
            "the tool",
            f"check the server's tool parser ({_flags(doc)}); train on ids, never on `tool_calls`",
        )
    elif not n_field:
        server = doc.choice.chat.server_name if doc.choice is not None else "a server"
        doc.add(
            "warn",
            TOOLS_TITLE,
            f"the server returned no tool_calls for the {plural(n_ids, 'call')} the ids hold{where}: it runs no tool parser "
            f"({server} without --tool-call-parser answers so), or its parser missed them",
            f"for agent traces, and a harness with tools behind tokview proxy, start the server with {_flags(doc)}; "
            "prompts without tools need none",
        )
    elif n_field < n_ids:
        doc.add(
            "fail",
            TOOLS_TITLE,
            f"the parser returned {n_field} of the {plural(n_ids, 'call')} the ids hold{where} ({names}): a harness never runs "
            "the others",
            f"check the server's tool parser ({_flags(doc)}); train on ids, never on `tool_calls`",
        )
    else:
        _check_fields(doc, cap, names, n_ids, n_field, where)


def _check_fields(doc: DoctorContext, cap: Capture, names: str, n_ids: int, n_field: int, where: str) -> None:
    """The parser returned as many calls as the ids hold (or more): do their names, ids and arguments match?"""
    found = doc.findings(cap) if doc.tokenizer is not None else []
    codes = {f.code: f.detail for f in found}
    broken = sorted((f for f in found if f.code in LAYOUT_CODES), key=lambda f: f.severity != ERROR)
    if broken:  # the calls are there and parsed, but their ids break the layout: a batch stores them invalid
        worst = broken[0]
        doc.add(
            "fail" if worst.severity == ERROR else "warn",
            TOOLS_TITLE,
            f"the parser returned {names}, but the call's ids break the {doc.profile.name} layout "
            f"({', '.join(f.code for f in broken)}): {worst.detail}",
            "a batch or the proxy stores such answers with this finding; check the server's chat template and "
            f"tool parser ({_flags(doc)})",
        )
    elif "tool_calls_field_mismatch" in codes:
        doc.add(
            "warn",
            TOOLS_TITLE,
            codes["tool_calls_field_mismatch"],
            "train on ids, never on `tool_calls`: a history built from the field re-renders other ids",
        )
    elif n_field > n_ids:
        doc.add(
            "warn",
            TOOLS_TITLE,
            f"the parser returned {n_field} calls ({names}) for the {plural(n_ids, 'call')} the ids hold",
        )
    else:
        unchecked = (
            "" if doc.tokenizer is not None else "; their names and arguments were not compared (needs --tokenizer)"
        )
        doc.add(
            "ok",
            TOOLS_TITLE,
            f"the parser returned {names}: the {plural(n_ids, 'call')} the ids hold{where}{unchecked}",
        )


LAYOUT_CODES = (
    "tool_section_unclosed",
    "tool_call_unclosed",
    "tool_call_out_of_order",
    "tool_section_in_reasoning",
    "text_after_tool_calls",
)
"""Findings about how the call's ids are laid out (markers, order, where the section sits): a probe whose parser
returned the calls still passed with them, and every sample a batch then made of such answers was marked invalid."""


def _flags(doc: DoctorContext) -> str:
    layout = doc.profile.tool_calls
    parser = layout.parser if layout is not None else "<the model's parser>"
    return doc.choice.chat.tool_parser_flags(parser) if doc.choice is not None else f"--tool-call-parser {parser}"


def check_stream(doc: DoctorContext, whole: Proxied, streamed: Proxied, tools: bool) -> None:
    if doc.choice is None:
        doc.add("skip", STREAM_TITLE, "skipped: the server kind is unknown")
        return
    if whole.capture is None:
        why = "it carried no ids (see Token-id fields)" if whole.no_ids else whole.error
        doc.add("skip", STREAM_TITLE, f"skipped: the unstreamed request failed: {why}")
        return
    if streamed.capture is None:
        if streamed.no_ids:
            doc.add(
                "warn",
                STREAM_TITLE,
                f"a streamed answer carried no ids ({streamed.error}): tokview proxy records streamed requests as "
                "failures",
                "upgrade the server (vLLM ≥0.10.2 returns ids on a stream; SGLang with the sglext id flags)",
            )
        else:  # the same request answered unstreamed: streaming itself is what fails (every retry of it)
            doc.add(
                "fail",
                STREAM_TITLE,
                f"the streamed request failed though the same request answered unstreamed: {streamed.error}",
                "a harness that streams gets this error through tokview proxy as it would without it; check the "
                "server's log for the stream's error",
            )
        return
    a, b = whole.capture, streamed.capture
    what = "a streamed answer with a tool call" if tools and (a.tool_calls or b.tool_calls) else "a streamed answer"
    problems = _stream_problems(doc, a, b)
    if not problems:
        doc.add("ok", STREAM_TITLE, f"{what} records the same {len(a.output_ids)} ids as the unstreamed one")
        return
    ids_fault = any(kind == IDS_FAULT for kind, _ in problems)
    status = "fail" if ids_fault or any(kind == CALLS_FAULT for kind, _ in problems) else "warn"
    doc.add(
        status,
        STREAM_TITLE,
        f"{what}: " + "; ".join(said for _, said in problems),
        "upgrade the server; until then have a harness call unstreamed (stream: false) on tool turns: the proxy "
        "records what the stream carried"
        if ids_fault
        else "report it to the server's project: a streaming harness runs other tools than the answer's ids call"
        if status == "fail"
        else "greedy sampling may not repeat here: compare a recorded streamed turn's ids with its text",
    )


IDS_FAULT, CALLS_FAULT, MAYBE_SAMPLING = "ids", "calls", "sampling"
"""What a difference between a streamed and an unstreamed answer says: the stream's ids are not the answer's (lost,
added, reordered: no sampling does that), its tool_calls are not its ids' calls, or the two answers went apart at
one point and on (a server whose greedy sampling does not repeat does that too)."""


def _stream_problems(doc: DoctorContext, a: Capture, b: Capture) -> list[tuple[str, str]]:
    """What differs between the unstreamed capture `a` and the streamed `b`, each with its kind (IDS_FAULT, ...)."""
    problems: list[tuple[str, str]] = []
    if a.prompt_ids != b.prompt_ids:
        problems.append((IDS_FAULT, f"its prompt ids differ ({len(b.prompt_ids)} vs {len(a.prompt_ids)})"))
    full, got = list(a.output_ids), list(b.output_ids)
    if full != got:
        problems.append(_ids_difference(doc, list(a.prompt_ids), full, got))
    if _calls_said(a.tool_calls) != _calls_said(b.tool_calls):
        kind = MAYBE_SAMPLING if problems and problems[-1][0] == MAYBE_SAMPLING else CALLS_FAULT
        if kind == CALLS_FAULT and _calls_match_ids(doc, b) and not _calls_match_ids(doc, a):
            return problems  # the stream's calls are its ids' and the whole answer's are not: the tool check says so
        problems.append(
            (
                kind,
                f"its tool_calls differ: {_calls_text(b.tool_calls)} where the unstreamed answer has "
                f"{_calls_text(a.tool_calls)}",
            )
        )
    return problems


def _ids_difference(doc: DoctorContext, prompt: list[int], full: list[int], got: list[int]) -> tuple[str, str]:
    missing, extra = Counter(full) - Counter(got), Counter(got) - Counter(full)
    if not extra and _in_order(got, full):
        return IDS_FAULT, (
            f"it lost {sum(missing.values())} of the {len(full)} output ids ({_distinct(doc, missing)}): a streaming "
            "harness behind tokview proxy records its turns without them"
        )
    if not missing and _in_order(full, got):
        echoed = next((k for k in range(len(got) - len(full), 0, -1) if prompt[-k:] == got[:k]), 0)
        if echoed and got[echoed:] == full:
            return IDS_FAULT, f"its output ids begin with the prompt's last {echoed} ids"
        return IDS_FAULT, f"it added {sum(extra.values())} output ids ({_distinct(doc, extra)})"
    if not missing and not extra:
        at = next(i for i, (x, y) in enumerate(zip(full, got, strict=True)) if x != y)
        return IDS_FAULT, f"its output ids are the same ids in another order from output[{at}]"
    at = next((i for i, (x, y) in enumerate(zip(full, got, strict=False)) if x != y), min(len(full), len(got)))
    return MAYBE_SAMPLING, f"its output ids differ from output[{at}] ({len(got)} vs {len(full)} ids)"


def _distinct(doc: DoctorContext, counts: Counter[int]) -> str:
    ids = sorted(counts, key=lambda t: (not _special(doc, t), t))
    more = f" and {len(ids) - NAMED_MAX} more" if len(ids) > NAMED_MAX else ""
    return f"{len(ids)} distinct: " + ", ".join(_named(doc, t) for t in ids[:NAMED_MAX]) + more


def _calls_match_ids(doc: DoctorContext, cap: Capture) -> bool:
    """Whether the capture's tool_calls are as many as the calls its ids hold."""
    on_ids = tool_calls_of(cap.output_ids, doc.profile, doc.tokenizer, [WEATHER_TOOL])
    return on_ids is not None and len(on_ids.calls) == len(cap.tool_calls or [])


def _calls_text(calls: list[dict[str, Any]] | None) -> str:
    """`get_weather({"city": "Paris"})`, each call cut at CALL_SHOWN characters; `no call`."""
    said = [f"{name}({arguments})" for name, arguments in _calls_said(calls)]
    return ", ".join(s if len(s) <= CALL_SHOWN else s[: CALL_SHOWN - 1] + "…" for s in said) or "no call"


CALL_SHOWN = 60


def _calls_said(calls: list[dict[str, Any]] | None) -> list[tuple[object, str]]:
    """Each call's name and arguments (parsed when JSON: a stream's pieces may join to other spacing)."""
    out: list[tuple[object, str]] = []
    for call in calls or []:
        arguments = call.get("arguments")
        try:
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError:
            pass
        out.append((call.get("name"), json.dumps(arguments, sort_keys=True)))
    return out


def _named(doc: DoctorContext, token_id: int) -> str:
    """`163595 '<|tool_calls_section_begin|>'`: the piece quoted, so `46 '.'` does not read as two numbers."""
    if doc.tokenizer is None:
        return str(token_id)
    return f"{token_id} {doc.tokenizer.piece_text(token_id)!r}"


def _special(doc: DoctorContext, token_id: int) -> bool:
    """A special id of the tokenizer, else (without one) a delimiter or tool marker the profile names."""
    if doc.tokenizer is not None:
        return doc.tokenizer.is_special(token_id)
    layout, p = doc.profile.tool_calls, doc.profile
    return (
        token_id in p.delimiter_ids or token_id in p.stop_ids or (layout is not None and token_id in layout.marker_ids)
    )


def _in_order(part: list[int], whole: list[int]) -> bool:
    """Whether `part` is `whole` with some ids left out (a subsequence)."""
    rest = iter(whole)
    return all(any(t == w for w in rest) for t in part)
