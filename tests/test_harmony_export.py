"""Exports of Harmony (gpt-oss) and GLM-4.7 samples on the pre-tokenized path (issue 28 item 6).

The trainers read pre-tokenized rows as they are (speculators `_passthrough_pretokenized`, SpecForge
`data.prompts_path` / `prepare_prompt_tasks`, Parquet), so a row is exact when its `input_ids` are the served
prompt + output ids and its `loss_mask` is 0 over the prompt and 1 over every generated id (the rules are
those of tests/test_export_conformance.py, written out there from the trainers' code). The SpecForge template
route is refused for Harmony, with the reason (SpecForge's own Harmony rendering and mask) in one line and in the
speculators manifest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import pytest

from tokview.core import gpt_oss_tokenizer as g
from tokview.core.analysis import analyze
from tokview.core.profiles import get_profile
from tokview.core.record import Capture, sample_id_for
from tokview.export import ExportError, export
from tokview.store import Store

KWARGS = {"reasoning_effort": "medium", "current_date": "2026-01-01"}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
ASK = [{"role": "user", "content": "What is 6 times 7?"}]
WEATHER = [{"role": "user", "content": "Weather in Paris?"}]
CALL = {
    "role": "assistant",
    "content": "",
    "reasoning_content": "Need the weather.",
    "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    ],
}
RESULT = {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "sunny"}
OUTPUTS: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]] | None, str]] = {
    "answer": (
        ASK,
        None,
        "<|channel|>analysis<|message|>Six sevens.<|end|><|start|>assistant<|channel|>final<|message|>42.<|return|>",
    ),
    "call": (
        WEATHER,
        TOOLS,
        "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>',
    ),
    "after_tool": (
        [*WEATHER, CALL, RESULT],
        TOOLS,
        "<|channel|>analysis<|message|>It is sunny.<|end|><|start|>assistant<|channel|>analysis<|message|>Say so."
        "<|end|><|start|>assistant<|channel|>final<|message|>Sunny.<|return|>",
    ),
}


@pytest.fixture(scope="module")
def oss_tok():
    from tokview.core.tokenizer import load_tokenizer

    try:
        return load_tokenizer(g.gpt_oss_tokenizer_dir())
    except g.GptOssDataError as exc:
        pytest.skip(f"no o200k ranks on this machine (npm pack js-tiktoken into ~/.cache/tokview): {exc}")


def _put(store: Store, prompt_id: str, cap: Capture, profile, tok) -> None:
    store.put_sample(
        sample_id_for(prompt_id, cap.settings, 0, None),
        prompt_id,
        None,
        cap,
        analyze(cap, profile, tok),
        gen_index=0,
        profile=profile.name,
    )


def _harmony_store(path: Path, tok) -> Store:
    oss = get_profile("gpt-oss")
    store = Store(path)
    for prompt_id, (messages, tools, text) in OUTPUTS.items():
        kwargs = {**KWARGS, **({"tools": tools} if tools else {})}
        cap = Capture(
            prompt_ids=tok.render(messages, template_kwargs=kwargs),
            output_ids=tok.encode(text),
            finish_reason="stop",
            messages=messages,
            settings={"chat_template_kwargs": KWARGS, **({"tools": tools} if tools else {})},
            endpoint="vllm-completions",
        )
        _put(store, prompt_id, cap, oss, tok)
    return store


def _served(store: Store) -> dict[str, tuple[list[int], list[int], list[str]]]:
    rows = store.query("SELECT sample_id, prompt_ids, output_ids, codes FROM samples")
    return {s: (list(p) + list(o), [0] * len(p) + [1] * len(o), list(c)) for s, p, o, c in rows}


def _pretokenized_exact(store: Store, tok, profile, tmp_path: Path) -> dict:
    """Export speculators and Parquet; every row must be the served ids and mask. Returns the manifest."""
    served = _served(store)
    result = export(store, "speculators", tmp_path / "s.jsonl", select="all", tokenizer=tok, profile=profile)
    rows = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert len(rows) == len(served)
    for row in rows:  # speculators _passthrough_pretokenized and SpecForge prepare_prompt_tasks: as they are
        ids, mask, _ = served[row["metadata"]["tokview_sample_id"]]
        assert row["input_ids"] == ids
        assert row["loss_mask"] == mask
    export(store, "parquet", tmp_path / "p.parquet", select="all", tokenizer=tok, profile=profile)
    table = duckdb.connect().execute(
        f"SELECT sample_id, input_ids, loss_mask FROM read_parquet('{tmp_path / 'p.parquet'}')"
    )
    for sid, ids, mask in table.fetchall():
        assert (ids, mask) == served[sid][:2]
    return result.manifest


def test_harmony_samples_export_exactly_on_the_pretokenized_path(oss_tok, tmp_path):
    with _harmony_store(tmp_path / "h.duckdb", oss_tok) as store:
        assert all(not codes for _, _, codes in _served(store).values())  # clean Harmony turns
        manifest = _pretokenized_exact(store, oss_tok, get_profile("gpt-oss"), tmp_path)
    assert manifest["counts"]["exported"] == 3
    harmony = [w for w in manifest["warnings"] if "no SpecForge ChatTemplate" in w]
    assert len(harmony) == 1
    assert "Harmony" in harmony[0]
    assert "2025-06-28" in harmony[0]  # SpecForge's HarmonyParser stamps its own date


def test_specforge_template_route_is_refused_for_harmony_with_the_reason(oss_tok, tmp_path):
    with _harmony_store(tmp_path / "h.duckdb", oss_tok) as store, pytest.raises(ExportError) as err:
        export(
            store, "specforge", tmp_path / "sf.jsonl", select="all", tokenizer=oss_tok, profile=get_profile("gpt-oss")
        )
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("--format specforge refused: no SpecForge ChatTemplate")
    assert "Harmony" in message
    assert "<|return|>" in message  # the final message's end token SpecForge renders as <|end|>
    assert "--format speculators" in message
    assert not list(tmp_path.glob("sf*"))


def test_glm_4_7_samples_export_exactly_on_the_pretokenized_path(qwen_tok, tmp_path):
    """GLM-4.7's layout (the generation prompt pre-fills <think>: the output starts inside reasoning) on Qwen3's
    ids and template, the nearest real tokenizer tokview ships offline."""
    glm = get_profile("glm-4.7").with_overrides(
        name="glm-4.7-on-qwen3-ids", think_open_id=151667, think_close_id=151668, stop_ids=(151645, 151643)
    )
    with Store(tmp_path / "g.duckdb") as store:
        for k, answer in enumerate(("Forty two.", "It is 42.")):
            messages = [{"role": "user", "content": f"What is 6 times 7, take {k}?"}]
            prompt = qwen_tok.render(messages, template_kwargs={"enable_thinking": True}) + [151667]
            output = qwen_tok.encode("\nSix sevens.\n") + [151668] + qwen_tok.encode(answer) + [151645]
            cap = Capture(
                prompt_ids=prompt,
                output_ids=output,
                finish_reason="stop",
                messages=messages,
                settings={"chat_template_kwargs": {"enable_thinking": True}},
                endpoint="vllm-completions",
            )
            _put(store, f"glm{k}", cap, glm, qwen_tok)
        manifest = _pretokenized_exact(store, qwen_tok, glm, tmp_path)
    assert manifest["counts"]["exported"] == 2


def _rows(path: Path) -> dict[str, dict]:
    return {json.loads(line)["id"]: json.loads(line) for line in path.read_text().splitlines()}


def test_text_exports_of_harmony_carry_the_channels_and_the_calls(oss_tok, tmp_path):
    """Read as think tags, a gpt-oss output has no answer: sharegpt wrote an empty assistant turn for every row, and
    no call. The final channel is the answer, the analysis channel the reasoning, a `<|call|>` message the call."""
    oss = get_profile("gpt-oss")
    with _harmony_store(tmp_path / "h.duckdb", oss_tok) as store:
        export(store, "sharegpt", tmp_path / "g.jsonl", select="all", tokenizer=oss_tok, profile=oss)
        export(store, "speculators", tmp_path / "s.jsonl", select="all", tokenizer=oss_tok, profile=oss)
        with pytest.raises(ExportError) as err:
            export(store, "kimi-inline", tmp_path / "k.jsonl", select="all", tokenizer=oss_tok, profile=oss)
    turns = {key: row["conversations"][-1] for key, row in _rows(tmp_path / "g.jsonl").items()}
    assert {k: (t["value"], t.get("reasoning_content")) for k, t in turns.items() if "tool_calls" not in t} == {
        "answer": ("42.", "Six sevens."),
        "after_tool": ("Sunny.", "It is sunny.\nSay so."),  # one analysis message a line, as vLLM joins them
    }
    assert turns["call"]["value"] == ""
    assert turns["call"]["reasoning_content"] == "Need the weather."
    assert [c["function"] for c in turns["call"]["tool_calls"]] == [
        {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    ]
    flags = {row["primary_id"]: row["metadata"]["is_tool_call"] for row in _rows(tmp_path / "s.jsonl").values()}
    assert flags == {"answer": False, "call": True, "after_tool": False}
    assert "\n" not in str(err.value) and "analysis channel" in str(err.value)
    assert not (tmp_path / "k.jsonl").exists()
