"""Templates tokview must read as they are. One with no thinking switch (Qwen3-2507 Thinking, kimi-k2-thinking, deepseek-r1): `--no-thinking` was
taken, changed nothing in the prompt, and every sample was flagged `reasoning_with_thinking_off`, blaming the server.
Now refused in one line. And the simulator writes no second newline after a pre-filled `<think>\\n`."""

from __future__ import annotations

import json

from tokview.cli import main
from tokview.core.profiles import get_profile
from tokview.sim import SimConfig, start_simulator
from tokview.sim.model import SimModel


def test_batch_refuses_no_thinking_where_the_profile_has_no_switch(tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "prompt": "hi"}) + "\n")
    db = tmp_path / "s.duckdb"
    with start_simulator(SimConfig(kind="vllm")) as sim:
        args = ["batch", str(prompts), "--server", sim.url, "--db", str(db), "--profile", "kimi-k2-thinking"]
        code = main([*args, "--no-thinking"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code != 0 and len(err) == 1, err
        assert "--no-thinking: profile kimi-k2-thinking names no template kwarg" in err[0]
        assert main(args) == 0  # thinking on is what such a template does


def test_tokenize_refuses_no_thinking_where_the_profile_has_no_switch(tmp_path, capsys):
    chat = tmp_path / "c.json"
    chat.write_text(json.dumps([{"role": "user", "content": "hi"}]))
    code = main(["tokenize", "--chat", str(chat), "--profile", "kimi-k2-thinking", "--no-thinking"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and "names no template kwarg that turns thinking off" in err[0], err
    assert main(["tokenize", "--chat", str(chat), "--profile", "kimi-k2.5", "--no-thinking"]) == 0


def test_the_sim_writes_no_second_newline_after_a_prefilled_one(qwen_tok):
    profile = get_profile("qwen3")
    model = SimModel(qwen_tok, profile)
    prompt = qwen_tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n")
    assert prompt[-2] == profile.think_open_id
    out = model.natural_output(prompt, seed=1)
    assert not qwen_tok.decode(out[:1]).startswith("\n")
    opened = qwen_tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert qwen_tok.decode(model.natural_output(opened, seed=1)[:2], skip_special_tokens=False) == "<think>\n"


def test_a_qwen3_coder_template_gets_no_hermes_layout(qwen_tok_dir, tmp_path):
    """Qwen3-Coder's `<tool_call>` holds `<function=NAME>` XML, not hermes JSON: read as hermes, every correct call was
    flagged. Its folder gets no layout; Qwen3's own keeps hermes."""
    import shutil

    from tokview.core.profiles import detect_profile
    from tokview.core.tokenizer import load_tokenizer

    assert detect_profile(load_tokenizer(qwen_tok_dir)).tool_calls.parser == "hermes"
    coder = tmp_path / "coder"
    shutil.copytree(qwen_tok_dir, coder)
    config = json.loads((coder / "tokenizer_config.json").read_text())
    config["chat_template"] = (
        "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
        "{%- if tools %}<tool_call>\n<function=example>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>"
        "{%- endif %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
    )
    (coder / "tokenizer_config.json").write_text(json.dumps(config))
    (coder / "chat_template.jinja").unlink(missing_ok=True)
    assert detect_profile(load_tokenizer(coder)).tool_calls is None
