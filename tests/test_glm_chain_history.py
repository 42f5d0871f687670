"""History reasoning on the simulator as each template keeps it (issue 28 done-when: "GLM-4.7 and K2.6 runs keep
history reasoning as their templates do").

`tokview batch --history served` regenerates a multi-turn trace over loopback: GLM-4.7 on the GLM-layout tokenizer
(`tokview.core.glm_layout`), Kimi-K2.6 on the Kimi-layout one, each served as its profile. Every served turn goes
back with its reasoning (`--history-reasoning template`, the default), and the next prompt's ids must hold it, id for
id, exactly where the template keeps it: GLM-4.7 after the last user turn (everywhere with `all`, which sends
`clear_thinking: false`), older turns as `</think>` alone; Kimi in a tool conversation after the last assistant turn
without calls, older turns as `<think></think>`. The rules are written here from the templates' sources, not read
back from the tokenizer. Stored ids are what the server serves for the stored request."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tokview.cli import main
from tokview.core.glm_layout import GLM_ID
from tokview.core.kimi_layout import KIMI_ID, kimi_tokenizer_dir
from tokview.core.profiles import detect_profile
from tokview.core.tokenizer import load_tokenizer
from tokview.errors import ExitCode
from tokview.sim import SimConfig, start_simulator
from tokview.store import Store

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def _call(n: int) -> list[dict]:
    call = {"id": f"w{n}", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    return [
        {"role": "assistant", "content": "", "reasoning_content": "file reasoning", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"w{n}", "content": f"sunny {n}"},
    ]


KIMI_TRACE = {
    "id": "agent",
    "tools": TOOLS,
    "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        *_call(0),
        {"role": "assistant", "content": "Sunny.", "reasoning_content": "file reasoning"},
        {"role": "user", "content": "And tomorrow?"},
        *_call(1),
        {"role": "assistant", "content": "Rain."},
    ],
}
GLM_TRACE = {
    "id": "talk",
    "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Sunny.", "reasoning_content": "file reasoning"},
        {"role": "user", "content": "And tomorrow?"},
        {"role": "assistant", "content": "Rain."},
        {"role": "assistant", "content": "Bring an umbrella."},  # the agent goes on without a new user turn
    ],
}


def glm47_keeps(messages: list[dict], at: int, keep_all: bool) -> bool:
    """GLM-4.7's chat_template.jinja: `(clear_thinking is defined and not clear_thinking) or loop.index0 >
    ns.last_user_index` (and reasoning not empty)."""
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    return keep_all or at > last_user


def kimi_keeps(messages: list[dict], at: int, keep_all: bool) -> bool:
    """Kimi-K2-Thinking/K2.5/K2.6 with tools: reasoning after the last assistant turn without tool calls."""
    plain = [i for i, m in enumerate(messages) if m["role"] == "assistant" and not m.get("tool_calls")]
    return keep_all or at > max(plain, default=-1)


CASES = {
    "glm-4.7": (
        GLM_TRACE,
        glm47_keeps,
        GLM_ID["<think>"],
        GLM_ID["</think>"],
        [GLM_ID["<|assistant|>"], GLM_ID["</think>"]],
    ),
    "kimi-k2.6": (
        KIMI_TRACE,
        kimi_keeps,
        KIMI_ID["<think>"],
        KIMI_ID["</think>"],
        [KIMI_ID["<|im_middle|>"], KIMI_ID["<think>"], KIMI_ID["</think>"]],
    ),
    "kimi-k2-thinking": (KIMI_TRACE, kimi_keeps, KIMI_ID["<think>"], KIMI_ID["</think>"], []),
}
"""profile -> (trace, the template's rule, think open id, think close id, the ids a dropped turn starts with)."""


def _contains(ids: list[int], block: list[int]) -> bool:
    n = len(block)
    return any(ids[i : i + n] == block for i in range(len(ids) - n + 1))


def _run(tmp_path: Path, profile: str, tok_dir: Path | None, history_reasoning: str) -> list:
    trace = CASES[profile][0]
    tools = "tools" in trace
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps(trace) + "\n")
    db = tmp_path / "s.duckdb"
    quirks = {"tool-calls": "each", "tool-rounds": 1} if tools else {}
    cfg = SimConfig(kind="vllm", tokenizer_dir=tok_dir, profile=profile, quirks=quirks)
    args = ["batch", str(prompts), "--db", str(db), "--mode", "chat", "--workers", "1", "--temperature", "0"]
    args += ["--max-new-tokens", "400", "--history", "served", "--history-reasoning", history_reasoning]
    args += ["--profile", profile] + (["--tokenizer", str(tok_dir)] if tok_dir else [])
    with start_simulator(cfg) as sim:
        assert main([*args, "--server", sim.url]) == ExitCode.OK
        store = Store(str(db))
        ids = [r[0] for r in store.query("SELECT sample_id FROM samples ORDER BY turn")]
        turns = [store.load_sample(i) for i in ids]
        for s in turns:  # the stored request asked again: the server serves the stored ids
            assert s.capture.raw_request is not None
            again = httpx.post(sim.url + "/v1/chat/completions", json=s.capture.raw_request["body"], timeout=30).json()
            assert s.capture.prompt_ids == again["prompt_token_ids"]
            assert s.capture.output_ids == again["choices"][0]["token_ids"]
    return turns


@pytest.mark.parametrize(
    ("profile", "history_reasoning"),
    [("glm-4.7", "template"), ("glm-4.7", "all"), ("kimi-k2.6", "template"), ("kimi-k2.6", "all")],
)
def test_served_history_reasoning_is_kept_exactly_where_the_template_keeps_it(
    tmp_path, glm_tok_dir, profile, history_reasoning
):
    tok_dir = glm_tok_dir if profile.startswith("glm") else kimi_tokenizer_dir(model=profile)
    trace, keeps, think_open, think_close, dropped_head = CASES[profile]
    turns = _run(tmp_path, profile, tok_dir, history_reasoning)
    assert len(turns) == sum(m["role"] == "assistant" for m in trace["messages"])
    seen = set()
    for t, sample in enumerate(turns):
        sent = sample.capture.messages
        history = [i for i, m in enumerate(sent) if m["role"] == "assistant"]
        assert len(history) == t, "every earlier turn goes back as served"
        for j, at in enumerate(history):
            out = turns[j].capture.output_ids
            close = out.index(think_close)
            reasoning, answer = out[:close], out[close + 1 : -1]  # the stop id is not history
            assert sent[at]["reasoning_content"], "the client sends the reasoning; the template decides"
            kept = [think_open, *reasoning, think_close, *answer]
            dropped = [*dropped_head, *answer]
            expected = keeps(sent, at, history_reasoning == "all")
            seen.add(expected)
            where = f"turn {t}'s prompt, served turn {j}"
            assert _contains(sample.capture.prompt_ids, kept) is expected, where
            assert _contains(sample.capture.prompt_ids, dropped) is not expected, where
    assert seen == ({True} if history_reasoning == "all" else {True, False}), "the trace shows both sides of the rule"


def test_kimi_k26_without_a_tokenizer_folder_serves_and_renders_k26s_template(tmp_path):
    """`tokview sim --profile kimi-k2.6` and `tokview batch --profile kimi-k2.6` with no `--tokenizer` use the built
    K2.6 variant (its template reads `preserve_thinking`) on both sides: `all` keeps every served turn's reasoning,
    and the local render agrees with the served prompt (no `prompt_render_mismatch`). K2.5's stays K2.5's."""
    k26 = kimi_tokenizer_dir(model="kimi-k2.6")
    assert (
        k26 != kimi_tokenizer_dir()
        and "preserve_thinking" not in (kimi_tokenizer_dir() / "chat_template.jinja").read_text()
    )
    assert detect_profile(load_tokenizer(k26)).name == "kimi-k2.6"
    assert detect_profile(load_tokenizer(kimi_tokenizer_dir())).name == "kimi-k2.5"
    turns = _run(tmp_path, "kimi-k2.6", None, "all")
    assert len(turns) == 4
    last = turns[-1].capture
    for j, earlier in enumerate(turns[:-1]):
        out = earlier.capture.output_ids
        kept = [KIMI_ID["<think>"], *out[: out.index(KIMI_ID["</think>"]) + 1]]
        assert _contains(last.prompt_ids, kept), f"served turn {j}'s reasoning is in the last prompt"
    codes = {f.code for t in turns for f in t.findings}
    assert "prompt_render_mismatch" not in codes, codes


def test_kimi_k2_thinking_without_a_tokenizer_folder_serves_prompts_the_model_opens_its_reasoning_after(tmp_path):
    """`--profile kimi-k2-thinking` with no `--tokenizer` served and rendered K2.5's template, which pre-fills the
    `<think>` the profile says K2-Thinking writes itself. Now its own variant: the prompt ends `<|im_middle|>`, each
    answer opens with `<think>`, the history keeps a tool loop's reasoning once (no doubled opener), and the local
    render agrees with the served prompt."""
    k2t = kimi_tokenizer_dir(model="kimi-k2-thinking")
    assert k2t not in (kimi_tokenizer_dir(), kimi_tokenizer_dir(model="kimi-k2.6"))
    detected = detect_profile(load_tokenizer(k2t))
    assert (detected.name, detected.prefills_opener, detected.thinking_kwarg) == ("kimi-k2-thinking", False, None)
    turns = _run(tmp_path, "kimi-k2-thinking", None, "template")
    assert len(turns) == 4
    think, close = KIMI_ID["<think>"], KIMI_ID["</think>"]
    for t in turns:
        assert t.capture.prompt_ids[-1] == KIMI_ID["<|im_middle|>"]
        assert t.capture.output_ids[0] == think
        assert not _contains(t.capture.prompt_ids, [think, think])
        assert not [f.code for f in t.findings if f.severity == "error"], t.findings
    loop_call = turns[2].capture.output_ids  # the call of the loop the last turn is in: its reasoning is kept
    assert _contains(turns[3].capture.prompt_ids, loop_call[: loop_call.index(close) + 1])
    codes = {f.code for t in turns for f in t.findings}
    assert "prompt_render_mismatch" not in codes, codes


def test_keep_all_on_a_template_that_never_reads_its_key_is_refused(tmp_path, capsys):
    """K2.5's template reads no `preserve_thinking`: `all` made a run of its own whose every prompt was `template`'s."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps(KIMI_TRACE) + "\n")
    with start_simulator(SimConfig(kind="vllm")) as sim:
        args = ["batch", str(prompts), "--server", sim.url, "--db", str(tmp_path / "s.duckdb"), "--mode", "chat"]
        code = main([*args, "--history-reasoning", "all"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == ExitCode.USAGE, err
    assert err[-1].startswith("tokview: error: --history-reasoning all sends preserve_thinking, which this chat "), err
