"""Hand-made Kimi-layout captures shared by the store, export and audit tests (a helper module, no tests).

Tests take them as conftest.py fixtures (`make_capture`, `put`, `sample_store`, `kimi_tok`, `kimi_profile`) or
import the builders from here where a module-level constant needs them."""

from __future__ import annotations

from functools import lru_cache

from facts import IM_END, THINK_CLOSE

from tokview.core.analysis import analyze
from tokview.core.kimi_layout import kimi_tokenizer_dir
from tokview.core.profiles import get_profile
from tokview.core.record import Capture, sample_id_for
from tokview.core.tokenizer import load_tokenizer

SETTINGS = {"temperature": 0.0, "top_p": 1.0, "max_new_tokens": 64, "thinking": True}


@lru_cache(maxsize=1)
def kimi():
    return load_tokenizer(kimi_tokenizer_dir())


def profile():
    return get_profile("kimi-k2.5")


def make_capture(
    question: str = "what is the answer",
    reasoning: str = "Okay , let me think",
    answer: str = "The answer is forty - two",
    *,
    finish_reason: str = "stop",
    history=None,
    stop: bool = True,
    reasoning_text: str | None = None,
) -> Capture:
    tok = kimi()
    messages = list(history or []) + [{"role": "user", "content": question}]
    prompt = tok.render(messages, template_kwargs={"thinking": True})
    output = tok.encode(reasoning) + [THINK_CLOSE] + tok.encode(answer) + ([IM_END] if stop else [])
    return Capture(
        prompt_ids=prompt,
        output_ids=output,
        finish_reason=finish_reason,
        matched_stop=IM_END if stop else None,
        reasoning=reasoning if reasoning_text is None else reasoning_text,
        content=answer,
        reasoning_field="reasoning",
        usage={
            "prompt_tokens": len(prompt),
            "completion_tokens": len(output),
            "total_tokens": len(prompt) + len(output),
        },
        settings=dict(SETTINGS),
        messages=messages,
        endpoint="vllm-chat",
        server_url="http://127.0.0.1:8000",
        server_kind="vllm",
        server_version="0.16.0",
        model="kimi-sim",
        raw_request={"model": "kimi-sim", "messages": messages, "api_key": "sk-secret"},
        raw_response={"choices": [{"message": {"content": answer}}]},
        latency_s=0.25,
    )


def put(store, prompt_id: str, capture: Capture, *, run_id: str = "run1", index: int = 0, turn=None) -> str:
    sid = sample_id_for(prompt_id, SETTINGS, index, turn)
    store.put_sample(
        sid,
        prompt_id,
        run_id,
        capture,
        analyze(capture, profile(), kimi()),
        gen_index=index,
        turn=turn,
        profile="kimi-k2.5",
    )
    return sid


def put_foreign(store, sample_id: str) -> None:
    """A sample another pipeline wrote (ids the simulator never writes), stored as an import."""
    cap = make_capture()
    cap.output_ids = [5000 + 37 * i for i in range(12)] + cap.output_ids[-1:]
    cap.endpoint = "imported"
    store.put_sample(sample_id, "foreign", "imported", cap, analyze(cap, profile(), kimi()))
