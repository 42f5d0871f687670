"""`tokview batch` sends its first request before the slow parts of its start-up (issue 30, item 3).

The tokenizer's load (`batch/preload.py`) waits until the run's first probe request is on its way, and
DuckDB and the analysis are imported after it: they overlap the probe's waiting on the servers instead
of delaying its first request."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

from tokview.batch import preload
from tokview.batch.config import BatchConfig


def _counting_config(tokenizer_dir) -> tuple[BatchConfig, threading.Event]:
    config = BatchConfig(servers=["http://127.0.0.1:1"], tokenizer_dir=tokenizer_dir)
    loading = threading.Event()
    load = config.load_tokenizer_and_profile

    def counted():
        loading.set()
        return load()

    config.load_tokenizer_and_profile = counted  # type: ignore[method-assign]
    return config, loading


def test_a_started_load_waits_for_the_release(qwen_tok_dir):
    config, loading = _counting_config(qwen_tok_dir)
    future = preload.start(config)
    assert future is not None
    assert not loading.wait(0.2)  # started, not released: nothing loads yet
    preload.release()
    _tokenizer, profile = future.result(timeout=60)
    assert loading.is_set()
    assert profile.name == "qwen3"
    assert preload.take(config) is future


def test_a_discarded_load_that_was_never_released_never_loads(qwen_tok_dir):
    config, loading = _counting_config(qwen_tok_dir)
    before = set(threading.enumerate())
    future = preload.start(config)
    (thread,) = [t for t in threading.enumerate() if t not in before and t.name == "tokview-tokenizer"]
    preload.discard(config)
    thread.join(timeout=10)
    assert not thread.is_alive()  # its thread ended
    assert future is not None
    assert future.cancelled()
    assert not loading.is_set()  # without loading anything


FIRST_REQUEST_PROBE = """
import json, socket, sys
from tokview.batch.config import BatchConfig
seen = {}
load = BatchConfig.load_tokenizer_and_profile
def counted(self):
    seen.setdefault("tokenizer_load_began_before_the_first_request", "first_request" not in seen)
    return load(self)
BatchConfig.load_tokenizer_and_profile = counted
connect = socket.socket.connect
def first(self, address):
    if "first_request" not in seen:
        seen["first_request"] = sorted(m for m in ("duckdb", "tokview.core.analysis", "tokenizers") if m in sys.modules)
    return connect(self, address)
socket.socket.connect = first
from tokview.cli import main
code = main(sys.argv[1:])
print(json.dumps(seen))
sys.exit(code)
"""


def test_the_first_request_goes_out_before_the_tokenizer_duckdb_and_the_analysis(tmp_path, monkeypatch):
    from tokview.cli import main
    from tokview.sim import SimConfig, start_simulator

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "messages": [{"role": "user", "content": "hi"}]}\n')
    monkeypatch.setenv("TOKVIEW_CACHE", str(tmp_path / "cache"))  # a run remembers its identity here
    with start_simulator(SimConfig(kind="vllm")) as sim:
        common = ["batch", str(prompts), "--server", sim.url, "--max-new-tokens", "8", "--workers", "1"]
        assert main([*common, "--db", str(tmp_path / "first.duckdb")]) == 0  # the identity is now known
        done = subprocess.run(
            [sys.executable, "-c", FIRST_REQUEST_PROBE, *common, "--db", str(tmp_path / "second.duckdb")],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 0, done.stderr[-800:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["first_request"] == []  # neither DuckDB, the analysis nor the tokenizers library yet
    assert seen["tokenizer_load_began_before_the_first_request"] is False


async def test_a_probe_cancelled_before_its_first_request_is_out_ends_with_it():
    """Ctrl-C while the probe is still opening its first connection: the probe is cancelled with the run,
    not left running behind it, and the tokenizer's load is released (whoever waits for it gets it)."""
    import asyncio

    class Pool:
        cancelled = False

        async def start(self) -> None:
            try:
                await asyncio.Event().wait()  # a server that never answers
            except asyncio.CancelledError:
                self.cancelled = True
                raise

    pool = Pool()
    probing = asyncio.create_task(preload.probe(pool))
    await asyncio.sleep(0)  # the probe's first turn: its start is under way
    probing.cancel()
    try:
        await probing
    except asyncio.CancelledError:
        pass
    await asyncio.sleep(0)  # the cancelled start runs to its end
    assert pool.cancelled


def test_a_resume_with_nothing_left_never_loads_the_tokenizer(tmp_path, monkeypatch):
    """A store that exists may hold every sample: its resume keeps the tokenizer's load held until a plan shows
    work left, so a resume with nothing to do never pays the parse (it holds the GIL the plan's reading of the
    stored ids needs); a new store's run, which always has work, releases it with the first probe request."""
    from tokview.cli import main
    from tokview.sim import SimConfig, start_simulator

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "messages": [{"role": "user", "content": "hi"}]}\n')
    monkeypatch.setenv("TOKVIEW_CACHE", str(tmp_path / "cache"))
    loads: list[str] = []
    load = BatchConfig.load_tokenizer_and_profile

    def counted(self):
        loads.append(str(self.tokenizer_dir))
        return load(self)

    monkeypatch.setattr(BatchConfig, "load_tokenizer_and_profile", counted)
    with start_simulator(SimConfig(kind="vllm")) as sim:
        common = ["batch", str(prompts), "--server", sim.url, "--max-new-tokens", "8", "--workers", "1"]
        assert main([*common, "--db", str(tmp_path / "s.duckdb")]) == 0  # the identity is now known
        assert len(loads) == 1
        assert main([*common, "--db", str(tmp_path / "s.duckdb")]) == 0  # nothing left to do
        assert len(loads) == 1
        assert main([*common, "--db", str(tmp_path / "other.duckdb")]) == 0  # a new store: work left
        assert len(loads) == 2


def test_a_rerun_probes_the_servers_once_while_its_tokenizer_loads(tmp_path, monkeypatch):
    """A run with a remembered identity probes the servers in full before its tokenizer has loaded (the probe's
    1-token generations overlap the load) and the run takes that probe: one probe per run, where a new store, a
    store with work left and one with nothing left each probed twice. A remembered entry of older tokview (no
    template settings), or settings that no longer hold, are probed again, and the entry is brought up to date."""
    from tokview.batch.identity import identities_file
    from tokview.cli import main
    from tokview.core.json_cache import read_json_cache, write_json_cache
    from tokview.sim import SimConfig, start_simulator

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "messages": [{"role": "user", "content": "hi"}]}\n')
    monkeypatch.setenv("TOKVIEW_CACHE", str(tmp_path / "cache"))
    with start_simulator(SimConfig(kind="vllm")) as sim:
        common = ["batch", str(prompts), "--server", sim.url, "--max-new-tokens", "8", "--workers", "1"]

        def probes(db: str) -> int:
            before = sim.stats.requests["/version"]
            assert main([*common, "--db", str(tmp_path / db)]) == 0
            return sim.stats.requests["/version"] - before

        assert probes("s.duckdb") == 1  # nothing remembered: the ordinary probe
        (entry,) = read_json_cache(identities_file()).values()
        assert entry["probe_kwargs"] == {"thinking": True}  # the Kimi layout's template switch
        assert probes("new.duckdb") == 1  # a new store
        prompts.write_text(prompts.read_text() + '{"id": "b", "messages": [{"role": "user", "content": "yo"}]}\n')
        assert probes("s.duckdb") == 1  # work left in a store that exists
        assert probes("s.duckdb") == 1  # nothing left
        older = {k: v for k, v in entry.items() if k != "probe_kwargs"}
        for db, stale in (("older.duckdb", older), ("other.duckdb", {**entry, "probe_kwargs": {}})):
            write_json_cache(identities_file(), {key: stale for key in read_json_cache(identities_file())})
            assert probes(db) == 2  # the shortcut's probe, then the run's own
            assert list(read_json_cache(identities_file()).values()) == [entry]
    from tokview.store import Store

    for db, stored in (("s.duckdb", 2), ("new.duckdb", 1), ("older.duckdb", 2), ("other.duckdb", 2)):
        store = Store(str(tmp_path / db))
        try:
            assert store.query("SELECT count(*) FROM samples")[0][0] == stored
        finally:
            store.close()
