"""Write speculators' `hs_{i}.safetensors` files for a prepared dataset from the HF model (runs in the benchmark venv).

Why not vLLM: its `extract_hidden_states` connector fails on CPU (`pin_memory=True requires a CUDA or other
accelerator backend`). The files hold what that connector writes — `hidden_states [T, 4, H]` and `token_ids
[T]` — computed by transformers instead: vLLM's auxiliary layer k is the residual stream after k decoder
layers, which is HF's `hidden_states[k]`; the fourth slice is the last decoder layer's output before the
final norm (the input of `model.norm`, captured by a hook: HF's last `hidden_states` entry is after the
norm). Rows are read from the dataset `speculators prepare-data` saved, by index, since the trainer looks
files up by the row's position.

    python capture_hidden.py MODEL_DIR DATA_DIR [--layers 2 15 27] [--reuse OTHER_DATA_DIR]

`--reuse`: a row whose `input_ids` appear in OTHER_DATA_DIR (same ids) gets that file copied instead of a
forward pass (condition D is a subset of A, and B's rows the text round trip left unchanged are A's rows:
same ids, same states).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import torch
from datasets import load_from_disk
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM


def _known_files(other: Path | None) -> dict[tuple[int, ...], Path]:
    if other is None:
        return {}
    data = load_from_disk(str(other))
    return {tuple(row["input_ids"]): other / "hidden_states" / f"hs_{i}.safetensors" for i, row in enumerate(data)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir")
    parser.add_argument("data_dir")
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 15, 27])
    parser.add_argument("--reuse", type=Path, default=None)
    args = parser.parse_args(argv)
    out = Path(args.data_dir) / "hidden_states"
    out.mkdir(parents=True, exist_ok=True)
    data = load_from_disk(args.data_dir)
    known = _known_files(args.reuse)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.bfloat16)
    model.eval()
    captured: dict[str, torch.Tensor] = {}
    model.model.norm.register_forward_pre_hook(lambda _m, inputs: captured.__setitem__("pre_norm", inputs[0]))
    t0, tokens, reused = time.perf_counter(), 0, 0
    for i, row in enumerate(data):
        path = out / f"hs_{i}.safetensors"
        if path.exists():
            continue
        ids = [int(x) for x in row["input_ids"]]
        twin = known.get(tuple(ids))
        if twin is not None and twin.exists():
            shutil.copyfile(twin, path)
            reused += 1
            continue
        with torch.inference_mode():
            result = model.model(torch.tensor([ids]), output_hidden_states=True)  # no lm_head: logits unused
        layers = [result.hidden_states[k][0] for k in args.layers] + [captured["pre_norm"][0]]
        states = torch.stack(layers, dim=1).to(torch.bfloat16).contiguous()  # [T, len(layers)+1, H]
        tmp = path.with_suffix(".tmp")
        save_file({"hidden_states": states, "token_ids": torch.tensor(ids, dtype=torch.long)}, str(tmp))
        tmp.rename(path)
        tokens += len(ids)
    took = time.perf_counter() - t0
    print(f"capture: {len(data)} rows, {tokens} tokens computed, {reused} reused, {took:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
