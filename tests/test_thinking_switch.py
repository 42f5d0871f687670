"""Templates tokview must read as they are. One that opens reasoning in every prompt with no switch to stop it
(Qwen3-2507 Thinking, deepseek-r1): `--no-thinking` was taken, changed nothing in the prompt, and every sample was
flagged `reasoning_with_thinking_off`, blaming the server; now refused in one line (a template of a model that never
thinks, Qwen3-2507 Instruct, is not refused). The simulator writes no second newline after a pre-filled
`<think>\\n`. A Qwen3-Coder template gets no hermes tool layout."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tokview.cli import main
from tokview.core.profiles import get_profile
from tokview.sim import SimConfig, start_simulator
from tokview.sim.model import SimModel

TURNS = "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
THINKING = TURNS + "{%- if add_generation_prompt %}<|im_start|>assistant\n<think>\n{%- endif %}"
INSTRUCT = TURNS + "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"


def _folder(qwen_tok_dir: Path, where: Path, template: str) -> Path:
    """The Qwen3 tokenizer folder with another template (a 2507 variant's shape)."""
    shutil.copytree(qwen_tok_dir, where)
    config = json.loads((where / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (where / "tokenizer_config.json").write_text(json.dumps(config))
    (where / "chat_template.jinja").unlink(missing_ok=True)
    return where


def test_batch_refuses_no_thinking_where_the_template_always_thinks(qwen_tok_dir, tmp_path, capsys):
    thinking = _folder(qwen_tok_dir, tmp_path / "thinking", THINKING)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "prompt": "hi"}) + "\n")
    with start_simulator(SimConfig(kind="vllm", tokenizer_dir=thinking)) as sim:
        args = ["batch", str(prompts), "--server", sim.url, "--db", str(tmp_path / "s.duckdb")]
        code = main([*args, "--tokenizer", str(thinking), "--no-thinking"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code != 0 and len(err) == 1, err
        assert "--no-thinking: profile qwen3's template opens reasoning in the prompt all the same" in err[0]
        assert err[0].endswith("leave thinking on, or name the template's switch: --chat-template-kwargs")
        kwargs = ["--chat-template-kwargs", '{"note": 1}']  # kwargs that switch nothing: refused all the same
        assert main([*args, "--tokenizer", str(thinking), "--no-thinking", *kwargs]) != 0
        assert "opens reasoning in the prompt all the same" in capsys.readouterr().err
        assert main([*args, "--tokenizer", str(thinking)]) == 0  # thinking on is what such a template does


def test_tokenize_refuses_no_thinking_only_where_the_template_always_thinks(qwen_tok_dir, tmp_path, capsys):
    chat = tmp_path / "c.json"
    chat.write_text(json.dumps([{"role": "user", "content": "hi"}]))
    thinking = _folder(qwen_tok_dir, tmp_path / "thinking", THINKING)
    code = main(["tokenize", "--tokenizer", str(thinking), "--chat", str(chat), "--no-thinking"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and "opens reasoning in the prompt all the same" in err[0], err
    instruct = _folder(qwen_tok_dir, tmp_path / "instruct", INSTRUCT)  # a model that never thinks: nothing to refuse
    assert main(["tokenize", "--tokenizer", str(instruct), "--chat", str(chat), "--no-thinking"]) == 0
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
    flagged. Its folder gets the qwen3_coder layout (tests/test_qwen3_coder_calls.py); Qwen3's own keeps hermes."""
    from tokview.core.profiles import detect_profile
    from tokview.core.tokenizer import load_tokenizer

    assert detect_profile(load_tokenizer(qwen_tok_dir)).tool_calls.parser == "hermes"
    coder = TURNS + (
        "{%- if tools %}<tool_call>\n<function=example>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>"
        "{%- endif %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
    )
    assert detect_profile(load_tokenizer(_folder(qwen_tok_dir, tmp_path / "coder", coder))).tool_calls.parser == (
        "qwen3_coder"
    )


def test_gpt_oss_refuses_no_thinking_and_a_model_that_opens_reasoning_itself_is_told_why(kimi_tok):
    """gpt-oss reasons in every answer: --no-thinking was dropped silently. A profile with no switch whose model opens
    reasoning itself (kimi-k2-thinking's template pre-fills nothing): its samples' finding no longer blames the
    server."""
    from tokview.core.analysis import analyze
    from tokview.core.record import Capture
    from tokview.core.thinking_switch import thinking_off_refusal

    assert "gpt-oss reasons in every answer" in (thinking_off_refusal(get_profile("gpt-oss"), kimi_tok, {}) or "")
    profile = get_profile("kimi-k2-thinking")  # (with K2.5's template, which does pre-fill: its refusal is right)
    assert thinking_off_refusal(profile, kimi_tok, profile.template_kwargs(False)) is not None
    prompt = kimi_tok.render([{"role": "user", "content": "hi"}], template_kwargs=profile.template_kwargs(False))
    out = [profile.think_open_id, *kimi_tok.encode("Let me think."), profile.think_close_id, *kimi_tok.encode("Hi.")]
    out.append(profile.stop_ids[0])
    c = Capture(prompt_ids=prompt, output_ids=out, finish_reason="stop", settings={"thinking": False})
    (found,) = [f for f in analyze(c, profile, kimi_tok).findings if f.code == "reasoning_with_thinking_off"]
    assert "names no template kwarg to turn thinking off: the model reasons all the same" in found.detail


def test_no_thinking_is_refused_where_the_profile_names_no_switch_the_template_reads(qwen_tok_dir, tmp_path, capsys):
    """A profile file `base = "deepseek-r1"` (no switch: R1's template has none) on Qwen3's template, which reads
    `enable_thinking`: `--no-thinking` sent no kwarg, the model thought, and every sample was flagged
    `reasoning_with_thinking_off`. Refused now in one line, naming the switch; sent by hand, it is taken."""
    profile = tmp_path / "ds-on-qwen.toml"
    profile.write_text(
        'base = "deepseek-r1"\nname = "ds-on-qwen"\nthink_open_id = 151667\nthink_close_id = 151668\n'
        "stop_ids = [151645]\n"
    )
    chat = tmp_path / "c.json"
    chat.write_text(json.dumps([{"role": "user", "content": "hi"}]))
    args = ["tokenize", "--tokenizer", str(qwen_tok_dir), "--profile", str(profile), "--chat", str(chat)]
    capsys.readouterr()
    assert main([*args, "--no-thinking"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "names no thinking switch, and its template reads `enable_thinking`" in err[0], err
    assert main(args) == 0  # thinking on: what the template does without the switch
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "prompt": "hi"}) + "\n")
    with start_simulator(SimConfig(kind="vllm", tokenizer_dir=qwen_tok_dir)) as sim:
        batch = ["batch", str(prompts), "--server", sim.url, "--db", str(tmp_path / "s.duckdb")]
        batch += ["--tokenizer", str(qwen_tok_dir), "--profile", str(profile), "--no-thinking"]
        capsys.readouterr()
        assert main(batch) == 1
        assert "names no thinking switch" in capsys.readouterr().err
        assert main([*batch, "--chat-template-kwargs", '{"enable_thinking": false}']) == 0


def test_the_sim_writes_qwen_newlines_for_a_qwen_profile_of_any_name(qwen_tok):
    """A profile file `base = "qwen3"` names itself (`my-qwen3-finetune`): the simulator read "qwen" off the name and
    served it without Qwen3's newlines, so every SpecForge row of such a store was inexact."""
    profile = get_profile("qwen3").with_overrides(name="my-finetune")
    opened = qwen_tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    out = SimModel(qwen_tok, profile).natural_output(opened, seed=1)
    assert qwen_tok.decode(out[:2], skip_special_tokens=False) == "<think>\n"


def test_no_thinking_is_refused_for_kimi_k2_thinking_which_always_reasons() -> None:
    """Its own layout's template reads no switch: `--no-thinking` sent nothing that could stop the model's `<think>`,
    and every sample of the run was flagged reasoning_with_thinking_off."""
    from tokview.core.kimi_layout import kimi_tokenizer_dir
    from tokview.core.profiles import get_profile
    from tokview.core.thinking_switch import thinking_off_refusal
    from tokview.core.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(kimi_tokenizer_dir(model="kimi-k2-thinking"))
    said = thinking_off_refusal(get_profile("kimi-k2-thinking"), tokenizer, {"thinking": False})
    assert said is not None and "reasons in every answer" in said
    assert said.endswith("leave thinking on") and "switch:" not in said  # no switch to name: it has none
