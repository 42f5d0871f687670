"""The proxy's id fields: added to requests, taken out of answers byte for byte (real-server recordings)."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest

from tokview.proxy.ids import Injection, id_only_chunk, inject, strip_body, strip_events, strip_rest
from tokview.proxy.sse import DONE, EventSplitter, data_of

REC = Path(__file__).resolve().parent / "recordings" / "proxy_tools"
_VARYING = re.compile(rb'"id":"[^"]*"|"created":\d+')


def _same_but_ids(a: bytes, b: bytes) -> bool:
    """Equal once the per-request `id` and `created` values are blanked (two runs of one request)."""
    return _VARYING.sub(b"", a) == _VARYING.sub(b"", b)


def _events(raw: bytes) -> list[bytes]:
    splitter = EventSplitter()
    events = list(splitter.feed(raw))
    assert splitter.rest() == b""
    return events


def _relay(raw: bytes, injection: Injection) -> bytes:
    out = []
    for event in _events(raw):
        data = data_of(event)
        if data is not DONE and id_only_chunk(data, injection):
            continue
        out.append(strip_body(event, injection))
    return b"".join(out)


def test_vllm_stream_with_ids_becomes_the_stream_vllm_sends_without_them() -> None:
    with_ids = (REC / "vllm_t1_stream.txt").read_bytes()
    without = (REC / "vllm_t1_stream_noids.txt").read_bytes()
    injection = Injection("vllm", ("return_token_ids",), True)
    relayed = _relay(with_ids, injection)
    assert len(_events(relayed)) == len(_events(without)) == 20  # 31 chunks + DONE → 19 + DONE
    assert _same_but_ids(relayed, without)


def test_vllm_stream_where_the_parser_hides_the_whole_section_keeps_only_its_text_chunks() -> None:
    raw = (REC / "vllm_choice_none_stream.txt").read_bytes()
    relayed = _relay(raw, Injection("vllm", ("return_token_ids",), True))
    for event in _events(relayed):
        data = data_of(event)
        if data is DONE or not data.get("choices"):
            continue
        choice = data["choices"][0]
        assert choice.get("token_ids") is None
        assert choice["delta"] != {} or choice["finish_reason"] is not None


def test_vllm_json_answer_keeps_its_keys_with_null_as_vllm_does() -> None:
    raw = (REC / "vllm_t1.json").read_bytes()
    stripped = strip_body(raw, Injection("vllm", ("return_token_ids",), False))
    original, edited = orjson.loads(raw), orjson.loads(stripped)
    assert edited["prompt_token_ids"] is None
    assert edited["choices"][0]["token_ids"] is None
    original["prompt_token_ids"] = original["choices"][0]["token_ids"] = None
    assert edited == original
    assert b'"token_ids":null,"routed_experts":null' in stripped  # the bytes around it untouched


def test_sglang_json_answer_loses_the_keys_it_would_not_have_had() -> None:
    with_ids = strip_body((REC / "sgl_t1.json").read_bytes(), Injection("sglang", ("return_token_ids",), False))
    sglext = (REC / "sgl_t1_sglext.json").read_bytes()
    without_ext = strip_body(sglext, Injection("sglang", ("return_input_ids_in_sglext",), False))
    assert b"token_ids" not in with_ids
    assert b"sglext" not in without_ext
    assert _same_but_ids(with_ids, without_ext)


def test_sglang_stream_drops_the_sglext_chunk() -> None:
    raw = (REC / "sgl_t1_stream_sglext.txt").read_bytes()
    injection = Injection("sglang", ("return_input_ids_in_sglext", "return_output_ids_in_sglext"), True)
    relayed = _relay(raw, injection)
    events = _events(raw)
    assert len(_events(relayed)) == len(events) - 1
    assert b"sglext" not in relayed
    assert relayed == b"".join(e for e in events if b"sglext" not in e)


def test_a_client_that_asked_for_ids_gets_them() -> None:
    body, injection = inject({"messages": [], "return_token_ids": True}, "vllm")
    assert not injection.strips
    assert body["return_token_ids"] is True
    raw = (REC / "vllm_t1.json").read_bytes()
    assert strip_body(raw, injection) == raw


@pytest.mark.parametrize(
    ("kind", "stream", "endpoint", "added"),
    [
        ("vllm", False, "chat", ("return_token_ids",)),
        ("vllm", True, "chat", ("return_token_ids",)),
        ("sglang", False, "chat", ("return_token_ids",)),
        ("sglang", True, "chat", ("return_input_ids_in_sglext", "return_output_ids_in_sglext")),
        ("vllm", True, "completions", ("return_token_ids",)),
        ("sglang", False, "completions", ("return_token_ids",)),
        # SGLang's completions take `return_token_ids` streamed too; the sglext flags are no fields of theirs
        ("sglang", True, "completions", ("return_token_ids",)),
    ],
)
def test_inject_adds_the_fields_each_server_needs_and_leaves_the_client_body_alone(
    kind: str, stream: bool, endpoint: str, added: tuple[str, ...]
) -> None:
    client = {"messages": [{"role": "user", "content": "hi"}], "stream": stream}
    body, injection = inject(client, kind, endpoint)
    assert injection.fields == added
    assert all(body[f] is True for f in added)
    assert "return_token_ids" not in client  # the client's own dict is not changed


def test_a_clients_own_prompt_id_flag_keeps_its_ids_on_sglang_chat_only() -> None:
    """SGLang's chat returns `prompt_token_ids` for the client's `return_prompt_token_ids`: those reach it. Its
    completions ignore the flag, so the ids there are the proxy's own `return_token_ids`'s and are taken out."""
    client = {"prompt": [1, 2], "return_prompt_token_ids": True}
    answer = b'{"choices":[{"index":0,"text":"x","token_ids":[5],"prompt_token_ids":[1,2]}]}'
    _, chat = inject(client, "sglang", "chat")
    _, completions = inject(client, "sglang", "completions")
    assert strip_body(answer, chat) == b'{"choices":[{"index":0,"text":"x","prompt_token_ids":[1,2]}]}'
    assert strip_body(answer, completions) == b'{"choices":[{"index":0,"text":"x"}]}'


def test_splitter_waits_for_whole_events_across_reads() -> None:
    raw = (REC / "vllm_t1_stream.txt").read_bytes()
    splitter = EventSplitter()
    got = [e for i in range(0, len(raw), 7) for e in splitter.feed(raw[i : i + 7])]
    assert b"".join(got) == raw
    assert got == _events(raw)


def test_an_id_key_inside_text_is_not_touched() -> None:
    raw = b'{"choices":[{"message":{"content":"say \\"token_ids\\":[1,2]"},"token_ids":[5]}],"prompt_token_ids":[1]}'
    out = strip_body(raw, Injection("vllm", ("return_token_ids",), False))
    assert (
        out
        == b'{"choices":[{"message":{"content":"say \\"token_ids\\":[1,2]"},"token_ids":null}],"prompt_token_ids":null}'
    )
    sgl = strip_body(
        b'{"choices":[{"prompt_token_ids":[1],"index":0}]}', Injection("sglang", ("return_token_ids",), False)
    )
    assert sgl == b'{"choices":[{"index":0}]}'


def test_splitting_a_read_of_many_events_takes_linear_time() -> None:
    """Each event searched the rest of the read for a CRLF terminator no server sends: a read holding a whole
    stream cost a scan per event (9 ms of a 256-chunk stream in the profile, quadratic in the read)."""
    import time

    raw = b"".join(b'data: {"choices":[{"delta":{"content":"x%d"}}]}\n\n' % i for i in range(20_000))
    started = time.perf_counter()
    got = list(EventSplitter().feed(raw))
    assert len(got) == 20_000
    assert time.perf_counter() - started < 1.0


def test_crlf_and_lf_terminated_events_are_both_split() -> None:
    splitter = EventSplitter()
    got = list(splitter.feed(b"data: 1\r\n\r\ndata: 2\n\ndata: 3\r\n\r\ndata: 4"))
    assert got == [b"data: 1\r\n\r\n", b"data: 2\n\n", b"data: 3\r\n\r\n"]
    assert splitter.rest() == b"data: 4"


def test_stripping_a_long_id_array_does_not_walk_it_byte_by_byte() -> None:
    """The end of an id array was found by a Python loop over its bytes (65 µs for 256 ids in the profile, ~1 ms
    for a 2,000-token answer, on the client's path): a flat array's end is one search."""
    import time

    ids = list(range(100_000, 600_000))
    raw = b'{"choices":[{"message":{"content":"x"},"token_ids":' + orjson.dumps(ids) + b'}],"prompt_token_ids":[1,2]}'
    started = time.perf_counter()
    out = strip_body(raw, Injection("vllm", ("return_token_ids",), False))
    took = time.perf_counter() - started
    assert out == b'{"choices":[{"message":{"content":"x"},"token_ids":null}],"prompt_token_ids":null}'
    assert took < 0.1, f"{took:.3f} s"


def test_feed_whole_gives_the_same_bytes_as_the_events_across_reads() -> None:
    raw = (REC / "vllm_t1_stream.txt").read_bytes()
    for step in (7, 100, 5000):
        splitter = EventSplitter()
        got = [splitter.feed_whole(raw[i : i + step]) for i in range(0, len(raw), step)]
        assert b"".join(got) + splitter.rest() == raw
        assert all(piece.endswith(b"\n\n") for piece in got if piece)


_VLLM_STREAM = Injection("vllm", ("return_token_ids",), True)
_SGL_STREAM = Injection("sglang", ("return_input_ids_in_sglext", "return_output_ids_in_sglext"), True)
_TRICKY = (  # "{}" in text, an id-only chunk first and last, a finish with an empty delta, ids in the text
    b'data: {"choices":[{"delta":{},"token_ids":[1],"finish_reason":null}]}\n\n'
    b'data: {"choices":[{"delta":{"content":"a {} b"},"token_ids":[2,3],"finish_reason":null}]}\n\n'
    b'data: {"choices":[{"delta":{"content":"\\"token_ids\\": [9]"},"token_ids":[4],"finish_reason":null}]}\n\n'
    b'data: {"choices":[{"delta":{},"token_ids":[5],"finish_reason":null}]}\n\n'
    b'data: {"choices":[{"delta":{},"token_ids":[],"finish_reason":"stop"}]}\n\n'
    b'data: {"choices":[{"delta":{},"token_ids":[6],"finish_reason":null}]}\n\n'
    b"data: [DONE]\n\n"
)


@pytest.mark.parametrize(
    ("raw", "injection"),
    [
        ((REC / "vllm_t1_stream.txt").read_bytes(), _VLLM_STREAM),
        ((REC / "vllm_choice_none_stream.txt").read_bytes(), _VLLM_STREAM),
        ((REC / "sgl_t1_stream_sglext.txt").read_bytes(), _SGL_STREAM),
        (_TRICKY, _VLLM_STREAM),
        (_TRICKY.replace(b"\n", b"\r\n"), _VLLM_STREAM),
    ],
    ids=["vllm", "vllm-hidden-section", "sglang-sglext", "tricky", "tricky-crlf"],
)
def test_a_read_of_many_events_is_relayed_as_event_by_event_would(raw: bytes, injection: Injection) -> None:
    """`strip_events` parses only the events that may be id-only; the client must still get exactly what
    relaying each event alone gives, however the reads cut the stream."""
    expected = _relay(raw, injection)
    for step in (1, 50, 333, len(raw)):
        splitter, out, counted = EventSplitter(), [], 0
        for i in range(0, len(raw), step):
            whole = splitter.feed_whole(raw[i : i + step])
            if whole:
                relayed, n = strip_events(whole, injection)
                out.append(relayed)
                counted += n
        assert splitter.rest() == b""
        assert b"".join(out) == expected, step
        assert counted == len(_events(expected)), step


def test_an_id_only_chunk_carrying_continuous_usage_is_still_dropped() -> None:
    """`stream_options.continuous_usage_stats` puts a usage on every chunk vLLM sends; without `return_token_ids` it
    skips an id-only chunk before the usage is added (serving_chat's `continue`), so the client never saw one."""
    usage = ',"usage":{"prompt_tokens":3,"total_tokens":4,"completion_tokens":1}'
    marker = '{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":null,"token_ids":[163606]}]' + usage + "}"
    text = (
        '{"id":"c","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null,"token_ids":[9]}]' + usage + "}"
    )
    final = '{"id":"c","choices":[]' + usage + "}"
    vllm = Injection("vllm", ("return_token_ids",), True)
    stream = b"".join(b"data: %s\n\n" % e.encode() for e in (marker, text, final)) + b"data: [DONE]\n\n"
    out, n = strip_events(stream, vllm)
    assert n == 3 and b'"delta":{}' not in out and out.count(b'"usage"') == 2
    assert b'"choices":[]' in out  # the usage-only chunk the client asked for stays


def test_sglang_ids_that_open_their_object_leave_valid_json() -> None:
    sglang = Injection("sglang", ("return_token_ids",), False)
    for raw, want in (
        (b'{"choices":[{"prompt_token_ids":[1,2],"response_token_ids":[3],"index":0}]}', {"choices": [{"index": 0}]}),
        (b'{"choices":[{"prompt_token_ids":[1], "response_token_ids":[3]}]}', {"choices": [{}]}),
        (b'{"choices":[{"index":0,"prompt_token_ids":[1],"response_token_ids":[3]}]}', {"choices": [{"index": 0}]}),
    ):
        assert orjson.loads(strip_body(raw, sglang)) == want


def test_a_last_event_without_its_blank_line_loses_its_ids_too() -> None:
    """A stream that ends mid-event (no blank line after the last one) or parts its events with bare CRs: the
    splitter's rest went out as it was, ids and id-only chunks included."""
    vllm = Injection("vllm", ("return_token_ids",), True)
    last = b'data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":"stop","token_ids":[1,2]}]}\n'
    assert strip_rest(last, vllm) == last.replace(b"[1,2]", b"null")
    marker = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":null,"token_ids":[5]}]}'
    bare_cr = marker + b"\r\r" + last.replace(b"\n", b"\r\r") + b"data: [DONE]\r\r"
    out = strip_rest(bare_cr, vllm)
    assert b'token_ids":[' not in out and b'"delta":{}' not in out and out.endswith(b"data: [DONE]\r\r")
    assert strip_rest(last, Injection("vllm", (), True)) == last  # nothing injected: nothing changed


def test_a_stream_flag_pydantic_reads_as_a_number_is_read_so() -> None:
    """`"stream": 1.0` is a stream to the servers' pydantic: the proxy asked SGLang for the non-stream id field."""
    from tokview.proxy.ids import SGLEXT_FLAGS, inject

    assert inject({"stream": 1.0}, "sglang")[1].fields == SGLEXT_FLAGS
    assert inject({"stream": 0.0}, "sglang")[1].fields == ("return_token_ids",)
    assert inject({"stream": " true"}, "sglang")[1].fields == ("return_token_ids",)  # refused: its 400 is the server's


@pytest.mark.parametrize(
    ("version", "kept"), [("0.30.0", False), ("0.31.0", True), ("v0.32.1+cpu", True), (None, True), ("abc", True)]
)
def test_a_marker_chunk_with_logprobs_is_the_clients_from_vllm_0_31(version, kept) -> None:
    """vLLM 0.31 sends a marker id's chunk (no delta, no finish) for its logprobs whatever the id flag: the proxy
    dropped it as a chunk only its flag made the upstream send, and a harness lost the `</think>` logprob. Before
    0.31 vLLM skipped it unless asked for ids: there it is the proxy's to drop (keeping it sent 25 chunks such a
    vLLM never sends). A version that does not read as one is taken as a current vLLM."""
    from tokview.proxy.ids import inject

    logprobs = '"logprobs":{"content":[{"token":"</think>","logprob":-0.1,"bytes":[60],"top_logprobs":[]}]}'
    marker = '{"id":"c","choices":[{"index":0,"delta":{},' + logprobs + ',"finish_reason":null,"token_ids":[163607]}]}'
    _, vllm = inject({"stream": True, "logprobs": True}, "vllm", "chat", version)
    out, _ = strip_events(b"data: %s\n\ndata: [DONE]\n\n" % marker.encode(), vllm)
    if kept:
        unasked = marker.replace('"token_ids":[163607]', '"token_ids":null')  # as vLLM sends it unasked
        assert out == b"data: %s\n\ndata: [DONE]\n\n" % unasked.encode()
    else:
        assert out == b"data: [DONE]\n\n"
    bare = marker.replace("," + logprobs, "")  # without logprobs: the flag's own chunk on every version
    assert strip_events(b"data: %s\n\n" % bare.encode(), vllm)[0] == b""


def test_an_lf_then_crlf_blank_line_ends_an_event_and_extra_line_endings_are_sent_on() -> None:
    """`data: …\\n\\r\\n` is a blank line in SSE: the splitter never cut there (the proxy held the whole stream to its
    end); line endings past a read's last blank line were dropped from the client's bytes when the read held a CR."""
    from tokview.proxy.sse import read_stream

    events = [b'data: {"a":1}\n\r\n', b'data: {"b":2}\r\n\r\n', b'data: {"c":3}\n\n']
    splitter = EventSplitter()
    assert list(splitter.feed(b"".join(events))) == events and splitter.rest() == b""
    whole = EventSplitter().feed_whole(b'data: {"a":1}\n\r\ndata: {"b"')
    assert whole == events[0]
    extra = b'data: {"a":1}\r\n\r\n\r\n'
    assert strip_events(extra, Injection("vllm", ("return_token_ids",), True))[0] == extra
    bom = b"\xef\xbb\xbf" + b"".join(events) + b"data: [DONE]\n\n"  # a UTF-8 BOM opens the stream: dropped
    assert read_stream(bom) == ([{"a": 1}, {"b": 2}, {"c": 3}], True, 0)


def test_a_completions_stream_reads_its_ids_under_either_name_sglang_gives_them() -> None:
    """SGLang names a chat choice's output ids `response_token_ids` (0.5.x renamed them from `token_ids`) and may do
    so on completions: a stream's ids are read under both names, each chunk's new ones in order."""
    from tokview.proxy.capture import completion_stream_fields

    for key in ("token_ids", "response_token_ids"):
        chunks = [
            {"choices": [{"index": 0, "text": "a", key: [5], "prompt_token_ids": [1, 2]}]},
            {"choices": [{"index": 0, "text": "b", key: [6], "finish_reason": "stop", "matched_stop": 6}]},
        ]
        fields = completion_stream_fields(chunks)
        assert (fields["prompt_ids"], fields["output_ids"], fields["text"]) == ([1, 2], [5, 6], "ab")
    both = [
        {"choices": [{"index": 0, "text": "a", "token_ids": [5], "response_token_ids": [5], "prompt_token_ids": [1]}]}
    ]
    assert completion_stream_fields(both)["output_ids"] == [5]  # one of them, as a whole answer's: never twice
