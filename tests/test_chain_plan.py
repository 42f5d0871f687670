"""How chains are planned (`--history served`): a multi-turn row is one piece of work per generation index,
to do while its first turn is not stored (chains are written whole); a chain stored up to where it stopped
counts its absent turns as `chain_left`, not as work; every chain's turns land in one shard."""

from __future__ import annotations

import json
import zlib

import pytest

from tokview.batch.chains import ChainItem
from tokview.batch.config import BatchConfig
from tokview.batch.worklist import plan_work

IDENTITY = {"model": "m", "tokenizer": "t", "profile": "p"}
MULTI = {
    "id": "multi",
    "messages": [
        {"role": "user", "content": "1"},
        {"role": "assistant", "content": "x"},
        {"role": "user", "content": "2"},
        {"role": "assistant", "content": "y"},
        {"role": "user", "content": "3"},
    ],
}


def _plan(tmp_path, stored=(), **flags):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps(MULTI) + "\n" + json.dumps({"id": "one", "prompt": "single"}) + "\n")
    config = BatchConfig(servers=[], prompts_path=path, **flags)
    return plan_work(config, config.sample_settings(IDENTITY), lambda frag: {s for s in stored if frag in s})


def test_a_multi_turn_row_is_one_chain_per_index_and_a_stored_first_turn_ends_it(tmp_path):
    work = _plan(tmp_path, samples_per_prompt=2)
    items = list(work.queue())
    chains = [i for i in items if isinstance(i, ChainItem)]
    assert (work.planned, work.todo, work.chain_left) == (8, 8, 0)
    assert [(c.index, [t[0] for t in c.turns], [t[1] for t in c.turns], c.todo) for c in chains] == [
        (0, [0, 1, 2], [1, 3, 5], 3),
        (1, [0, 1, 2], [1, 3, 5], 3),
    ]
    assert all(c.sample_id == c.turns[0][2] and "#turn0@" in c.sample_id for c in chains)
    assert chains[0].conversation == chains[0].sample_id.replace("#turn0", "")
    single = work.key
    assert chains[0].sample_id.split("@")[1] != f"{single}_gen0", "a chain's ids hash its history mode"
    stopped = {chains[0].turns[0][2]}  # index 0 stored up to its first turn: it stopped there
    again = _plan(tmp_path, stopped, samples_per_prompt=2)
    assert (again.planned, again.resumed, again.chain_left, again.todo) == (8, 1, 2, 5)
    assert [i.index for i in again.queue() if isinstance(i, ChainItem)] == [1]


def test_history_file_plans_slots_as_before_and_a_chain_keeps_to_one_shard(tmp_path):
    work = _plan(tmp_path, history="file")
    assert work.chain_key is None
    assert not any(isinstance(i, ChainItem) for i in work.queue())
    for k in (1, 2, 3):
        shard = _plan(tmp_path, shard=(k, 3))
        for chain in (i for i in shard.queue() if isinstance(i, ChainItem)):
            assert zlib.crc32(chain.sample_id.encode()) % 3 == k - 1
            assert chain.todo == 3


def test_history_made_otherwise_is_another_default_run_and_the_default_keeps_its_id():
    """`--history file` and `--history served` on one file were one run (their turns mixed in `stats`, joined as
    branches by `--trajectory`); `--history-reasoning` the same. The default history adds nothing to the run id, so a
    run from before resumes under its id."""
    from tokview.batch.config import settings_key

    served = BatchConfig(servers=[])
    ids = {
        served.run_id(IDENTITY),
        BatchConfig(servers=[], history="file").run_id(IDENTITY),
        BatchConfig(servers=[], history_reasoning="all").run_id(IDENTITY),
        BatchConfig(servers=[], history_reasoning="none").run_id(IDENTITY),
    }
    assert len(ids) == 4
    assert served.run_id(IDENTITY) == f"batch-{settings_key(served.sample_settings(IDENTITY))}"
    assert BatchConfig(servers=[], history="file", run="mine").run_id(IDENTITY) == "mine"
    file_history = BatchConfig(servers=[], history="file").run_id(IDENTITY)  # history reasoning is a chain's only
    assert BatchConfig(servers=[], history="file", history_reasoning="all").run_id(IDENTITY) == file_history


@pytest.mark.parametrize("reasoning", ["all", "none"])
def test_history_reasoning_with_the_files_history_is_refused(reasoning):
    """`--history file --history-reasoning all` was taken and did nothing (the file's turns go without reasoning)."""
    from tokview.batch.inputs import InputError

    config = BatchConfig(servers=["http://127.0.0.1:9"], history="file", history_reasoning=reasoning)
    with pytest.raises(InputError, match=f"--history-reasoning {reasoning} applies to --history served"):
        config.validate()
    BatchConfig(servers=["http://127.0.0.1:9"], history="file").validate()  # the default: nothing to refuse
