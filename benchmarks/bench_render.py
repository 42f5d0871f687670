"""Render benchmark: the Line-API token view and sample list beside a `Static(Text)` baseline.

    .venv/bin/python benchmarks/bench_render.py            # 32,000 tokens, 100,000 samples
    .venv/bin/python benchmarks/bench_render.py --tokens 8000 --samples 20000
    .venv/bin/python benchmarks/bench_render.py --slow-paint 30   # the honesty check: figures must rise

Measures, at 120x40, in one run: a 32,000-token sample's first paint, resize (120→100 cols), scroll
one page, recolour one visible token, move the cursor; then cold start to first paint of the samples
screen with 100,000 samples in a DuckDB store. Each figure is printed beside the same step done with
one `Static(Text)` (one span per token / one line per row), and the ratio. Then the whole app on the
same sample (Enter on the samples list opens the inspect screen; resize; page down; cursor right),
each step beside the bare token view's: what the rest of the screen adds.

The wall figure is what a user waits for: from the input reaching the app (a key press or a terminal
resize, handed over by the driver as a terminal's input thread does) to the write of the first frame
that shows the result. The app runs with a driver that is a terminal in every respect but the screen:
Textual renders each frame to escape sequences and writes it, and the driver stamps each write with the
time. Which frame "shows the result" is decided afterwards, outside the measured interval: every write
is replayed into a small terminal model (cursor moves, colours, cells) and the first frame after the
input whose screen equals the screen once the app has settled is the one. A frame that shows an
intermediate state (old wrap, stale scrollbar) does not count. Pilot's idle pauses only separate steps;
none lies inside a measured interval. Textual's own delays do: a resize waits 1/120 s for the terminal
to stop resizing, and frames are paced at most 60 per second.

Two CPU figures (`time.process_time`, every thread): to the frame (the work that frame cost) and to
idle (anything the app still did after it, plus about 1 ms of Pilot's own wait). "GC in wall" is the
part of the wall figure the garbage collector took (a full collection of this process takes 10-20 ms
and lands wherever the allocation count says; it is in the figures, not left out).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from rich.cells import cell_len
from rich.text import Text
from textual import events
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.drivers.headless_driver import HeadlessDriver
from textual.geometry import Size
from textual.pilot import Pilot
from textual.widgets import Static

from tokview.core.analysis import analyze
from tokview.core.kimi_layout import kimi_tokenizer_dir
from tokview.core.profiles import get_profile
from tokview.core.tokenizer import load_tokenizer
from tokview.ui import display
from tokview.ui.examples import long_capture
from tokview.ui.widgets.token_view import TokenView

SIZE = (120, 40)
BASELINE_STYLES = [
    "dim",
    "bold yellow",
    "cyan",
    "white",
    "bold red",
    "magenta",
    "bold magenta",
    "red",
    "underline yellow",
    "bold underline red",
    "dim",
]


def baseline_text(seq: display.TokenSeq, recoloured: int | None = None) -> Text:
    """elia's approach: one Text, one span per token."""
    text = Text()
    for i, (piece, cls) in enumerate(zip(seq.pieces, seq.classes)):
        style = "reverse" if i == recoloured else BASELINE_STYLES[cls]
        text.append(piece + ("\n" if seq.breaks_after[i] else ""), style)
    return text


# -- the terminal: frames stamped as they are written, replayed into a model afterwards ------------


GC_SPANS: list[tuple[float, float]] = []
"""(start, end) of every garbage collection: how much of a step the collector took."""


def _gc_clock(phase: str, info: dict) -> None:
    if phase == "start":
        GC_SPANS.append((time.perf_counter(), float("inf")))
    else:
        GC_SPANS[-1] = (GC_SPANS[-1][0], time.perf_counter())


def gc_time(start: float, end: float) -> float:
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in GC_SPANS)


@dataclass
class Frame:
    wall: float
    cpu: float
    data: str


class FrameDriver(HeadlessDriver):
    """A terminal that draws nothing but keeps every write, stamped with the wall and CPU clocks.

    Not headless to the app: Textual renders each frame to escape sequences and writes it, as it does
    to a real terminal (the headless driver skips that work).
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.frames: list[Frame] = []

    @property
    def is_headless(self) -> bool:
        return False

    def write(self, data: str) -> None:
        self.frames.append(Frame(time.perf_counter(), time.process_time(), data))

    def deliver(self, event: events.Event) -> None:
        """Hand an input event to the app as a terminal's input thread does."""
        self.process_message(event)


ESCAPE = re.compile(r"\x1b\[([0-9;?<>=]*)([@-~])|\x1b[^\[]|\n|\r|[^\x1b\n\r]+")


class TerminalModel:
    """The cells a terminal would show after the writes so far: character and colour escapes per cell.

    Enough of a VT for what Textual writes (cursor moves, SGR colours, text, line feeds); other
    sequences (cursor visibility, modes) change no cell and are skipped.
    """

    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.cells = [[(" ", "")] * width for _ in range(height)]
        self.x = self.y = 0
        self.sgr = ""

    def resize(self, width: int, height: int) -> None:
        rows = [row[:width] + [(" ", "")] * (width - len(row)) for row in self.cells[:height]]
        self.cells = rows + [[(" ", "")] * width for _ in range(height - len(rows))]
        self.width, self.height = width, height

    def feed(self, data: str) -> None:
        for match in ESCAPE.finditer(data):
            token = match.group(0)
            if token[0] == "\x1b":
                final, params = match.group(2), match.group(1) or ""
                if final == "H":
                    y, _, x = params.partition(";")
                    self.y, self.x = int(y or 1) - 1, int(x or 1) - 1
                elif final == "m":
                    self.sgr = "" if params in ("", "0") else (f"{self.sgr};{params}" if self.sgr else params)
            elif token == "\n":
                self.y, self.x = self.y + 1, 0
            elif token == "\r":
                self.x = 0
            else:
                self._text(token)

    def _text(self, text: str) -> None:
        if not 0 <= self.y < self.height:
            self.x += cell_len(text)
            return
        row, sgr = self.cells[self.y], self.sgr
        for ch in text:
            width = cell_len(ch)
            if width == 0 and self.x > 0:  # a combining character joins the cell before it
                prev = row[self.x - 1]
                row[self.x - 1] = (prev[0] + ch, prev[1])
                continue
            if self.x < self.width:
                row[self.x] = (ch, sgr)
            if width == 2 and self.x + 1 < self.width:
                row[self.x + 1] = ("", sgr)
            self.x += width

    def screen(self) -> tuple[tuple[tuple[str, str], ...], ...]:
        return tuple(tuple(row) for row in self.cells)


def first_showing(frames: list[Frame], mark: int, sizes: dict[int, Size]) -> Frame | None:
    """The first frame at or after `mark` whose screen is the settled screen (the last one).

    `sizes` maps a frame index to the terminal size from that frame on (a resize).
    """
    model = TerminalModel(*sizes[0])
    screens = []
    for i, frame in enumerate(frames):
        if i in sizes:
            model.resize(*sizes[i])
        model.feed(frame.data)
        if i >= mark:
            screens.append((frame, model.screen()))
    if not screens:
        return None
    settled = screens[-1][1]
    return next(frame for frame, screen in screens if screen == settled)


# -- the two apps, driven by the same keys ------------------------------------------------------

STEP_KEYS = [Binding("f5", "page", priority=True), Binding("f6", "recolour", priority=True)]
STEP_KEYS.append(Binding("f7", "move_cursor", priority=True))


class LineApp(App):
    BINDINGS = STEP_KEYS

    def __init__(self, seq: display.TokenSeq) -> None:
        super().__init__(driver_class=FrameDriver)
        self.seq = seq

    def compose(self) -> ComposeResult:
        yield TokenView(self.seq)

    def action_page(self) -> None:
        view = self.query_one(TokenView)
        view.scroll_to(y=view.scroll_y + 40, animate=False)

    def action_recolour(self) -> None:  # a token on a visible row: its row must be rebuilt and repainted
        view = self.query_one(TokenView)
        view.recolour(view.row_starts[int(view.scroll_y) + 5] + 1, display.CLASS_INDEX["drift"])

    def action_move_cursor(self) -> None:  # the old and the new cursor token's rows
        view = self.query_one(TokenView)
        view.cursor = view.row_starts[int(view.scroll_y) + 10]


class StaticApp(App):
    BINDINGS = STEP_KEYS

    def __init__(self, renderable: Text, seq: display.TokenSeq | None = None) -> None:
        super().__init__(driver_class=FrameDriver)
        self.renderable, self.seq = renderable, seq

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(self.renderable, id="static")

    def action_page(self) -> None:
        scroller = self.query_one(VerticalScroll)
        scroller.scroll_to(y=scroller.scroll_y + 40, animate=False)

    def action_recolour(self, offset: int = 0) -> None:  # one Text: a recolour rebuilds it all
        assert self.seq is not None
        self.query_one("#static", Static).update(baseline_text(self.seq, recoloured=len(self.seq) // 2 + offset))

    def action_move_cursor(self) -> None:  # a cursor in one Text is a recolour of the next token
        self.action_recolour(1)


# -- measuring ------------------------------------------------------------------------------------


@dataclass
class Figure:
    wall: float
    """Input → write of the first frame showing the result, seconds."""
    cpu_frame: float
    """CPU from the input to that write."""
    cpu_idle: float
    """CPU from the input until the app is idle again."""
    frames: int
    """Frames written for the step."""
    gc: float
    """Of the wall time, how much the garbage collector took."""


async def settle(pilot: Pilot, driver: FrameDriver) -> None:
    """Wait (workers, then Pilot's idle pauses) until a pause passes without a new frame."""
    for _ in range(20):
        n = len(driver.frames)
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        if len(driver.frames) == n and not any(w.is_running for w in pilot.app.workers):
            return


def press(key: str):
    def deliver(app: App, driver: FrameDriver) -> None:
        driver.deliver(events.Key(key, None))

    return deliver


def resize_to(width: int, height: int):
    def deliver(app: App, driver: FrameDriver) -> None:
        driver._size = (width, height)  # what the terminal now reports
        driver.deliver(events.Resize(Size(width, height), Size(width, height)))

    return deliver


async def measure(app: App, steps) -> dict[str, Figure]:
    """Each step: settle, deliver the input, settle; then find the frame that showed the result."""
    out: dict[str, Figure] = {}
    sizes = {0: Size(*SIZE)}
    t0, c0 = time.perf_counter(), time.process_time()
    async with app.run_test(headless=False, size=SIZE) as pilot:
        driver = app._driver
        assert isinstance(driver, FrameDriver)
        await settle(pilot, driver)
        marks = [("first paint", 0, t0, c0, time.process_time())]
        for name, deliver in steps:
            await settle(pilot, driver)
            mark = len(driver.frames)
            t0, c0 = time.perf_counter(), time.process_time()
            deliver(app, driver)
            if driver._size != tuple(sizes[max(sizes)]):
                sizes[mark] = Size(*driver._size)
            await settle(pilot, driver)
            marks.append((name, mark, t0, c0, time.process_time()))
        frames = list(driver.frames)
    ends = [m[1] for m in marks[1:]] + [len(frames)]
    for (name, mark, t0, c0, c_idle), end in zip(marks, ends):
        frame = first_showing(frames[:end], mark, sizes)
        if frame is None:
            raise SystemExit(f"{name}: no frame was painted after the input")
        out[name] = Figure(frame.wall - t0, frame.cpu - c0, c_idle - c0, end - mark, gc_time(t0, frame.wall))
    return out


async def bench_app(capture, analysis, tokenizer, profile) -> dict[str, Figure]:
    """The whole app on the same sample: the samples list, Enter opens the inspect screen (both panes,
    detail panel, findings, footer), then the same resize, a page and a cursor move by their keys."""
    from tokview.store import Store
    from tokview.ui.app import TokviewApp
    from tokview.ui.session import Session

    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "app.duckdb") as store:
        store.put_sample("long@bench_gen0", "long", "bench", capture, analysis)
        app = TokviewApp(Session(store, tokenizer=tokenizer, profile=profile))
        app.driver_class = FrameDriver
        steps = [
            ("open (enter)", press("enter")),
            ("resize 120→100", resize_to(100, 40)),
            ("page down", press("pagedown")),
            ("cursor right", press("right")),
        ]
        return await measure(app, steps)


def slow_paint(ms: float) -> None:
    """The honesty check: every TokenView paint sleeps `ms` more; every Line-API figure must rise."""
    original = TokenView.render_lines

    def render_lines(self, crop):
        time.sleep(ms / 1000)
        return original(self, crop)

    TokenView.render_lines = render_lines  # type: ignore[method-assign]


async def bench_tokens(n_tokens: int) -> tuple[dict, dict, dict, int]:
    tokenizer, profile = load_tokenizer(kimi_tokenizer_dir()), get_profile("kimi-k2.5")
    capture = long_capture(tokenizer, n_tokens)
    analysis = analyze(capture, profile, tokenizer)
    seq = display.served_seq(capture, analysis, tokenizer)
    steps = [
        ("resize 120→100", resize_to(100, 40)),
        ("scroll a page", press("f5")),
        ("recolour 1 token", press("f6")),
        ("move the cursor", press("f7")),
    ]
    line = await measure(LineApp(seq), steps)
    static = await measure(StaticApp(baseline_text(seq), seq), steps)
    whole = await bench_app(capture, analysis, tokenizer, profile)
    return line, static, whole, len(seq)


def build_store(path: Path, n: int) -> None:
    """n light sample rows written in one SQL statement (the benchmark needs rows, not captures)."""
    from tokview.store import Store

    with Store(path) as store:
        store.execute(
            "INSERT INTO samples (sample_id, prompt_id, run_id, prompt_ids, output_ids, finish_reason, status, "
            "valid, n_errors, codes, prompt_len, output_len, supervised, created_at) "
            "SELECT printf('p%06d@bench_gen0', i), printf('p%06d', i), 'bench', [1, 2, 3], [4, 5, 6], "
            "CASE WHEN i % 7 = 0 THEN 'length' ELSE 'stop' END, 'pending', i % 7 <> 0, "
            "CASE WHEN i % 7 = 0 THEN 1 ELSE 0 END, "
            "CASE WHEN i % 7 = 0 THEN ['truncated', 'think_close_missing'] ELSE ['parser_hidden_ids'] END, "
            "28, 100 + i % 5000, 100 + i % 5000, TIMESTAMP '2026-01-01' + INTERVAL (i) SECOND "
            "FROM range(?) t(i)",
            [n],
        )


async def bench_samples(n: int) -> tuple[Figure, Figure]:
    from tokview.store import Store
    from tokview.ui.app import TokviewApp
    from tokview.ui.session import Session

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.duckdb"
        build_store(db, n)
        with Store(db) as store:
            app = TokviewApp(Session(store, profile_name="kimi-k2.5"))
            app.driver_class = FrameDriver
            line = await cold_start(
                app, lambda: app.samples_screen is not None and app.samples_screen.sample_list.row(0) is not None
            )
            rows = store.samples_page(None, "created_at", 0, n)
        text = Text(
            "\n".join(
                f"·  {'✓' if r.valid else '✗'}  {r.finish_reason:<8}{r.prompt_len:>6} {r.output_len:>6} "
                f"{r.sample_id}  {' '.join(r.codes)}"
                for r in rows
            )
        )
        static = await cold_start(StaticApp(text), lambda: True)
    return line, static


async def cold_start(app: App, loaded) -> Figure:
    """From starting the app to the first frame that shows the settled first page."""
    t0, c0 = time.perf_counter(), time.process_time()
    async with app.run_test(headless=False, size=SIZE) as pilot:
        driver = app._driver
        assert isinstance(driver, FrameDriver)
        while not loaded():
            await pilot.pause(0.005)
        await settle(pilot, driver)
        c_idle = time.process_time()
        frames = list(driver.frames)
    frame = first_showing(frames, 0, {0: Size(*SIZE)})
    assert frame is not None, "the app painted nothing"
    return Figure(frame.wall - t0, frame.cpu - c0, c_idle - c0, len(frames), gc_time(t0, frame.wall))


def report(title: str, line: dict[str, Figure], static: dict[str, Figure]) -> None:
    print(f"\n{title}")
    print(
        f"  {'':<18}{'wall: input → frame shown':^36}{'CPU to that frame':^24}{'CPU to idle':^24}"
        f"{'GC in wall':^24}{'frames':>8}"
    )
    print(f"  {'step':<18}{'Line API':>12}{'Static(Text)':>14}{'ratio':>10}" + f"{'Line API':>12}{'Static':>12}" * 3)
    for step, a in line.items():
        b = static[step]
        print(
            f"  {step:<18}{a.wall * 1e3:>10.1f}ms{b.wall * 1e3:>12.1f}ms{b.wall / max(a.wall, 1e-6):>9.1f}×"
            + "".join(f"{x * 1e3:>10.1f}ms" for x in (a.cpu_frame, b.cpu_frame, a.cpu_idle, b.cpu_idle, a.gc, b.gc))
            + f"{a.frames:>5}/{b.frames}"
        )


def report_app(whole: dict[str, Figure], line: dict[str, Figure]) -> None:
    """The app's figures beside the bare token view's same step (the rest of the screen's cost)."""
    print("\nthe whole app, same sample: inspect screen (two panes, detail, findings, footer)")
    print(
        f"  {'step':<18}{'app wall':>12}{'bare view':>12}{'ratio':>9}{'CPU to frame':>14}{'CPU to idle':>13}"
        f"{'GC in wall':>12}{'frames':>8}"
    )
    same = {"open (enter)": "first paint", "resize 120→100": "resize 120→100", "page down": "scroll a page"}
    same["cursor right"] = "move the cursor"
    for step, b_name in same.items():
        a, b = whole[step], line[b_name]
        print(
            f"  {step:<18}{a.wall * 1e3:>10.1f}ms{b.wall * 1e3:>10.1f}ms{a.wall / max(b.wall, 1e-6):>8.1f}×"
            f"{a.cpu_frame * 1e3:>12.1f}ms{a.cpu_idle * 1e3:>11.1f}ms{a.gc * 1e3:>10.1f}ms{a.frames:>8}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=32_000)
    parser.add_argument("--samples", type=int, default=100_000)
    parser.add_argument("--slow-paint", type=float, default=0, metavar="MS", help="add MS to every token-view paint")
    args = parser.parse_args()
    if args.slow_paint:
        slow_paint(args.slow_paint)
    gc.callbacks.append(_gc_clock)
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; targets: recolour < 10 ms, resize < 50 ms")
    line, static, whole, n = asyncio.run(bench_tokens(args.tokens))
    report(f"token view, {n:,} tokens (prompt + output), {SIZE[0]}x{SIZE[1]}", line, static)
    report_app(whole, line)
    list_line, list_static = asyncio.run(bench_samples(args.samples))
    report(
        f"cold start to first paint of the samples list, {args.samples:,} samples in DuckDB",
        {"cold start": list_line},
        {"cold start": list_static},
    )


if __name__ == "__main__":
    main()
