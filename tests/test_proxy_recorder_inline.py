"""The recorder process records on the thread that reads its pipe (issue 24 item 5): a thread of its own between
that reader and the writer cost a GIL hand-over per request in a process that does nothing else."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from tokview.core.profiles import ModelProfile
from tokview.core.tokenizer import TokenizerAdapter
from tokview.proxy.recorder import Failed, Finished, Recorder
from tokview.store import Store


def _finished(capture: Any) -> Finished:
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "prompt_token_ids": capture.prompt_ids,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": capture.content},
                "finish_reason": "stop",
                "token_ids": capture.output_ids,
            }
        ],
    }
    request = {"model": "m", "messages": capture.messages}
    return Finished(
        "chat", "vllm", "http://up", {}, None, request, {"body": request}, orjson.dumps(body), False, 0.01, None, None
    )


def test_an_unthreaded_recorder_records_on_the_callers_thread_and_lands_it_all(
    tmp_path: Path, kimi_tok: TokenizerAdapter, kimi_profile: ModelProfile, make_capture: Callable[..., Any]
) -> None:
    capture = make_capture("what is two and two")
    with Store(tmp_path / "r.duckdb") as store:
        store.put_run("r", settings={"mode": "proxy"})
        recorder = Recorder(store, profile=kimi_profile, tokenizer=kimi_tok, run_id="r", threaded=False)
        assert "tokview-proxy-recorder" not in {t.name for t in threading.enumerate()}
        recorder.take(_finished(capture))
        recorder.take(Failed("abandoned by the client after 3 chunks", "http://up", None, None))
        assert (recorder.recorded, recorder.failed) == (1, 1)  # handed to the writer before take returned
        recorder.close()
        rows = store.query("SELECT prompt_ids, output_ids FROM samples")
    assert [(list(p), list(o)) for p, o in rows] == [(capture.prompt_ids, capture.output_ids)]
