"""Build the tiny Kimi-layout Llama that a real vLLM serves in the live tier (real-servers.md §3).

A real Kimi-K2.5 cannot run on a CPU, but the live tier must still watch a real server emit
reasoning, the special ``</think>`` closer, an answer and ``<|im_end|>``.  This builder keeps
Kimi's tokenizer layout (our own ``build_kimi_tokenizer_dir``) and pairs it with a 2-layer,
64-wide Llama whose "chain" weights (§3.6) make the next chain token win with probability ≈1, so
every faithful server produces the same 18 ids after a prompt that ends with ``<think>``.

Usage (run with the vLLM venv's python; tokview itself need not be installed there)::

    make_tiny_kimi.py OUT_DIR [chain|random] [bf16|fp32] [--non-special-think] [--verify]

``--verify`` loads the result with HF transformers and checks the greedy chain output.
Deterministic: same torch/transformers → byte-identical files.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# Run as a script under the vLLM venv, where neither tokview nor the tests are on sys.path: the repository root
# gives the layout builder, tests/ the Kimi facts (a standard-library-only module) every test also reads.
REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
if str(REPO_ROOT / "tests") not in sys.path:
    sys.path.append(str(REPO_ROOT / "tests"))

from facts import BOS, IM_END, KIMI_CHAIN_OUTPUT, KIMI_PROMPT_6X7, KIMI_VOCAB_SIZE, PAD, THINK_OPEN  # noqa: E402

from tokview.core.kimi_layout import build_kimi_tokenizer_dir  # noqa: E402

VOCAB_SIZE = KIMI_VOCAB_SIZE
BOS_ID, EOS_ID, PAD_ID = BOS, IM_END, PAD
# <think> Okay , Ġlet Ġme Ġthink Ġabout Ġthis Ġcarefully . </think> The Ġanswer Ġis Ġforty - two ! <|im_end|>
CHAIN_IDS = [THINK_OPEN, *KIMI_CHAIN_OUTPUT]
CHAIN_OUTPUT = list(KIMI_CHAIN_OUTPUT)
LM_HEAD_SCALE = 4.0
PROMPT_IDS = list(KIMI_PROMPT_6X7)
MODEL_INFO = "tiny_kimi.json"

LLAMA_CONFIG = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=1,
    num_key_value_heads=1,
    head_dim=64,  # CPU attention kernels want 32/64/80/96/128
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    bos_token_id=BOS_ID,
    eos_token_id=EOS_ID,
    pad_token_id=PAD_ID,
)


def apply_chain(model) -> None:
    """The §3.6 edit: one-hot embeddings for the 19 chain tokens; lm_head row of token i+1 gets 4.0 in column i.

    After the final RMSNorm a one-hot vector has magnitude 8, so the next chain token's logit is ≈32
    against ≈±0.7 for every random row: it wins even when sampling at temperature 1.
    """
    import torch

    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    with torch.no_grad():
        for i, tid in enumerate(CHAIN_IDS):
            emb[tid].zero_()
            emb[tid, i] = 1.0
        for i in range(len(CHAIN_IDS) - 1):
            head[CHAIN_IDS[i + 1], i] = LM_HEAD_SCALE


def build(out_dir: Path, mode: str = "chain", dtype: str = "bf16", think_special: bool = True) -> Path:
    """Write tokenizer + config + safetensors weights into ``out_dir`` (replaced if present)."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    out_dir = build_kimi_tokenizer_dir(Path(out_dir), think_special=think_special)
    torch.manual_seed(0)
    config = LlamaConfig(**LLAMA_CONFIG)
    model = LlamaForCausalLM(config).float()
    if mode == "chain":
        apply_chain(model)
    model = model.to(torch.bfloat16 if dtype == "bf16" else torch.float32)
    model.generation_config = GenerationConfig(bos_token_id=BOS_ID, eos_token_id=[EOS_ID], pad_token_id=PAD_ID)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    info = {
        "mode": mode,
        "dtype": dtype,
        "think_special": think_special,
        "chain_ids": CHAIN_IDS if mode == "chain" else None,
        "expected_output_ids": CHAIN_OUTPUT if mode == "chain" else None,
    }
    (out_dir / MODEL_INFO).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return out_dir


def greedy_output(model_dir: Path, prompt_ids: list[int], max_new_tokens: int = 32) -> list[int]:
    """Greedy generation with HF transformers: the reference every server must reproduce."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype="auto")
    model.eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, len(prompt_ids) :].tolist()


def verify(model_dir: Path) -> None:
    """Check the tokenizer renders the recorded 28-id prompt and the model emits the 18 chain ids."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": "What is 6 times 7?"}], add_generation_prompt=True, tokenize=True
    )
    rendered = list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)
    if rendered != PROMPT_IDS:
        raise SystemExit(f"prompt render mismatch: {rendered}")
    got = greedy_output(model_dir, PROMPT_IDS)
    if got != CHAIN_OUTPUT:
        raise SystemExit(f"chain output mismatch: {got}")
    print(f"verified: prompt {len(PROMPT_IDS)} ids, greedy output {got}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir", type=Path)
    p.add_argument("mode", nargs="?", default="chain", choices=("chain", "random"))
    p.add_argument("dtype", nargs="?", default="bf16", choices=("bf16", "fp32"))
    p.add_argument(
        "--non-special-think",
        action="store_true",
        help="register <think>/</think> as ordinary added tokens (text-based parsers need it)",
    )
    p.add_argument("--verify", action="store_true", help="check the chain output with HF transformers")
    args = p.parse_args(argv)
    out = build(args.out_dir, args.mode, args.dtype, think_special=not args.non_special_think)
    print(f"built {args.mode} {args.dtype} model in {out}")
    if args.verify:
        if args.mode != "chain":
            print("--verify applies to the chain model only", file=sys.stderr)
            return 1
        verify(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
