"""Conditions B and C: training rows built the way text pipelines build them (render, then re-tokenize).

Why: the peers' regeneration scripts (SpecForge, Model-Optimizer, DeepSpec, …) store the served answer as
text and later render `[user, assistant]` with the chat template and tokenize the whole string; the loss
mask covers what follows the generation prompt. Condition B feeds tokview's served outputs through exactly
that path (decode → render → encode), so B differs from A (the served ids) by exactness alone; condition C
feeds the prompt set's own reference answers through it (off-policy text).

The functions take the tokenizer's operations as callables (`render(messages, add_generation_prompt)` →
text, `encode(text)` → ids) so the row logic is tested without a model folder; `hf_ops` adapts a
transformers tokenizer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

Render = Callable[[list[dict[str, str]], bool], str]
Encode = Callable[[str], list[int]]


def text_row(
    row_id: str,
    prompt: str,
    answer: str,
    *,
    render: Render,
    encode: Encode,
    end_marker: str,
) -> dict[str, Any]:
    """A speculators-format row (`id`, `input_ids`, `loss_mask`) for `prompt` answered by `answer` as text.

    The sequence is the rendered conversation up to and including the assistant turn's `end_marker` (the
    template's end-of-turn text, e.g. `<|im_end|>`), the way the trainer's chat template closes the turn;
    the mask is 1 from the end of the generation prompt on.
    """
    user = [{"role": "user", "content": prompt}]
    head = render(user, True)
    full = render([*user, {"role": "assistant", "content": answer}], False)
    if not full.startswith(head):
        raise ValueError(f"{row_id}: the template does not render the generation prompt as a prefix")
    cut = full.find(end_marker, len(head) + len(answer))
    text = full if cut < 0 else full[: cut + len(end_marker)]
    ids = encode(text)
    head_ids = encode(head)
    start = _common_prefix(ids, head_ids)
    return {"id": row_id, "input_ids": ids, "loss_mask": [0] * start + [1] * (len(ids) - start)}


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def hf_ops(tokenizer: Any) -> tuple[Render, Encode]:
    """`render` and `encode` of a transformers tokenizer, special-token text parsed as special ids."""

    def render(messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt))

    def encode(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    return render, encode


def drift_count(exact_rows: Sequence[dict[str, Any]], text_rows: Sequence[dict[str, Any]]) -> dict[str, int]:
    """How many text-path rows differ from the served row of the same id (ids, or only the mask)."""
    served = {r["id"]: r for r in exact_rows}
    out = {"rows": 0, "ids_differ": 0, "mask_differs": 0}
    for row in text_rows:
        twin = served.get(row["id"])
        if twin is None:
            continue
        out["rows"] += 1
        if row["input_ids"] != twin["input_ids"]:
            out["ids_differ"] += 1
        elif row["loss_mask"] != twin["loss_mask"]:
            out["mask_differs"] += 1
    return out


def main(argv: list[str]) -> int:
    """`python textpath.py MODEL_DIR IN.jsonl OUT.jsonl`: rows {id, prompt, answer} → speculators rows (benchmark venv)."""
    import json
    import sys

    from transformers import AutoTokenizer

    model_dir, src, dst = argv
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    render, encode = hf_ops(tokenizer)
    end_marker = str(tokenizer.eos_token)
    n = 0
    with open(src, encoding="utf-8") as fin, open(dst, "w", encoding="utf-8") as fout:
        for line in fin:
            row = json.loads(line)
            out = text_row(row["id"], row["prompt"], row["answer"], render=render, encode=encode, end_marker=end_marker)
            fout.write(json.dumps(out) + "\n")
            n += 1
    print(f"textpath: {n} rows -> {dst}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
