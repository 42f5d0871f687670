"""The findings list re-colours itself after a refresh; scheduled as its screen goes (`f` then `esc` in inspect), that
repaint ran with the widget gone and crashed the app: `KeyError: "No 'findings--error' key in COMPONENT_CLASSES"`."""

from __future__ import annotations

from textual.app import App, ComposeResult

from tokview.ui.widgets.findings_list import FindingRow, FindingsList


class _Holder(App[None]):
    def compose(self) -> ComposeResult:
        yield FindingsList([FindingRow("finding-0", "error", "truncated", " at 3", "cut short")], id="findings")


async def test_a_repaint_that_runs_after_the_list_is_gone_does_nothing():
    app = _Holder()
    async with app.run_test() as pilot:
        findings = app.query_one("#findings", FindingsList)
        findings._painted_with = None  # as if the theme changed: the next repaint must colour again
        await findings.remove()
        await pilot.pause()
        findings._repaint()  # what call_after_refresh runs once the screen is gone
        assert not findings.is_attached
