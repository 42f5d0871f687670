"""The inspect screen's heat key: acceptance run → sampled logprob → target logprob → segments."""

from __future__ import annotations

from ui.helpers import InspectApp

from tokview.core import spec_decode as sd
from tokview.core.analysis import analyze
from tokview.ui import display as d
from tokview.ui.examples import short_capture
from tokview.ui.screens.inspect import InspectData, InspectScreen
from tokview.ui.widgets.token_detail import TokenDetail
from tokview.ui.widgets.token_view import TokenView


def _scored_capture():
    cap = short_capture()
    n = len(cap.output_ids)
    accepted, covered = [], 1
    while covered < n:  # every step drafts 3 and accepts 2: the steps cover the output (last one clamped)
        accepted.append(2)
        covered += 3
    cap.spec_decode = sd.SpecDecode(
        "vllm",
        len(accepted),
        3 * len(accepted),
        sum(accepted),
        per_step_accepted=accepted,
        per_step_drafted=[3] * len(accepted),
        num_spec_tokens=3,
    ).to_dict()
    cap.output_logprobs = [-0.01] * (n - 1) + [-6.0]
    cap.output_top_ids = [[t] for t in cap.output_ids]
    cap.output_top_logprobs = [[lp] for lp in cap.output_logprobs]
    cap.target_logprobs = [-3.0] * n
    return cap


async def test_heat_key_cycles_modes_colours_and_fills_the_detail_panel(tokenizer, profile):
    cap = _scored_capture()
    data = InspectData("s@x_gen0", cap, analyze(cap, profile, tokenizer))
    app = InspectApp(data, tokenizer, profile)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        assert isinstance(screen, InspectScreen)
        served = screen.query_one("#served", TokenView)
        segments = list(served.seq.classes)
        n_prompt = len(cap.prompt_ids)
        last = n_prompt + len(cap.output_ids) - 1
        heat = {d.CLASS_INDEX[name]: level for level, name in enumerate(d.HEAT_CLASSES)}

        await pilot.press("h")  # acceptance run: accepted 2 of 3 everywhere → level 1; prefill uncoloured
        assert screen.heat == "acceptance"
        assert "heat acceptance run" in str(screen.query_one("#served-label").content)
        assert served.seq.classes[:n_prompt] == segments[:n_prompt]
        assert served.seq.classes[n_prompt] == segments[n_prompt]
        assert {heat.get(c) for c in served.seq.classes[n_prompt + 1 :]} == {1}
        served.cursor = n_prompt + 2
        await pilot.pause()
        rows = app.screen.query_one(TokenDetail).rows
        assert rows["acceptance run"].startswith("step 0: 2 of 3 drafts accepted")
        assert rows["logprob"].startswith("-0.0100")
        assert rows["target logprob"].startswith("-3.0000")
        assert rows["sampled top-K"].startswith(f"{cap.output_ids[2]} ")

        await pilot.press("h")  # sampled logprob: the last token is unlikely
        assert heat[served.seq.classes[last]] == 4
        assert heat[served.seq.classes[last - 1]] == 0
        await pilot.press("h")  # target logprob: p = e^-3 ≈ 0.05 → level 3 everywhere
        assert {heat.get(c) for c in served.seq.classes[n_prompt:]} == {3}
        await pilot.press("h")  # back to segments
        assert screen.heat == "segments"
        assert served.seq.classes == segments


async def test_heat_says_unavailable_when_steps_cannot_be_placed(tokenizer, profile):
    cap = short_capture()
    cap.spec_decode = sd.SpecDecode("vllm", 1, 3, 1, per_step_accepted=[1], per_step_drafted=[3]).to_dict()
    data = InspectData("s@x_gen0", cap, analyze(cap, profile, tokenizer))
    app = InspectApp(data, tokenizer, profile)
    async with app.run_test(size=(120, 40)) as pilot:
        served = app.screen.query_one("#served", TokenView)
        before = list(served.seq.classes)
        await pilot.press("h")
        await pilot.pause()
        label = str(app.screen.query_one("#served-label").content)
        assert "unavailable" in label
        assert "not every decode step drafted" in label
        assert served.seq.classes == before  # nothing coloured: never a guess
        await pilot.press("h")  # sampled: none here, said where an 80-column label cannot say it
        await pilot.pause()
        said = [str(n.message) for n in app._notifications]
        assert any(m.startswith("sampled logprob: no logprobs captured") for m in said), said
