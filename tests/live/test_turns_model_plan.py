"""Fast tier (no torch, no server): the turns model's plan (make_tiny_kimi.py `turns`). Every branch of its five
generations is won on the ratios the template's prompts give, by a margin, and the chain test's premises hold: the
second user turn's first prompt breaks the extension (the template drops the finished loop's reasoning), the
others extend the previous prompt + output ids."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from live.make_tiny_kimi import (
    MIN_MARGIN,
    SLOPE_STEP,
    SQUARE_TOOL,
    TURNS_SECOND_USER_BEFORE,
    WEATHER_TOOL,
    extend_tokenizer,
    turns_decisions,
    turns_extends,
    turns_lines,
    turns_markers,
    turns_messages,
    turns_outputs,
    turns_program,
    turns_texts,
)
from tokview.core.kimi_layout import kimi_tokenizer_dir
from tokview.core.tokenizer import load_tokenizer

THINK_OPEN = 163606


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory):
    out = Path(tmp_path_factory.mktemp("turns")) / "tok"
    shutil.copytree(kimi_tokenizer_dir(), out)  # the layout every test shares, built once per machine
    extend_tokenizer(out, turns_texts(), "turns")
    tok, renderer = Tokenizer.from_file(str(out / "tokenizer.json")), load_tokenizer(out)

    def render(messages: list[dict]) -> list[int]:
        return renderer.render(messages, template_kwargs={"tools": [WEATHER_TOOL, SQUARE_TOOL]})

    outputs = turns_outputs(tok)
    return render, outputs, turns_decisions(render, outputs, turns_markers(tok))


def test_each_successor_wins_its_interval_of_the_ratio_by_half_the_gap() -> None:
    lines = turns_lines({10: [0.0], 11: [0.5, 2 / 3], 12: [-0.6], 13: [1.0]})
    for b, xs in {10: [0.0], 11: [0.5, 2 / 3], 12: [-0.6], 13: [1.0]}.items():
        for x in xs:
            value = {c: i + s * x for c, (i, s) in lines.items()}
            winner = value.pop(b)
            assert winner - max(value.values()) >= SLOPE_STEP * (1 / 6) / 2 - 1e-9, (b, x)
    with pytest.raises(SystemExit, match="interleave"):
        turns_lines({1: [0.0, 1.0], 2: [0.5]})


def test_the_five_generations_branch_on_the_planned_ratios_with_a_margin(planned) -> None:
    render, outputs, decisions = planned
    rounds = [xr for a, _, xr, _ in decisions if a == THINK_OPEN]
    assert [round(x, 3) for x in rounds] == [0.0, 0.5, 0.667, -0.6, -0.333]
    *_, worst = turns_program(decisions)
    assert worst >= MIN_MARGIN
    previous: list[int] = []
    for g, out in enumerate(outputs):
        prompt = render(turns_messages(g))
        if g:
            assert turns_extends(previous, prompt) is (g != TURNS_SECOND_USER_BEFORE), g
        previous = prompt + out
