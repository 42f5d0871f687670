"""Write an SVG of each screen from the demo data (the README embeds them).

    .venv/bin/python screenshots/make_screenshots.py [--out screenshots] [--size 120x40]

Runs exactly what `tokview demo` runs (two loopback simulators, three batches into a temporary
store), then drives the app headless with Pilot and saves one screenshot per screen.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


async def settle(app, pilot) -> None:
    for _ in range(3):
        await app.workers.wait_for_complete()
        await pilot.pause()


async def shoot(app, out: Path, size: tuple[int, int]) -> list[Path]:
    written: list[Path] = []

    async def save(pilot, name: str, *keys: str) -> None:
        if keys:
            await pilot.press(*keys)
        await settle(app, pilot)
        path = out / f"{name}.svg"
        path.write_text(app.export_screenshot(title=f"tokview · {name.replace('-', ' ')}"), encoding="utf-8")
        written.append(path)

    async with app.run_test(size=size) as pilot:
        await settle(app, pilot)
        lst = app.samples_screen.sample_list
        rows = [lst.row(i) for i in range(lst.count)]
        chat = next(i for i, r in enumerate(rows) if r.run_id == "demo-chat")
        bad_parser = next(i for i, r in enumerate(rows) if "parser_split_mismatch" in r.codes)
        truncated = next(i for i, r in enumerate(rows) if "truncated" in r.codes)
        lst.cursor = chat
        await save(pilot, "samples")
        await save(pilot, "inspect", "enter")
        await save(pilot, "inspect-both", "v", "v")
        await pilot.press("v", "escape")
        lst.cursor = bad_parser
        await save(pilot, "inspect-parser-split", "enter", "f", "down", "down")
        await pilot.press("escape")
        lst.cursor = truncated
        await save(pilot, "inspect-truncated", "enter", "end")
        await save(pilot, "reject", "r")
        await pilot.press("escape", "escape")
        await save(pilot, "generate", "g")
        await pilot.press("escape")
        await save(pilot, "doctor", "D")
        await pilot.press("escape")
        await save(pilot, "stats", "S")
        await pilot.press("escape")
        await save(pilot, "help", "question_mark")
    return written


def main() -> int:
    from tokview.commands.demo import _prompts, fill_store
    from tokview.core.resolve import load_tokenizer_and_profile
    from tokview.sim import SimConfig, start_simulator
    from tokview.store import Store
    from tokview.ui.app import TokviewApp
    from tokview.ui.config import UIConfig
    from tokview.ui.session import Session

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument("--size", default="120x40")
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.lower().split("x"))
    args.out.mkdir(parents=True, exist_ok=True)
    tokenizer, profile = load_tokenizer_and_profile(None, "kimi-k2.5")
    with (
        tempfile.TemporaryDirectory() as tmp,
        start_simulator(SimConfig(kind="vllm")) as current,
        start_simulator(SimConfig(kind="vllm", quirks={"vllm-pre-0.16": True, "parser-all-reasoning": True})) as old,
    ):
        with Store(Path(tmp) / "demo.duckdb") as store:
            prompts, _bad = _prompts(None, 12)
            asyncio.run(
                fill_store(
                    store, prompts, tokenizer=tokenizer, profile=profile, current_url=current.url, old_url=old.url
                )
            )
            session = Session(store, tokenizer=tokenizer, profile=profile, server_url=current.url)
            written = asyncio.run(shoot(TokviewApp(session, UIConfig()), args.out, (width, height)))
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
