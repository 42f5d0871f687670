"""Credentials kept out of everything stored, printed or logged: one set of rules and one mask.

What is a secret: the API key (TOKVIEW_API_KEY), the user name and password of a server URL in every
form they travel in (raw, percent-encoded, `user:password`, and the base64 of that pair a Basic
Authorization header carries, with and without its padding), any URL's `user:password@`, and any
`Bearer …`/`Basic …` header value a server quotes back.

Two ways to apply the rules, because text differs:
- `scrub_text` for text that is tokview's own or a server's (failure reasons, error messages, server
  URLs, notes, server info): every rule applies. `Secrets.scrub` is the same with a server's known
  credentials added; `TokviewError` runs its message through `scrub_text` when it is made, so no error
  reaches the terminal, a notification or the store with a credential in it.
- `scrub_payload` for data (messages, request and response bodies): only secret-named keys, URL userinfo
  under URL-named keys and exact known values change. Prose such as "the basic idea of a bearer token"
  is training data and must survive byte for byte, so the header rule is not applied there.

This module imports nothing from tokview but `untrusted_text`, so every layer (errors.py included) can
use it. It replaces two maskers that disagreed (`***` for 8+ character header values in servers/urls.py,
`[redacted]` for any header value in store/sample_rows.py); each now masks what either masked.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, overload
from urllib.parse import unquote

from tokview.untrusted_text import storable

API_KEY_ENV = "TOKVIEW_API_KEY"
PROXY_KEY_ENV = "TOKVIEW_PROXY_KEY"
"""The key `tokview proxy --allow-remote` asks its clients for: a secret too, masked like the API key."""
MASK = "[redacted]"
SECRET_KEYS = frozenset({"api_key", "apikey", "authorization", "x-api-key", "proxy-authorization", "api-key"})
SECRET_KEY_HINTS = ("api", "authorization")
"""Every name in SECRET_KEYS holds one of these (a test checks it): a body without them has no secret key."""
URL_KEYS = frozenset({"url", "base_url", "server_url", "endpoint_url"})
MIN_SECRET_LEN = 3
"""Shorter user names/passwords are masked only where they stand as a value (`pw=p4`), never as bare
text: replacing every `p4` or `a` in a message would garble it."""
DATA_MIN_SECRET_LEN = 8
"""Exact values masked in data (messages, bodies, a model's text) are at least this long: an API key of `test` or
`e` replaced every `test` and `e` of the prompts and answers (`"us[redacted]r"`); real keys are far longer."""

_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@?#]+@")
_URL_QUERY = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s?#'\"<>]*\?)([^\s#'\"<>]*)")
_AUTH_VALUE = re.compile(r"(?i)\b(basic|bearer)(\s+)([A-Za-z0-9+/=._~-]+)")
_WORD = re.compile(r"[A-Za-z][a-z]{0,19}")
"""A header scheme followed by a plain word (`Basic authentication required`) is prose, not a credential."""


def api_key_from_env() -> str | None:
    """The API key, only ever from the environment."""
    return os.environ.get(API_KEY_ENV) or None


def check_header_value(value: str, name: str) -> None:
    """A key sent in a header must be printable ASCII: a CR or LF (a `.env` file written on Windows, a pasted line)
    wrote a header of its own into the request, and the server's answer blamed the body. ValueError names `name`,
    never the value."""
    bad = next((c for c in value if not " " < c <= "~"), None)
    if bad is not None:
        raise ValueError(
            f"{name} holds a character a header cannot carry ({bad.encode('unicode_escape').decode()}): check "
            "where it is set (a line ending, a space or a non-ASCII letter copied in)"
        )


def env_keys() -> list[str]:
    """The keys the environment gives this process: the API key and the proxy's client key."""
    return [k for k in (os.environ.get(API_KEY_ENV), os.environ.get(PROXY_KEY_ENV)) if k]


def authorization_values(header: str | None) -> list[str]:
    """The credentials an Authorization header value carries: its token, and for Basic the decoded pair and its
    halves (a server echoing them back in an error puts them in a failure reason)."""
    if not header:
        return []
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if not token:
        return [scheme] if len(scheme) >= MIN_SECRET_LEN else []
    out = [token]
    if scheme.lower() == "basic":
        try:
            user, _, password = base64.b64decode(token + "=" * (-len(token) % 4)).decode("utf-8").partition(":")
        except (ValueError, UnicodeDecodeError):
            pass
        else:
            out += credential_values(user, password)
    return [v for v in dict.fromkeys(out) if len(v) >= MIN_SECRET_LEN]


class HasAuth(Protocol):
    """A parsed server URL (servers/urls.py `ServerURL`): its `(user, password)`, if it has any."""

    @property
    def auth(self) -> tuple[str, str] | None: ...


@dataclass(frozen=True)
class Secrets:
    """The exact values to mask besides the rules: a server's API key and URL credentials."""

    values: tuple[str, ...] = field(default_factory=tuple)
    """Values of MIN_SECRET_LEN characters or more, longest first: masked wherever they occur."""
    short: tuple[str, ...] = field(default_factory=tuple)
    """Shorter values: masked only where they stand as a value (`user:pw`, `'pw'`, `=pw`)."""

    @classmethod
    def of(cls, found: list[str]) -> Secrets:
        longest_first = sorted({v for v in found if v}, key=len, reverse=True)
        return cls(
            tuple(v for v in longest_first if len(v) >= MIN_SECRET_LEN),
            tuple(v for v in longest_first if len(v) < MIN_SECRET_LEN),
        )

    @classmethod
    def for_server(cls, parts: HasAuth, api_key: str | None) -> Secrets:
        """The key sent as a bearer token and the URL's credentials in every form they are sent in."""
        found = [api_key] if api_key else []
        if parts.auth is not None:
            found += credential_values(*parts.auth) + [_percent_encoded(v) for v in parts.auth if v]
        return cls.of(found)

    def scrub(self, text: str) -> str:
        return scrub_text(text, self)


NO_SECRETS = Secrets()


def credential_values(user: str, password: str) -> list[str]:
    """A user name and password as they travel: each alone, the `user:password` pair, and the Basic
    credential (base64 of the pair) with and without its `=` padding: a gateway echoing the request's
    Authorization header puts that in an error message or even a 200 body."""
    pair = f"{user}:{password}"
    token = base64.b64encode(pair.encode("utf-8")).decode("ascii")
    return [user, password, pair, token, token.rstrip("=")]


def _percent_encoded(value: str) -> str:
    """`value` as httpx writes it into a URL's userinfo (what a server quoting the URL shows)."""
    import httpx

    return httpx.URL("http://h/").copy_with(username=value).userinfo.decode()


def url_secrets(url: str | None) -> list[str]:
    """The credentials in a URL's `user:password@` (as typed and percent-decoded, see `credential_values`),
    the values long enough to mask anywhere; [] for a URL without userinfo."""
    if not url or "@" not in url:
        return []
    match = _URL_USERINFO.match(url.strip())
    if not match:
        return []
    userinfo = url.strip()[match.end(1) : match.end() - 1]
    user, _, password = userinfo.partition(":")
    typed = [user, password] if ":" in userinfo else [user]
    out = [*typed, *(unquote(v) for v in typed), *credential_values(unquote(user), unquote(password))]
    return [v for v in dict.fromkeys(out) if len(v) >= MIN_SECRET_LEN]


def known_secrets(extra: tuple[str, ...] | list[str] = ()) -> list[str]:
    """The exact values to mask in payloads, longest first: `extra` (a server's URL credentials) and the env keys
    `DATA_MIN_SECRET_LEN` long at least (secret-named keys and URL userinfo are masked whatever their length)."""
    values = {v for v in extra if v and len(v) >= MIN_SECRET_LEN}
    values |= {k for k in env_keys() if len(k) >= DATA_MIN_SECRET_LEN}
    return sorted(values, key=len, reverse=True)


# -- text: every rule ----------------------------------------------------------------------------------
def scrub_text(text: str, secrets: Secrets = NO_SECRETS) -> str:
    """`text` without credentials, and storable (a lone surrogate a server sent, which no part or column
    takes, written as its escape): URL userinfo removed (the URL stays usable), URL query values, the
    env key, `secrets` and Bearer/Basic header values masked. Plain words after `Basic`/`Bearer` stay."""
    if "@" in text:
        text = _URL_USERINFO.sub(r"\1", text)
    if "?" in text:
        text = _URL_QUERY.sub(lambda m: m.group(1) + masked_query(m.group(2)), text)
    keys = env_keys()
    for value in sorted({*secrets.values, *(k for k in keys if len(k) >= MIN_SECRET_LEN)}, key=len, reverse=True):
        if value in text:
            text = text.replace(value, MASK)
    for value in (*secrets.short, *(k for k in keys if len(k) < MIN_SECRET_LEN)):
        text = re.sub(rf"(?<=[:='\"@]){re.escape(value)}(?=$|[@'\"\s,;)}}\]])", MASK, text)
    return storable(_AUTH_VALUE.sub(_mask_auth_value, text))


def masked_query(query: str) -> str:
    """`a=1&b=2` → `a=[redacted]&b=[redacted]`: a key in a query is a key too."""
    if not query:
        return query
    return "&".join(k + "=" + MASK if sep else MASK for k, sep, _ in (p.partition("=") for p in query.split("&")))


def _mask_auth_value(match: re.Match[str]) -> str:
    """`Basic YWxpY2U6…` → `Basic [redacted]`; `Basic authentication` (a word, not a token) stays."""
    if _WORD.fullmatch(match.group(3)):
        return match.group(0)
    return f"{match.group(1)}{match.group(2)}{MASK}"


def scrub_optional(text: str | None) -> str | None:
    return None if text is None else scrub_text(text)


@overload
def scrub(value: str) -> str: ...


@overload
def scrub(value: Mapping[str, object]) -> dict[str, object]: ...


@overload
def scrub(value: Sequence[Mapping[str, object]]) -> list[dict[str, object]]: ...


@overload
def scrub(value: object) -> object: ...


def scrub(value: object) -> object:
    """Metadata without credentials: secret-named keys masked, every string through `scrub_text`. The value keeps
    its shape (a tuple becomes a list).

    Never for payloads (messages, bodies): see `scrub_payload`."""
    if isinstance(value, dict):
        return {
            (scrub_text(k) if isinstance(k, str) else k): (MASK if str(k).lower() in SECRET_KEYS else scrub(v))
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [scrub(v) for v in value]
    if isinstance(value, str):
        return scrub_text(value)
    return value


def redact_url(url: str) -> str:
    """A URL the user typed, for a message about why it is bad: the text rules, and every query value and
    the fragment masked even when the URL has no scheme (`h:8000?key`)."""
    url, hashmark, fragment = url.partition("#")
    url, qmark, query = url.partition("?")
    tail = qmark + masked_query(query) + hashmark + (MASK if fragment else "")
    return scrub_text(url) + tail


# -- payloads: keys and known values only ------------------------------------------------------------
def _masked_key(key: object, secrets: list[str]) -> object:
    return _values_masked(key, secrets) if isinstance(key, str) else key


def _values_masked(text: str, secrets: list[str]) -> str:
    """`text` with each of `secrets` masked where it stands whole."""
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def scrub_payload(value: object, secrets: list[str], key: str | None = None) -> object:
    """A request/response body or message list with its secrets masked and everything else untouched.

    Only secret-named keys, userinfo in URL-valued keys and exact `secrets` values change (in keys too: a server
    that echoes a credential as an object's key): text a person wrote or a model produced is training data and must
    survive byte for byte."""
    if isinstance(value, dict):
        return {
            _masked_key(k, secrets): (
                MASK if str(k).lower() in SECRET_KEYS else scrub_payload(v, secrets, str(k).lower())
            )
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        if value and type(value[0]) is int and all(type(v) is int for v in value):
            return list(value)  # an id array (2,000+ ids in every body): nothing to mask, no per-id call
        return [scrub_payload(v, secrets) for v in value]
    if isinstance(value, str):
        if key in URL_KEYS and "@" in value:
            value = _URL_USERINFO.sub(r"\1", value)
        return _values_masked(value, secrets)
    return value
