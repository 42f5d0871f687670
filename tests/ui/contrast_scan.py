"""Contrast of everything a screen paints, as a terminal shows it: truecolor, and quantised to 256 colours.

Why from the compositor's strips and not from the CSS: what a reader sees is the painted cell, after
translucent backgrounds are blended, `dim` is turned into a colour (Textual's DimFilter) and, in a
256-colour terminal, both colours are rounded to the xterm palette by Rich. A style read from one
widget's CSS misses all three (the tester measured 1.7:1 on a cell whose CSS said nothing wrong).
"""

from __future__ import annotations

from rich.color import Color, ColorSystem
from rich.style import Style
from textual.filter import dim_style

AA = 4.5


def luminance(color: Color) -> float:
    r, g, b = color.get_truecolor()

    def channel(byte: int) -> float:
        c = byte / 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    return 0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b)


def ratio(fg: Color, bg: Color) -> float:
    a, b = sorted((luminance(fg), luminance(bg)), reverse=True)
    return (a + 0.05) / (b + 0.05)


def painted(style: Style, background: Color, palette_256: bool) -> tuple[Color, Color]:
    """The foreground and background a terminal shows for `style`."""
    if style.dim:
        style = dim_style(style, background, 0.5)
    fg, bg = style.color or Color.default(), style.bgcolor or background
    if fg.is_default:
        fg = Color.parse("#ffffff") if luminance(bg) < 0.2 else Color.parse("#000000")
    if style.reverse:
        fg, bg = bg, fg
    if palette_256:
        fg, bg = fg.downgrade(ColorSystem.EIGHT_BIT), bg.downgrade(ColorSystem.EIGHT_BIT)
    return fg, bg


GRAPHICS = set("▀▄▁▂▃▄▅▆▇█▔▕▏▎▍▌▋▊▉━─│┃╸╺╴╶▐ ")
"""Drawn lines (borders, bars, scrollbars): no text to read."""


def disabled_regions(app) -> list:
    """Where disabled widgets are painted: WCAG 1.4.3 exempts inactive controls (a Cancel with nothing to cancel)."""
    return [w.region for w in app.screen.walk_children() if w.disabled and w.region]


def low_contrast(app, palette_256: bool = False, minimum: float = AA, region=None) -> list[tuple[int, str, float]]:
    """(row, text, ratio) of every painted run of text under `minimum` on the app's current screen, or inside
    `region` of it (a dialog: the screen under a modal shows through dimmed on purpose); disabled widgets'
    cells are left out."""
    from rich.cells import cell_len
    from textual.geometry import Offset

    exempt = disabled_regions(app)
    from textual.color import Color as TColor

    background = TColor.parse(app.current_theme.background or "#000000").rich_color
    low = []
    for y, strip in enumerate(app.screen._compositor.render_strips()):
        x = 0
        if region is not None:
            if not region.y <= y < region.bottom:
                continue
            strip = strip.crop(region.x, region.right)
            x = region.x
        for segment in strip:
            at, x = x, x + cell_len(segment.text)
            if any(r.contains_point(Offset(at, y)) for r in exempt):
                continue
            text = segment.text.strip()
            if not text or segment.style is None or set(text) <= GRAPHICS:
                continue
            fg, bg = painted(segment.style, background, palette_256)
            r = ratio(fg, bg)
            if r < minimum:
                low.append((y, text[:20], round(r, 2)))
    return low
