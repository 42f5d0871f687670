"""A store made by an older tokview, resumed with the same command after an upgrade.

Until 2026-12-02 a multi-turn row was sent on the prompts file's history (`--history file` now), and until
2026-12-05 a run's default name held its sample settings only. Such a run is made here by naming it as the old
default was named (`--run` with today's default name, `--history file`). The default command then wrote a second
copy of every turn into that run, chained; `--history file` resumed it under a new name, one run split in two."""

from __future__ import annotations

import json
from pathlib import Path

from tokview.cli import main
from tokview.errors import ExitCode
from tokview.store import Store

MULTITURN = Path(__file__).resolve().parents[1] / "sample_data" / "multiturn.jsonl"


def _batch(capsys, db: Path, url: str, *extra: str) -> tuple[int, dict, str]:
    argv = ["batch", str(MULTITURN), "--server", url, "--db", str(db), "--mode", "chat", "--workers", "1"]
    code = main([*argv, "--limit", "3", "--summary-json", *extra])
    out, err = capsys.readouterr()
    return code, (json.loads(out.strip().splitlines()[-1]) if out.strip() else {}), err


def _samples(db: Path) -> list[tuple[str, str]]:
    with Store(db) as store:
        return store.query("SELECT run_id, sample_id FROM samples ORDER BY 1, 2")


def test_an_old_file_history_run_is_resumed_by_its_own_command_and_never_doubled(vllm_sim, tmp_path, capsys):
    probe_db = tmp_path / "probe.duckdb"
    code, summary, err = _batch(capsys, probe_db, vllm_sim.url)  # today's default name for these settings
    assert code == ExitCode.OK, err
    default_name = summary["run_id"]

    db = tmp_path / "old.duckdb"
    code, summary, err = _batch(capsys, db, vllm_sim.url, "--history", "file", "--run", default_name)
    assert code == ExitCode.OK, err
    before = _samples(db)
    assert {run for run, _ in before} == {default_name} and any("#turn" in sid for _, sid in before)

    code, summary, err = _batch(capsys, db, vllm_sim.url)  # the default: it would chain the rows into that run
    assert code == ExitCode.USAGE, err
    assert f"run {default_name} was made by an older tokview" in err and "--history file" in err
    assert _samples(db) == before

    code, summary, err = _batch(capsys, db, vllm_sim.url, "--history", "file")  # the same command resumes it
    assert code == ExitCode.OK, err
    assert summary["run_id"] == default_name and summary["ok"] == 0, summary
    assert _samples(db) == before

    code, summary, err = _batch(capsys, db, vllm_sim.url, "--run", "chained")  # chains of their own, by name
    assert code == ExitCode.OK, err
    assert {run for run, _ in _samples(db)} == {default_name, "chained"}
