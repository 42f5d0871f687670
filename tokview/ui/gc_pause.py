"""While token views are on screen, full garbage collections skip what was alive when their screen opened.

Why: a full collection walks every container the process holds (the tokenizer's vocabularies, the
sample's per-token arrays, every imported module's objects): 10-20 ms in bench_render's bare view and
about 250 ms in the whole app, landing in whatever frame allocates next. Opening a sample makes enough
new objects that one such collection follows each open, in the open itself or in one of the next
frames (measured inside resizes, 100-330 ms). So the open pays for it at a moment of our choosing: after
the screen's first frame, one collection runs (while the user reads) and what is left is frozen
(`gc.freeze`: later collections skip it; reference counting still frees whatever stops being used).
The next screen that opens views unfreezes first, so its collection also frees what died meanwhile
(a closed screen's widgets, which are cycles); when the last view closes everything goes back to the
collector as before. One collection per screen however many panes it has.
"""

from __future__ import annotations

import gc

_views: dict[int, int] = {}
"""Open token views per screen (by id)."""


def collect_and_freeze() -> None:
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def view_opened(screen: object) -> None:
    """A token view on `screen` painted its first frame; the screen's first one collects and freezes."""
    key = id(screen)
    if key not in _views:
        collect_and_freeze()
    _views[key] = _views.get(key, 0) + 1


def view_closed(screen: object) -> None:
    """A token view left `screen`; when no view is left anywhere, nothing stays frozen."""
    key = id(screen)
    if key in _views:
        _views[key] -= 1
        if not _views[key]:
            del _views[key]
    if not _views:
        gc.unfreeze()
