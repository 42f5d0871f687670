"""`tokview batch` sends its first request before the slow parts of its start-up (issue 30, item 3).

The tokenizer's load (`batch/preload.py`) waits until the run's first probe request is on its way, and
DuckDB and the analysis are imported after it: they overlap the probe's waiting on the servers instead
of delaying its first request."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

from tokview.batch import preload
from tokview.batch.config import BatchConfig


def _counting_config(tokenizer_dir) -> tuple[BatchConfig, threading.Event]:
    config = BatchConfig(servers=["http://127.0.0.1:1"], tokenizer_dir=tokenizer_dir)
    loading = threading.Event()
    load = config.load_tokenizer_and_profile

    def counted(*, sliced=True):
        loading.set()
        return load(sliced=sliced)

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
def counted(self, **kw):
    seen.setdefault("tokenizer_load_began_before_the_first_request", "first_request" not in seen)
    return load(self, **kw)
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

    def counted(self, **kw):
        loads.append(str(self.tokenizer_dir))
        return load(self, **kw)

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


def _raw_only_gateway(upstream: str):
    """A server known only by its raw probe: a gateway in front of vLLM that passes /v1/models and /v1/completions
    and nothing else (chat answers 400: a model without a chat template; no /tokenize, no /version)."""
    import httpx
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    client = httpx.AsyncClient(base_url=upstream)

    async def forward(request: Request) -> Response:
        if request.url.path == "/v1/chat/completions":
            return JSONResponse({"error": {"message": "this model has no chat template"}}, status_code=400)
        if request.url.path not in ("/v1/models", "/v1/completions", "/health"):
            return Response(status_code=404)
        answer = await client.request(
            request.method, request.url.path, content=await request.body(), headers={"content-type": "application/json"}
        )
        return Response(answer.content, status_code=answer.status_code, media_type="application/json")

    return Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST"])])


def test_a_server_known_only_by_its_raw_probe_is_probed_again_with_the_tokenizer(tmp_path, monkeypatch):
    """The probe ahead of the tokenizer has no prompt ids for a server whose only id path is the raw one: it leaves
    that server unknown instead of refusing it, and the run probes it again with the tokenizer (every run exits 0)."""
    from loopback import serve_asgi

    from tokview.cli import main
    from tokview.sim import SimConfig, start_simulator

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "messages": [{"role": "user", "content": "hi"}]}\n')
    monkeypatch.setenv("TOKVIEW_CACHE", str(tmp_path / "cache"))
    with start_simulator(SimConfig(kind="vllm")) as sim, serve_asgi(_raw_only_gateway(sim.url)) as url:
        common = ["batch", str(prompts), "--server", url, "--max-new-tokens", "8"]
        assert main([*common, "--db", str(tmp_path / "s.duckdb")]) == 0  # nothing remembered
        prompts.write_text(prompts.read_text() + '{"id": "b", "messages": [{"role": "user", "content": "y"}]}\n')
        assert main([*common, "--db", str(tmp_path / "s.duckdb")]) == 0  # remembered, work left
        assert main([*common, "--db", str(tmp_path / "t.duckdb")]) == 0  # remembered, a new store


def test_a_cancel_while_the_tokenizer_loads_writes_nothing_and_leaves_no_connection_open(tmp_path, monkeypatch):
    """Ctrl-C while the tokenizer loads, after the servers were probed ahead of it: the run stops before anything
    is written (no store is made), as it did when the probe came after the load; and a Ctrl-C as the probe ahead
    ends closes the servers it probed."""
    import asyncio

    from tokview.batch import resume, run_batch
    from tokview.batch.store_opener import StoreOpener
    from tokview.batch.tasks import StartInterrupted
    from tokview.servers import ServerPool
    from tokview.sim import SimConfig, start_simulator

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "messages": [{"role": "user", "content": "hi"}]}\n')
    monkeypatch.setenv("TOKVIEW_CACHE", str(tmp_path / "cache"))
    made: list[ServerPool] = []
    closed: set[int] = set()
    init, aclose = ServerPool.__init__, ServerPool.aclose

    def counted_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)

    async def counted_aclose(self):
        closed.add(id(self))
        await aclose(self)

    monkeypatch.setattr(ServerPool, "__init__", counted_init)
    monkeypatch.setattr(ServerPool, "aclose", counted_aclose)

    def run(db: str, cancel_when: str | None) -> object:
        config = BatchConfig(servers=[sim.url], prompts_path=prompts, max_new_tokens=8, workers=1)
        cancel = asyncio.Event()
        if cancel_when == "load":
            load = config.tokenizer_and_profile

            def loaded(*, sliced=True):
                out = load(sliced=sliced)
                opened_ahead = tmp_path / db  # the landing child opened the new store as the tokenizer loaded
                deadline = time.monotonic() + 30
                while not opened_ahead.exists():
                    assert time.monotonic() < deadline, "the store was not opened ahead of the run"
                    time.sleep(0.01)
                cancel.set()  # what the SIGINT handler does the moment the loop runs again
                return out

            config.tokenizer_and_profile = loaded  # type: ignore[method-assign]
        plan = resume.plan_work  # type: ignore[attr-defined]  # imported there, and replaced there

        def planned(*args, **kwargs):
            out = plan(*args, **kwargs)
            if cancel_when == "plan":
                cancel.set()  # the shortcut's plan runs on the loop: the cancel is seen as the shortcut ends
            return out

        monkeypatch.setattr(resume, "plan_work", planned)
        made.clear()
        closed.clear()
        opener = StoreOpener(str(tmp_path / db), config.servers)
        try:
            return asyncio.run(run_batch(config, opener, cancel=cancel))
        except StartInterrupted as exc:
            return exc
        finally:
            for store in opener.opened:
                store.close()
            assert made and all(id(pool) in closed for pool in made)

    with start_simulator(SimConfig(kind="vllm")) as sim:
        assert not run("warm.duckdb", None).interrupted  # the identity is remembered
        for cancel_when in ("load", "plan"):
            stopped = run(f"{cancel_when}.duckdb", cancel_when)
            assert isinstance(stopped, StartInterrupted), stopped
            assert "nothing was written" in str(stopped)
            assert not (tmp_path / f"{cancel_when}.duckdb").exists()


def test_a_resume_with_work_left_loads_the_tokenizer_while_the_probe_generates(tmp_path, monkeypatch):
    """A store that exists: the servers' names are read with the tokenizer's load held (a resume with nothing left
    never parses it); once the plan shows work, the load is released before the probe's 1-token generations go
    out, so the two overlap; with nothing left the load stays held and the generations are sent for the summary."""
    from tokview.batch import resume
    from tokview.cli import main
    from tokview.servers import ServerPool
    from tokview.sim import SimConfig, start_simulator

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "messages": [{"role": "user", "content": "hi"}]}\n')
    monkeypatch.setenv("TOKVIEW_CACHE", str(tmp_path / "cache"))
    events: list[str] = []
    release, generations = resume.release, ServerPool.probe_generations

    def released() -> None:
        events.append("release")
        release()

    async def generated(self: ServerPool) -> None:
        events.append("generations")
        await generations(self)

    monkeypatch.setattr(resume, "release", released)
    monkeypatch.setattr(ServerPool, "probe_generations", generated)
    with start_simulator(SimConfig(kind="vllm")) as sim:
        common = ["batch", str(prompts), "--server", sim.url, "--max-new-tokens", "8", "--workers", "1"]
        db = str(tmp_path / "s.duckdb")
        assert main([*common, "--db", db]) == 0  # the identity is now remembered
        prompts.write_text(prompts.read_text() + '{"id": "b", "messages": [{"role": "user", "content": "y"}]}\n')
        events.clear()
        assert main([*common, "--db", db]) == 0
        assert events == ["release", "generations"]
        events.clear()
        assert main([*common, "--db", db]) == 0  # nothing left
        assert events == ["generations"]
