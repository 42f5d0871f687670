"""A row changed under its id since its samples were stored is never taken as done on resume.

A sample's id is its prompt id, settings and index: a prompts file whose row was edited (a typo fixed, a system prompt
added) kept its id, so the resume counted its samples as stored and the export trained on answers to the old text,
with nothing said. An older tokview that read a row otherwise (a `system` beside `messages`, read since) left the
same. Planning now holds each stored single-turn row's messages against the file's: a changed one is a bad row."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from builders import kimi, profile

from tokview.batch import BatchConfig, run_batch
from tokview.batch.inputs import InputError
from tokview.store import Store

SHAPES = [
    {"id": "s1", "prompt": "Say hi", "system": "Be brief."},
    {"id": "s2", "messages": [{"role": "developer", "content": "Be terse."}, {"role": "user", "content": "2+2?"}]},
    {"id": "s3", "messages": [{"role": "user", "content": [{"type": "text", "text": "One."}, {"type": "text", "text": "Two."}]}]},
    {"id": "s4", "messages": [{"role": "user", "content": "Why?"}, {"role": "assistant", "content": "Because.", "reasoning_content": "hm"}]},
    {"id": "s5", "conversations": [{"from": "human", "value": "Hello there"}, {"from": "gpt", "value": "Hi!"}]},
    {"id": "s6", "system": "Top system.", "messages": [{"role": "user", "content": "With a system beside."}]},
    {"id": "s7", "messages": [{"role": "user", "content": "What is 6 times 7?"}]},
    {"id": "s8", "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"}]},
    {"prompt": "No id at all"},
]  # fmt: skip


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _config(url: str, path: Path, **kw) -> BatchConfig:
    return BatchConfig(
        servers=[url], prompts_path=path, tokenizer=kimi(), model_profile=profile(), max_new_tokens=64, **kw
    )


@pytest.mark.parametrize("mode", ["raw", "chat"])
async def test_an_unchanged_file_resumes_whole_whatever_its_rows_shapes(vllm_sim, tmp_path, mode):
    """No false alarm: every shape a row may take resumes as stored (the stored messages are the generation point's
    history: a last assistant turn to regenerate and history reasoning are not in them)."""
    path = _write(tmp_path / "p.jsonl", SHAPES)
    with Store(tmp_path / "s.duckdb") as store:
        first = await run_batch(_config(vllm_sim.url, path, mode=mode, samples_per_prompt=2), store)
        again = await run_batch(_config(vllm_sim.url, path, mode=mode, samples_per_prompt=2), store)
    assert first.ok == 2 * len(SHAPES) and not first.bad_rows
    assert (again.ok, again.resumed, again.bad_rows) == (0, first.ok, [])


async def test_a_row_changed_under_its_id_is_a_bad_row_not_a_stored_one(vllm_sim, tmp_path):
    path = _write(tmp_path / "p.jsonl", SHAPES)
    with Store(tmp_path / "s.duckdb") as store:
        first = await run_batch(_config(vllm_sim.url, path), store)
        stored = {s: store.load_sample(s).capture.messages for s in store.stored_ids_with("_gen0")}
        edited = [dict(r) for r in SHAPES]
        edited[0]["system"] = "Be very brief."  # line 1: the system beside the prompt
        edited[6]["messages"] = [{"role": "user", "content": "What is 6 times 8?"}]  # line 7: a typo fixed
        edited[4]["conversations"] = [*SHAPES[4]["conversations"][:1], {"from": "gpt", "value": "Hey"}]  # line 5: the
        # answer to regenerate is no part of the prompt: unchanged
        again = await run_batch(_config(vllm_sim.url, _write(path, edited)), store)
        assert [b.split(":")[0] for b in again.bad_rows] == ["line 1", "line 7"], again.bad_rows
        assert '"s1" were asked with other messages' in again.bad_rows[0]
        assert "give it a new id to ask it" in again.bad_rows[0]
        assert (again.ok, again.resumed) == (0, first.ok - 2)
        assert again.balanced and again.input == first.input
        assert {s: store.load_sample(s).capture.messages for s in stored} == stored  # nothing stored was touched
        with pytest.raises(InputError, match=r"p\.jsonl:1: changed since it was stored.*--on-bad-row skip"):
            await run_batch(_config(vllm_sim.url, path, on_bad_row="stop"), store)


def test_the_cli_exits_4_naming_the_changed_row(vllm_sim, tmp_path):
    path = _write(tmp_path / "p.jsonl", SHAPES[6:7])
    db = tmp_path / "c.duckdb"
    cmd = [sys.executable, "-m", "tokview", "batch", str(path), "--server", vllm_sim.url, "--db", str(db)]
    assert subprocess.run(cmd, capture_output=True, text=True).returncode == 0
    _write(path, [{"id": "s7", "messages": [{"role": "user", "content": "What is 6 times 8?"}]}])
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 4, done.stderr
    assert 'p.jsonl:1: changed since it was stored: the samples stored under its id "s7"' in done.stderr
    assert "1 bad rows" in done.stderr and "Traceback" not in done.stderr


def test_the_fast_readers_digest_is_the_asked_digest_and_other_keys_do_not_count():
    """The common row's digest comes from its raw turns (`_fast_scan`), a stored sample's from its messages column
    through `asked_digest`: the two must agree on an unchanged row, whatever key order or other keys either holds."""
    from tokview.batch.inputs import _fast_scan, asked_digest

    row = {"id": "a", "messages": [{"content": "Be brief.", "role": "system"}, {"role": "user", "content": "Hi"}]}
    quick = _fast_scan(row)
    assert quick is not None
    stored = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi", "name": "bob"}]
    assert asked_digest(stored) == quick[2]
    assert asked_digest([*stored[:1], {"role": "user", "content": "Hi!"}]) != quick[2]


async def test_a_system_beside_messages_is_sent_as_the_first_turn_by_the_common_rows_reader(vllm_sim, tmp_path):
    """A JSONL row `{"id", "system", "messages"}` took the fast reader, which never looked at `system`: its samples
    were asked without the system prompt (only a Parquet row, read by `parse_row`, had it). A sample stored so is now
    found changed on the resume."""
    from tokview.batch.inputs import fast_row

    row = {"id": "s", "system": "Answer in French.", "messages": [{"role": "user", "content": "Hello"}]}
    assert fast_row(row, 1) is None  # the full reader takes it
    path = _write(tmp_path / "p.jsonl", [row])
    with Store(tmp_path / "s.duckdb") as store:
        first = await run_batch(_config(vllm_sim.url, path), store)
        (sample_id,) = store.stored_ids_with("_gen0")
        sent = store.load_sample(sample_id).capture.messages
        assert first.ok == 1 and sent[0] == {"role": "system", "content": "Answer in French."}
        store.execute("UPDATE samples SET messages = ?", [json.dumps(sent[1:])])  # as the fast reader stored it
        again = await run_batch(_config(vllm_sim.url, path), store)
    assert [b.split(":")[0] for b in again.bad_rows] == ["line 1"]


def test_a_prompt_holding_the_servers_credentials_resumes_as_stored(vllm_sim, tmp_path):
    """The stored messages mask the server URL's user and password wherever they occur (`secrets`): an unchanged row
    whose text held one ("Write to alice" with `http://alice:…@host`) was taken for changed, the resume blocked."""
    path = _write(tmp_path / "p.jsonl", [{"id": "c1", "messages": [{"role": "user", "content": "Write to alice."}]}])
    url = vllm_sim.url.replace("http://", "http://alice:hunter22@")
    with Store(tmp_path / "s.duckdb") as store:
        first = asyncio.run(run_batch(_config(url, path), store))
        (sample_id,) = store.stored_ids_with("_gen0")
        assert "[redacted]" in json.dumps(store.load_sample(sample_id).capture.messages)
        again = asyncio.run(run_batch(_config(url, path), store))
    assert (first.ok, again.resumed, again.bad_rows) == (1, 1, [])


async def test_each_shard_says_the_changed_rows_of_its_own_store(vllm_sim, tmp_path):
    """`--shard K/N` on a Slurm array, each into its own store: bad rows are said by shard 1 alone (each shard reads
    the whole file), but a changed row is found only by the shard that stored it: said by that shard, once."""
    rows = [{"id": f"r{i}", "messages": [{"role": "user", "content": f"question {i}"}]} for i in range(12)]
    path = _write(tmp_path / "p.jsonl", rows)
    stores = {k: Store(tmp_path / f"s{k}.duckdb") for k in (1, 2)}
    try:
        for k, store in stores.items():
            await run_batch(_config(vllm_sim.url, path, shard=(k, 2)), store)
        owner = {
            k: {store.load_sample(s).prompt_id for s in store.stored_ids_with("_gen")} for k, store in stores.items()
        }
        edited = next(i for i in range(12) if f"r{i}" in owner[2])
        rows[edited] = {"id": f"r{edited}", "messages": [{"role": "user", "content": "another question"}]}
        _write(path, rows)
        again = {k: await run_batch(_config(vllm_sim.url, path, shard=(k, 2)), store) for k, store in stores.items()}
    finally:
        for store in stores.values():
            store.close()
    assert again[1].bad_rows == []
    assert [b.split(":")[0] for b in again[2].bad_rows] == [f"line {edited + 1}"]
    assert (again[1].ok, again[2].ok) == (0, 0)
