"""A finding with several positions is stepped through, not only its first position shown."""

from __future__ import annotations

from textual.widgets import OptionList
from ui.helpers import settle

from tokview.ui.screens.inspect import InspectScreen


async def _open(app, pilot, row: int) -> InspectScreen:
    await settle(app, pilot)
    for _ in range(row):
        await pilot.press("down")
    await pilot.press("enter")
    await settle(app, pilot)
    assert isinstance(app.screen, InspectScreen)
    return app.screen


def _choose(screen: InspectScreen, code: str) -> None:
    findings = screen.query_one("#findings", OptionList)
    wanted = next(i for i, f in enumerate(screen.data.analysis.findings) if f.code == code)
    findings.focus()
    findings.highlighted = findings.get_option_index(f"finding-{wanted}")


async def test_repeated_enter_steps_through_every_position_of_a_finding(make_app):
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await _open(app, pilot, 1)  # p001: parser_hidden_ids at 37 and 45
        hidden = next(f for f in screen.data.analysis.findings if f.code == "parser_hidden_ids")
        assert hidden.positions == (37, 45)
        _choose(screen, "parser_hidden_ids")
        await pilot.press("enter")
        assert screen.served.cursor == 37
        assert screen.focused is screen.served
        await pilot.press("enter")  # from the served pane: the chosen finding's next position
        assert screen.served.cursor == 45
        await pilot.press("enter")  # past the last: round to the first
        assert screen.served.cursor == 37
        await pilot.press("N")
        assert screen.served.cursor == 45
        await pilot.press("P", "P")
        assert screen.served.cursor == 45
        _choose(screen, "parser_hidden_ids")
        await pilot.press("enter")  # enter on the same finding in the list goes on too
        assert screen.served.cursor == 37


async def test_a_finding_with_one_position_stays_on_it_and_says_which(make_app):
    app = make_app()
    notes: list = []
    async with app.run_test(size=(120, 40), message_hook=notes.append) as pilot:
        screen = await _open(app, pilot, 1)
        retok = next(f for f in screen.data.analysis.findings if f.code == "retokenize_drift")
        _choose(screen, "retokenize_drift")
        await pilot.press("enter", "N")  # one position: N stays on it and says so
        assert screen.served.cursor == retok.positions[0]
        await pilot.pause()
        from textual.notifications import Notify

        said = [str(m.notification.message) for m in notes if isinstance(m, Notify)]
        assert said == ["retokenize_drift: its only position"]  # the first jump to a lone position says nothing
