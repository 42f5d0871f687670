"""Messages that say what is wrong: a parent path that is a file, and `sim --tokenizer` on a
folder that needs its own code."""

from __future__ import annotations

import json

from tokview.cli import main
from tokview.errors import describe_error
from tokview.sim import SimConfig, start_simulator


def test_a_database_under_a_file_names_the_file(tmp_path, capsys):
    blocker = tmp_path / "notes.txt"
    blocker.write_text("x")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hi"}\n')
    with start_simulator(SimConfig(kind="vllm")) as sim:
        code = main(["batch", str(prompts), "--server", sim.url, "--db", str(blocker / "sub" / "s.duckdb")])
    err = capsys.readouterr().err.strip().splitlines()
    expected = f"tokview: error: cannot create {blocker / 'sub'}: {blocker} is a file, not a folder"
    assert code == 1
    assert err[-1] == expected
    assert not any("Errno" in line for line in err)


def test_describe_error_keeps_other_os_errors():
    assert describe_error(PermissionError(13, "Permission denied", "/x")) == "[Errno 13] Permission denied: '/x'"
    assert describe_error(ValueError("plain")) == "plain"


def test_sim_does_not_suggest_a_flag_it_does_not_take(tmp_path, capsys):
    folder = tmp_path / "needs-code"
    folder.mkdir()
    (folder / "tokenization_kimi.py").write_text("raise ImportError('never run')\n")
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
                "tokenizer_class": "TikTokenTokenizer",
            }
        )
    )
    code = main(["sim", "--tokenizer", str(folder), "--port", "0"])
    err = capsys.readouterr().err
    assert code == 1
    assert len(err.strip().splitlines()) == 1
    assert "--trust-remote-code" not in err
    assert "`tokview sim` never runs a folder's code" in err
    assert "tokenization_kimi.py" in err
