"""Every colour pair tokview uses for text reaches WCAG AA (4.5:1) in both themes the app switches between.

Measured on the styles the widgets really paint with (component classes blended over their background),
for every token style class, alternate shading, cursor (focused and not) and finding marks, and for the
sample list's rows, badges and cursor.
"""

from __future__ import annotations

import itertools

import pytest
from rich.color import Color
from rich.style import Style
from ui import contrast_scan as scan
from ui.helpers import InspectApp, settle

from tokview.ui.display import STYLE_CLASSES
from tokview.ui.screens.inspect import InspectData

THEMES = ("textual-dark", "textual-light")
PALETTES = (False, True)
"""Painted in truecolor, and in 256 colours (`palette_256`)."""
AA = 4.5


def luminance(color: Color) -> float:
    r, g, b = color.get_truecolor()

    def channel(byte: int) -> float:
        c = byte / 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    return 0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b)


def contrast(style: Style) -> float:
    assert style.color is not None, style
    assert style.bgcolor is not None, style
    a, b = sorted((luminance(style.color), luminance(style.bgcolor)), reverse=True)
    return (a + 0.05) / (b + 0.05)


def test_the_contrast_formula_matches_wcag():
    assert contrast(Style(color="#000000", bgcolor="#ffffff")) == pytest.approx(21.0)
    assert contrast(Style(color="#777777", bgcolor="#ffffff")) == pytest.approx(4.48, abs=0.01)


@pytest.mark.parametrize("theme", THEMES)
async def test_token_panes_reach_aa(theme, short, tokenizer, profile):
    capture, analysis = short
    app = InspectApp(InspectData("s1", capture, analysis), tokenizer, profile)
    async with app.run_test(size=(120, 40)) as pilot:
        app.theme = theme
        await pilot.pause()
        low = []
        for view in (app.screen.served, app.screen.kept):
            for focused in (True, False):
                (view.focus() if focused else app.screen.query_one("#findings").focus())
                await pilot.pause()
                view.notify_style_update()  # styles are cached per focus state
                for cls, name in enumerate(STYLE_CLASSES):
                    if name == "empty":
                        continue  # blank cells (prompt positions in the right pane): no text to read
                    for alt in (False, True):
                        for cursor in (False, True):
                            for mark, palette_256 in itertools.product((False, True), PALETTES):
                                style = view.cell_style(cls, alt=alt, cursor=cursor, mark=mark)
                                ratio = scan.ratio(*scan.painted(style, style.bgcolor, palette_256))
                                if ratio < AA:
                                    low.append(
                                        (view.id, focused, name, alt, cursor, mark, palette_256, round(ratio, 2))
                                    )
        assert not low, low


@pytest.mark.parametrize("theme", THEMES)
async def test_sample_list_rows_reach_aa_as_painted(theme, make_app, store):
    """Every segment of every painted row (header, verdict colours, invalid marks, badges), with the cursor
    on each row in turn, focused and not."""
    store.record_verdict("p001@demo_gen0", "approved")
    store.record_verdict("p002@demo_gen0", "rejected", reason="duplicate")
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        app.theme = theme
        await settle(app, pilot)
        lst = app.screen.sample_list
        low = set()
        for focused in (True, False):
            (lst.focus() if focused else app.screen.query_one("#search").focus())
            await pilot.pause()
            for cursor in range(6):
                lst.cursor = cursor
                lst.notify_style_update()  # painted rows are cached
                for y in range(8):
                    for seg in lst.render_line(y):
                        if seg.text.strip() and contrast(seg.style) < AA:
                            low.add((focused, cursor == y - 1, seg.text.strip()[:12], round(contrast(seg.style), 2)))
        title = app.screen.query_one("#samples-title")
        if contrast(title.rich_style) < AA:
            low.add(("samples-title", round(contrast(title.rich_style), 2)))
        assert not low, sorted(low, key=str)[:10]


# -- every painted cell of a screen, truecolor and 256 colours (tests/ui/contrast_scan.py) -------------------
def _low_in_both_palettes(app, region=None) -> set:
    """`low_contrast` of the screen as painted in truecolor and in 256 colours (one render, read both ways: an app
    per palette only doubled the app starts)."""
    from ui.contrast_scan import low_contrast

    return {
        (palette_256, *entry) for palette_256 in PALETTES for entry in low_contrast(app, palette_256, region=region)
    }


async def _open_inspect(app, pilot, theme: str) -> None:
    """Opened in the dark theme, then switched: the title and findings must follow a theme change."""
    await settle(app, pilot)
    for key in ("down", "enter"):
        await pilot.press(key)
        await settle(app, pilot)
    app.theme = theme
    await settle(app, pilot)


@pytest.mark.parametrize("theme", THEMES)
async def test_inspect_screen_reaches_aa_as_painted(theme, make_app, store):
    """Title, review line, pane labels, tokens, detail panel, footer keys, and each finding highlighted in turn
    (the info label on a highlighted finding measured 1.7:1)."""
    store.add_note("p001@demo_gen0", "looks fine", who="tester", tags=("math",))
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await _open_inspect(app, pilot, theme)
        low = _low_in_both_palettes(app)
        findings = app.screen.query_one("#findings")
        findings.focus()
        for index in range(findings.option_count):
            findings.highlighted = index
            await pilot.pause()
            low |= _low_in_both_palettes(app)
        assert not low, sorted(low)[:12]


@pytest.mark.parametrize("theme", THEMES)
@pytest.mark.parametrize("key", ["question_mark", "S"], ids=["help", "stats"])
async def test_panels_reach_aa_as_painted(theme, key, make_app, store):
    store.record_verdict("p001@demo_gen0", "approved")
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        app.theme = theme
        await settle(app, pilot)
        await pilot.press(key)
        await settle(app, pilot)
        region = app.screen.query_one("#help").region if key == "question_mark" else None
        low = _low_in_both_palettes(app, region=region)
        assert not low, sorted(low)[:12]


@pytest.mark.parametrize("theme", THEMES)
async def test_compare_screen_reaches_aa_as_painted(theme, make_app, store, tokenizer, profile):
    from ui.helpers import add_sibling

    add_sibling(store, tokenizer, profile)
    app = make_app()
    async with app.run_test(size=(120, 30)) as pilot:
        await _open_inspect(app, pilot, theme)
        await pilot.press("d")
        await settle(app, pilot)
        assert app.screen.__class__.__name__ == "CompareScreen"
        low = _low_in_both_palettes(app)
        assert not low, sorted(low)[:12]


KNOWN_LOW: dict[tuple, str] = {}
"""Measured contrast failures left as strict expected failures until fixed (none left: the doctor's failure line
and the list's light badges were fixed in their files)."""


@pytest.mark.parametrize("theme", THEMES)
@pytest.mark.parametrize(
    "keys", [(), ("g",), ("D",), ("r",), ("n",)], ids=["samples", "generate", "doctor", "reject", "note"]
)
async def test_other_screens_reach_aa_as_painted(theme, keys, make_app, store, request):
    """The samples screen, the generate and doctor panels and the curation dialogs (a dialog: inside its frame)."""
    known = KNOWN_LOW.get((keys, theme))
    if known:  # strict: once fixed, this flags itself to be removed
        request.applymarker(pytest.mark.xfail(strict=True, reason=known))

    store.record_verdict("p001@demo_gen0", "approved")
    app = make_app(server_url="http://127.0.0.1:9")
    async with app.run_test(size=(120, 40)) as pilot:
        app.theme = theme
        await settle(app, pilot)
        for key in keys:
            await pilot.press(key)
            await settle(app, pilot)
        dialog = app.screen.query(".modal")
        low = _low_in_both_palettes(app, region=dialog.first().region if dialog else None)
        assert not low, sorted(low)[:12]
