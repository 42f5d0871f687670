"""Failed workers, told the same way everywhere: the app's one `on_worker_state_changed` handler notifies.

Textual posts `Worker.StateChanged` only to the node that started the worker (the message does not bubble),
so screens and widgets that start workers mix in `ForwardsWorkerErrors`: it lets the node react to the
failure in its own place (`worker_failed`: re-enable a button, say it in a panel) and forwards the event
to the app. Workers therefore carry no try/except of their own: an error is raised, never swallowed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from textual.worker import Worker, WorkerState

from tokview.errors import TokviewError, one_line
from tokview.store.sample_rows import UnknownSample

if TYPE_CHECKING:
    from textual.app import App

BUG_TITLE = "unexpected error"
WORDED = (TokviewError, UnknownSample)
"""The failures `failure_notice` words for a person; any other is a bug (its traceback goes to the log)."""


def failure_notice(error: BaseException) -> tuple[str, str]:
    """(title, message) of the notification for a failed worker: a TokviewError's own, else a generic line
    that says it is a bug (the traceback is in the Textual log: `textual console`, then `textual run --dev`)."""
    if isinstance(error, TokviewError):
        return error.title, error.message
    if isinstance(error, UnknownSample):  # the store was replaced, or the sample removed, since the list was read
        return (
            "store",
            f"sample {error.args[0] if error.args else ''} is no longer in the store: ctrl+r reads the list again",
        )
    return BUG_TITLE, f"{one_line(error)} (a bug in tokview; the traceback is in the textual console log)"


def failure_text(error: BaseException) -> str:
    """One line for a panel that shows the failure in place: `server unreachable: …`, `store: …`."""
    if isinstance(error, WORDED):
        return ": ".join(failure_notice(error))
    return one_line(error)


class _NodeInAnApp(Protocol):
    """What the mixin needs of the Screen or Widget it is mixed into."""

    @property
    def app(self) -> App[object]: ...

    def worker_failed(self, worker: Worker[object], error: BaseException) -> bool | None: ...


class ForwardsWorkerErrors:
    """Mixin for a Screen or Widget that starts workers: its failures reach the app's one handler."""

    def worker_failed(self, worker: Worker[object], error: BaseException) -> bool | None:
        """This node's own reaction to a failed worker; True when that says all there is to say (a cancel the
        person asked for: no error to notify), else the app notifies too. The default: nothing, the app notifies."""
        return None

    def on_worker_state_changed(self: _NodeInAnApp, event: Worker.StateChanged) -> None:
        if event.state is not WorkerState.ERROR or event.worker.error is None:
            return
        if not self.worker_failed(event.worker, event.worker.error):
            self.app.post_message(event)
