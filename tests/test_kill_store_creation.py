"""A batch SIGKILLed the moment its new store's write-ahead log appears (DuckDB's first write: the schema).

The merge case is in test_kill_matrix.py; a batch creates its store the same way but beside other threads,
so the kill met the "not a tokview store (it has tables schema_version)" refusal in some runs only. Here
it is killed twice (two new stores), and each re-run must complete its store.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

from hostile_events import IN_CREATE, Proc, Watch

from tokview.sim import SimConfig, start_simulator
from tokview.store import Store

ROOT = Path(__file__).resolve().parents[1]
TOKVIEW = [sys.executable, "-c", "import sys; from tokview.cli import main; sys.exit(main())"]
KILLS = 2


def test_a_batch_killed_while_it_creates_its_store_leaves_one_the_rerun_completes(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"c{i}", "prompt": f"Create {i}?"}) + "\n" for i in range(3)))
    with start_simulator(SimConfig(kind="vllm", seed=5)) as sim:
        for kill in range(KILLS):
            db = tmp_path / f"new{kill}" / "store.duckdb"
            argv = [*TOKVIEW, "batch", str(prompts), "--server", sim.url, "--db", str(db), "--workers", "1"]
            argv += ["--max-new-tokens", "8"]
            with Watch(db.parent, IN_CREATE) as watch:
                proc = Proc(argv, ROOT)
                ready = lambda: any(n.endswith(".wal") for n in watch.poll())  # noqa: E731
                assert proc.wait_for("the new store's write-ahead log", ready)
                proc.send(signal.SIGKILL, "process")
                assert proc.finish() == -signal.SIGKILL
            rerun = Proc(argv, ROOT)
            assert rerun.finish() == 0, rerun.stderr
            with Store(db) as store:
                assert sorted(r[0] for r in store.query("SELECT prompt_id FROM samples")) == ["c0", "c1", "c2"]
