"""`tokview proxy`: an OpenAI-compatible front in front of vLLM or SGLang that records every generation.

The HTTP front only (architecture.md, "one capture path, two front doors"): it forwards, adds the
fields that return token ids and takes them out again (`ids.py`), groups requests into sessions
(`sessions.py`) and hands each finished generation to the batch's own writer (`recorder.py`). The
capture, the analysis and the part writing are the ones `tokview batch` uses. Never imports Textual.
"""
