"""A bad server URL is a `BadServerURL` (a TokviewError) everywhere, never a bare ValueError (issue 27).

Catching ValueError for it also caught every other ValueError of the code around (a bug's too), and a caller
that re-wrapped it lost its title and exit code.
"""

from __future__ import annotations

import socket

import pytest

from tokview.errors import TokviewError
from tokview.proxy.serve import ProxyConfig, detect_upstreams
from tokview.servers import ServerUnreachable
from tokview.servers.urls import BadServerURL, validate_server_url


def test_a_bad_server_url_is_a_tokview_error_and_not_a_value_error() -> None:
    assert not issubclass(BadServerURL, ValueError)
    with pytest.raises(BadServerURL, match="out of range") as info:
        validate_server_url("http://127.0.0.1:99999")
    assert isinstance(info.value, TokviewError)


def test_an_empty_panel_url_box_is_a_bad_server_url(store) -> None:
    from tokview.ui.session import Session

    session = Session(store)
    with pytest.raises(BadServerURL, match="give a server URL"):
        session.server_for("   ")
    with pytest.raises(BadServerURL, match="bad server URL"):
        session.server_for("ftp://example.com")


def test_a_session_shows_a_bad_stored_url_masked_instead_of_failing(store) -> None:
    from tokview.ui.session import Session

    session = Session(store, server_url="http://user:secret@bad host:1")
    assert "secret" not in session.server_shown


def test_the_proxy_lets_a_bad_server_url_through_as_itself() -> None:
    with pytest.raises(BadServerURL, match="bad server URL") as info:
        detect_upstreams(ProxyConfig(["http://127.0.0.1:99999"], db=None))
    assert info.value.title == "server URL"


def test_the_proxy_lets_an_unreachable_server_through_as_itself() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ServerUnreachable) as info:
        detect_upstreams(ProxyConfig([f"http://127.0.0.1:{port}"], db=None))
    assert info.value.exit_code == ServerUnreachable.exit_code
