"""Core analysis on a 32,000-token sample: `analyze` (segments, alignment, every finding) and display pieces.

Baseline, measured in the same run: one `tokenizer.decode` of the same ids, the least any tool that
looks at a sample must do. The ratio says what the full analysis costs on top of that.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from tokview.core.analysis import analyze
from tokview.core.record import Capture
from tokview.core.resolve import load_tokenizer_and_profile


def best_of(fn, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def main() -> None:
    tok, profile = load_tokenizer_and_profile()
    prompt = tok.render(
        [{"role": "user", "content": "Explain token ids in detail."}], template_kwargs={"thinking": True}
    )
    sentence = "Okay, let me think about this carefully, step by step: 你好, the answer is forty-two! "
    unit = tok.encode(sentence)
    reasoning = (unit * (16000 // len(unit) + 1))[:16000]
    answer = (unit * (15990 // len(unit) + 1))[:15990]
    output = reasoning + [profile.think_close_id] + answer + [profile.stop_ids[0]]
    reasoning_text, content_text = tok.decode(reasoning), tok.decode(answer)
    capture = Capture(
        prompt_ids=prompt,
        output_ids=output,
        finish_reason="stop",
        reasoning=reasoning_text,
        content=content_text,
        reasoning_field="reasoning",
        endpoint="vllm-chat",
        settings={"thinking": True},
        usage={"completion_tokens": len(output)},
    )
    n = len(output)
    tok.pieces(output)  # warm the per-id byte cache, as a long-running app would be
    base_min, base_med = best_of(lambda: tok.decode(output))
    full_min, full_med = best_of(lambda: analyze(capture, profile, tok))
    pieces_min, pieces_med = best_of(lambda: tok.pieces(output))
    print(f"sample: {len(prompt)} prompt + {n} output ids")
    print(f"baseline decode(output_ids)      best {base_min * 1e3:8.1f} ms  median {base_med * 1e3:8.1f} ms")
    print(
        f"tokview analyze (all findings)   best {full_min * 1e3:8.1f} ms  median {full_med * 1e3:8.1f} ms"
        f"  ratio {full_min / base_min:5.1f}x"
    )
    print(
        f"tokview pieces (display strings) best {pieces_min * 1e3:8.1f} ms  median {pieces_med * 1e3:8.1f} ms"
        f"  ratio {pieces_min / base_min:5.1f}x"
    )


if __name__ == "__main__":
    main()
