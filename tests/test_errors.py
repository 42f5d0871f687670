"""One error model: a TokviewError is one line and its exit code; anything else is a bug, said as such."""

from __future__ import annotations

import socket

import pytest

import tokview.commands.stats as stats_command
from tokview.batch.config import BatchSummary
from tokview.batch.inputs import InputError
from tokview.batch.ray_shards import RayUnavailable
from tokview.cli import DEBUG_HINT, main
from tokview.core.logprobs import LogprobShapeError
from tokview.core.profiles import ProfileError
from tokview.core.prompts import PromptError
from tokview.core.tokenizer import TokenizerError
from tokview.core.tokenizer_folder import FolderError
from tokview.errors import ExitCode, TokviewError, UserError, first_line, one_line
from tokview.export.export_error import ExportError
from tokview.export.output import OutputError
from tokview.servers.errors import CaptureFailed, ServerUnreachable
from tokview.sim.config import SimConfigError
from tokview.store.merge import MergeRefused
from tokview.store.schema import SchemaError
from tokview.store.store import StoreError, StoreFull
from tokview.ui.config import ConfigError

ERRORS = (
    UserError,
    StoreError,
    StoreFull,
    SchemaError,
    MergeRefused,
    CaptureFailed,
    ServerUnreachable,
    InputError,
    RayUnavailable,
    ExportError,
    OutputError,
    ConfigError,
    SimConfigError,
    TokenizerError,
    FolderError,
    PromptError,
    ProfileError,
    LogprobShapeError,
)


@pytest.mark.parametrize("cls", ERRORS, ids=lambda c: c.__name__)
def test_every_error_type_is_a_titled_tokview_error_not_a_value_error(cls):
    assert issubclass(cls, TokviewError)
    assert not issubclass(cls, ValueError)
    assert cls.title != TokviewError.title
    assert cls.title.strip()  # its own kind, for the app's notification


def test_titles_name_the_kind_of_problem():
    error = ServerUnreachable("cannot connect to http://127.0.0.1:9")
    assert (error.title, error.message, error.reason) == ("server unreachable", error.reason, error.reason)
    assert error.exit_code == ExitCode.UNREACHABLE
    assert StoreError("x").exit_code == ExitCode.USAGE
    assert StoreFull("no space").title == "disk full"
    assert StoreError("x").title == "store"
    assert TokviewError("m", title="custom", exit_code=7).title == "custom"


def test_first_line_and_one_line():
    assert first_line(ValueError("  \n first\nsecond")) == "first"
    assert first_line(KeyError()) == "KeyError"
    assert first_line(RuntimeError("x" * 500), 20) == "x" * 20
    # a first line that only introduces the next (transformers' tokenizer error) keeps the next with it
    said = "Couldn't instantiate the backend tokenizer from one of: \n(1) a `tokenizers` serialization file\n(2) more"
    assert first_line(ValueError(said)) == (
        "Couldn't instantiate the backend tokenizer from one of: (1) a `tokenizers` serialization file"
    )
    assert one_line(StoreError("cannot open database a.duckdb\n  hint")) == "cannot open database a.duckdb hint"
    assert one_line(TypeError("bad operand\ncontext")) == "TypeError: bad operand"
    assert one_line(ZeroDivisionError()) == "ZeroDivisionError"


def test_batch_exit_codes_come_from_the_one_enum():
    summary = BatchSummary(run_id="r", input=2, ok=2)
    assert summary.exit_code == ExitCode.OK
    summary.bad_rows = ["line 3: not JSON"]
    assert summary.exit_code == ExitCode.BAD_ROWS == 4
    summary.failed = 1
    assert summary.exit_code == ExitCode.FAILURES == 3
    summary.interrupted = True
    assert summary.exit_code == ExitCode.INTERRUPTED == 130


# -- the CLI ----------------------------------------------------------------------------------


def _raising(exc: BaseException):
    def run(args):
        raise exc

    return run


def test_a_tokview_error_is_its_one_line_and_its_exit_code(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TOKVIEW_DEBUG", raising=False)
    code = main(["stats", "--db", str(tmp_path / "missing.duckdb")])
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE
    assert err == f"tokview: error: database not found: {tmp_path / 'missing.duckdb'} (pass --db PATH)\n"


def test_a_tokview_error_keeps_its_own_exit_code_and_no_traceback_even_under_debug(capsys, monkeypatch):
    monkeypatch.setenv("TOKVIEW_DEBUG", "1")
    monkeypatch.setattr(stats_command, "run", _raising(CaptureFailed("HTTP 500\nbody", url="http://x")))
    assert main(["stats"]) == ExitCode.USAGE
    monkeypatch.setattr(stats_command, "run", _raising(ServerUnreachable("nothing answered")))
    assert main(["stats"]) == ExitCode.UNREACHABLE
    err = capsys.readouterr().err.splitlines()
    assert err == ["tokview: error: HTTP 500 body", "tokview: error: server unreachable: nothing answered"]


def test_an_unreachable_server_exits_2_in_one_line(capsys, monkeypatch):
    monkeypatch.delenv("TOKVIEW_DEBUG", raising=False)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = main(["doctor", "--server", f"http://127.0.0.1:{port}", "--timeout", "5"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == ExitCode.UNREACHABLE
    assert len(err) == 1
    assert err[0].startswith("tokview: error: server unreachable")


@pytest.mark.parametrize(
    "bug", [ValueError("a value no check expected"), OSError(5, "Input/output error"), KeyError("k")]
)
def test_a_bug_is_one_line_with_the_debug_hint(bug, capsys, monkeypatch):
    """A ValueError or OSError that no layer turned into a TokviewError is a bug: exit 70, not a usage error."""
    monkeypatch.delenv("TOKVIEW_DEBUG", raising=False)
    monkeypatch.setattr(stats_command, "run", _raising(bug))
    code = main(["stats"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == ExitCode.INTERNAL
    assert len(err) == 1
    assert err[0] == f"tokview: internal error: {one_line(bug)} ({DEBUG_HINT})"
    assert "TOKVIEW_DEBUG=1" in err[0]
    assert type(bug).__name__ in err[0]


def test_a_bug_shows_its_traceback_under_tokview_debug(capsys, monkeypatch):
    """A ValueError inside a command is an internal error, not a usage error: under TOKVIEW_DEBUG its traceback shows."""
    monkeypatch.setenv("TOKVIEW_DEBUG", "1")

    def deep_inside(args):
        return int("not a number")

    monkeypatch.setattr(stats_command, "run", deep_inside)
    code = main(["stats"])
    err = capsys.readouterr().err
    assert code == ExitCode.INTERNAL
    assert err.startswith("Traceback (most recent call last):")
    assert "in deep_inside" in err
    assert err.rstrip().endswith("ValueError: invalid literal for int() with base 10: 'not a number'")
    assert DEBUG_HINT not in err


def test_an_unwritable_out_folder_is_one_line_not_a_bug(tmp_path, capsys, monkeypatch, tokenizer_free_store):
    """OSError from the user's own path is turned into a TokviewError where it happens."""
    monkeypatch.delenv("TOKVIEW_DEBUG", raising=False)
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    blocked.chmod(0o500)
    try:
        probe = blocked / "probe"
        try:
            probe.mkdir()  # root ignores the mode: use a folder under /proc instead, which nobody can create
            probe.rmdir()
            out = "/proc/no-such-folder/train.jsonl"
        except OSError:
            out = str(blocked / "sub" / "train.jsonl")
        code = main(["export", "--db", str(tokenizer_free_store), "--format", "sharegpt", "--out", out])
    finally:
        blocked.chmod(0o700)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == ExitCode.USAGE
    assert len(err) == 1
    assert err[0].startswith(f"tokview: error: cannot write {out}")
    assert "internal error" not in err[0]


@pytest.fixture
def tokenizer_free_store(tmp_path):
    """A store with one sample (exported with the built-in Kimi-layout tokenizer)."""
    from tokview.core.analysis import analyze
    from tokview.core.kimi_layout import kimi_tokenizer_dir
    from tokview.core.profiles import get_profile
    from tokview.core.tokenizer import load_tokenizer
    from tokview.store import Store
    from tokview.ui import examples

    tokenizer, profile = load_tokenizer(kimi_tokenizer_dir()), get_profile("kimi-k2.5")
    path = tmp_path / "one.duckdb"
    capture = examples.short_capture()
    with Store(path) as store:
        store.put_sample("p0@demo_gen0", "p0", "run-a", capture, analyze(capture, profile, tokenizer))
    return path


def test_an_error_quoting_server_text_reaches_the_terminal_with_its_controls_escaped(capsys, monkeypatch):
    """A server's text in an error (here a model name) must not clear the screen or retitle the window."""
    monkeypatch.delenv("TOKVIEW_DEBUG", raising=False)
    hostile = "a\x1b]0;pwned\x07\x1b[2J\x9b"
    monkeypatch.setattr(stats_command, "run", _raising(CaptureFailed(f"model {hostile}\nsaid no", url="http://x")))
    assert main(["stats"]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert err == "tokview: error: model a\\x1b]0;pwned\\x07\\x1b[2J\\x9b said no\n"
