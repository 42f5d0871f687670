"""A small plain chat tokenizer folder (no think tokens), built offline with the `tokenizers` library.

SmolLM2-like: byte-level BPE trained on a few sentences, `<|endoftext|>` / `<|im_start|>` /
`<|im_end|>` as ids 0-2, a ChatML chat template, and a generation_config.json that lists one more
stop id than the tokenizer's eos (as hub folders often do). Deterministic: the same corpus gives the
same vocabulary. Used by the plain-profile tests (no hub, no fixture files).
"""

from __future__ import annotations

import json
from pathlib import Path

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ENDOFTEXT, IM_START, IM_END = 0, 1, 2
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CORPUS = [
    "You are a helpful assistant.",
    "What is 6 times 7? The answer is forty-two.",
    "Tell me a short story about a cat who lived in a lighthouse by the sea.",
    "The capital of France is Paris. The capital of Italy is Rome.",
    "Once upon a time there was a little robot that wanted to learn how to paint.",
    "system user assistant",
    "Hello there! How can I help you today?",
] * 20


def build_plain_tokenizer_dir(out: Path) -> Path:
    """Write tokenizer.json, tokenizer_config.json and generation_config.json into `out`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=700,
        special_tokens=SPECIALS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "GPT2Tokenizer",
                "bos_token": "<|im_start|>",
                "eos_token": "<|im_end|>",
                "unk_token": "<|endoftext|>",
                "pad_token": "<|im_end|>",
                "add_prefix_space": False,
                "clean_up_tokenization_spaces": False,
                "model_max_length": 2048,
                "chat_template": CHAT_TEMPLATE,
            },
            indent=2,
        )
    )
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": IM_START, "eos_token_id": [IM_END, ENDOFTEXT]})
    )
    return out
