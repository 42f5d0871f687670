"""A prompts file edited while a batch on it runs: the README says an edited row is noticed
and the run stops. A row is checked against a hash of the whole line planning read, not only its id, so an
edit that keeps the id and the file's size is noticed too; rows appended after the plan still wait."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokview.batch import BatchConfig, InputError
from tokview.batch.worklist import plan_work

IDENTITY = {"model": "m", "tokenizer": "t", "profile": "kimi-k2.5"}


def _rows(n: int) -> list[str]:
    return [json.dumps({"id": f"q{i:04d}", "prompt": f"p{i:04d}"}) for i in range(n)]


def _queue(path: Path):
    config = BatchConfig(servers=[], prompts_path=path)
    return plan_work(config, config.sample_settings(IDENTITY), lambda _f: set()).queue()


def test_an_edit_that_keeps_the_id_and_the_size_stops_the_run(tmp_path):
    path = tmp_path / "p.jsonl"
    lines = _rows(2000)
    path.write_text("\n".join(lines) + "\n")
    queue = _queue(path)
    assert queue.popleft().messages[-1]["content"] == "p0000"  # the file is open, its first block read
    lines[1500] = lines[1500].replace('"p1500"', '"x1500"')  # same id, same length: another prompt
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match="changed while the batch ran"):
        while queue:
            item = queue.popleft()
            assert item.messages[-1]["content"].startswith("p")  # never the edited prompt
    assert 1000 < 2000 - len(queue) <= 1501


def test_rows_read_again_are_the_rows_planned_and_appended_rows_wait(tmp_path):
    path = tmp_path / "p.jsonl"
    odd = '{"id": "nan", "prompt": "with a NaN beside it", "meta": NaN}'  # a line orjson refuses, json reads
    path.write_text("\ufeff" + "\n".join([*_rows(3), odd, "", "  "]) + "\r\n")
    queue = _queue(path)
    first = queue.popleft()
    with path.open("a") as fh:
        fh.write(json.dumps({"id": "late", "prompt": "appended"}) + "\n")
    taken = [first.prompt_id] + [item.prompt_id for item in queue]
    assert taken == ["q0000", "q0001", "q0002", "nan"]


def test_bytes_that_are_not_utf8_written_into_the_file_mid_run_stop_it_as_a_change(tmp_path):
    """They were an internal error (UnicodeDecodeError, exit 70), where a cut file already said it changed."""
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(_rows(2000)) + "\n")
    queue = _queue(path)
    queue.popleft()
    with path.open("r+b") as fh:
        fh.seek(40_000)
        fh.write(b"\xff\xfe\xff")
    with pytest.raises(InputError, match="changed while the batch ran"):
        while queue:
            queue.popleft()
