"""The doctor's checks, one function each: a question, the evidence, a verdict and what to do.

Each takes the running doctor's context (`DoctorContext`: client, info, the server's endpoint pair,
profile, tokenizer, settings) and the captures it made, and adds one DoctorCheck. What differs by
endpoint family (its path, where its ids come back, its reasoning field) is asked of the family's
`Backend`, never switched on a server's name.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from tokview.core.alignment import HIDDEN
from tokview.core.analysis import analyze
from tokview.core.profiles import HARMONY, ModelProfile
from tokview.core.record import Capture
from tokview.core.segments import prompt_opens_reasoning
from tokview.servers.capture import merge_dual
from tokview.servers.doctor_context import QUESTION, DoctorContext
from tokview.servers.features import AUTH_HINT, AUTH_REFUSED
from tokview.servers.registry import ENDPOINTS, server_name

RAW_UNKNOWN = ENDPOINTS["vllm", "completions"]
"""Named in the Token-id fields check when the server kind is unknown (no raw path was tried)."""


def check_server(doc: DoctorContext) -> None:
    info = doc.info
    name = server_name(info.kind)
    sim = " (this is the tokview simulator, not a real model server)" if info.features.get("simulator") else ""
    model = f', model "{info.model}"' if info.model else ""
    if name is None and info.details.get("auth_refused"):
        doc.add(
            "fail",
            "Server kind",
            f"{info.url} refused tokview's credentials: {info.details['auth_refused']}",
            AUTH_HINT,
        )
        return
    if name is None:
        redirected = info.details.get("redirected")
        doc.add(
            "warn",
            "Server kind",
            f"could not tell SGLang from vLLM at {info.url}{model}{sim}"
            + (f": its info endpoints redirect ({redirected})" if redirected else ""),
            "pass the server the redirect names as --server"
            if redirected
            else "give the server's root URL (http://host:port, not an API path), or pass --backend sglang or "
            "--backend vllm to tokview batch if it is one behind a path"
            if urlsplit(info.url).path.strip("/")
            else "pass --backend sglang or --backend vllm to tokview batch, if it is one of them",
        )
        return
    version = info.version or "unknown version"
    doc.add("ok", "Server kind", f"{name} {version}{model}{sim}")


def _prefilling_profile(profile: ModelProfile) -> str:
    """What to use instead of a profile that says the model emits the opener the template pre-fills: a built-in one
    of the same think ids that pre-fills it (GLM-4.5's → `--profile glm-4.7`), else a profile file saying so."""
    from tokview.core.profiles import BUILTIN_PROFILES

    same = [
        name
        for name, other in BUILTIN_PROFILES.items()
        if other.prefills_opener
        and (other.think_open_id, other.think_close_id) == (profile.think_open_id, profile.think_close_id)
    ]
    if same:
        return f"use --profile {same[0]} (its template pre-fills the opener)"
    return "use a profile file with prefills_opener = true (`base` the profile you use)"


def check_ids(
    doc: DoctorContext,
    *,
    raw: Capture | None,
    raw_error: str | None,
    chat: Capture | None,
    chat_ids: list[int] | None,
    chat_error: str | None,
) -> None:
    f = doc.info.features
    found, missing = [], []
    raw_backend = doc.choice.raw if doc.choice is not None else RAW_UNKNOWN
    raw_ok = raw is not None and bool(raw.output_ids)  # an empty list for an answer of N tokens is no ids
    if raw is not None and raw_ok:
        found.append(f"{raw_backend.path} → {raw_backend.ids_field} ({len(raw.output_ids)} ids)")
    elif raw is not None:
        missing.append(f"{raw_backend.path} returns an empty {raw_backend.ids_field}{_for_tokens(raw)}")
    else:
        missing.append(f"{raw_backend.path}: {raw_error}")
    if chat is not None and chat_ids:
        where = f.get("chat_prompt_ids_field") or "prompt ids"
        found.append(f"/v1/chat/completions → {where} + {f.get('chat_ids_field') or 'token ids'}")
    elif chat is not None and chat_ids is not None:
        missing.append(
            f"/v1/chat/completions returns an empty {f.get('chat_ids_field') or 'token ids'}{_for_tokens(chat)}"
        )
    elif chat is not None:
        missing.append("/v1/chat/completions returns no token-id fields")
    else:
        missing.append(f"/v1/chat/completions: {chat_error}")
    if not found:
        answered_without = doc.ids_not_returned or raw is not None or chat is not None
        refused = doc.info.details.get("auth_refused") or any(
            error is not None and error.startswith(AUTH_REFUSED) for error in (raw_error, chat_error)
        )
        doc.add(
            "fail",
            "Token-id fields",
            "no ids: " + "; ".join(missing),
            "tokview needs ids from the server: vLLM ≥0.10.2 (return_token_ids), SGLang with output_ids on "
            "/generate (or return_token_ids on chat); upgrade the server"
            if answered_without  # else no endpoint answered at all: the server failed, whatever its version
            else AUTH_HINT
            if refused  # the key, not the server, is what to change
            else "the server failed every probe rather than answer without ids: see its log, then run doctor again",
        )
        return
    detail = "; ".join(found)
    if missing:
        doc.add(
            "warn",
            "Token-id fields",
            f"{detail}; but {'; '.join(missing)}",
            "the raw path takes the local tokenizer's prompt ids, and the server's ids are not this tokenizer's: "
            "give doctor (and batch) the served model's tokenizer folder (--tokenizer DIR)"
            if not raw_ok and doc.other_vocabulary is not None
            else f"capture with --mode {'raw' if raw_ok else 'chat'} (the endpoint that returns ids)",
        )
        return
    doc.add("ok", "Token-id fields", detail)


def _for_tokens(capture: Capture) -> str:
    """` for the 145 tokens it says it generated`, when the answer's usage says how many."""
    n = (capture.usage or {}).get("completion_tokens")
    return f" for the {n} tokens it says it generated" if isinstance(n, int) and n > 0 else ""


def check_opener(doc: DoctorContext, served: list[int] | None, output: list[int] | None = None) -> None:
    """What the template does with the think opener, said of the served prompt; what it means for the
    output is said only as far as the probe's own `output` (when there is one) bears it out."""
    p = doc.profile
    opener = f"{p.think_open} ({p.think_open_id})"
    closer = f"{p.think_close} ({p.think_close_id})"
    thinking = doc.settings.get("thinking")
    switch = (
        f"the server ignores chat_template_kwargs {{'{p.thinking_kwarg}': false}}; check its template"
        if p.thinking_kwarg
        else f"the {p.name} profile names no template kwarg that turns thinking off; check --profile"
    )
    if doc.skip_on_other_vocabulary("Think opener in the prompt"):
        return
    if not p.has_reasoning:
        said = (
            f"the {p.name} profile reasons in Harmony channels, not think tags: the output is its analysis and final "
            "messages (or a call), each after its channel header"
            if p.format == HARMONY
            else f"the {p.name} profile has no think delimiters: the output is the answer, then a stop id"
        )
        doc.add("ok", "Think opener in the prompt", said)
        return
    if not served:
        doc.add(
            "skip",
            "Think opener in the prompt",
            "skipped: the server returned no prompt ids and its /tokenize does not take messages",
            "this check reads the server's own prompt ids (vLLM ≥0.10.2 returns them); `tokview tokenize --chat` "
            "shows what the local template renders",
        )
        return
    opens = prompt_opens_reasoning(served, p)
    last = served[-1] == p.think_open_id
    if thinking is False:
        if opens:
            doc.add(
                "fail",
                "Think opener in the prompt",
                f"thinking is off, yet the served prompt ends inside reasoning ({opener} is the last delimiter)",
                switch,
            )
        elif output and p.think_close_id in output:
            doc.add(
                "warn",
                "Think opener in the prompt",
                f"thinking off: the served prompt closes reasoning ({len(served)} ids), yet the output holds "
                f"{closer} at position {output.index(p.think_close_id)}: the model reasoned anyway",
                switch,
            )
        else:
            doc.add(
                "ok",
                "Think opener in the prompt",
                f"thinking off: the served prompt closes reasoning ({len(served)} ids); the output is the answer only",
            )
        return
    if p.prefills_opener and last:
        doc.add(
            "ok",
            "Think opener in the prompt",
            f"the template pre-fills {opener} as the last of "
            f"{len(served)} prompt ids: the output starts inside reasoning, so {p.think_open_id} lives in "
            f"the prompt and never in output_ids",
        )
    elif p.prefills_opener:
        doc.add(
            "fail",
            "Think opener in the prompt",
            f"the {p.name} profile expects the template to end the "
            f"prompt with {opener}, but the served prompt ends with {served[-3:]}",
            (
                f"the {p.thinking_kwarg} template kwarg did not reach the template, or the server's template is "
                f"not {p.name}'s; check --profile and the server's chat template"
                if p.thinking_kwarg
                else f"the server's template is not {p.name}'s; check --profile and the server's chat template"
            ),
        )
    elif opens:
        doc.add(
            "warn",
            "Think opener in the prompt",
            f"the template pre-fills {opener}, but the {p.name} profile says the model emits it",
            _prefilling_profile(p),
        )
    elif output and output[0] != p.think_open_id:
        doc.add(
            "warn",
            "Think opener in the prompt",
            f"the template does not pre-fill {opener}, yet the output starts with {output[0]}, not {opener}",
            f"the {p.name} profile's delimiters may not be this model's; check --profile",
        )
    else:
        doc.add(
            "ok",
            "Think opener in the prompt",
            f"the template does not pre-fill {opener}: the model emits it as its first output id"
            + (" (it did here)" if output else ""),
        )


REASONED_IDS = 2
"""Ids before the closer that may still be an empty think block's blank lines (`_closer_without_reasoning`)."""


def check_parser(
    doc: DoctorContext, raw: Capture | None, chat: Capture | None, chat_ids: list[int] | None, chat_error: str | None
) -> None:
    if chat is None:
        doc.add("skip", "Reasoning parser", f"skipped: the chat endpoint failed ({chat_error})")
        return
    field = chat.reasoning_field
    advice = doc.choice.chat.reasoning_field_advice(field) if doc.choice is not None else None
    hidden_note, problems = "", []
    if raw is not None:
        dual = merge_dual(raw, chat, chat_ids)
        if doc.tokenizer is not None:
            analysis = analyze(dual, doc.profile, doc.tokenizer)
            if any(f.code == "unknown_token_id" for f in analysis.findings):  # no parser makes an id the vocab lacks
                doc.add(
                    "skip",
                    "Reasoning parser",
                    "skipped: the server's ids are not this tokenizer's (output_ids honesty)",
                )
                return
            problems += [
                f.detail for f in analysis.findings if f.code in ("parser_split_mismatch", "reasoning_field_missing")
            ]
            ids = dual.aligned_output_ids
            hidden = analysis.alignment.positions(HIDDEN) if analysis.alignment is not None else []
            names = ", ".join(doc.name(t) for t in sorted({ids[i] for i in hidden}))
            hidden_note = (
                f"; it hides {names} from the text (the ids keep them; tokview trains on ids)"
                if names
                else "; it hides no ids from the text"
            )
        else:
            hidden_note = "; which ids it hides: skipped (needs --tokenizer)"
    if problems:
        doc.add(
            "fail",
            "Reasoning parser",
            f"field `{field}`: " + " ".join(p.rstrip(". ") for p in problems) + hidden_note,
            f"start the server with --reasoning-parser {doc.profile.reasoning_parser or '<family>'} and a "
            f"tokenizer whose {doc.profile.think_close} the parser can see; train on ids, not on text fields"
            if doc.profile.has_reasoning
            else "start the server without --reasoning-parser: this model has no "
            "think delimiters; train on ids, not on text fields",
        )
    elif not doc.profile.has_reasoning and not (chat.reasoning or "").strip():
        doc.add(
            "ok",
            "Reasoning parser",
            f"no reasoning came back, as expected of a model without think delimiters{hidden_note}",
        )
    elif advice is not None:
        doc.add(advice.status, "Reasoning parser", f"{advice.detail}{hidden_note}", advice.recommendation)
    elif field is None:
        why = (
            "thinking is off"
            if doc.settings.get("thinking") is False
            else "neither `reasoning` nor `reasoning_content`: the server may run no reasoning parser"
        )
        doc.add("warn", "Reasoning parser", f"no reasoning field came back ({why}){hidden_note}")
    elif not (raw is not None and doc.tokenizer is not None) and _closer_without_reasoning(doc, chat, chat_ids):
        closer = f"{doc.profile.think_close} ({doc.profile.think_close_id})"
        doc.add(
            "fail",
            "Reasoning parser",
            f"the output ids hold {closer}, but `{field}` came back empty: the server split no reasoning off "
            f"(no --reasoning-parser, or one that does not see {doc.profile.think_close}){hidden_note}",
            f"start the server with --reasoning-parser {doc.profile.reasoning_parser or '<family>'}; train on ids, "
            "not on text fields",
        )
    elif raw is None or doc.tokenizer is None:
        doc.add(
            "ok",
            "Reasoning parser",
            f"the parser puts reasoning in `{field}`; its split could not be checked "
            f"against ids{hidden_note or ' (no raw ids)'}",
        )
    else:
        doc.add(
            "ok",
            "Reasoning parser",
            f"the parser puts reasoning in `{field}` and splits it where the ids do{hidden_note}",
        )


def _closer_without_reasoning(doc: DoctorContext, chat: Capture, chat_ids: list[int] | None) -> bool:
    """Whether the chat answer's ids close a reasoning (the profile's closer id after more than REASONED_IDS ids of
    it) that no text field carries: read off the ids alone, for a doctor whose tokenizer analysis did not run (a
    server with no reasoning parser still sends the field, null). A think block closed at once, or after a blank
    line, is no reasoning to lose."""
    p = doc.profile
    if not p.has_reasoning or p.think_close_id is None or chat.thinking is False or (chat.reasoning or "").strip():
        return False
    ids = list(chat_ids or chat.output_ids or ())
    if p.think_close_id not in ids:
        return False
    reasoned = ids[: ids.index(p.think_close_id)]
    if p.think_open_id in reasoned:
        reasoned = reasoned[reasoned.index(p.think_open_id) + 1 :]
    return len(reasoned) > REASONED_IDS


def check_output_ids(doc: DoctorContext, raw: Capture | None, raw_error: str | None, chat: Capture | None) -> None:
    cap = raw or chat
    if cap is None:
        doc.add("skip", "output_ids honesty", f"skipped: no capture returned ids ({raw_error})")
        return
    codes = doc.analysis(cap)
    ct = cap.usage.get("completion_tokens")
    where = cap.endpoint
    problems = [
        codes[c] for c in ("unknown_token_id", "output_prefix_overlap", "completion_count_mismatch") if c in codes
    ]
    if problems:
        advice = (
            "give doctor the served model's own tokenizer folder (--tokenizer DIR), or find what changes the ids on "
            "the way (a gateway, a server sampling the padded rows of its embedding)"
            if "unknown_token_id" in codes
            else "a server that echoes prompt ids into output_ids corrupts training data: upgrade SGLang "
            "(#17240/#10896), or drop the overlap after checking it"
            if "output_prefix_overlap" in codes
            else "the ids returned are not the tokens the server counts as generated: compare a direct request's ids "
            "with its usage, and report it to the server's project"
        )
        doc.add("fail", "output_ids honesty", f"on {where}: " + " ".join(problems), advice)
        return
    count = (
        f"{len(cap.output_ids)} ids = completion_tokens {ct}"
        if isinstance(ct, int)
        else f"{len(cap.output_ids)} ids (the server reported no completion_tokens to compare)"
    )
    doc.add(
        "ok" if isinstance(ct, int) else "warn",
        "output_ids honesty",
        f"on {where}: {count}, and they hold no prompt ids",
    )


def _lost_specials(doc: DoctorContext, ids: list[int], text: str, skipped_text: str) -> list[int]:
    """The special ids whose text is in `text` and not (as often) in `skipped_text`: what skipping lost,
    not every special id of the output (prompt ids a server echoed there were never in the text)."""
    tok = doc.tokenizer
    if tok is None:
        return []
    out = []
    for t in dict.fromkeys(i for i in ids if tok.is_special(i)):
        piece = tok.piece_text(t)
        if piece and text.count(piece) > skipped_text.count(piece):
            out.append(t)
    return out


async def check_skip_special(doc: DoctorContext, raw: Capture | None) -> None:
    if raw is None or raw.text is None:
        doc.add("skip", "skip_special_tokens", "skipped: the raw path returned no text to compare")
        return
    try:
        skipped = await doc.policy.run(lambda: doc.raw(skip_special_tokens=True))
    except Exception as exc:  # CaptureFailed: report it rather than stop the doctor
        doc.add("skip", "skip_special_tokens", f"skipped: {getattr(exc, 'reason', exc)}")
        return
    if skipped.output_ids != raw.output_ids:
        doc.add(
            "warn",
            "skip_special_tokens",
            "the two requests (same seed) produced different ids, so the texts cannot be compared",
            "sampling is not deterministic per seed on this server",
        )
    elif (skipped.text or "") == raw.text:
        doc.add("ok", "skip_special_tokens", "does not change the text of these ids")
    else:
        lost = _lost_specials(doc, raw.output_ids, raw.text, skipped.text or "")
        names = ", ".join(sorted({doc.name(t) for t in lost})) if lost else "special tokens"
        doc.add(
            "warn",
            "skip_special_tokens",
            f"changes the text: with true (the server default) `text` loses "
            f"{names} ({len(raw.text)} → {len(skipped.text or '')} chars)",
            "never rebuild ids from default-decoded text; tokview sends skip_special_tokens=false and keeps ids",
        )


def check_tokenizer(doc: DoctorContext, served: list[int] | None) -> None:
    if doc.tokenizer is None:
        doc.add("skip", "Local tokenizer", "skipped (needs --tokenizer)")
        return
    if not served:
        doc.add("skip", "Local tokenizer", "skipped: the server returned no prompt ids to compare with")
        return
    if not doc.tokenizer.chat_template:
        doc.add("skip", "Local tokenizer", "skipped: the local tokenizer has no chat template to render with")
        return
    # The same judgement as every stored sample: analyze's prompt_render_mismatch on the served prompt.
    served_prompt = Capture(
        prompt_ids=list(served),
        output_ids=[],
        messages=QUESTION,
        settings={
            "thinking": doc.settings.get("thinking"),
            "chat_template_kwargs": doc.settings["chat_template_kwargs"],
        },
    )
    finding = next(
        (f for f in analyze(served_prompt, doc.profile, doc.tokenizer).findings if f.code == "prompt_render_mismatch"),
        None,
    )
    if finding is None:
        doc.add("ok", "Local tokenizer", f"renders the same {len(served)} prompt ids as the server")
        return
    doc.add(
        "fail", "Local tokenizer", finding.detail, "point --tokenizer at the server's own tokenizer and chat template"
    )
