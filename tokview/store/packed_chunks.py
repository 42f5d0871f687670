"""A streamed answer's chunks are stored packed (zlib, base64) inside its raw body, and read back as served.

A stream's raw body is tokview's own wrapper, `{"stream": true, "n_chunks": N, "chunks": [...]}`, holding every
chunk the server sent. Each chunk repeats its envelope (id, object, created, model, index, logprobs,
finish_reason) around a delta of a token or two: a 256-token vLLM stream is ~57 kB of JSON, most of it repeated.
Stored as JSON text that was the costliest part of recording a stream through `tokview proxy`: dumped into the
part line, parsed again by DuckDB's JSON reader, copied through the landing's temporary table and written whole
to the WAL. Measured on 300 streams of 256 tokens recorded through the proxy from `tokview sim` (whose text
repeats more than a model's, so it packs smaller: 56 kB of JSON to 2.2 kB of base64), the row, the part and the
landing cost 0.95 ms a stream with the chunks as JSON and 0.42 ms packed; in `bench_proxy` the recorder
process's CPU per stream fell from 3.2-3.6 to 2.0-2.5 ms.

So the wrapper's `chunks` list is stored as `chunks_zlib64` at the same place in the wrapper: the base64 of the
zlib-compressed JSON text the store would otherwise have written, after the store's masking of secrets
(`sample_rows.to_json`): nothing is packed that the store would not have written in clear. Everything else in
the wrapper stays readable JSON (`raw_response->>'n_chunks'` still works in SQL). `unpack` (in
`sample_rows.capture_from_row`, before any elided ids go back) restores the list, so every reader of a capture
sees the chunks as served.

Only a wrapper (`"stream": true` and a `chunks` list) of at least PACK_MIN_CHUNKS chunks is packed: a short stream
saves nothing worth the opaque column. A chunks text that is not valid UTF-8 (a lone surrogate the stdlib's
JSON wrote) stays as it was. Schema version 9 marks stores that may hold packed chunks, so an older tokview,
which would read such a stream as having no chunks (and no tool calls), refuses the store instead.
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Callable
from typing import Any

RESPONSE_COLUMNS = ("raw_response", "parsed_raw_response")
"""The columns whose bodies may hold a stream wrapper (a request body is never packed)."""
PACKED_KEY = "chunks_zlib64"
PACK_MIN_CHUNKS = 16
LEVEL = 1
"""zlib's fastest level: the chunks' repetition is what it removes (56 kB of the simulator's chunks: 1.6 kB at
level 1, dumped, compressed and base64'd in 0.10 ms; level 6 saves 0.2 kB more for 0.14 ms)."""


def pack(body: Any, dump: Callable[[object], str | None]) -> Any:
    """`body` with its chunks packed when it is a stream wrapper of at least PACK_MIN_CHUNKS chunks (a new dict,
    the key in its place), else `body` itself. `dump`: how the store writes a value as JSON (masking it)."""
    if type(body) is not dict or body.get("stream") is not True or PACKED_KEY in body:
        return body
    chunks = body.get("chunks")
    if type(chunks) is not list or len(chunks) < PACK_MIN_CHUNKS:
        return body
    text = dump(chunks)
    if text is None:
        return body
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: stored as JSON, as before
        return body
    return _replaced(body, "chunks", PACKED_KEY, base64.b64encode(zlib.compress(data, LEVEL)).decode("ascii"))


def unpack(body: Any) -> Any:
    """A stored body with its packed chunks back as the list they were (freshly parsed: a new dict); any other
    body as it is. A packed value that does not decode (a store edited by hand) is left packed."""
    if type(body) is not dict or "chunks" in body or type(body.get(PACKED_KEY)) is not str:
        return body
    try:
        chunks = json.loads(zlib.decompress(base64.b64decode(body[PACKED_KEY], validate=True)).decode("utf-8"))
    except (ValueError, zlib.error):
        return body
    return _replaced(body, PACKED_KEY, "chunks", chunks)


def _replaced(body: dict[str, Any], old: str, new: str, value: object) -> dict[str, Any]:
    """A copy of `body` with its `old` entry replaced by `new` = `value` at the same place (key order is kept)."""
    return {(new if key == old else key): (value if key == old else item) for key, item in body.items()}
