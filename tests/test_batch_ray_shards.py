"""`--ray` scheduling without Ray: the driver cuts the streamed work list into shards as it submits them and
keeps only a few per CPU in flight, so a million-prompt run never holds its work list (fast tier; the real
Ray runs in tests/test_batch_ray.py)."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

from tokview.batch import BatchConfig, ray_shards
from tokview.batch.worklist import plan_work

IDENTITY = {"model": "m", "tokenizer": "t", "profile": "p"}


class FakeRef:
    def __init__(self, shard):
        self.shard = shard


class FakeTask:
    def __init__(self, ray):
        self.ray = ray

    def options(self, **_):
        return self

    def remote(self, config, run_id, shard):
        return self.ray.submit(shard)


class FakeRay:
    """Runs nothing: a task's result is its shard's count; records how much work was out at once."""

    def __init__(self, queue, cpus=2):
        self.queue, self.cpus = queue, cpus
        self.queue_total = len(queue)
        self.landed = 0
        self.most_out = 0
        self.submitted: list[list[str]] = []

    def remote(self, fn):
        return FakeTask(self)

    def cluster_resources(self):
        return {"CPU": self.cpus}

    def submit(self, shard):
        self.submitted.append([i.sample_id for i in shard])
        taken = self.queue_total - len(self.queue)
        self.most_out = max(self.most_out, taken - self.landed)
        return FakeRef(shard)

    def wait(self, refs, num_returns, timeout):
        return refs[:1], refs[1:]

    def get(self, ref):
        self.landed += len(ref.shard)
        return {
            "samples": [],
            "failures": [],
            "outcome": None,
            "ok": len(ref.shard),
            "failed": 0,
            "flagged": 0,
            "truncated": 0,
            "output_tokens": 0,
            "reasons": {},
        }

    def cancel(self, ref, force):
        pass


class NoStore:
    def write_part(self, samples, failures):
        pass

    def ingest(self):
        return 0, 0


def test_shards_are_cut_as_they_are_submitted_with_a_bounded_number_in_flight(tmp_path, monkeypatch):
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"p{i}"}) + "\n" for i in range(5000)))
    config = BatchConfig(servers=[], prompts_path=path, ray="auto")
    work = plan_work(config, config.sample_settings(IDENTITY), lambda _f: set())
    queue = work.queue()
    fake = FakeRay(queue)
    monkeypatch.setattr(ray_shards, "connect", _connected_to(fake))
    tally = ray_shards.Tally()
    outcomes = asyncio.run(
        ray_shards.run_on_ray(
            config, NoStore(), run_id="run", todo=queue, tally=tally, cancel=None, report=lambda: None
        )
    )
    size = ray_shards.SHARD_MAX
    assert tally.ok == 5000
    assert outcomes == [None] * len(fake.submitted)
    ids = [i for shard in fake.submitted for i in shard]
    assert len(ids) == len(set(ids)) == 5000
    assert Counter(len(s) for s in fake.submitted)[size] == 5000 // size
    assert fake.most_out <= ray_shards.SHARDS_IN_FLIGHT_PER_CPU * fake.cpus * size < 5000


def test_shard_size_is_bounded_both_ways():
    assert ray_shards.shard_size(10, 2) == ray_shards.SHARD_MIN
    assert ray_shards.shard_size(1_000_000, 2) == ray_shards.SHARD_MAX
    assert ray_shards.shard_size(1000, 2) == 125


def test_a_cancel_submits_nothing_more(tmp_path, monkeypatch):
    path: Path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"p{i}"}) + "\n" for i in range(2000)))
    config = BatchConfig(servers=[], prompts_path=path, ray="auto")
    queue = plan_work(config, config.sample_settings(IDENTITY), lambda _f: set()).queue()
    fake = FakeRay(queue)
    monkeypatch.setattr(ray_shards, "connect", _connected_to(fake))
    cancel = asyncio.Event()
    cancel.set()
    outcomes = asyncio.run(
        ray_shards.run_on_ray(
            config, NoStore(), run_id="run", todo=queue, tally=ray_shards.Tally(), cancel=cancel, report=list
        )
    )
    assert outcomes == ["interrupted"]
    assert fake.submitted == []
    assert len(queue) == 2000


def _connected_to(fake: object) -> object:
    """`ray_shards.connect` handing back `fake` (it is a coroutine: Ray connects on a thread the loop waits for)."""

    async def connect(address: str, cancel: object = None) -> object:
        return fake

    return connect
