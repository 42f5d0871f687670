"""The sessions list (V) and a session's chain of turns, on a store a real `tokview proxy` recorded from the
simulator: two turns named by the request's `user`, one conversation found by its ids, and a turn landed while
the list is open (it must show up without a key press)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from ui.helpers import until

from tokview.proxy.serve import ProxyConfig, start_proxy
from tokview.sim.config import SimConfig
from tokview.sim.server import start_simulator
from tokview.store import Store
from tokview.store.sessions_query import list_sessions, session_turns

UA = "agent-harness/1.0"


def _ask(client: httpx.Client, url: str, model: str, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    body = {"model": model, "messages": messages, "max_tokens": 30, "temperature": 0, **extra}
    response = client.post(url + "/v1/chat/completions", json=body, headers={"user-agent": UA})
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]


@pytest.fixture(scope="module")
def sim() -> Iterator[Any]:
    with start_simulator(SimConfig(kind="vllm")) as running:
        yield running


@pytest.fixture(scope="module")
def recorded(sim, tmp_path_factory, tokenizer, profile) -> Iterator[str]:
    """A store holding user:alice (2 turns) and one unnamed conversation (1 turn), recorded by a real proxy."""
    db = str(tmp_path_factory.mktemp("sessions") / "proxy.duckdb")
    config = ProxyConfig([sim.url], listen="127.0.0.1:0", db=db, tokenizer=tokenizer, profile=profile)
    model = sim.cfg.model_name
    with start_proxy(config) as proxy, httpx.Client() as client:
        first = [{"role": "user", "content": "What is 2 + 2?"}]
        answer = _ask(client, proxy.url, model, first, user="alice")
        _ask(client, proxy.url, model, [*first, answer, {"role": "user", "content": "And 3 + 3?"}], user="alice")
        _ask(client, proxy.url, model, [{"role": "user", "content": "Name a colour."}])
    yield db


def test_sessions_are_grouped_with_their_turns_in_order(recorded) -> None:
    with Store(recorded) as store:
        sessions = {row.session_id: row for row in list_sessions(store)}
        alice = sessions.pop("user:alice")
        assert alice.turns == 2
        assert alice.harness == UA
        assert alice.failed == 0
        [(other_id, other)] = sessions.items()
        assert other_id.startswith("proxy:")
        assert other.turns == 1
        turns = session_turns(store, "user:alice")
    assert [t.turn for t in turns] == [0, 1]
    assert turns[0].prompt_len < turns[1].prompt_len
    assert alice.context == turns[1].prompt_len + turns[1].output_len
    assert alice.output_tokens == sum(t.output_len for t in turns)


def _app(db: str, tokenizer: Any, profile: Any) -> Any:
    from tokview.ui.app import TokviewApp
    from tokview.ui.session import Session

    return TokviewApp(Session(Store(db), tokenizer=tokenizer, profile=profile, who="tester"))


async def _open_sessions(app: Any, pilot: Any) -> None:
    """`V`, and wait for the sessions list's first load."""
    from tokview.ui.screens.sessions import SessionsScreen

    await pilot.press("V")
    await until(pilot, lambda: isinstance(app.screen, SessionsScreen) and app.screen.loads, "the sessions list")


def _copy(recorded: str, to: Path) -> Path:
    """A copy of the recorded store a test may change."""
    to.write_bytes(Path(recorded).read_bytes())
    return to


async def test_v_lists_sessions_enter_opens_the_turns_and_a_turn_in_inspect(recorded, tokenizer, profile) -> None:
    from tokview.ui.screens.inspect import InspectScreen
    from tokview.ui.screens.sessions import SessionTurnsScreen

    app = _app(recorded, tokenizer, profile)
    async with app.run_test(size=(160, 40)) as pilot:
        await _open_sessions(app, pilot)
        screen = app.screen
        assert len(screen.rows) == 2
        assert {r.session_id for r in screen.rows} >= {"user:alice"}
        while screen.rows[screen.query_one("DataTable").cursor_row].session_id != "user:alice":
            await pilot.press("down")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, SessionTurnsScreen) and app.screen.loads, "the turns")
        turns = app.screen
        assert turns.session_id == "user:alice"
        assert [t.turn for t in turns.rows] == [0, 1]
        await pilot.press("down", "enter")
        await until(pilot, lambda: isinstance(app.screen, InspectScreen), "the inspect screen")
        assert app.screen.data.sample_id == turns.rows[1].sample_id
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is turns, "the turns again")
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is screen, "the sessions list again")


async def test_the_sessions_list_shows_a_turn_the_proxy_lands_while_it_is_open(
    sim, recorded, tmp_path, tokenizer, profile
) -> None:

    db = str(tmp_path / "live.duckdb")
    Path(db).write_bytes(Path(recorded).read_bytes())
    app = _app(db, tokenizer, profile)
    async with app.run_test(size=(160, 40)) as pilot:
        await _open_sessions(app, pilot)
        screen = app.screen
        assert len(screen.rows) == 2
        config = ProxyConfig([sim.url], listen="127.0.0.1:0", db=db, tokenizer=tokenizer, profile=profile)
        running = start_proxy(config)  # it detects its upstream with asyncio.run: started off the app's loop
        proxy = await asyncio.to_thread(running.__enter__)
        try:
            with httpx.Client() as client:
                ask = [{"role": "user", "content": "Live?"}]
                await asyncio.to_thread(_ask, client, proxy.url, sim.cfg.model_name, ask, user="bob")
            await until(pilot, lambda: any(r.session_id == "user:bob" for r in screen.rows), "bob's session")
        finally:
            await asyncio.to_thread(running.__exit__, None, None, None)
        assert len(screen.rows) == 3
        assert screen.rows[0].session_id == "user:bob"  # the most recent first


async def test_a_store_moved_away_while_the_list_is_open_is_said_once_and_never_made_again(
    recorded, tmp_path, tokenizer, profile
) -> None:
    """Each poll made an empty DuckDB file at the moved store's path and said its missing tables, every second."""

    db = _copy(recorded, tmp_path / "moving.duckdb")
    app = _app(str(db), tokenizer, profile)
    async with app.run_test(size=(160, 40)) as pilot:
        await _open_sessions(app, pilot)
        app.session.store._file.release(force=True)
        db.rename(tmp_path / "moved.duckdb")
        gone = lambda: [n for n in app._notifications if "is gone" in str(n.message)]  # noqa: E731
        await until(pilot, lambda: bool(gone()), "the store said gone")
        await pilot.pause(2.5)  # two more polls
        assert len(gone()) == 1
        assert not db.exists()


async def test_an_open_sessions_list_never_takes_the_store_from_the_proxy(
    recorded, tmp_path, tokenizer, profile, monkeypatch
):
    """The screen read `sessions_version` every second, opening the store each time: the proxy's own landings (and
    any other program) met a held store while the list merely sat open. It now looks at the files, and reads
    only when they changed."""
    from ui.helpers import refused_connects

    from tokview.ui.screens.sessions import SessionsScreen

    monkeypatch.setattr(SessionsScreen, "poll_s", 0.02)
    db = _copy(recorded, tmp_path / "idle.duckdb")
    app = _app(str(db), tokenizer, profile)
    async with app.run_test(size=(160, 40)) as pilot:
        await _open_sessions(app, pilot)
        await pilot.pause(0.5)  # the list's own reads are done and the file closed (its linger)
        assert await refused_connects(pilot, str(db)) == 0


HOLD_AND_WRITE = r"""
import duckdb, sys, time
for _ in range(500):
    try:
        con = duckdb.connect(sys.argv[1])
        break
    except duckdb.Error:
        time.sleep(0.02)
con.execute("INSERT INTO verdicts (sample_id, \"at\", kind) VALUES ('x', now(), 'note')")
con.execute("CHECKPOINT")
print("ready", flush=True)
sys.stdin.readline()
con.close()
"""
"""Another program that writes into the store (a note: the sessions' version changes) and holds it until told."""


async def test_a_reload_while_another_program_holds_the_store_is_tried_again_after_it_lets_go(
    recorded, tmp_path, tokenizer, profile, monkeypatch
) -> None:
    """ctrl+r during the hold failed, and marked the files seen: nothing read the store again until another write,
    so the holder's change was never shown."""
    import subprocess
    import sys

    monkeypatch.setenv("TOKVIEW_STORE_WAIT_S", "0.3")
    db = _copy(recorded, tmp_path / "held.duckdb")
    app = _app(str(db), tokenizer, profile)
    async with app.run_test(size=(160, 40)) as pilot:
        await _open_sessions(app, pilot)
        screen = app.screen
        screen._files.retry_s = 0.5
        await pilot.pause(0.5)  # the list's own reads are done and the file closed (its linger)
        loads = screen.loads
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLD_AND_WRITE, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        try:
            assert holder.stdout is not None and holder.stdin is not None
            assert (await asyncio.to_thread(holder.stdout.readline)).strip() == "ready"
            await until(pilot, lambda: screen._files._retry_at is not None, "a poll meeting the held store")
            screen._files._retry_at = None  # as after a read that met nothing: only the reload's failure sets it
            await pilot.press("ctrl+r")
            await until(pilot, lambda: screen._files._retry_at is not None, "the reload meeting the held store")
            assert screen.loads == loads
            holder.stdin.write("\n")
            holder.stdin.flush()
        finally:
            await asyncio.to_thread(holder.wait)
        await until(pilot, lambda: screen.loads > loads, "the holder's change shown", timeout=10)


def test_a_session_whose_every_request_failed_is_listed_and_the_totals_count_every_session(recorded, tmp_path) -> None:
    """bob's two requests failed (HTTP 500): his session was not listed at all (the list began from the samples), and
    the summary totalled only the listed rows (at most MAX_SESSIONS)."""
    from tokview.store.sessions_query import session_totals

    db = _copy(recorded, tmp_path / "failed.duckdb")
    with Store(db) as store:
        for n in range(2):
            store.put_failure("user:bob", f"proxy:r:bob{n}", "r", "HTTP 500 from the upstream")
        sessions = {row.session_id: row for row in list_sessions(store)}
        bob = sessions["user:bob"]
        assert (bob.turns, bob.failed, bob.context, bob.findings) == (0, 2, 0, 0)
        assert sessions["user:alice"].failed == 0
        totals = session_totals(store)
        assert (totals.sessions, totals.turns) == (3, 3)
        assert [r.session_id for r in list_sessions(store, limit=1)] == ["user:bob"]  # the most recent


async def test_a_sessions_failed_requests_are_listed_among_its_turns(recorded, tmp_path, tokenizer, profile) -> None:
    """The sessions list counted alice's failed request, but her chain of turns never showed it: a person looking
    for it found two turns and no trace of the third request."""
    from tokview.ui.screens.sessions import SessionTurnsScreen

    db = _copy(recorded, tmp_path / "failed_turn.duckdb")
    with Store(db) as store:
        store.put_failure("user:alice", "proxy:r:alice-x", "r", "refused by the upstream: HTTP 400: [bad] request")
        turns = session_turns(store, "user:alice")
        store.record_verdict(turns[0].sample_id, "approved", override=True)  # reviewed: `]` passes it
    assert [(t.turn, t.failed) for t in turns] == [(0, False), (1, False), (-1, True)]  # it came last
    app = _app(str(db), tokenizer, profile)
    async with app.run_test(size=(160, 40)) as pilot:
        await _open_sessions(app, pilot)
        while app.screen.rows[app.screen.query_one("DataTable").cursor_row].session_id != "user:alice":
            await pilot.press("down")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, SessionTurnsScreen) and app.screen.loads, "the turns")
        screen = app.screen
        assert "2 turns · 1 failed request" in str(screen.query_one("#turns-summary").render())
        await pilot.press("down", "down", "enter")
        await pilot.pause()
        assert app.screen is screen  # nothing to inspect: said instead
        assert any("this request failed: refused by the upstream" in str(n.message) for n in app._notifications)
        await pilot.press("a")  # said as what it is (it said "no sample here: open one, or move the list cursor")
        await pilot.pause()
        assert any("a failed request is no sample: nothing to review" in str(n.message) for n in app._notifications)
        # `]`: the next pending turn of this session (it did nothing here); none after the last, and a failed
        # request is no turn to review
        table = screen.query_one("DataTable")
        await pilot.press("up", "up", "right_square_bracket")
        await pilot.pause()
        assert table.cursor_row == 1
        await pilot.press("right_square_bracket")
        await pilot.pause()
        assert table.cursor_row == 1
        assert any("no pending turn after this one" in str(n.message) for n in app._notifications)


def _alice(sim: Any, db: str, tokenizer: Any, profile: Any, questions: list[str], user: str = "alice") -> None:
    """alice's conversation through a proxy on `db`, one proxy run per question (each a restart), each turn going on
    from the answers before it."""
    messages: list[dict[str, Any]] = []
    for question in questions:
        config = ProxyConfig([sim.url], listen="127.0.0.1:0", db=db, tokenizer=tokenizer, profile=profile)
        with start_proxy(config) as proxy, httpx.Client() as client:
            messages.append({"role": "user", "content": question})
            messages.append(_ask(client, proxy.url, sim.cfg.model_name, messages, user=user))


async def test_two_stores_sessions_of_one_name_are_two_conversations_after_a_merge(
    sim, tmp_path, tokenizer, profile
) -> None:
    """Two harnesses both named their session alice; merged, the list showed one alice of 4 turns, its turns 0, 0,
    1, 1 from both. A restarted proxy's turns that go on with a conversation stay one conversation."""
    from tokview.cli import main
    from tokview.ui.screens.sessions import SessionTurnsScreen

    first, second, merged = (str(tmp_path / f"{n}.duckdb") for n in ("first", "second", "merged"))
    questions = ["What is 2 + 2?", "And 3 + 3?", "And 4 + 4?"]  # three proxy runs
    await asyncio.to_thread(_alice, sim, first, tokenizer, profile, questions)  # the proxy runs its own loop
    await asyncio.to_thread(_alice, sim, second, tokenizer, profile, ["Name a colour.", "Another one?"])
    with Store(first) as store:
        [one] = list_sessions(store)
        assert (one.session_id, one.part, one.turns) == ("user:alice", 0, 3), "a restart goes on with it"
    assert await asyncio.to_thread(main, ["merge", first, second, "--into", merged]) == 0
    with Store(merged) as store:
        rows = sorted(list_sessions(store), key=lambda r: r.part)
        assert [(r.label, r.turns) for r in rows] == [("user:alice", 3), ("user:alice (2)", 2)]
        assert [t.turn for t in session_turns(store, "user:alice", 0)] == [0, 1, 2]
        later = session_turns(store, "user:alice", 1)
        assert [t.turn for t in later] == [0, 1]
        assert rows[1].context == later[1].prompt_len + later[1].output_len
    # a harness may name a session as the list names a later conversation: both listed, the list keyed apart
    await asyncio.to_thread(_alice, sim, merged, tokenizer, profile, ["Hello?"], "alice (2)")
    app = _app(merged, tokenizer, profile)
    async with app.run_test(size=(160, 40)) as pilot:
        await _open_sessions(app, pilot)
        assert sorted(r.label for r in app.screen.rows) == ["user:alice", "user:alice (2)", "user:alice (2)"]
        while app.screen.rows[app.screen.query_one("DataTable").cursor_row].part != 1:
            await pilot.press("down")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, SessionTurnsScreen) and app.screen.loads, "the turns")
        assert [t.sample_id for t in app.screen.rows] == [t.sample_id for t in later]
        assert "session user:alice (2) · 2 turns" in str(app.screen.query_one("#turns-summary").render())


async def test_failed_requests_of_unnamed_harnesses_are_counted_apart_not_as_a_session(
    recorded, tmp_path, tokenizer, profile
) -> None:
    """A failed request of a harness that names no session has no ids to place it by: filed under `RUN:unplaced`, it
    was listed as a session of failures and counted among the sessions (3 sessions for 2 conversations)."""
    from tokview.store.sessions_query import session_totals

    db = _copy(recorded, tmp_path / "unplaced.duckdb")
    with Store(db) as store:
        for n in range(3):
            store.put_failure("proxy:r:unplaced", f"proxy:r:u{n}", "r", "refused by the upstream: HTTP 400: too long")
        assert not any(r.session_id.endswith(":unplaced") for r in list_sessions(store))
        totals = session_totals(store)
        assert (totals.sessions, totals.turns, totals.unplaced_failures) == (2, 3, 3)
    app = _app(str(db), tokenizer, profile)
    async with app.run_test(size=(160, 40)) as pilot:
        await _open_sessions(app, pilot)
        assert len(app.screen.rows) == 2
        said = str(app.screen.query_one("#sessions-summary").render())
        assert "2 sessions · 3 turns" in said and "3 failed requests in no session" in said, said


def test_a_long_session_name_takes_a_bounded_column() -> None:
    """A 155-character `X-Tokview-Session` widened the name column so that every other column of every row was off
    the screen."""
    from datetime import datetime

    from tokview.store.sessions_query import SessionRow
    from tokview.ui.display import NAME_CELLS as LABEL_CELLS
    from tokview.ui.screens.sessions import session_cells

    now = datetime(2026, 12, 6, 12, 0, 0)
    row = SessionRow("session:" + "x" * 155, "openai-python", 3, 900, 40, 1, 0, 0, now, now)
    name = str(session_cells(row)[0])
    assert len(name) == LABEL_CELLS and "…" in name and name.startswith("session:xxx")
    short = SessionRow("session:agent-7", None, 1, 10, 5, 0, 0, 0, now, now)
    assert str(session_cells(short)[0]) == "session:agent-7"


async def test_at_80_columns_the_sessions_counts_and_the_turns_answers_show(recorded, tokenizer, profile) -> None:
    """At 80 columns the name took 50 cells and every count was off-screen; a run's unnamed sessions, cut at their
    end, all read `proxy:proxy-2026…`; each turn's id repeated the run's long prefix; and a tool-calling turn's answer
    showed the start of its reasoning, never its calls."""
    from tokview.ui.screens.sessions import SessionTurnsScreen, label_cells

    app = _app(recorded, tokenizer, profile)
    async with app.run_test(size=(80, 24)) as pilot:
        await _open_sessions(app, pilot)
        table = app.screen.query_one("#sessions-table")
        header = table.render_line(0).text
        assert all(name in header for name in ("session", "turns", "context", "output", "findings", "failed")), header
        names = [str(c) for c in table.get_column_at(0)]
        assert names and all(len(name) <= label_cells(80) for name in names), names
        table.move_cursor(row=next(k for k, r in enumerate(app.screen.rows) if r.session_id == "user:alice"))
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, SessionTurnsScreen) and app.screen.loads, "the turns")
        shown = [str(c) for c in app.screen.query_one("#turns-table").get_column_at(1)]
        assert all(s.startswith("…:") for s in shown), shown


def test_a_tool_calling_turn_lists_its_calls_as_its_answer(recorded, tmp_path) -> None:
    db = _copy(recorded, tmp_path / "calls.duckdb")
    with Store(db) as store:
        store.execute('UPDATE samples SET tool_calls_text = \'get_weather {"city": "Oslo"}\', content = NULL')
        turns = session_turns(store, "user:alice")
    assert turns[0].answer == '→ get_weather {"city": "Oslo"}'


def test_turn_ids_drop_what_every_turn_shares_up_to_its_last_colon() -> None:
    from tokview.ui.screens.sessions import short_ids

    assert short_ids(["proxy:run-1:0000001", "proxy:run-1:0000002"]) == {
        "proxy:run-1:0000001": "…:0000001",
        "proxy:run-1:0000002": "…:0000002",
    }
    assert short_ids(["a:1", "b:2"]) == {"a:1": "a:1", "b:2": "b:2"}
    assert short_ids(["proxy:x:1"]) == {"proxy:x:1": "proxy:x:1"}


def test_a_turns_errors_come_before_its_notes_in_the_findings_column() -> None:
    from tokview.ui.screens.sessions import by_severity

    assert by_severity(["think_open_in_prompt", "truncated", "parser_hidden_ids"])[0] == "truncated"


async def test_curation_keys_act_on_the_turn_under_the_cursor_and_undo_works_on_the_sessions_list(
    recorded, tmp_path, tokenizer, profile
) -> None:
    """a, r, n, t and u did nothing on a session's turns (no bell, no word), though help lists them everywhere."""
    from tokview.ui.screens.export_dialog import ExportDialog
    from tokview.ui.screens.sessions import SessionTurnsScreen

    db = _copy(recorded, tmp_path / "curate.duckdb")
    app = _app(str(db), tokenizer, profile)
    async with app.run_test(size=(160, 40)) as pilot:
        await _open_sessions(app, pilot)
        sessions = app.screen
        sessions.query_one("#sessions-table").move_cursor(
            row=next(k for k, r in enumerate(sessions.rows) if r.session_id == "user:alice")
        )
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, SessionTurnsScreen) and app.screen.loads, "the turns")
        turns = app.screen
        first = turns.rows[0].sample_id
        await pilot.press("r", "enter")  # rejected with the first reason offered
        await until(pilot, lambda: turns.rows[0].status == "rejected", "the turn shown rejected")
        with Store(db) as store:
            assert store.load_sample(first).status == "rejected"
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is sessions, "the sessions list again")
        await pilot.press("u")  # the store's latest action, from a screen that shows no sample
        await pilot.pause(0.3)
        with Store(db) as store:
            assert store.load_sample(first).status == "pending"
        await pilot.press("E")
        await until(pilot, lambda: isinstance(app.screen, ExportDialog), "the export dialog")


async def test_a_proxied_turns_inspect_title_names_its_session_and_turn(recorded, tokenizer, profile) -> None:
    """A batch chain's turn said `#turnN` in its title; a proxied turn named neither its session nor its turn."""
    from tokview.ui.screens.inspect import InspectScreen

    with Store(recorded) as store:
        (sample_id,) = store.query("SELECT sample_id FROM samples WHERE prompt_id = 'user:alice' AND turn = 1")[0]
    app = _app(recorded, tokenizer, profile)
    async with app.run_test(size=(160, 40)) as pilot:
        app.open_sample(sample_id)
        # Pushed is not composed: on a busy box the title was asked for before it was there.
        await until(
            pilot, lambda: isinstance(app.screen, InspectScreen) and app.screen.query("#inspect-title"), "its title"
        )
        assert "user:alice #turn1" in str(app.screen.query_one("#inspect-title").render())
