"""Server URLs: one validator for every command, and credentials kept out of anything stored or shown.

`validate_server_url` is what batch, doctor and the UI call on a user's `--server` before anything
else, so a bad URL is a one-line error and never reaches httpx (whose own failures on a port of
99999 or a bare `http://` are tracebacks). `parse_server_url` splits a valid URL into the public
part tokview records and prints (no `user:password@`), the credentials (sent as httpx Basic auth)
and notes (e.g. a trailing `/v1` that was dropped: tokview adds the paths itself).
`server_url_notes` gives those notes for the URL the user typed, to print.
A bad URL is a `BadServerURL` (a TokviewError); the masking of credentials is tokview/secrets.py's.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import unquote

from tokview.errors import UserError, first_line
from tokview.secrets import Secrets, api_key_from_env, redact_url

__all__ = [
    "BadServerURL",
    "Secrets",
    "ServerURL",
    "api_key_from_env",
    "credential_notes",
    "parse_server_url",
    "public_url",
    "server_url_notes",
    "validate_server_url",
]


@dataclass(frozen=True)
class ServerURL:
    url: str
    """Normalised, without credentials: the only form that is stored, logged or shown."""
    auth: tuple[str, str] | None = None
    """(user, password) from `user:password@` in the URL, sent as HTTP Basic auth."""
    notes: tuple[str, ...] = ()


class BadServerURL(UserError):
    """A server URL tokview cannot use, said in one line with its credentials masked.

    Not a ValueError: a caller catches exactly this (a `except ValueError` around a URL check also
    swallowed every other ValueError of the code it guarded)."""

    title = "server URL"


def _fail(url: str, why: str) -> BadServerURL:
    return BadServerURL(f"bad server URL {redact_url(url)!r}: {why}")


_PLAIN = re.compile(
    r"(?P<scheme>https?)://(?P<host>(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?\.)*[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)"
    r"(?::(?P<port>[1-9][0-9]{0,4}))?(?P<v1>/v1)?/?"
)
"""The URLs people type (`http://127.0.0.1:8000`, `https://gpu-3.lab:30000/v1`): see `_plain_url`."""
_DEFAULT_PORTS = {"http": "80", "https": "443"}
_V1_NOTE = "dropped the trailing /v1 from the server URL: tokview adds /v1/... and /generate itself"


def _plain_url(url: str) -> ServerURL | None:
    """A URL httpx would give back unchanged, split without importing httpx (~70 ms of a batch's start-up).

    Only lowercase ASCII host names and canonical IPv4 addresses, a port that is not the scheme's
    default, and no path but an optional `/v1`; anything else (credentials, IPv6, IDNA, odd ports or
    paths) is None and goes through httpx. tests/test_servers_urls.py holds the two paths equal."""
    m = _PLAIN.fullmatch(url)
    if m is None:
        return None
    scheme, host, port = m["scheme"], m["host"], m["port"]
    if port is not None and (int(port) > 65535 or _DEFAULT_PORTS[scheme] == port):
        return None
    if "xn--" in host or (host.replace(".", "").isdigit() and not _canonical_ipv4(host)):
        return None
    text = f"{scheme}://{host}" + (f":{port}" if port else "")
    return ServerURL(url=text, notes=(_V1_NOTE,) if m["v1"] else ())


def _canonical_ipv4(host: str) -> bool:
    try:
        return str(ipaddress.IPv4Address(host)) == host
    except ValueError:
        return False


def parse_server_url(url: str) -> ServerURL:
    """Validate and split a server URL; raises BadServerURL with a one-line reason."""
    if not isinstance(url, str) or not url.strip():
        raise BadServerURL("bad server URL: it is empty (expected e.g. http://127.0.0.1:8000)")
    url = url.strip()
    plain = _plain_url(url)
    if plain is not None:
        return plain
    import httpx

    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError, TypeError, OverflowError) as exc:
        raise _fail(url, first_line(exc) if str(exc).strip() else "not a URL") from None
    if parsed.scheme not in ("http", "https") or "://" not in url:
        raise _fail(url, "it must start with http:// or https:// (e.g. http://127.0.0.1:8000)")
    if not parsed.host:
        raise _fail(url, "it has no host (e.g. http://127.0.0.1:8000)")
    if parsed.port is not None and not 0 < parsed.port <= 65535:
        raise _fail(url, f"port {parsed.port} is out of range (1-65535)")
    if parsed.query or parsed.fragment:
        raise _fail(url, "it must not carry a query or fragment (give the server's root URL)")
    auth = None
    if parsed.userinfo:
        user, _, password = parsed.userinfo.decode("ascii", "replace").partition(":")
        auth = (unquote(user), unquote(password))
    notes: list[str] = []
    path = parsed.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
        notes.append(_V1_NOTE)
    public = parsed.copy_with(userinfo=b"", path=path or "/")
    text = str(public).rstrip("/")
    return ServerURL(url=text, auth=auth, notes=tuple(notes))


def validate_server_url(url: str) -> str:
    """The normalised URL (credentials kept, so it can be passed on to `ServerPool`), or BadServerURL.

    Show or store `public_url(url)` instead of the returned string: it may still hold a password.
    """
    parts = parse_server_url(url)
    if parts.auth is None:
        return parts.url
    import httpx

    return str(httpx.URL(parts.url).copy_with(username=parts.auth[0], password=parts.auth[1]))


def server_url_notes(url: str) -> list[str]:
    """What tokview changes about the URL the user typed (e.g. a dropped trailing `/v1`), in words to print.

    `validate_server_url` returns only the URL, and the URL it returns no longer shows what was changed,
    so a command calls this on the user's original text and prints each note on stderr (or in its report).
    Raises BadServerURL for a bad URL, like `validate_server_url`.
    """
    parts = parse_server_url(url)
    return [*parts.notes, *credential_notes(parts, api_key_from_env())]


def credential_notes(parts: ServerURL, api_key: str | None) -> list[str]:
    """Which credential goes out when the URL has `user:password@` and TOKVIEW_API_KEY is set too.

    A request carries one Authorization header, so both cannot be sent: the URL's credentials win
    (they were given for this server; the environment variable may be meant for another), and the
    user is told so instead of the bearer token vanishing without a word."""
    if parts.auth is None or not api_key:
        return []
    return [
        f"{parts.url}: user:password in the URL and TOKVIEW_API_KEY are both set; a request carries one "
        f"Authorization header, so tokview sends the URL's user:password (Basic auth) and NOT the "
        f"TOKVIEW_API_KEY bearer token (unset TOKVIEW_API_KEY, or drop user:password from the URL, to choose)"
    ]


def public_url(url: str) -> str:
    """The URL as tokview records and prints it: normalised, without credentials."""
    return parse_server_url(url).url
