"""A simulator that cannot listen says so as a TokviewError where it fails: the port is the user's to change,
and every caller of `launch` (not only `tokview sim`) gets the one-line message with its remedy."""

from __future__ import annotations

import socket

import pytest

from tokview.errors import ExitCode, TokviewError
from tokview.sim import SimConfig, launch


def test_a_taken_port_is_a_usage_error_naming_the_address_and_the_remedy() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(TokviewError) as raised:
            launch(SimConfig(port=port)).stop()
    error = raised.value
    assert error.exit_code == ExitCode.USAGE
    assert error.message.startswith(f"cannot listen on 127.0.0.1:{port}: ")
    assert error.message.endswith(": choose another --port (0 picks a free one)")


def test_a_tokenizer_path_that_is_a_file_is_said_to_be_one(tmp_path, capsys) -> None:
    """`sim --tokenizer /etc/passwd` (and `ui`) said "tokenizer directory not found" of a file that was there; the
    other commands say it is a file and name the folder to pass."""
    from tokview.cli import main

    afile = tmp_path / "tokenizer.json"
    afile.write_text("{}")
    for argv in (["sim", "--tokenizer", str(afile)], ["ui", "--tokenizer", str(afile), "--db", str(tmp_path / "u")]):
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert f"tokenizer path {afile} is a file, not a folder: pass the model folder that holds it" in err, err
