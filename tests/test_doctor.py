"""`tokview doctor` against the simulator: text, JSON, exit codes, and what it says for each quirk."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest
from plain_tokenizer import build_plain_tokenizer_dir

from tokview.cli import main
from tokview.core.profiles import get_profile
from tokview.servers import doctor_tool_checks as tool_checks
from tokview.servers.doctor import guess_profile, run_doctor
from tokview.servers.doctor_context import DoctorContext
from tokview.servers.features import detect
from tokview.servers.http import ServerClient
from tokview.servers.retry import RetryPolicy
from tokview.sim import SimConfig, start_simulator

KIMI = get_profile("kimi-k2.5")


def by_title(report: Any) -> dict[str, dict[str, Any]]:
    return {c["title"]: c for c in report.to_dict()["checks"]}


async def doctor_for(kind: str, tok: Any, **quirks: Any) -> Any:
    with start_simulator(SimConfig(kind=kind, quirks=quirks)) as sim:
        return await run_doctor(sim.url, tokenizer=tok, profile=KIMI, timeout=5.0)


async def test_vllm_all_good(kimi_tok: Any) -> None:
    report = await doctor_for("vllm", kimi_tok)
    checks = by_title(report)
    assert report.info.kind == "vllm"
    assert not report.failed
    assert "vLLM 0.32.0" in checks["Server kind"]["detail"]
    assert "simulator" in checks["Server kind"]["detail"]
    assert "/v1/chat/completions → prompt_token_ids + token_ids" in checks["Token-id fields"]["detail"]
    assert "/v1/completions → choices[].token_ids" in checks["Token-id fields"]["detail"]
    assert checks["Think opener in the prompt"]["ok"] is True
    assert "163606" in checks["Think opener in the prompt"]["detail"]
    parser = checks["Reasoning parser"]
    assert parser["ok"] is True
    assert "`reasoning`" in parser["detail"]
    assert "163607" in parser["detail"]
    assert checks["output_ids honesty"]["ok"] is True
    assert checks["skip_special_tokens"]["status"] == "warn"
    assert "163607" in checks["skip_special_tokens"]["detail"]
    assert checks["Local tokenizer"]["ok"] is True


async def test_sglang_kind_sees_special_closer_trap(kimi_tok: Any) -> None:
    report = await doctor_for("sglang", kimi_tok)
    checks = by_title(report)
    assert "SGLang 0.5.23" in checks["Server kind"]["detail"]
    assert "/generate → output_ids" in checks["Token-id fields"]["detail"]
    assert "response_token_ids" in checks["Token-id fields"]["detail"]
    # A special </think> is invisible to SGLang's text parser: everything lands in reasoning_content.
    assert checks["Reasoning parser"]["ok"] is False
    assert "reasoning_content" in checks["Reasoning parser"]["detail"]


async def test_vllm_pre_016_says_reasoning_content(kimi_tok: Any) -> None:
    checks = by_title(await doctor_for("vllm", kimi_tok, **{"vllm-pre-0.16": True}))
    parser = checks["Reasoning parser"]
    assert parser["status"] == "warn"
    assert "reasoning arrives in `reasoning_content`" in parser["detail"]
    assert "fall back" in parser["recommendation"]
    assert "0.15.1" in checks["Server kind"]["detail"]


async def test_parser_all_reasoning_is_a_failure(kimi_tok: Any) -> None:
    report = await doctor_for("vllm", kimi_tok, **{"parser-all-reasoning": True})
    parser = by_title(report)["Reasoning parser"]
    assert parser["ok"] is False
    assert "split reasoning/content" in parser["detail"]
    assert report.failed


async def test_no_id_fields_says_no_ids(kimi_tok: Any) -> None:
    report = await doctor_for("vllm", kimi_tok, **{"no-id-fields": True})
    checks = by_title(report)
    assert checks["Token-id fields"]["ok"] is False
    assert checks["Token-id fields"]["detail"].startswith("no ids")
    assert "✗ Token-id fields: no ids" in report.render_text()


async def test_prompt_prefix_bug_caught(kimi_tok: Any) -> None:
    checks = by_title(await doctor_for("sglang", kimi_tok, **{"prompt-prefix-bug": True}))
    honesty = checks["output_ids honesty"]
    assert honesty["ok"] is False
    assert "prompt" in honesty["detail"]


async def test_without_tokenizer_non_kimi_checks_skip(kimi_tok: Any) -> None:
    with start_simulator(SimConfig(kind="vllm")) as sim:
        report = await run_doctor(sim.url, tokenizer=None, profile=KIMI, default_tokenizer=False)
    checks = by_title(report)
    assert checks["Local tokenizer"]["status"] == "skip"
    assert "needs --tokenizer" in checks["Local tokenizer"]["detail"]
    assert "skipped (needs --tokenizer)" in checks["Reasoning parser"]["detail"]
    assert checks["Think opener in the prompt"]["ok"] is True  # from the served ids alone


def test_cli_text_json_and_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with start_simulator(SimConfig(kind="vllm")) as sim:
        assert main(["doctor", "--server", sim.url]) == 0
        text = capsys.readouterr().out
        assert main(["doctor", "--server", sim.url, "--json", "--no-thinking"]) == 0
        data = json.loads(capsys.readouterr().out)
    assert "✓ Server kind: vLLM" in text
    assert "→" in text
    assert "no blocking problems" in text
    assert data["kind"] == "vllm"
    assert data["simulator"] is True
    assert data["tokenizer"]  # Kimi layout found on its own
    opener = {c["title"]: c for c in data["checks"]}["Think opener in the prompt"]
    assert opener["ok"] is True
    assert "thinking off" in opener["detail"]


def test_cli_failures_and_unreachable(capsys: pytest.CaptureFixture[str]) -> None:
    with start_simulator(SimConfig(kind="vllm", quirks={"no-id-fields": True})) as sim:
        assert main(["doctor", "--server", sim.url]) == 3
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    capsys.readouterr()
    assert main(["doctor", "--server", f"http://127.0.0.1:{port}", "--timeout", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tokview: error: server unreachable")
    assert "\n" not in err


async def test_local_tokenizer_check_is_analyzes_prompt_render_mismatch_finding(qwen_tok: Any) -> None:
    """The doctor judges the local template with the same finding a stored sample gets, word for word."""
    with start_simulator(SimConfig(kind="sglang")) as sim:
        report = await run_doctor(sim.url, tokenizer=qwen_tok, profile=KIMI, timeout=5.0)
    local = by_title(report)["Local tokenizer"]
    assert local["ok"] is False
    assert local["detail"].startswith("The local tokenizer renders")
    assert "the server used" in local["detail"]
    assert "the local template or tokenizer is not the server's" in local["detail"]


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
async def test_doctor_reports_the_context_length_batch_checks_against(kind: str) -> None:
    with start_simulator(SimConfig(kind=kind, max_model_len=4096)) as sim:
        report = await run_doctor(sim.url, profile=KIMI, timeout=5.0)
    assert report.to_dict()["max_model_len"] == 4096
    assert "\n  max_model_len 4096\n" in report.render_text()


async def test_the_think_opener_check_says_only_what_the_probes_output_bears_out(kimi_tok: Any) -> None:
    """A Kimi server checked with another family's profile: the template pre-fills no Qwen3 <think>, and
    the doctor once said "the model emits it as its first output id" without looking; and a profile with
    no thinking switch was advised about `chat_template_kwargs {'None': false}`."""
    with start_simulator(SimConfig(kind="vllm")) as sim:
        qwen = await run_doctor(sim.url, tokenizer=kimi_tok, profile=get_profile("qwen3"), timeout=5.0)
        no_switch = get_profile("kimi-k2.5").with_overrides(thinking_kwarg=None, prefills_opener=False)
        off = await run_doctor(sim.url, tokenizer=kimi_tok, profile=no_switch, timeout=5.0, thinking=False)
    opener = by_title(qwen)["Think opener in the prompt"]
    assert opener["status"] == "warn"
    assert "yet the output starts with" in opener["detail"]
    assert "check --profile" in opener["recommendation"]
    said = json.dumps(off.to_dict())
    assert "'None'" not in said
    assert "None template kwarg" not in said


async def test_skip_special_names_only_the_ids_whose_text_was_lost(kimi_tok: Any) -> None:
    """SGLang's prefix bug echoes prompt ids (<|im_middle|>, <think>) into output_ids; they were never in
    the text, so skipping special tokens cannot have dropped them (the doctor once said it did)."""
    detail = by_title(await doctor_for("sglang", kimi_tok, **{"prompt-prefix-bug": True}))["skip_special_tokens"][
        "detail"
    ]
    assert "163607" in detail
    assert "163586" in detail
    assert "163601" not in detail
    assert "163606" not in detail


def test_the_ids_check_fails_on_empty_id_lists_and_recommends_the_endpoint_that_works() -> None:
    """A server answering `token_ids: []` for 145 tokens passed (exit 0: the lists were there), and with only chat
    returning ids the doctor recommended `--mode raw`, the endpoint that had just failed."""
    from types import SimpleNamespace

    from tokview.core.record import Capture
    from tokview.servers import doctor_checks

    said: list[tuple] = []
    doc = SimpleNamespace(
        info=SimpleNamespace(features={"chat_ids_field": "token_ids"}, details={}),
        choice=SimpleNamespace(raw=SimpleNamespace(path="/v1/completions", ids_field="token_ids")),
        add=lambda *line: said.append(line),
        ids_not_returned=False,
        other_vocabulary=None,
    )
    empty = Capture(prompt_ids=[1], output_ids=[], usage={"completion_tokens": 145})
    doctor_checks.check_ids(doc, raw=empty, raw_error=None, chat=empty, chat_ids=[], chat_error=None)  # type: ignore[arg-type]
    [(status, _, detail, *_)] = said
    assert status == "fail" and "returns an empty token_ids for the 145 tokens it says it generated" in detail
    said.clear()
    chat = Capture(prompt_ids=[1], output_ids=[5, 6])
    doctor_checks.check_ids(doc, raw=None, raw_error="HTTP 404", chat=chat, chat_ids=[5, 6], chat_error=None)  # type: ignore[arg-type]
    [(status, _, detail, hint)] = said
    assert (status, hint) == ("warn", "capture with --mode chat (the endpoint that returns ids)")


async def test_a_profile_of_another_model_is_said_first_not_blamed_on_the_server(kimi_tok: Any) -> None:
    """`doctor --profile qwen3` against a Kimi server (the Kimi tokenizer loaded) said ✗ Reasoning parser and told
    the user to restart the server with --reasoning-parser qwen3, with nothing about the profile itself."""
    with start_simulator(SimConfig(kind="vllm")) as sim:
        for tokenizer in (kimi_tok, None):  # None: the Kimi-layout tokenizer the simulator's prompt implies
            report = await run_doctor(sim.url, tokenizer=tokenizer, profile=get_profile("qwen3"), timeout=5.0)
            first = report.to_dict()["checks"][0]
            assert (first["title"], first["status"]) == ("Profile", "fail")
            assert "profile qwen3: think_open_id 151667 is" in first["detail"]
            assert "pass the served model's profile" in first["recommendation"]


@pytest.mark.parametrize("family", ["qwen3", "plain"])
async def test_without_a_tokenizer_the_profile_is_guessed_from_the_served_ids(family, qwen_tok_dir, tmp_path) -> None:
    """With no --tokenizer and no --profile, a server whose prompt held no Kimi `<think>` was judged as Kimi-K2.5:
    a healthy Qwen3 or plain server failed the opener check (exit 3). The served ids name the family now (Qwen3's
    `<|im_end|>` ends the user's message), and ids that name none are a plain model's."""
    folder = qwen_tok_dir if family == "qwen3" else build_plain_tokenizer_dir(tmp_path / "plain-tok")
    with start_simulator(SimConfig(kind="vllm", tokenizer_dir=folder)) as sim:
        report = await run_doctor(sim.url, timeout=5.0)
    assert report.profile is not None and report.profile.name == family
    assert [c["title"] for c in report.to_dict()["checks"] if c["status"] == "fail"] == []


def test_the_guess_goes_by_ids_a_family_owns() -> None:
    def name(ids: list[int]) -> str | None:
        guessed = guess_profile(ids)
        return None if guessed is None else guessed.name

    assert name([163587, 375, 163586, 163588, 163606]) == "kimi-k2.5"  # the opener, pre-filled
    assert name([151644, 872, 198, 9707, 151645, 198, 151644]) == "qwen3"
    assert name([151331, 151336, 198, 9707, 151337]) == "glm-4.5"  # GLM's <|user|>
    assert guess_profile([1, 2, 3, 100]) is None  # DeepSeek's stop id 1 is any model's text id
    assert name([0, 128803, 3085, 128804]) == "deepseek-r1"  # <｜User｜> … <｜Assistant｜>, no <think> pre-filled
    assert name([200006, 17360, 200008, 3575, 200007, 200006, 173781]) == "gpt-oss"  # Harmony: no stop id in a prompt
    assert name([151331, 128803, 151336]) == "glm-4.5"  # one DeepSeek mark alone is a GLM text id here
    assert guess_profile([]) is None


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
@pytest.mark.parametrize("with_tokenizer", [True, False])
async def test_a_server_with_no_reasoning_parser_fails_the_parser_check(kind, with_tokenizer, kimi_tok) -> None:
    """A reasoning model served without --reasoning-parser still sends the reasoning field, null. Without a
    tokenizer that read "✓ … its split could not be checked against ids"; the output ids' closer says it alone."""
    with start_simulator(SimConfig(kind=kind, quirks={"no-reasoning-parser": True})) as sim:
        tok = kimi_tok if with_tokenizer else None
        report = await run_doctor(sim.url, tokenizer=tok, profile=KIMI, timeout=5.0, default_tokenizer=False)
    parser = by_title(report)["Reasoning parser"]
    assert parser["status"] == "fail", parser
    assert "--reasoning-parser kimi_k2" in parser["recommendation"], parser


async def test_the_parser_check_without_a_tokenizer_passes_a_server_that_splits(kimi_tok) -> None:
    with start_simulator(SimConfig(kind="vllm")) as sim:
        report = await run_doctor(sim.url, tokenizer=None, profile=KIMI, timeout=5.0, default_tokenizer=False)
    assert by_title(report)["Reasoning parser"]["status"] == "ok"


@pytest.mark.parametrize(("quirk", "upgrade"), [("no-id-fields", True), ("http-500", False)])
async def test_upgrading_is_advised_for_ids_not_returned_not_for_a_failing_server(quirk, upgrade, kimi_tok) -> None:
    """A server whose endpoints failed (HTTP 500 on both) was told to upgrade, as one too old to return ids is."""
    with start_simulator(SimConfig(kind="vllm", quirks={quirk: True})) as sim:
        report = await run_doctor(sim.url, tokenizer=kimi_tok, profile=KIMI, timeout=5.0, retries=0)
    ids = by_title(report)["Token-id fields"]
    assert ids["status"] == "fail"
    assert ("upgrade the server" in ids["recommendation"]) is upgrade, ids
    assert ("the server failed every probe" in ids["recommendation"]) is not upgrade, ids


async def test_ids_outside_the_vocabulary_fail_the_honesty_check_and_are_not_blamed_on_the_parser(
    kimi_tok: Any,
) -> None:
    """A server whose first output id is past the tokenizer's vocabulary (another model's tokenizer, a gateway that
    changes ids): doctor said "✓ output_ids honesty" and blamed the reasoning parser for hiding id 200000, with the
    advice to start the server with --reasoning-parser kimi_k2."""
    from hostile_proxy import hostile_proxy, proxy_url

    with start_simulator(SimConfig(kind="vllm")) as sim, hostile_proxy(sim.url, "output-id-out-of-vocab") as gate:
        report = await run_doctor(proxy_url(gate), tokenizer=kimi_tok, profile=KIMI, timeout=5.0)
    checks = by_title(report)
    honesty = checks["output_ids honesty"]
    assert honesty["status"] == "fail", honesty
    assert "the tokenizer does not have" in honesty["detail"] and "999999" in honesty["detail"]
    assert "--tokenizer" in honesty["recommendation"]
    assert checks["Reasoning parser"]["status"] == "skip", checks["Reasoning parser"]
    assert "reasoning-parser" not in json.dumps(checks["Reasoning parser"])


async def test_an_api_path_for_a_server_is_told_to_give_the_root_url_and_a_glm_prefill_names_glm_47(
    tmp_path: Any,
) -> None:
    """`--server …/v1/chat/completions` was told to pass --backend (batch says: the root URL); GLM-4.7's pre-filled
    opener under the glm-4.5 profile was told "e.g. --profile kimi-k2.5", another model's."""
    from tokview.core.profiles import BUILTIN_PROFILES
    from tokview.servers.doctor_checks import _prefilling_profile

    with start_simulator(SimConfig(kind="vllm")) as sim:
        report = await run_doctor(sim.url + "/v1/chat/completions", timeout=5.0)
    (kind,) = [c for c in report.to_dict()["checks"] if c["title"] == "Server kind"]
    assert kind["recommendation"].startswith("give the server's root URL (http://host:port, not an API path)"), kind
    assert (
        _prefilling_profile(BUILTIN_PROFILES["glm-4.5"]) == "use --profile glm-4.7 (its template pre-fills the opener)"
    )
    assert _prefilling_profile(BUILTIN_PROFILES["qwen3"]).startswith("use a profile file with prefills_opener = true")


async def test_the_tool_parser_and_a_streamed_tool_call_pass_on_a_server_that_keeps_every_id(kimi_tok: Any) -> None:
    for kind in ("vllm", "sglang"):
        checks = by_title(await doctor_for(kind, kimi_tok))
        tools, stream = checks["Tool-call parser"], checks["Streamed ids (tokview proxy)"]
        assert tools["ok"] is True, tools
        assert "returned get_weather: the 1 call the ids hold at output[" in tools["detail"]
        assert stream["ok"] is True, stream
        assert stream["detail"].startswith("a streamed answer with a tool call records the same ")


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
@pytest.mark.parametrize("with_tokenizer", [True, False])
@pytest.mark.parametrize(
    ("quirks", "title", "status", "said"),
    [
        # The parser drops one of two calls: the harness never runs that tool.
        ({"parser-drops-call": True, "tool-calls": 2}, "Tool-call parser", "fail", "returned 1 of the 2 calls the ids"),
        # No call came back at all: vLLM refuses tools without a parser, so its parser missed the call; SGLang may
        # run none (it then answers so), a warning.
        ({"parser-drops-call": True}, "Tool-call parser", "fail|warn", "returned no tool_calls for the 1 call the ids"),
        # The stream drops the section's marker ids: the proxy would record the call without them.
        ({"stream-misses-ids": True}, "Streamed ids (tokview proxy)", "fail", "163595"),
    ],
)
async def test_a_tool_parser_or_stream_that_loses_a_call_is_said_by_the_doctor(
    kind: str, with_tokenizer: bool, quirks: dict[str, Any], title: str, status: str, said: str, kimi_tok: Any
) -> None:
    with start_simulator(SimConfig(kind=kind, quirks=quirks)) as sim:
        tok = kimi_tok if with_tokenizer else None
        report = await run_doctor(sim.url, tokenizer=tok, profile=KIMI, timeout=5.0, default_tokenizer=False)
    check = by_title(report)[title]
    status = status.split("|")[kind == "sglang"] if "|" in status else status
    assert check["status"] == status, check
    assert said in check["detail"], check
    if kind == "vllm":  # the simulated SGLang fails the reasoning parser check whatever the quirk
        assert report.failed is (status == "fail")
    others = [c for c in report.checks if c.title in ("Tool-call parser", "Streamed ids (tokview proxy)")]
    assert [c.status for c in others if c.title != title] == ["ok"]  # each fault is said by its own check only


@pytest.mark.parametrize(
    ("quirk", "status", "code"),
    [
        ("unclosed-section", "fail", "tool_section_unclosed"),
        ("section-in-reasoning", "warn", "tool_section_in_reasoning"),
    ],
)
async def test_a_call_whose_ids_break_the_layout_is_said_though_the_parser_returned_it(
    quirk: str, status: str, code: str, kimi_tok: Any
) -> None:
    """The parser returned the call, so the probe passed ("no blocking problems"), and every sample a batch then made
    of such answers carried an error finding the probe's own answer already held."""
    tools = by_title(await doctor_for("vllm", kimi_tok, **{quirk: True}))["Tool-call parser"]
    assert tools["status"] == status, tools
    assert code in tools["detail"] and "--tool-call-parser kimi_k2" in tools["recommendation"], tools


async def test_a_server_whose_streams_fail_fails_the_stream_check(kimi_tok: Any) -> None:
    """Every streamed answer broke off with an error while the same request answered unstreamed: the check was only
    skipped and the doctor said "no blocking problems", and a streaming harness behind the proxy failed each time."""
    with start_simulator(SimConfig(kind="vllm", quirks={"stream-error": True})) as sim:
        report = await run_doctor(sim.url, tokenizer=kimi_tok, profile=KIMI, timeout=5.0, default_tokenizer=False)
    stream = by_title(report)["Streamed ids (tokview proxy)"]
    assert stream["status"] == "fail" and "answered unstreamed" in stream["detail"], stream
    assert report.failed


async def test_a_renamed_call_id_is_a_warning_and_an_unjudged_probe_a_skip(kimi_tok: Any) -> None:
    checks = by_title(await doctor_for("vllm", kimi_tok, **{"uuid-call-ids": True}))
    assert checks["Tool-call parser"]["status"] == "warn"
    assert "id 'chatcmpl-tool-" in checks["Tool-call parser"]["detail"]
    # A thinking model that reasons past the probe's token limit never finishes its call: nothing to judge, no ✗.
    for limit, where in ((10, "before any call"), (30, "inside its call")):
        with start_simulator(SimConfig(kind="vllm")) as sim:
            client = ServerClient(sim.url, timeout=5.0)
            info = await detect(client, RetryPolicy(retries=0), KIMI)
            ctx = DoctorContext(client, RetryPolicy(retries=0), info, KIMI, kimi_tok, True)
            ctx.settings["max_new_tokens"] = limit
            tool_checks.check_tools(ctx, await tool_checks.probe(ctx, tools=True, stream=False), True)
            await client.aclose()
        [tools] = ctx.checks
        assert tools.status == "skip", tools
        assert f"reached the probe's {limit}-token limit {where}" in tools.detail
        assert "--no-thinking" in tools.recommendation
    # A profile without a tool-call layout compares nothing: a skip, not a ✓.
    with start_simulator(SimConfig(kind="vllm")) as sim:
        report = await run_doctor(
            sim.url, tokenizer=None, profile=get_profile("deepseek-r1"), timeout=5.0, default_tokenizer=False
        )
    assert by_title(report)["Tool-call parser"]["status"] == "skip"
    assert "names no tool-call layout" in by_title(report)["Tool-call parser"]["detail"]


async def test_a_key_the_server_refuses_is_not_said_to_be_a_refusal_of_tools(kimi_tok: Any, monkeypatch) -> None:
    """A 401 (or 404, 429) says nothing about tools: no tool-parser flags are advised for it."""
    monkeypatch.setenv("TOKVIEW_API_KEY", "sk-wrong-key-999999")
    with start_simulator(SimConfig(kind="vllm", api_key="sk-right-key-123456")) as sim:
        report = await run_doctor(sim.url, tokenizer=kimi_tok, profile=KIMI, timeout=5.0)
    tools = by_title(report)["Tool-call parser"]
    assert tools["status"] == "skip" and "refused a request with tools" not in tools["detail"], tools
    assert "--tool-call-parser" not in tools["recommendation"]


def test_a_streamed_capture_is_compared_by_prompt_ids_output_ids_and_tool_calls() -> None:
    from types import SimpleNamespace

    from tokview.core.record import Capture

    ids, calls, sampling = tool_checks.IDS_FAULT, tool_checks.CALLS_FAULT, tool_checks.MAYBE_SAMPLING
    doc: Any = SimpleNamespace(tokenizer=None, profile=KIMI)
    call = {"id": "functions.get_weather:0", "name": "get_weather", "arguments": '{"city": "Paris"}'}
    section = [163595, 163597, 5, 163598, 6, 163599, 163596]
    whole = Capture(prompt_ids=[1, 2, 3], output_ids=[*section, 163586], tool_calls=[call])

    def said(**changed: Any) -> list[tuple[str, str]]:
        streamed = Capture(**{**whole.__dict__, **changed})
        return tool_checks._stream_problems(doc, whole, streamed)

    assert said() == []
    assert said(tool_calls=[{**call, "arguments": '{"city":"Paris"}'}]) == []  # the same JSON, other spacing
    [(kind, text)] = said(output_ids=[5, 6, 163586])
    assert kind == ids and text.startswith("it lost 5 of the 8 output ids (5 distinct: 163595, 163596, 163597")
    [(kind, text)] = said(output_ids=[2, 3, *section, 163586])  # SGLang #17240: the prompt's last ids first
    assert kind == ids and "begin with the prompt's last 2 ids" in text
    [(kind, text)] = said(output_ids=[*section, 6, 163586])
    assert kind == ids and text.startswith("it added 1 output ids")
    [(kind, text)] = said(output_ids=[*section[:2], 6, 163598, 5, *section[5:], 163586])
    assert kind == ids and "another order from output[2]" in text
    [(kind, text)] = said(prompt_ids=[1, 2, 3, 4])
    assert kind == ids and "prompt ids differ (4 vs 3)" in text
    [(kind, text)] = said(output_ids=[*section[:4], 7, *section[5:], 163586])
    assert kind == sampling and "differ from output[4]" in text  # may be sampling: a warning, not a ✗
    # the calls differ where the ids went apart: sampling too, not the stream's fault
    [_, (kind, text)] = said(
        output_ids=[*section[:4], 7, *section[5:], 163586], tool_calls=[{**call, "arguments": "{}"}]
    )
    assert kind == sampling and 'get_weather({}) where the unstreamed answer has get_weather({"city": "Paris"})' in text
    # the stream's field lost the call its ids hold: the stream's fault
    [(kind, text)] = said(tool_calls=None)
    assert kind == calls and "no call where the unstreamed answer has get_weather" in text
    # the unstreamed answer's field lost it, the stream's is right: the tool check says so, not the stream check
    streamed, whole_without = Capture(**whole.__dict__), Capture(**{**whole.__dict__, "tool_calls": None})
    assert tool_checks._stream_problems(doc, whole_without, streamed) == []


async def test_a_vllm_without_a_tool_parser_is_a_skip_naming_the_flags_and_streams_the_plain_question(
    kimi_tok: Any,
) -> None:
    report = await doctor_for("vllm", kimi_tok, **{"no-tool-parser": True})
    checks = by_title(report)
    tools, stream = checks["Tool-call parser"], checks["Streamed ids (tokview proxy)"]
    assert tools["status"] == "skip", tools
    assert '"auto" tool choice requires --enable-auto-tool-choice' in tools["detail"]
    assert "--enable-auto-tool-choice --tool-call-parser kimi_k2" in tools["recommendation"]
    assert stream["ok"] is True and stream["detail"].startswith("a streamed answer records the same "), stream
    assert not report.failed


async def test_a_server_that_never_answers_is_asked_every_info_endpoint_at_once() -> None:
    """A server that accepts and never answers was asked the four info endpoints two at a time (the doctor's client
    held two connections): declared unreachable after twice the `--timeout` × attempts its message named."""
    import threading
    import time

    from tokview.servers.errors import ServerUnreachable
    from tokview.servers.features import INFO_PATHS

    arrived: dict[str, float] = {}
    held: list[socket.socket] = []
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.2)
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            held.append(conn)
            line = conn.recv(4096).split(b" ")
            if len(line) > 1:
                arrived.setdefault(line[1].decode(), time.monotonic())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        with pytest.raises(ServerUnreachable):
            await run_doctor(f"http://127.0.0.1:{listener.getsockname()[1]}", tokenizer=None, timeout=2.0, retries=0)
    finally:
        done.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()
    assert set(INFO_PATHS) <= set(arrived), arrived
    first = min(arrived.values())
    assert all(arrived[p] - first < 1.5 for p in INFO_PATHS), arrived  # one round, not a second after a timeout


async def test_a_server_that_stops_answering_leaves_no_clean_bill(kimi_tok: Any) -> None:
    """A server that answered its first generations and then stalled: the later checks were skipped ("timed out"),
    and the doctor still said "no blocking problems" and exited 0, so `doctor && batch` let it through."""
    from gated_sim import gated

    from tokview.servers.doctor import DoctorReport

    with start_simulator(SimConfig(kind="vllm")) as sim, gated(sim.url, free=2) as (url, gate):
        try:
            report: DoctorReport = await run_doctor(url, tokenizer=kimi_tok, profile=KIMI, timeout=1.0, retries=0)
        finally:
            gate.open()
    assert not report.failed and report.incomplete, [(c.title, c.status) for c in report.checks]
    assert report.to_dict()["ok"] is False and report.to_dict()["gave_up"]
    verdict = report.render_text().splitlines()[-1]
    assert verdict.startswith("checks could not run: the server failed") and "no blocking problems" not in verdict


def test_a_skip_for_another_reason_beside_a_failed_request_is_no_incomplete_report() -> None:
    """A check skipped without --tokenizer beside a request the server failed once had the whole report called
    incomplete: only a skip that quotes such a failure makes it so."""
    from tokview.servers.doctor import DoctorCheck, DoctorReport
    from tokview.servers.info import ServerInfo

    report = DoctorReport(url="http://x", info=ServerInfo("http://x", kind="vllm"), profile=None, tokenizer_name=None)
    report.gave_up.append("POST /v1/completions timed out (gave up after 1 attempt)")
    report.checks.append(DoctorCheck("skip", "Local tokenizer", "skipped (needs --tokenizer)", ""))
    assert not report.incomplete
    report.checks.append(DoctorCheck("skip", "skip_special_tokens", f"skipped: {report.gave_up[0]}", ""))
    assert report.incomplete


@pytest.mark.parametrize("direction", ["kimi server, qwen3 tokenizer", "qwen3 server, kimi tokenizer"])
async def test_a_tokenizer_of_another_vocabulary_skips_the_checks_that_would_blame_the_server(qwen_tok_dir, direction):
    """A user pass met doctor, with the app's default Kimi tokenizer in front of a Qwen3 server, advising `--mode chat`
    for the raw path's 400 (the local ids past Qwen3's vocabulary), and a tool-call parser that "lost the calls'
    markers: upgrade the server"; with Qwen3's tokenizer on a Kimi server, a think opener to "check --profile"."""
    from tokview.core.kimi_layout import kimi_tokenizer_dir
    from tokview.core.tokenizer import load_tokenizer

    qwen = load_tokenizer(qwen_tok_dir)
    served_qwen = direction.startswith("qwen3")
    sim_config = (
        SimConfig(kind="vllm", tokenizer_dir=qwen_tok_dir, profile="qwen3") if served_qwen else SimConfig(kind="vllm")
    )
    tokenizer, profile = (load_tokenizer(kimi_tokenizer_dir()), KIMI) if served_qwen else (qwen, get_profile("qwen3"))
    with start_simulator(sim_config) as sim:
        report = await run_doctor(sim.url, tokenizer=tokenizer, profile=profile)
    checks = by_title(report)
    for title in ("Think opener in the prompt", "Tool-call parser"):
        assert checks[title]["status"] == "skip", checks[title]
        assert checks[title]["detail"].startswith("skipped: the server's ids are not this tokenizer's"), checks[title]
    assert checks["Local tokenizer"]["status"] == "fail"
    assert checks["Vocabulary"]["status"] == "fail"  # said on its own: where no prompt ids came back, the only fail
    assert "--tokenizer DIR" in checks["Vocabulary"]["recommendation"]
    if served_qwen:  # the raw path refused the Kimi ids: the advice names the tokenizer, not --mode chat
        ids = checks["Token-id fields"]
        assert "--tokenizer DIR" in ids["recommendation"] and "--mode chat" not in ids["recommendation"], ids
