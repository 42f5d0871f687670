"""Render benchmark: the Line-API token view and sample list beside a `Static(Text)` baseline.

    .venv/bin/python benchmarks/bench_render.py            # 32,000 tokens, 100,000 samples
    .venv/bin/python benchmarks/bench_render.py --tokens 8000 --samples 20000

Measures, headless at 120x40, in one run: a 32,000-token sample's first paint, resize (120→100 cols),
scroll one page, recolour one visible token, move the cursor one token; then cold start to first
paint of the samples screen with 100,000 samples in a DuckDB store. Each figure is printed beside
the same step done with one `Static(Text)` (one span per token / one line per row), and the ratio.

Two clocks per step. Wall time includes Pilot's `pause()`, which sleeps until the process has been
idle for one 20 ms window: a step that does nothing (the `idle pause` row) already takes ~21 ms, and a
resize takes two pauses. CPU time (`time.process_time`, every thread of the process) is the work the
app did for the step — layout, wrapping, strips, compositing — with the idle sleeps left out; it is
the figure the targets are set on (recolour < 10 ms, resize < 50 ms) and is steadier on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from rich.text import Text
from textual.app import App, ComposeResult
from textual.containers import VerticalScroll
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


class LineApp(App):
    def __init__(self, seq: display.TokenSeq) -> None:
        super().__init__()
        self.seq = seq

    def compose(self) -> ComposeResult:
        yield TokenView(self.seq)


class StaticApp(App):
    def __init__(self, renderable: Text) -> None:
        super().__init__()
        self.renderable = renderable

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(self.renderable, id="static")


async def time_steps(app: App, steps) -> dict[str, tuple[float, float]]:
    """(wall, CPU) seconds per step, each step followed by one `pilot.pause()`."""
    out: dict[str, tuple[float, float]] = {}
    t0, c0 = time.perf_counter(), time.process_time()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        out["first paint"] = (time.perf_counter() - t0, time.process_time() - c0)
        for name, step in [("idle pause", idle), *steps]:
            t, c = time.perf_counter(), time.process_time()
            await step(app, pilot)
            await pilot.pause()
            out[name] = (time.perf_counter() - t, time.process_time() - c)
    return out


async def idle(app, pilot) -> None:
    """No change at all: what Pilot's pause costs by itself (the floor under every wall figure)."""


async def bench_tokens(n_tokens: int) -> tuple[dict, dict, int]:
    tokenizer, profile = load_tokenizer(kimi_tokenizer_dir()), get_profile("kimi-k2.5")
    capture = long_capture(tokenizer, n_tokens)
    seq = display.served_seq(capture, analyze(capture, profile, tokenizer), tokenizer)
    target = len(seq) // 2

    async def resize(app, pilot):
        await pilot.resize_terminal(100, 40)

    async def line_scroll(app, pilot):
        view = app.query_one(TokenView)
        view.scroll_to(y=view.scroll_y + 40, animate=False)

    async def line_recolour(app, pilot):  # a token on a visible row: its row must be rebuilt and repainted
        view = app.query_one(TokenView)
        view.recolour(view.row_starts[int(view.scroll_y) + 5] + 1, display.CLASS_INDEX["drift"])

    async def line_cursor(app, pilot):  # the old and the new cursor token's rows
        view = app.query_one(TokenView)
        view.cursor = view.row_starts[int(view.scroll_y) + 10]

    async def static_scroll(app, pilot):
        scroller = app.query_one(VerticalScroll)
        scroller.scroll_to(y=scroller.scroll_y + 40, animate=False)

    async def static_recolour(app, pilot):
        app.query_one("#static", Static).update(baseline_text(seq, recoloured=target))

    line = await time_steps(
        LineApp(seq),
        [
            ("resize 120→100", resize),
            ("scroll a page", line_scroll),
            ("recolour 1 token", line_recolour),
            ("move the cursor", line_cursor),
        ],
    )
    static = await time_steps(
        StaticApp(baseline_text(seq)),
        [
            ("resize 120→100", resize),
            ("scroll a page", static_scroll),
            ("recolour 1 token", static_recolour),
            ("move the cursor", static_recolour),  # a cursor in one Text is a recolour: rebuild it all
        ],
    )
    return line, static, len(seq)


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


async def bench_samples(n: int) -> tuple[tuple[float, float], tuple[float, float]]:
    from tokview.store import Store
    from tokview.ui.app import TokviewApp
    from tokview.ui.session import Session

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.duckdb"
        build_store(db, n)
        with Store(db) as store:
            session = Session(store, profile_name="kimi-k2.5")
            app = TokviewApp(session)
            t0, c0 = time.perf_counter(), time.process_time()
            async with app.run_test(size=SIZE) as pilot:
                while app.samples_screen is None or app.samples_screen.sample_list.row(0) is None:
                    await pilot.pause(0.005)
                await pilot.pause()
                line = (time.perf_counter() - t0, time.process_time() - c0)
            rows = store.samples_page(None, "created_at", 0, n)
        text = Text(
            "\n".join(
                f"·  {'✓' if r.valid else '✗'}  {r.finish_reason:<8}{r.prompt_len:>6} {r.output_len:>6} "
                f"{r.sample_id}  {' '.join(r.codes)}"
                for r in rows
            )
        )
        t0, c0 = time.perf_counter(), time.process_time()
        async with StaticApp(text).run_test(size=SIZE) as pilot:
            await pilot.pause()
            static = (time.perf_counter() - t0, time.process_time() - c0)
    return line, static


def report(title: str, line: dict, static: dict) -> None:
    print(f"\n{title}")
    print(f"  {'':<20}{'wall (with Pilot pause)':^38}{'CPU (the work)':^38}")
    print(f"  {'step':<20}" + f"{'Line API':>12}{'Static(Text)':>16}{'ratio':>10}" * 2)
    for step in line:
        cols = ""
        for k in (0, 1):
            a, b = line[step][k] * 1000, static[step][k] * 1000
            cols += f"{a:>10.1f}ms{b:>14.1f}ms{b / max(a, 1e-3):>9.1f}×"
        print(f"  {step:<20}{cols}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=32_000)
    parser.add_argument("--samples", type=int, default=100_000)
    args = parser.parse_args()
    line, static, n = asyncio.run(bench_tokens(args.tokens))
    report(f"token view, {n:,} tokens (prompt + output), {SIZE[0]}x{SIZE[1]}", line, static)
    list_line, list_static = asyncio.run(bench_samples(args.samples))
    report(
        f"cold start to first paint of the samples list, {args.samples:,} samples in DuckDB",
        {"cold start": list_line},
        {"cold start": list_static},
    )


if __name__ == "__main__":
    main()
