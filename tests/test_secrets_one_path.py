"""One set of masking rules (tokview/secrets.py) for the store, server URLs, failure reasons and errors.

There used to be two maskers: the store's (`[redacted]`, any bearer/basic token) and the servers' (`***`,
eight characters or more, base64 user:password). Each missed what the other caught; now every path masks
the union, with one mask.
"""

from __future__ import annotations

import base64

import pytest

from tokview.errors import UserError, one_line
from tokview.secrets import MASK, Secrets, redact_url, scrub_text
from tokview.servers.errors import CaptureFailed
from tokview.servers.urls import parse_server_url, validate_server_url


@pytest.fixture
def no_env_key(monkeypatch):
    monkeypatch.delenv("TOKVIEW_API_KEY", raising=False)


def _server_secrets(url: str = "http://alice:hunter2pw@h:1") -> Secrets:
    return Secrets.for_server(parse_server_url(url), None)


def test_the_mask_is_one_string():
    assert MASK == "[redacted]"


@pytest.mark.parametrize(
    "text, masked",
    [
        ("Authorization: Bearer abc.def", "Authorization: Bearer [redacted]"),
        ("got 'Bearer sk-abc123XYZ'", "got 'Bearer [redacted]'"),
        ("Basic authentication required", "Basic authentication required"),
        ("POST http://bob:zz9@h:8000/generate failed", "POST http://h:8000/generate failed"),
        (
            "GET http://h:8000/v1/models?api_key=k3y&x=1 gave 401",
            "GET http://h:8000/v1/models?api_key=[redacted]&x=[redacted] gave 401",
        ),
    ],
)
def test_server_reasons_and_stored_text_are_masked_alike(text, masked, no_env_key):
    """A failure reason scrubbed by the server's secrets and the same text scrubbed for the store agree."""
    assert scrub_text(text) == masked
    assert _server_secrets().scrub(text) == masked


def test_a_server_echo_of_the_basic_header_is_masked_for_the_store_too(no_env_key):
    token = base64.b64encode(b"alice:hunter2pw").decode()
    text = f"denied header='Basic {token}' decoded='alice:hunter2pw'"
    assert scrub_text(text, _server_secrets()) == "denied header='Basic [redacted]' decoded='[redacted]'"


def test_the_env_key_is_masked_on_every_path(monkeypatch):
    monkeypatch.setenv("TOKVIEW_API_KEY", "sk-env-0123456789")
    assert scrub_text("bad key sk-env-0123456789") == "bad key [redacted]"
    assert _server_secrets().scrub("bad key sk-env-0123456789") == "bad key [redacted]"


def test_a_bad_url_is_shown_with_the_same_mask(no_env_key):
    assert redact_url("http://alice:pw@h:99999/x?api_key=k#frag") == "http://h:99999/x?api_key=[redacted]#[redacted]"
    assert redact_url("h:8000?k3y") == "h:8000?[redacted]"


# -- errors ---------------------------------------------------------------------------------------------
def test_an_error_never_carries_a_credential(monkeypatch):
    monkeypatch.setenv("TOKVIEW_API_KEY", "sk-env-0123456789")
    error = UserError("cannot reach http://alice:s3cret@h:1 with key sk-env-0123456789")
    assert error.message == "cannot reach http://h:1 with key [redacted]"
    assert one_line(error) == error.message


def test_a_capture_failure_reason_is_masked_like_its_message(no_env_key):
    failed = CaptureFailed("HTTP 401: rejected Bearer sk-abc123XYZ")
    assert failed.reason == failed.message == "HTTP 401: rejected Bearer [redacted]"


def test_a_bad_server_url_is_a_tokview_error_worded_once(no_env_key):
    from tokview.errors import TokviewError

    with pytest.raises(TokviewError, match="bad server URL") as info:
        validate_server_url("http://alice:s3cretpw@h:99999")
    assert info.value.title == "server URL"
    assert "s3cretpw" not in info.value.message
