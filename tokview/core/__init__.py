"""The Textual-free core: profiles, tokenizer adapter, the capture record, segments, findings.

Nothing here imports Textual, httpx or duckdb (a test enforces it), so the batch command, the
simulator and any script can use it without the UI's start-up cost.
"""
