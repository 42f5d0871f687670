"""Inside a sample: go to a position, an id or a text; copy the sample id and the token; j/k; the view mode
and auto-advance across samples."""

from __future__ import annotations

from facts import THINK_CLOSE
from ui.helpers import InspectApp, open_first, settle

from tokview.ui import goto
from tokview.ui.display import served_seq
from tokview.ui.screens.inspect import InspectData
from tokview.wording import plural


def test_goto_parses_positions_ids_and_text():
    assert goto.parse("120") == goto.Target("position", "120")
    assert goto.parse("#163607") == goto.Target("id", "163607")
    assert goto.parse("id 163607") == goto.Target("id", "163607")
    assert goto.parse("let me") == goto.Target("text", "let me")
    assert goto.parse("  ") is None
    assert goto.parse("²") == goto.Target("text", "²")  # a digit int() refuses: the app exited with a ValueError


def test_goto_finds_ids_and_text_after_the_cursor_round_to_the_start(short, tokenizer):
    seq = served_seq(*short, tokenizer)
    close = seq.ids.index(THINK_CLOSE)
    assert goto.find(seq, goto.Target("id", str(THINK_CLOSE)), 0) == close
    assert goto.find(seq, goto.Target("id", str(THINK_CLOSE)), close) == close  # round: the cursor's own last
    assert goto.find(seq, goto.Target("position", "5"), 0) == 5
    assert goto.find(seq, goto.Target("position", str(len(seq))), 0) is None
    hit = goto.find(seq, goto.Target("text", "let me"), 0)
    assert hit is not None
    assert "let" in seq.pieces[hit].lower()
    assert goto.find(seq, goto.Target("text", "no such words"), 0) is None


async def _inspect(short, tokenizer, profile, size=(100, 30)):
    capture, analysis = short
    app = InspectApp(InspectData("s1@run-a", capture, analysis), tokenizer, profile)
    return app


async def test_colon_goes_to_an_id_then_a_position_then_a_text(short, tokenizer, profile):
    app = await _inspect(short, tokenizer, profile)
    seq = served_seq(*short, tokenizer)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        screen = app.screen
        for query, expected in (
            (f"#{THINK_CLOSE}", seq.ids.index(THINK_CLOSE)),
            ("3", 3),
            ("carefully", next(i for i, p in enumerate(seq.pieces) if "carefully" in p)),
        ):
            await pilot.press("colon")
            await pilot.pause()
            field = app.screen.query_one("#modal-input")
            field.value = query
            await pilot.press("enter")
            await pilot.pause()
            assert app.screen is screen
            assert screen.served.cursor == expected, query


async def test_c_copies_the_sample_id_and_shift_c_the_token(short, tokenizer, profile):
    app = await _inspect(short, tokenizer, profile)
    seq = served_seq(*short, tokenizer)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        await pilot.press("c")
        assert app.clipboard == "s1@run-a"
        app.screen.served.cursor = seq.ids.index(THINK_CLOSE)
        await pilot.press("C")
        assert app.clipboard == "</think>"


async def test_j_and_k_move_the_token_cursor_a_row(short, tokenizer, profile):
    app = await _inspect(short, tokenizer, profile)
    async with app.run_test(size=(60, 30)) as pilot:
        await pilot.pause()
        view = app.screen.served
        view.cursor = 0
        await pilot.press("j")
        below = view.cursor
        assert below > 0
        await pilot.press("k")
        assert view.cursor == 0


def test_counts_agree_with_their_nouns():
    assert plural(1, "position") == "1 position"
    assert plural(2, "position") == "2 positions"
    assert plural(1204, "sample") == "1,204 samples"


async def test_the_view_mode_stays_as_chosen_from_sample_to_sample(make_app):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("enter")
        await settle(app, pilot)
        await pilot.press("v")
        assert app.screen.served.mode == "ids"
        await pilot.press("escape", "down", "enter")
        await settle(app, pilot)
        assert app.screen.data.sample_id == "p001@demo_gen0"
        assert app.screen.served.mode == "ids"


async def test_auto_advance_opens_the_next_pending_sample_after_a_verdict(make_app, store):
    from tokview.ui.config import UIConfig

    app = make_app(UIConfig(auto_advance=True))
    async with app.run_test(size=(120, 40)) as pilot:
        assert await open_first(app, pilot, past=1) == "p001@demo_gen0"
        await pilot.press("r")
        await settle(app, pilot)
        await pilot.press("enter")  # the first reason
        await settle(app, pilot)
        assert store.load_sample("p001@demo_gen0").status == "rejected"
        assert app.screen.data.sample_id == "p002@demo_gen0"
        await pilot.press("n")  # a note does not advance
        await settle(app, pilot)
        app.screen.query_one("#modal-input").value = "fine"
        await pilot.press("enter")
        await settle(app, pilot)
        assert app.screen.data.sample_id == "p002@demo_gen0"
        await pilot.press("greater_than_sign")  # off: a verdict stays
        await pilot.press("r")
        await settle(app, pilot)
        await pilot.press("enter")
        await settle(app, pilot)
        assert app.screen.data.sample_id == "p002@demo_gen0"
        assert app.config.auto_advance is False


async def test_auto_advance_moves_on_from_a_sample_that_had_the_verdict_already(make_app, store):
    """Approving an approved sample records nothing; with auto-advance it still moves on, as a reviewer pressing
    `a` down the samples expects (it stayed put)."""
    from tokview.ui.config import UIConfig

    store.record_verdict("p001@demo_gen0", "approved")
    app = make_app(UIConfig(auto_advance=True))
    async with app.run_test(size=(120, 40)) as pilot:
        assert await open_first(app, pilot, past=1) == "p001@demo_gen0"
        await pilot.press("a")
        await settle(app, pilot)
        assert app.screen.data.sample_id == "p002@demo_gen0"
    assert len(store.load_sample("p001@demo_gen0").history) == 1


def test_auto_advance_is_read_from_the_config(tmp_path):
    from tokview.errors import TokviewError
    from tokview.ui.config import load_config

    path = tmp_path / "config.toml"
    path.write_text("[ui]\nauto_advance = true\n")
    assert load_config(path).auto_advance is True
    path.write_text('[ui]\nauto_advance = "yes"\n')
    try:
        load_config(path)
    except TokviewError as exc:
        assert "auto_advance must be true or false" in str(exc)
    else:
        raise AssertionError("a non-boolean auto_advance was accepted")
