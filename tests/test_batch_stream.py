"""Streamed planning: the same ids and accounting as `runner.plan`, in bounded memory.

`worklist.plan_work` reads the prompts file a chunk at a time and `TodoQueue` reads the rows with work
again as they are taken; these tests hold it to the reference (`read_prompts` + `plan` + the stored-id
anti-join) on every row shape, duplicates and conflicts across chunk borders, shards, resumes and
several samples per prompt, and measure that it never holds the whole file.
"""

from __future__ import annotations

import json
import random
import tracemalloc
from pathlib import Path

import orjson
import pytest

from tokview.batch import BatchConfig, InputError, plan, read_prompts
from tokview.batch import inputs as inputs_module
from tokview.batch.inputs import (
    _fast_scan,
    checked_row,
    conversation_digest,
    fast_row,
    generation_turns,
    iter_checked,
    iter_jsonl_fast,
    parse_checked,
)
from tokview.batch.runner import select_shard
from tokview.batch.seen_ids import SeenIds
from tokview.batch.worklist import plan_work
from tokview.core.prompts import generation_points, iter_jsonl
from tokview.store import Store

IDENTITY = {"model": "m", "tokenizer": "t", "profile": "kimi-k2.5"}


def mixed_rows() -> list[object]:
    """Every shape, and the rows the fast paths must hand over to the full checks."""
    return [
        {"id": "a", "messages": [{"role": "user", "content": "hi"}]},
        {"id": "b", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]},
        {
            "id": "multi",
            "messages": [
                {"role": "user", "content": "1"},
                {"role": "assistant", "content": "x"},
                {"role": "user", "content": "2"},
                {"role": "assistant", "content": "y"},
            ],
        },
        {
            "id": "open",
            "messages": [
                {"role": "user", "content": "1"},
                {"role": "assistant", "content": "x", "reasoning_content": "r"},
                {"role": "user", "content": "2"},
            ],
        },
        {"id": "one-answer", "messages": [{"role": "user", "content": "1"}, {"role": "assistant", "content": "x"}]},
        {"id": "sharegpt", "conversations": [{"from": "human", "value": "v"}, {"from": "gpt", "value": "w"}]},
        {"id": 7, "prompt": "integer id", "system": "sys"},
        {"prompt": "no id: a hash id"},
        {"id": "parts", "messages": [{"role": "user", "content": [{"type": "text", "text": "p"}]}]},
        {"id": "ünïcode", "messages": [{"role": "user", "content": "é"}]},
        {"id": "a", "messages": [{"role": "user", "content": "hi"}]},  # duplicate of line 1
        {"id": "a", "messages": [{"role": "user", "content": "other"}]},  # conflict with line 1
        {"id": "bad", "messages": [{"role": "user", "content": 3}]},  # bad content
        {"id": "norole", "messages": [{"role": "wizard", "content": "x"}]},
        {"id": "noturn", "messages": [{"role": "assistant", "content": "x"}]},
        {"id": "tab\tid", "messages": [{"role": "user", "content": "x"}]},
        {"id": "extra", "messages": [{"role": "user", "content": "x", "name": "n"}]},
        {"id": "  ", "messages": [{"role": "user", "content": "blank id"}]},
        {"id": "b", "messages": [{"role": "user", "content": "q"}, {"role": "system", "content": "s"}]},  # conflict
        {
            "id": "multi",
            "messages": [
                {"role": "user", "content": "1"},
                {"role": "assistant", "content": "x"},
                {"role": "user", "content": "2"},
                {"role": "assistant", "content": "y"},
            ],
        },  # a duplicate with two generation points
        [1, 2],
    ]


def write(path: Path, rows: list[object], extra_lines: tuple[str, ...] = ()) -> Path:
    lines = [json.dumps(r) for r in rows] + list(extra_lines)
    path.write_text("\n".join(lines) + "\n\n")
    return path


def reference(path: Path, config: BatchConfig, stored: set[str]):
    """What the batch did before streaming: every row held, every slot planned, then the anti-join."""
    rows, bad = read_prompts(path, limit=config.limit)
    items, duplicates = plan(rows, config, config.sample_settings(IDENTITY))
    items = select_shard(items, config.shard)
    if config.shard is not None and config.shard[0] != 1:
        duplicates, bad = 0, []
    todo = [i for i in items if i.sample_id not in stored]
    return len(items), duplicates, bad, len(items) - len(todo), todo


@pytest.mark.parametrize("per_prompt", [1, 2])
@pytest.mark.parametrize(("shard", "limit"), [(None, None), ((1, 3), None), ((2, 3), None), (None, 15)])
def test_streamed_plan_equals_the_held_plan(tmp_path, monkeypatch, per_prompt, shard, limit):
    monkeypatch.setattr(inputs_module, "CHUNK_ROWS", 4)  # duplicates and conflicts across chunk borders
    rows = mixed_rows()
    path = write(tmp_path / "p.jsonl", rows, ("{not json", '{"id": "lone", "prompt": "\\ud800"}'))
    # per slot: `--history file` (a chain is planned whole: tests/test_chain_plan.py)
    config = BatchConfig(
        servers=[], prompts_path=path, samples_per_prompt=per_prompt, shard=shard, limit=limit, history="file"
    )
    settings = config.sample_settings(IDENTITY)
    everything = reference(path, BatchConfig(servers=[], samples_per_prompt=per_prompt, history="file"), set())[4]
    stored = {i.sample_id for i in everything[::3]}  # a third already stored: a resume
    planned, duplicates, bad, resumed, todo = reference(path, config, stored)
    work = plan_work(config, settings, lambda fragment: {s for s in stored if fragment in s})
    assert (work.planned, work.duplicates, work.bad, work.resumed) == (planned, duplicates, bad, resumed)
    assert work.todo == len(todo)
    assert work.input == planned + duplicates + len(bad)
    assert list(work.queue()) == todo  # same ids, turns, indexes and messages, in the same order
    if shard is None and limit is None:
        assert len(bad) == 9
        assert duplicates == 3 * per_prompt
        assert todo


def test_chunk_size_changes_nothing(tmp_path, monkeypatch):
    rows = mixed_rows() * 3  # every id three times: duplicates, and conflicts naming the first line
    path = write(tmp_path / "p.jsonl", rows)
    whole = [(c.line, c.prompt_id, c.turns, c.bad, c.first) for c in iter_checked(path)]
    for chunk in (1, 2, 5, 7):
        monkeypatch.setattr(inputs_module, "CHUNK_ROWS", chunk)
        assert [(c.line, c.prompt_id, c.turns, c.bad, c.first) for c in iter_checked(path)] == whole
    assert "line 12: id 'a' conflicts with line 1: same id, different conversation" in whole[11][3]
    assert [first for _, pid, _, _, first in whole if pid == "a"] == [True] + [False] * 5


def test_the_fast_paths_give_the_full_checks_answer():
    rows = [*mixed_rows(), {"id": "x", "messages": [{"content": "c", "role": "user"}]}]
    fast = 0
    for n, obj in enumerate(rows, start=1):
        try:
            full = parse_checked(obj, n)
        except Exception:
            full = None
        quick = fast_row(obj, n)
        scan = _fast_scan(obj)
        assert (quick is None) == (scan is None)
        if quick is not None:
            fast += 1
            assert quick == full
            assert scan == (full.prompt_id, generation_turns(full.messages), conversation_digest(full.messages))
        if full is not None:
            assert generation_turns(full.messages) == [p.turn for p in generation_points(full)]
    assert fast >= 5  # the common rows do take the fast path


def test_orjson_reader_reads_what_the_standard_reader_reads(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(
        "\ufeff"
        + "\n".join(
            [
                '{"id": "a", "prompt": "x"}',
                "",
                '{"id": "n", "prompt": "x", "score": NaN}',
                '{"id": "big", "prompt": "x", "n": 123456789012345678901234567890}',
                '{"id": "s", "prompt": "\\ud800"}',
                '{"id": "raw", "prompt": "a\tb"}',
                "{nope",
                '{"id": "a", "id": "dup-key", "prompt": "x"}',
                "   ",
            ]
        )
        + "\n",
        encoding="utf-8",
    )

    def outcome(read, n, obj):
        try:
            return read(n, obj)
        except Exception as exc:
            return str(exc)

    fast = [(n, outcome(lambda n, o: checked_row(n, o, text), n, obj)) for n, obj, text in iter_jsonl_fast(path)]
    slow = [(n, outcome(lambda n, o: parse_checked(o, n), n, obj)) for n, obj in iter_jsonl(path)]
    assert fast == slow
    assert dict(slow)[4].prompt_id == "big"
    assert "not valid JSON" in dict(slow)[7]
    assert [n for n, _, text in iter_jsonl_fast(path) if text is None] == [3, 5, 6, 7]  # what orjson refuses
    _rows, bad = read_prompts(path)
    assert any("lone UTF-16 surrogate U+D800" in b for b in bad)  # orjson's refusal did not hide the reason
    big = tmp_path / "big.jsonl"
    big.write_text(
        '{"id": 123456789012345678901234567890, "prompt": "x"}\n{"prompt": "y", "n": 12345678901234567890123}\n'
    )
    rows, _ = read_prompts(big)  # orjson would read both numbers as floats: a bad id, another hash id
    assert [r.prompt_id for r in rows] == [
        "123456789012345678901234567890",
        parse_checked(json.loads(big.read_text().splitlines()[1]), 2).prompt_id,
    ]


@pytest.mark.parametrize("small", [0, 100, SeenIds.SMALL])
def test_seen_ids_agree_with_a_dict(monkeypatch, small):
    """All in numpy runs (0), the dict front handing over mid-read (100), and all in the dict."""
    monkeypatch.setattr(SeenIds, "SMALL", small)
    rng = random.Random(5)
    seen, oracle = SeenIds(), {}
    line = 0
    for _ in range(60):
        size = rng.randint(0, 40)
        keys = [rng.randint(-(2**63), 2**63 - 1) if rng.random() < 0.5 else rng.randint(0, 300) for _ in range(size)]
        digests = [rng.randint(0, 1) for _ in keys]
        lines = list(range(line, line + size))
        line += size
        got = seen.settle(keys, digests, lines)
        want = {}
        for i, (k, d, n) in enumerate(zip(keys, digests, lines)):
            if k in oracle:
                want[i] = (oracle[k][0], oracle[k][1] == d)
            else:
                oracle[k] = (n, d)
        assert got == want
    assert len(seen) == len(oracle)


def test_planning_holds_a_chunk_not_the_file(tmp_path, monkeypatch):
    """The bounded-memory claim, measured: planning 6,000 rows of 5 kB and taking every item from the
    queue peaks at a few MB; holding the rows (what the batch did) takes over 25 MB."""
    monkeypatch.setattr(inputs_module, "CHUNK_ROWS", 256)
    path = tmp_path / "big.jsonl"
    with path.open("wb") as f:
        for i in range(6_000):
            f.write(orjson.dumps({"id": f"r{i}", "messages": [{"role": "user", "content": f"{i} " + "x" * 5000}]}))
            f.write(b"\n")
    config = BatchConfig(servers=[], prompts_path=path)
    settings = config.sample_settings(IDENTITY)
    plan_work(config, settings, lambda _fragment: set())  # imports (numpy) are not what is measured
    tracemalloc.start()
    try:
        work = plan_work(config, settings, lambda _fragment: set())
        queue = work.queue()
        taken = 0
        while queue:
            taken += len(queue.popleft().messages)
        _, streamed_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        rows, _ = read_prompts(path)
        _, held_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert taken == work.todo == len(rows) == 6_000
    assert streamed_peak < 6_000_000 < 25_000_000 < held_peak


def test_a_file_changed_after_planning_is_refused(tmp_path):
    path = write(tmp_path / "p.jsonl", [{"id": "a", "prompt": "x"}])
    config = BatchConfig(servers=[], prompts_path=path)
    work = plan_work(config, config.sample_settings(IDENTITY), lambda _f: set())
    path.write_text(path.read_text() + '{"id": "b", "prompt": "y"}\n')
    with pytest.raises(InputError, match="changed"):
        work.queue()


def test_stored_ids_with_reads_only_this_runs_ids(tmp_path):
    from builders import kimi, make_capture, profile

    from tokview.core.analysis import analyze

    capture = make_capture()
    with Store(tmp_path / "s.duckdb") as store:
        for sid in ("p1@aaa_gen0", "p2@aaa_gen1", "p3@bbb_gen0"):
            store.put_sample(sid, sid.split("@")[0], "r", capture, analyze(capture, profile(), kimi()))
        assert store.stored_ids_with("@aaa_gen") == {"p1@aaa_gen0", "p2@aaa_gen1"}
        assert store.stored_ids_with("@ccc_gen") == set()


# -- resuming a fully stored run without the tokenizer -------------------------------------------------


@pytest.fixture(scope="module")
def sim():
    from tokview.sim import SimConfig, start_simulator

    with start_simulator(SimConfig(kind="vllm")) as server:
        yield server


def _resume_config(url: str, path: Path, **kw) -> BatchConfig:
    from tokview.core.kimi_layout import kimi_tokenizer_dir

    return BatchConfig(servers=[url], prompts_path=path, tokenizer_dir=kimi_tokenizer_dir(), max_new_tokens=16, **kw)


async def test_a_stored_run_resumes_without_loading_the_tokenizer(sim, tmp_path, monkeypatch):
    from tokview.batch import run_batch

    monkeypatch.setenv("TOKVIEW_CACHE", str(tmp_path / "cache"))  # nothing remembered yet
    rows = [{"id": f"q{i}", "prompt": f"question {i}"} for i in range(6)] + [{"id": "q0", "prompt": "question 0"}]
    path = write(tmp_path / "p.jsonl", rows, ("{bad",))
    with Store(tmp_path / "s.duckdb") as store:
        first = await run_batch(_resume_config(sim.url, path), store)
        assert first.ok == 6
        assert first.duplicates == 1
        assert len(first.bad_rows) == 1
        full = await run_batch(_resume_config(sim.url, path), store)  # loads the tokenizer: the reference

        def no_tokenizer(_config):
            raise AssertionError("the tokenizer was loaded to find that nothing is left to do")

        monkeypatch.setattr(BatchConfig, "tokenizer_and_profile", no_tokenizer)
        quick = await run_batch(_resume_config(sim.url, path), store)
        for summary in (full, quick):
            assert (summary.run_id, summary.input, summary.ok, summary.resumed) == (first.run_id, 8, 0, 6)
            assert (summary.skipped, summary.duplicates, summary.bad_rows) == (8, 1, first.bad_rows)
            assert summary.balanced
            assert summary.exit_code == full.exit_code
        with pytest.raises(AssertionError, match="tokenizer was loaded"):  # work left: the ordinary path
            await run_batch(_resume_config(sim.url, path, samples_per_prompt=2), store)


async def test_what_is_left_after_the_shortcut_is_generated_once(sim, tmp_path, monkeypatch):
    from tokview.batch import run_batch

    monkeypatch.setenv("TOKVIEW_CACHE", str(tmp_path / "cache"))
    path = write(tmp_path / "p.jsonl", [{"id": f"q{i}", "prompt": f"question {i}"} for i in range(5)])
    with Store(tmp_path / "s.duckdb") as store:
        assert (await run_batch(_resume_config(sim.url, path, limit=2), store)).ok == 2
        summary = await run_batch(_resume_config(sim.url, path), store)  # the plan made without a tokenizer is reused
        assert (summary.ok, summary.resumed, summary.input) == (3, 2, 5)
        assert summary.balanced
        assert store.count_samples() == 5


async def test_a_resume_with_work_left_sends_the_probe_generations_once(sim, tmp_path, monkeypatch):
    """The shortcut needs only the model's name. It used to run the whole probe, and the ordinary path then ran it
    again: on every run after the first, a live server answered the 1-token chat and raw probes and /tokenize
    twice."""
    from collections import Counter

    from tokview.batch import run_batch

    monkeypatch.setenv("TOKVIEW_CACHE", str(tmp_path / "cache"))
    path = write(tmp_path / "p.jsonl", [{"id": f"q{i}", "prompt": f"question {i}"} for i in range(5)])
    with Store(tmp_path / "s.duckdb") as store:
        assert (await run_batch(_resume_config(sim.url, path, limit=2), store)).ok == 2
        before = Counter(sim.stats.requests)
        summary = await run_batch(_resume_config(sim.url, path), store)
        sent = Counter(sim.stats.requests) - before
        assert (summary.ok, summary.resumed) == (3, 2)
        assert (sent["/v1/chat/completions"], sent["/tokenize"], sent["/v1/completions"]) == (1, 1, 1 + 3)
        assert (
            summary.servers[0]["features"]
            == (await run_batch(_resume_config(sim.url, path), store)).servers[0]["features"]
        )  # the nothing-to-do summary still says what the full probe found
    from tokview.batch.store_opener import StoreOpener
    from tokview.store import parts

    fresh = StoreOpener(tmp_path / "new.duckdb")  # a store not made yet: planned without opening it
    assert fresh.holds_nothing() and parts.parts_dir(fresh.path) == Path(fresh.path + ".parts")
    before = Counter(sim.stats.requests)
    try:
        assert (await run_batch(_resume_config(sim.url, path), fresh)).ok == 5
    finally:
        for opened in fresh.opened:
            opened.close()
    sent = Counter(sim.stats.requests) - before
    assert (sent["/v1/chat/completions"], sent["/tokenize"], sent["/v1/completions"]) == (1, 1, 1 + 5)
    assert fresh.opened == [] and not fresh.holds_nothing()  # made by its landing child (`landing_process`)


def test_the_remembered_identity_follows_the_tokenizer_files_and_the_profile(tmp_path, monkeypatch):
    import shutil

    from tokview.batch.identity import identity_key, known_identity, remember_identity
    from tokview.core.kimi_layout import kimi_tokenizer_dir

    monkeypatch.setenv("TOKVIEW_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "tok"
    shutil.copytree(kimi_tokenizer_dir(), folder)
    config = BatchConfig(servers=[], tokenizer_dir=folder)
    assert known_identity(config) is None
    remember_identity(config, {"model": "m", "tokenizer": "vocab1", "profile": "kimi-k2.5"})
    assert known_identity(config) == {"tokenizer": "vocab1", "profile": "kimi-k2.5"}
    assert known_identity(BatchConfig(servers=[], tokenizer_dir=folder, profile="qwen3")) is None
    assert identity_key(BatchConfig(servers=[], tokenizer_dir=folder, trust_remote_code=True)) != identity_key(config)
    template = folder / "chat_template.jinja"
    template.write_text(template.read_text() + "\n")  # another template may detect another profile
    assert known_identity(config) is None
    assert identity_key(BatchConfig(servers=[], tokenizer=object())) is None  # the app's loaded tokenizer


def test_a_row_edited_while_the_batch_runs_stops_it(tmp_path):
    path = write(tmp_path / "p.jsonl", [{"id": f"q{i:04d}", "prompt": f"p{i}"} for i in range(2000)])
    config = BatchConfig(servers=[], prompts_path=path)
    work = plan_work(config, config.sample_settings(IDENTITY), lambda _f: set())
    queue = work.queue()
    assert queue.popleft().prompt_id == "q0000"  # the file is open, its first block read
    lines = path.read_text().splitlines()
    lines[1500] = json.dumps({"id": "z1500", "prompt": "p1500"})  # same length, another id
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match="changed while the batch ran"):
        while queue:
            queue.popleft()
    assert 1000 < 2000 - len(queue) <= 1501  # what was read before the edited row was handed out
