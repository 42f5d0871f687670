"""Things defined once and read everywhere: batch defaults, the tokenizer/profile flags, a run's row."""

from __future__ import annotations

import argparse

import pytest

from tokview.batch.config import BATCH_DEFAULTS, PANEL_DEFAULTS, BatchConfig
from tokview.cli import build_parser
from tokview.store import Store

FLAG_FIELDS = {
    "backend": "backend",
    "mode": "mode",
    "concurrency": "concurrency",
    "max_new_tokens": "max_new_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "thinking": "thinking",
    "samples_per_prompt": "samples_per_prompt",
    "limit": "limit",
    "on_bad_row": "on_bad_row",
    "timeout": "timeout",
    "retries": "retries",
    "max_consecutive_failures": "max_consecutive_failures",
    "any_vocabulary": "any_vocabulary",
    "tokenizer": "tokenizer_dir",
    "profile": "profile",
    "trust_remote_code": "trust_remote_code",
}


def _subparser(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def test_batch_flags_default_to_the_batch_config_defaults():
    args = build_parser().parse_args(["batch", "p.jsonl", "--server", "http://127.0.0.1:8000"])
    for flag, field in FLAG_FIELDS.items():
        assert getattr(args, flag) == BATCH_DEFAULTS[field], flag
    assert BATCH_DEFAULTS["concurrency"] == BatchConfig(servers=["x"]).concurrency
    help_text = _subparser("batch").format_help()
    assert f"(default {BATCH_DEFAULTS['concurrency']})" in help_text


def test_the_panel_defaults_differ_only_where_a_short_interactive_run_needs_it():
    changed = {k for k in BATCH_DEFAULTS if PANEL_DEFAULTS[k] != BATCH_DEFAULTS[k]}
    assert changed == {"temperature", "max_new_tokens", "concurrency", "timeout", "retries"}
    BatchConfig(servers=["http://127.0.0.1:8000"], **{k: v for k, v in PANEL_DEFAULTS.items()}).validate()


@pytest.mark.parametrize("command", ["batch", "doctor", "audit", "export", "show", "ui", "tokenize"])
def test_every_command_takes_the_one_tokenizer_and_profile_flags(command):
    reference = {a.dest: a for a in _subparser("show")._actions}
    actions = {a.dest: a for a in _subparser(command)._actions}
    for dest in ("tokenizer", "profile", "trust_remote_code"):
        ours, ref = actions[dest], reference[dest]
        assert (ours.option_strings, ours.metavar, ours.type, ours.default) == (
            ref.option_strings,
            ref.metavar,
            ref.type,
            ref.default,
        ), (command, dest)
    assert actions["tokenizer"].help.startswith("local tokenizer/model folder (default: ")
    assert actions["profile"].help.startswith("kimi-k2.5, ")
    assert "or a .toml (default: " in actions["profile"].help
    assert actions["trust_remote_code"].help == reference["trust_remote_code"].help


def test_one_run_row_lookup(tmp_path):
    with Store(tmp_path / "s.duckdb") as store:
        store.put_run("run-a", settings={"temperature": 0.6}, profile="qwen3", tokenizer_dir="/models/q")
        store.put_run("run-b", profile="kimi-k2.5")
        run = store.run("run-a")
        assert run is not None
        assert (run["run_id"], run["profile"], run["tokenizer_dir"]) == (
            "run-a",
            "qwen3",
            "/models/q",
        )
        assert run["settings"] == {"temperature": 0.6}
        assert store.run("missing") is None
        assert store.run(None) is None
