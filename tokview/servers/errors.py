"""Why a capture did not happen, in words a person can act on.

`CaptureFailed` is final (retries are spent or retrying cannot help); `Retryable` is the internal
signal that one attempt failed in a way another attempt may fix (connection trouble, timeouts,
408/409/425/429/5xx, garbage bodies). `ServerUnreachable` means no server answered at all.
"""

from __future__ import annotations

import json

from tokview.errors import ExitCode, TokviewError


class CaptureFailed(TokviewError):
    """A capture could not be made; `.reason` says why in one line."""

    title = "capture failed"

    def __init__(self, reason: str, *, status: int | None = None, url: str | None = None) -> None:
        super().__init__(reason)
        self.reason = self.message
        """Masked like the message (see TokviewError)."""
        self.status = status
        self.url = url


class KindMismatch(CaptureFailed):
    """The server's info endpoints say it is the other kind than `--backend` names: the flag is wrong, not the
    server (the pool refuses the run at its start, exit 1, where a server that does not answer is exit 2)."""


class IdsNotReturned(CaptureFailed):
    """The server answered, without the id field asked for: a build too old (or started so) to return ids, where
    another failure is the server failing (the doctor advises an upgrade for this one only)."""


class ServerUnreachable(CaptureFailed):
    """No server answered the probe (connection refused, timed out, or not an HTTP server)."""

    title = "server unreachable"
    exit_code = ExitCode.UNREACHABLE
    titled = True


class Retryable(Exception):
    """One attempt failed in a way that another attempt may fix.

    `connection` marks failures that say the server itself is gone (they count toward eviction);
    `timed_out` an attempt that got no answer within the timeout; `retry_after` is the server's own
    `Retry-After` in seconds, when it sent one.
    """

    def __init__(
        self,
        reason: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
        connection: bool = False,
        timed_out: bool = False,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.url: str | None = None
        """The server the attempt went to (set by the pool): a request that gave up names it."""
        self.retry_after = retry_after
        self.connection = connection
        self.timed_out = timed_out


class RetryElsewhere(Retryable):
    """An answer this server will give again (one `tokview score` cannot read): worth another attempt only on another
    server. The pool fails it at once when no other healthy server is left (retried on the same one, every sample of a
    100k-sample run on an unreadable server took four attempts and their backoff)."""


def error_message(body: bytes | str, limit: int = 300) -> str:
    """The server's own error message out of whatever shape it used (OpenAI, FastAPI, plain text), at most `limit`
    characters (`cut`). JSON is written as it reads (`ensure_ascii=False`): a password with `ä` escaped as `\u00e4`
    no longer matched the secret masked later."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return cut(" ".join(text.split()), limit) or "(empty body)"
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and err.get("message"):
            return cut(str(err["message"]), limit)
        for key in ("message", "detail", "error"):
            if data.get(key):
                value = data[key]
                return cut(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False), limit)
    return cut(json.dumps(data, ensure_ascii=False), limit)


def cut(text: str, limit: int) -> str:
    """`text` in at most `limit` characters (then `…`), cut before a key-like run it would split: a credential the
    server quoted is masked after this, and half of one no longer matches it (`sk-proj-AbCdEf0` of a 27-character
    key). Keys are letters, digits, `-` and `_`; a message that is one such run (or CJK text without punctuation)
    is cut where the limit falls."""
    if len(text) <= limit:
        return text
    kept = text[:limit]
    if _key_like(text[limit]):
        start = next((i for i in range(limit - 1, -1, -1) if not _key_like(kept[i])), -1)
        if start >= 0:
            kept = kept[: start + 1]
    return kept.rstrip() + "…"


def _key_like(c: str) -> bool:
    return c.isascii() and (c.isalnum() or c in "-_")


def stream_abort(chunk: object) -> str | None:
    """The server's message when a stream chunk is the error it sends on aborting a generation mid-stream (vLLM:
    `data: {"error": {…}}`, then `[DONE]`); None for any other chunk. The chunks before it are a cut-off answer."""
    if isinstance(chunk, dict) and chunk.get("error") is not None and not chunk.get("choices"):
        return error_message(json.dumps(chunk))
    return None
