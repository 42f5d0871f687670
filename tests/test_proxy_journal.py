"""The recorder child's journal (`recorder_process._Journal`): what it writes reads back as the answer the recorder
would record, under its sample id, whatever credentials the client sent; a record that does not load is passed
over, never a reason a proxy cannot start."""

from __future__ import annotations

import os
import pickle
import struct

from tokview.proxy import spool_folder
from tokview.proxy.recorder import Failed, Finished
from tokview.proxy.recorder_process import _Journal, _SpoolReader


def _finished(secrets: tuple[str, ...], raw: bytes) -> Finished:
    request = {"messages": [{"role": "user", "content": "null tokview proxy user"}], "user": "u1"}
    return Finished(
        "/v1/chat/completions", "vllm", "http://up", {}, None, request, request, raw, False, 0.1, None, "u1", secrets
    )


def test_short_credentials_leave_the_journal_readable_and_long_ones_are_masked(tmp_path) -> None:
    """Credentials were written over in the pickled bytes: a Basic user `proxy`, `tokview` or `user`, or a token
    `null`, matched a module, class or field name or JSON text, and the journal no longer loaded (every later start
    of the proxy failed on it)."""
    long_key = "sk-live-4f9a2c7e1b"
    raw = b'{"choices": [{"message": {"content": null}}], "echo": "' + long_key.encode() + b'"}'
    item = _finished(("proxy", "tokview", "user", "null", long_key), raw)
    journal = _Journal(str(tmp_path), _SpoolReader(str(tmp_path)))
    assert journal.add("proxy:r:0000001", pickle.dumps(item), item) == "proxy:r:0000001"
    journal.add(
        "proxy:r:0000002", pickle.dumps(Failed("refused", "http://up", None, None)), Failed("x", "y", None, None)
    )
    journal.close(2)
    [(sample_id, back)] = list(spool_folder.spooled(str(tmp_path), "r"))
    assert sample_id == "proxy:r:0000001" and isinstance(back, Finished)
    assert back.user == "u1" and back.request == item.request and back.client_secrets == ()
    assert long_key.encode() not in back.raw and b"null" in back.raw  # masked as the recorder masks it


def test_a_record_that_does_not_load_is_passed_over(tmp_path) -> None:
    good = _finished((), b"{}")
    path = tmp_path / f"{spool_folder.SPOOL_PREFIX}c000001"
    records = [b"not a pickle", pickle.dumps(good)]
    path.write_bytes(b"".join(struct.pack("!i", len(r)) + r for r in records))
    assert [type(item).__name__ for _, item in spool_folder.records(str(path))] == ["Finished"]
    os.unlink(path)
