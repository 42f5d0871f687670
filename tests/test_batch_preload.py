"""The tokenizer loads on a background thread while `tokview batch` starts up (`batch/preload.py`):
the run gets exactly what it would have loaded itself, a loading error surfaces where it always did,
and parsing the batch flags imports neither the capture machinery nor DuckDB."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tokview.batch import preload
from tokview.batch.config import BatchConfig
from tokview.core.tokenizer import TokenizerError


def test_the_run_takes_the_preloaded_tokenizer(qwen_tok_dir):
    config = BatchConfig(servers=["http://127.0.0.1:1"], tokenizer_dir=qwen_tok_dir)
    loads = []
    load = config.load_tokenizer_and_profile

    def counted(*, sliced=True):
        loads.append(1)
        return load(sliced=sliced)

    config.load_tokenizer_and_profile = counted
    preload.start(config)
    preload.start(config)  # a second start while one is under way adds nothing
    tokenizer, profile = config.tokenizer_and_profile()
    assert len(loads) == 1  # the run waited for the preload instead of loading again
    assert profile.name == "qwen3"
    assert tokenizer.decode(tokenizer.encode("hello world")) == "hello world"
    assert preload.take(config) is None  # taken once
    config.tokenizer_and_profile()
    assert len(loads) == 2  # nothing preloaded: loaded now, as before


def test_a_loading_error_surfaces_in_the_run(tmp_path):
    config = BatchConfig(servers=["http://127.0.0.1:1"], tokenizer_dir=tmp_path / "missing")
    with pytest.raises(TokenizerError) as direct:
        config.load_tokenizer_and_profile()
    preload.start(config)
    with pytest.raises(TokenizerError) as preloaded:
        config.tokenizer_and_profile()
    assert str(preloaded.value) == str(direct.value)


def test_discard_forgets_an_untaken_load(tmp_path):
    config = BatchConfig(servers=["http://127.0.0.1:1"], tokenizer_dir=tmp_path / "missing")
    preload.start(config)
    preload.discard(config)
    assert preload.take(config) is None


def test_loaded_objects_are_not_preloaded(kimi_tok):
    config = BatchConfig(servers=["http://127.0.0.1:1"], tokenizer=kimi_tok)
    preload.start(config)
    assert preload.take(config) is None


def test_parsing_batch_flags_imports_no_capture_machinery():
    """What lets the tokenizer load side by side with the rest: the batch command's module and the
    package import only the config; the runner, the servers layer, DuckDB and httpx come later."""
    code = (
        "import sys, tokview.cli as c; c.build_parser('batch'); import tokview.batch.config; "
        "print(sorted(m for m in ('duckdb', 'httpx', 'numpy', 'tokview.batch.runner', 'tokview.servers') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_batch_as_its_own_process_ends_without_teardown_yet_keeps_everything(tmp_path):
    """`tokview batch` ends its process in `cli.exit_without_teardown` (no interpreter teardown): its
    atexit handlers still run, its piped output arrives whole, its store holds every sample; called
    in-process (`main(argv)`), the same command returns instead."""
    import json

    from tokview.cli import main
    from tokview.sim import SimConfig, start_simulator
    from tokview.store import Store

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "".join(
            json.dumps({"id": f"q{i}", "messages": [{"role": "user", "content": f"q {i}"}]}) + "\n" for i in range(6)
        )
    )
    marker, freed = tmp_path / "atexit-ran", tmp_path / "freed-at-teardown"
    tokenizer_freed = tmp_path / "tokenizer-freed"
    script = (
        "import atexit, sys; from pathlib import Path; "
        f"atexit.register(lambda: Path({str(marker)!r}).write_text('yes')); "
        f"Freed = type('Freed', (), {{'__del__': lambda self: Path({str(freed)!r}).write_text('yes')}}); "
        "kept = Freed(); "  # a module global: the interpreter's teardown would free it
        # the tokenizer (~25 ms to free) must outlive the command's own function, up to the process's end
        "from tokview.core.tokenizer import TokenizerAdapter; "
        f"TokenizerAdapter.__del__ = lambda self: Path({str(tokenizer_freed)!r}).write_text('yes'); "
        "from tokview.cli import main; sys.exit(main())"
    )
    with start_simulator(SimConfig(kind="vllm")) as sim:
        common = ["--server", sim.url, "--max-new-tokens", "24", "--workers", "1", "--summary-json"]
        proc = subprocess.run(
            [sys.executable, "-c", script, "batch", str(prompts), "--db", str(tmp_path / "a.duckdb"), *common],
            capture_output=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr.decode()[-800:]
        summary = json.loads(proc.stdout.decode().strip().splitlines()[-1])
        assert summary["ok"] == 6
        assert summary["balanced"]
        assert marker.read_text() == "yes"
        assert not freed.exists()  # atexit ran; the teardown did not
        assert not tokenizer_freed.exists()  # never freed: the process ended holding it
        assert "run " in proc.stderr.decode()  # the summary written to stderr arrived
        with Store(tmp_path / "a.duckdb") as store:
            assert store.count_samples() == 6
        code = main(["batch", str(prompts), "--db", str(tmp_path / "b.duckdb"), *common])
    assert code == 0  # returned: a caller in the same process goes on


def test_a_first_batch_on_a_machine_with_an_empty_tokenizer_cache_builds_it_once(tmp_path):
    """The start-up thread and the loading thread both ask for the default tokenizer before it exists:
    one builds it and the other waits (two threads importing transformers at once failed one of them,
    so every first `tokview batch` on a new machine exited 1)."""
    import os

    from tokview.sim import SimConfig, start_simulator

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "messages": [{"role": "user", "content": "hi"}]}\n')
    env = {**os.environ, "TOKVIEW_CACHE": str(tmp_path / "empty-cache")}
    with start_simulator(SimConfig(kind="vllm")) as sim:
        done = subprocess.run(
            [*(sys.executable, "-m", "tokview", "batch", str(prompts), "--server", sim.url), "--summary-json"]
            + ["--db", str(tmp_path / "s.duckdb")],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
    assert done.returncode == 0, done.stderr[-800:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["ok"] == 1
    assert (tmp_path / "empty-cache" / "kimi-layout" / "tokenizer.json").is_file()
