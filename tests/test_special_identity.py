"""Two tokenizers alike but for which ids are special are not the same tokenizer.

The Kimi-layout folder and its `think_special=False` twin have the same id → token table, so the
same vocabulary fingerprint and the same sample ids; only `<think>`/`</think>` (163606, 163607) are
special in one and ordinary in the other, which changes `skip_special_tokens`, decoding and the
reasoning split. A run records the special id set beside its settings; `merge` and a resume refuse
to mix the two in one line, and runs recorded before that record existed keep working as before.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tokview.cli import main
from tokview.core.kimi_layout import kimi_tokenizer_dir
from tokview.core.tokenizer import load_tokenizer
from tokview.sim import SimConfig, start_simulator
from tokview.store import Store

THINK, THINK_END = 163606, 163607
SPECIAL_KEYS = ("tokenizer_special", "tokenizer_special_ids")


@pytest.fixture(scope="module")
def folders() -> dict[str, Path]:
    return {"special": kimi_tokenizer_dir(), "plain": kimi_tokenizer_dir(think_special=False)}


_ADAPTERS: dict[Path, Any] = {}


def adapter(folder: Path) -> Any:
    """The folder's tokenizer, loaded once per test module."""
    if folder not in _ADAPTERS:
        _ADAPTERS[folder] = load_tokenizer(folder)
    return _ADAPTERS[folder]


@pytest.fixture(scope="module")
def sim_url():
    with start_simulator(SimConfig(kind="vllm")) as sim:
        yield sim.url


PROMPTS = "".join(
    json.dumps({"id": f"q{i}", "messages": [{"role": "user", "content": f"question {i}"}]}) + "\n" for i in range(2)
)


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("prompts") / "p.jsonl"
    path.write_text(PROMPTS)
    return path


@pytest.fixture(scope="module")
def made(folders, sim_url, prompts, tmp_path_factory) -> dict[str, Path]:
    """Stores made once by `tokview batch` (each test works on copies): both prompts with each folder, and
    one prompt with the special folder (what a resume finishes)."""
    where = tmp_path_factory.mktemp("made")
    dbs = {"special": where / "special.duckdb", "plain": where / "plain.duckdb", "special1": where / "special1.duckdb"}
    for name, db in dbs.items():
        folder = folders["plain" if name == "plain" else "special"]
        assert batch(prompts, sim_url, db, folder, *(["--limit", "1"] if name == "special1" else [])) == 0
        stored(db)  # parts a batch left are landed: the file alone is the store
    return dbs


def copy_of(made: dict[str, Path], name: str, tmp_path: Path, as_name: str | None = None) -> Path:
    target = tmp_path / f"{as_name or name}.duckdb"
    shutil.copyfile(made[name], target)
    return target


def batch(prompts: Path, url: str, db: Path, folder: Path, *more: str) -> int:
    return main(
        [
            "batch",
            str(prompts),
            "--server",
            url,
            "--db",
            str(db),
            "--tokenizer",
            str(folder),
            "--max-new-tokens",
            "24",
            *more,
        ]
    )


def stored(db: Path) -> int:
    with Store(db) as store:
        return int(store.query("SELECT count(*) FROM samples")[0][0])


def forget_special_record(db: Path) -> None:
    """What a store written before runs recorded their special ids holds: settings without those keys."""
    import duckdb

    stored(db)  # parts a batch left are landed
    with duckdb.connect(str(db)) as conn:
        for run_id, settings in conn.execute("SELECT run_id, settings FROM runs").fetchall():
            older = {k: v for k, v in json.loads(settings).items() if k not in SPECIAL_KEYS}
            conn.execute("UPDATE runs SET settings = ? WHERE run_id = ?", [json.dumps(older), run_id])


def record_special_ids(db: Path, folder: Path) -> None:
    """Store the folder's special-id record beside every run's settings, as the batch runner does once it
    passes `checked_special_tokens` to `put_run`: merge is checked on exactly what runs will hold."""
    import duckdb

    from tokview.batch.identity import special_tokens_record

    record = special_tokens_record(adapter(folder))
    stored(db)  # parts a batch left are landed
    with duckdb.connect(str(db)) as conn:
        for run_id, settings in conn.execute("SELECT run_id, settings FROM runs").fetchall():
            conn.execute(
                "UPDATE runs SET settings = ? WHERE run_id = ?",
                [json.dumps({**json.loads(settings), **record}), run_id],
            )


def expand(ranges: str) -> set[int]:
    """The ids of a recorded "a-b,c" list."""
    out: set[int] = set()
    for part in ranges.split(","):
        first, _, last = part.partition("-")
        out.update(range(int(first), int(last or first) + 1))
    return out


def test_the_twin_folders_share_a_vocabulary_but_not_their_special_ids(folders):
    special, plain = adapter(folders["special"]), adapter(folders["plain"])
    assert special.vocab_fingerprint() == plain.vocab_fingerprint()  # sample ids cannot tell them apart
    assert special.special_fingerprint() != plain.special_fingerprint()
    assert special.is_special(THINK_END)
    assert not plain.is_special(THINK_END)


def test_a_run_records_its_special_ids(folders, made):
    with Store(made["plain"]) as store:
        (run,) = store.runs()
        settings = run["settings"]
    assert settings["tokenizer_special"] == adapter(folders["plain"]).special_fingerprint()
    ids = expand(settings["tokenizer_special_ids"])
    assert THINK not in ids
    assert THINK_END not in ids
    assert {163584, 163605, 163608, 163839} <= ids


def test_merge_refuses_a_store_whose_tokenizer_differs_only_in_special_ids(made, tmp_path, capsys):
    into = copy_of(made, "special", tmp_path)
    capsys.readouterr()
    assert main(["merge", str(made["plain"]), "--into", str(into)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert "merge refused" in err, err
    assert "Traceback" not in err, err
    assert f"{THINK}, {THINK_END} special only in {into}" in err, err
    assert stored(into) == 2
    assert stored(made["plain"]) == 2  # nothing landed, nothing lost


def test_a_resume_with_the_other_special_ids_is_refused_in_one_line(folders, sim_url, prompts, made, tmp_path, capsys):
    db = copy_of(made, "special1", tmp_path)
    capsys.readouterr()
    assert batch(prompts, sim_url, db, folders["plain"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert "Traceback" not in err, err
    assert f"{THINK_END} </think> special only in the stored runs" in err, err
    assert stored(db) == 1  # nothing generated with the other tokenizer
    assert batch(prompts, sim_url, db, folders["special"]) == 0  # the same tokenizer resumes
    assert stored(db) == 2


def test_runs_recorded_before_the_special_ids_merge_and_resume_as_before(folders, sim_url, prompts, made, tmp_path):
    into, other = copy_of(made, "special", tmp_path), copy_of(made, "special1", tmp_path)
    for db in (into, other):
        forget_special_record(db)
    assert batch(prompts, sim_url, other, folders["plain"]) == 0  # nothing recorded: no check
    assert stored(other) == 2
    forget_special_record(other)
    assert main(["merge", str(other), "--into", str(into)]) == 0
    assert stored(into) == 2


def test_merge_compares_the_special_ids_each_store_recorded(folders, made, tmp_path, capsys):
    dbs = {name: copy_of(made, name, tmp_path) for name in ("special1", "plain", "special")}
    for name, db in dbs.items():
        record_special_ids(db, folders["plain" if name == "plain" else "special"])
    capsys.readouterr()
    assert main(["merge", str(dbs["plain"]), "--into", str(dbs["special1"])]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert "merge refused" in err, err
    assert "other special tokens" in err, err
    assert f"{THINK}, {THINK_END} special only in {dbs['special1']}" in err, err
    assert stored(dbs["special1"]) == 1
    assert main(["merge", str(dbs["special"]), "--into", str(dbs["special1"])]) == 0  # the same special ids
    assert stored(dbs["special1"]) == 2
    # an empty store takes one tokenizer's runs, then refuses the other's
    into = tmp_path / "into.duckdb"
    assert main(["merge", str(dbs["plain"]), "--into", str(into)]) == 0
    capsys.readouterr()
    assert main(["merge", str(dbs["special"]), "--into", str(into)]) == 1
    assert f"special only in {dbs['special']}" in capsys.readouterr().err


def test_the_recorded_ranges_name_every_id():
    from tokview.store.merge import id_ranges, ids_of_ranges, special_difference

    ids = {0, 1, 2, 7, 163584, 163585, 163839}
    assert id_ranges(ids) == "0-2,7,163584-163585,163839"
    assert ids_of_ranges(id_ranges(ids)) == ids
    assert id_ranges([]) == ""
    assert ids_of_ranges("") == set()
    many = special_difference(id_ranges(range(20)), "", "a", "b")
    assert many == "0, 1, 2, 3, 4, 5, 6, 7 and 12 more special only in a"
