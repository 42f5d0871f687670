"""How the CLI ends: a bug has its own exit code, a command that does not load is said, the store's name is one.

A script must tell "I typed it wrong" (1) from "tokview broke" (70, sysexits' EX_SOFTWARE), and neither
may print a raw traceback unless asked for it. A command module that fails to import is a broken install,
said in one line, never a command that silently vanished from `--help`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import tokview.commands.stats as stats_command
from tokview.cli import DEBUG_HINT, build_parser, main
from tokview.default_store import DEFAULT_DB
from tokview.errors import ExitCode
from tokview.store import Store

COMMANDS_DIR = Path(__file__).resolve().parents[1] / "tokview" / "commands"


def _raising(exc: BaseException):
    def run(args):
        raise exc

    return run


# -- bugs ---------------------------------------------------------------------------------------------
def test_a_bug_exits_with_the_internal_code_not_the_usage_code(capsys, monkeypatch):
    monkeypatch.delenv("TOKVIEW_DEBUG", raising=False)
    monkeypatch.setattr(stats_command, "run", _raising(ZeroDivisionError("division by zero")))
    code = main(["stats"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == ExitCode.INTERNAL == 70
    assert ExitCode.INTERNAL != ExitCode.USAGE
    assert err == [f"tokview: internal error: ZeroDivisionError: division by zero ({DEBUG_HINT})"]


def test_a_bug_under_tokview_debug_shows_the_traceback_and_still_exits_internal(capsys, monkeypatch):
    monkeypatch.setenv("TOKVIEW_DEBUG", "1")
    monkeypatch.setattr(stats_command, "run", _raising(ZeroDivisionError("division by zero")))
    code = main(["stats"])
    err = capsys.readouterr().err
    assert code == ExitCode.INTERNAL
    assert err.startswith("Traceback (most recent call last):")


def test_a_ctrl_c_that_duckdb_turned_into_its_own_error_is_an_interruption(capsys, monkeypatch):
    """A Ctrl-C during a statement reaches DuckDB, which stops it and raises "Query interrupted" (as an
    InterruptException, or a RuntimeError from a fetch): an export interrupted so exited 70, an internal error, in
    the kill matrix, where every other Ctrl-C gives 130."""
    import duckdb

    monkeypatch.delenv("TOKVIEW_DEBUG", raising=False)
    for raised in (duckdb.InterruptException("INTERRUPT Error: Interrupted!"), RuntimeError("Query interrupted")):
        monkeypatch.setattr(stats_command, "run", _raising(raised))
        assert main(["stats"]) == ExitCode.INTERRUPTED == 130
        assert capsys.readouterr().err.strip().splitlines() == ["tokview: interrupted"]
    monkeypatch.setattr(stats_command, "run", _raising(RuntimeError("something else")))
    assert main(["stats"]) == ExitCode.INTERNAL


# -- commands that do not load ------------------------------------------------------------------------
def test_a_missing_command_module_is_said_not_dropped(capsys, monkeypatch):
    """`None` in sys.modules makes the import fail as a missing module would (a broken install)."""
    monkeypatch.delenv("TOKVIEW_DEBUG", raising=False)
    monkeypatch.setitem(sys.modules, "tokview.commands.stats", None)
    code = main(["stats"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == ExitCode.INTERNAL
    assert len(err) == 1
    assert err[0].startswith("tokview: internal error: the stats command did not load: ")
    assert DEBUG_HINT in err[0]


def test_a_command_whose_dependency_fails_to_import_is_one_line_not_a_traceback(capsys, monkeypatch):
    monkeypatch.delenv("TOKVIEW_DEBUG", raising=False)
    monkeypatch.delitem(sys.modules, "tokview.commands.stats")
    monkeypatch.setitem(sys.modules, "tokview.commands.store_arg", None)
    code = main(["stats"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == ExitCode.INTERNAL
    assert len(err) == 1
    assert err[0].startswith("tokview: internal error: the stats command did not load: ")


def test_help_fails_loudly_when_one_command_does_not_load(capsys, monkeypatch):
    monkeypatch.delenv("TOKVIEW_DEBUG", raising=False)
    monkeypatch.setitem(sys.modules, "tokview.commands.merge", None)
    code = main(["--help"])
    err = capsys.readouterr().err
    assert code == ExitCode.INTERNAL
    assert "the merge command did not load" in err


# -- the default store's name -------------------------------------------------------------------------
def test_every_db_flag_defaults_to_the_one_store_name():
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    defaults = {
        name: action.default
        for name, parser in sub.choices.items()
        for action in parser._actions
        if action.dest == "db" and name != "demo"  # demo makes its own store in a temporary folder
    }
    assert len(defaults) >= 9
    assert set(defaults.values()) == {DEFAULT_DB}


def test_the_store_name_is_written_in_no_command():
    literal = '"' + DEFAULT_DB + '"'
    holders = [p.name for p in sorted(COMMANDS_DIR.glob("*.py")) if literal in p.read_text()]
    assert holders == []


def test_the_store_opens_the_same_default():
    import inspect

    assert inspect.signature(Store).parameters["path"].default == DEFAULT_DB


def test_a_path_the_system_refuses_is_one_line_naming_it_not_an_internal_error(tmp_path, capsys, monkeypatch):
    """Python's `Path.exists()` and `is_dir()` raise on a name too long or a folder this user may not read, instead of
    answering False: twelve commands reported them as an internal error (exit 70)."""
    monkeypatch.chdir(tmp_path)
    long_name = "a" * 300
    batch = ["batch", long_name + ".jsonl", "--db", "x.duckdb", "--server", "http://127.0.0.1:9"]
    for argv in (["stats", "--db", long_name + ".duckdb"], batch):
        assert main(argv) == ExitCode.USAGE, argv
        err = capsys.readouterr().err
        assert err.startswith(f"tokview: error: cannot use {long_name}") and err.count("\n") == 1, err
        assert "File name too long" in err


def test_a_duckdb_file_whose_schema_version_tokview_did_not_write_is_refused_in_one_line(tmp_path, capsys):
    import duckdb

    db = tmp_path / "f.duckdb"
    with duckdb.connect(str(db)) as conn:
        conn.execute("CREATE TABLE schema_version (version VARCHAR)")
        conn.execute("INSERT INTO schema_version VALUES ('1.2.0')")
        conn.execute("CREATE TABLE samples (x INTEGER)")
    before = db.read_bytes()
    assert main(["stats", "--db", str(db)]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "not a tokview store" in err and err.count("\n") == 1, err
    assert db.read_bytes() == before
    with duckdb.connect(str(db)) as conn:  # with the tables merge reads: it compared the text with a number (exit 70)
        conn.execute("CREATE TABLE runs (run_id VARCHAR)")
    before = db.read_bytes()
    assert main(["merge", str(db), "--into", str(tmp_path / "into.duckdb")]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "is not a tokview store" in err and "internal error" not in err and err.count("\n") == 1, err
    assert db.read_bytes() == before
    for table in ("schema_version (v INTEGER)", "schema_version (version DOUBLE)"):  # no `version`; an infinity
        other = tmp_path / f"o{len(table)}.duckdb"
        with duckdb.connect(str(other)) as conn:
            conn.execute(f"CREATE TABLE {table}")
            conn.execute("INSERT INTO schema_version VALUES ('inf')" if "DOUBLE" in table else "SELECT 1")
            conn.execute("CREATE TABLE samples (x INTEGER)")
            conn.execute("CREATE TABLE runs (run_id VARCHAR)")
        assert main(["merge", str(other), "--into", str(tmp_path / "into.duckdb")]) == ExitCode.USAGE
        err = capsys.readouterr().err
        assert "not a tokview store" in err and "internal error" not in err, err
        assert main(["stats", "--db", str(other)]) == ExitCode.USAGE  # every command reads it one way
        err = capsys.readouterr().err
        assert "not a tokview store" in err and "internal error" not in err and err.count("\n") == 1, err


def test_a_refused_path_is_said_on_one_line_whatever_it_holds(tmp_path, capsys, monkeypatch):
    """The path is the user's text: a newline or a terminal escape in it is shown escaped, never acted on."""
    monkeypatch.chdir(tmp_path)
    name = "a" * 150 + "\n\x1b[31m" + "b" * 150 + ".duckdb"
    assert main(["stats", "--db", name]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\x1b" not in err, err


def test_a_one_value_flag_given_twice_is_refused_not_the_last_taken(capsys, tmp_path):
    """`export --select approved --select all` exported everything and `merge --into a --into b` wrote only b: argparse
    keeps the last value. Such a flag given twice is refused in one line, exit 1, nothing run."""
    db = tmp_path / "s.duckdb"
    Store(db).close()
    for argv, flag in (
        (
            ["export", "--db", str(db), "--select", "approved", "--select", "all", "--out", str(tmp_path / "o.jsonl")],
            "--select",
        ),
        (["export", "--db", str(db), "--out", str(tmp_path / "a.jsonl"), "--out", str(tmp_path / "b.jsonl")], "--out"),
        (["merge", str(db), "--into", str(tmp_path / "a.duckdb"), "--into", str(tmp_path / "b.duckdb")], "--into"),
        (["stats", "--db", str(db), "--db", str(tmp_path / "other.duckdb")], "--db"),
        # every command's one-value flags, not only those declared one by one: the proxy recorded into b
        (["proxy", "--server", "http://127.0.0.1:9", "--db", str(tmp_path / "a.duckdb"), "--db", str(db)], "--db"),
        (
            ["batch", "p.jsonl", "--server", "http://127.0.0.1:9", "--temperature", "1", "--temperature", "0"],
            "--temperature",
        ),
        (["sim", "--port", "0", "--port", "0"], "--port"),
    ):
        assert main(argv) == ExitCode.USAGE, argv
        err = capsys.readouterr().err
        assert f"{flag} given twice: it takes one value" in err and err.count("\n") == 1, err
    assert not any(tmp_path.glob("[ab].*")) and not (tmp_path / "o.jsonl").exists()
    assert main(["stats", "--db", str(db)]) == ExitCode.OK  # once is fine, the default too


def test_a_merge_that_names_the_target_among_its_sources_merges_nothing(tmp_path, capsys, put, make_capture):
    """`merge a.duckdb T.duckdb b.duckdb --into T.duckdb` merged a, then refused T (found in its turn), b untried;
    a hard link to the target was not caught at all."""
    import os

    a, into = tmp_path / "a.duckdb", tmp_path / "T.duckdb"
    for path, sample in ((a, "s1"), (into, "s2")):
        with Store(path) as store:
            put(store, sample, make_capture(question=f"question {sample}"))
    os.link(into, tmp_path / "linked.duckdb")
    for named in (into, tmp_path / "linked.duckdb"):
        assert main(["merge", str(a), str(named), "--into", str(into)]) == ExitCode.USAGE
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"tokview: error: {named} is the store itself (--into {into}): leave it out; nothing was merged"]
    with Store(into) as store:
        assert [sid.split("@")[0] for (sid,) in store.query("SELECT sample_id FROM samples")] == ["s2"]
