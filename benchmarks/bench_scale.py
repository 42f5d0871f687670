"""Scale: resume of a 100,000-sample store, `stats` and the first page on 1,000,000 samples, and the
peak memory of a 1,000,000-prompt batch.

    python benchmarks/bench_scale.py [--resume 100000] [--store 1000000] [--prompts 1000000]
                                     [--repeats 3] [--workers 1 2] [--run-s 10]

Goals (issue 11): resume to "nothing to do" < 2 s; `stats` < 1 s and the app's first page < 100 ms on
1,000,000 samples; a 1,000,000-prompt batch in bounded memory. Stores are filled with SQL (short id
arrays: the list and stats queries never read the id arrays), the batch runs against `tokview sim`.
Each figure is printed beside its goal, with its range over repeats, the process CPU and the load
average (the machine is shared: CPU seconds say more than wall time under load). The resume is timed
after a run (the tokenizer's identity remembered) and cold (the tokenizer loaded). Peak memory is the
VmHWM of the batch and its worker processes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tokview.store import Store  # noqa: E402

TOKVIEW = [sys.executable, "-m", "tokview"]
FILL = (
    "INSERT INTO samples (sample_id, prompt_id, run_id, gen_index, prompt_ids, output_ids, finish_reason, status, "
    "valid, n_errors, codes, prompt_len, output_len, supervised, content, messages, created_at) "
    "SELECT {ids}, {prompts}, 'run' || (i % 4), 0, range(0, 40)::INTEGER[], range(0, 100 + i % 50)::INTEGER[], "
    "CASE WHEN i % 20 = 0 THEN 'length' ELSE 'stop' END, CASE WHEN i % 50 = 0 THEN 'approved' ELSE 'pending' END, "
    "i % 20 <> 0, CAST(i % 20 = 0 AS INTEGER), CASE WHEN i % 20 = 0 THEN ['truncated'] ELSE [] END, 40, "
    "100 + i % 50, 100 + i % 50, 'answer number ' || i, "
    '\'[{{"role":"user","content":"question \' || i || \'"}}]\', now() + to_microseconds(i) FROM {source}'
)


def timed(argv: list[str], env: dict | None = None) -> tuple[float, float, subprocess.CompletedProcess, float]:
    """(wall s, peak RSS MB of the process and its children, the finished process, CPU s of the process)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env)
        peaks = PeakRss(proc.pid)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        done = subprocess.CompletedProcess(
            argv, os.waitstatus_to_exitcode(status), out.read().decode(), err.read().decode()
        )
    return wall, peaks.stop(), done, usage.ru_utime + usage.ru_stime


class PeakRss:
    """The high-water RSS (VmHWM) of a process and of every child it starts, polled from /proc.

    Not `ru_maxrss`: a child forked from this (large) benchmark process starts with the parent's pages
    counted, so its ru_maxrss is at least the parent's RSS. VmHWM belongs to the program after exec."""

    def __init__(self, pid: int) -> None:
        import threading

        self.pid = pid
        self.peaks: dict[int, int] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._done.is_set():
            for pid in self._tree():
                try:
                    status = Path(f"/proc/{pid}/status").read_text()
                except OSError:
                    continue
                for line in status.splitlines():
                    if line.startswith("VmHWM:"):
                        self.peaks[pid] = max(self.peaks.get(pid, 0), int(line.split()[1]))
            self._done.wait(0.01)

    def _tree(self) -> list[int]:
        found, todo = [], [self.pid]
        while todo:
            pid = todo.pop()
            found.append(pid)
            try:
                for task in os.listdir(f"/proc/{pid}/task"):
                    todo += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
            except OSError:
                pass
        return found

    def stop(self) -> float:
        """MB: the process's own peak plus its children's (an upper bound of what they held together)."""
        self._done.set()
        self._thread.join()
        return sum(self.peaks.values()) / 1024


def start_sim() -> tuple[subprocess.Popen, str]:
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sim = subprocess.Popen(
        [*TOKVIEW, "sim", "--port", str(port), "--output-tokens", "40"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            urllib.request.urlopen(url + "/v1/models", timeout=1)
            return sim, url
        except OSError:
            time.sleep(0.1)
    sim.kill()
    raise SystemExit("simulator did not start")


def write_prompts(path: Path, n: int) -> None:
    with path.open("w") as f:
        for i in range(n):
            f.write('{"id": "s%07d", "messages": [{"role": "user", "content": "question %d"}]}\n' % (i, i))


def bench_resume(n: int, url: str, tmp: Path, repeats: int) -> None:
    from tokview.batch import BatchConfig, plan, read_prompts
    from tokview.core.kimi_layout import kimi_tokenizer_dir
    from tokview.core.record import settings_key

    prompts = tmp / "resume.jsonl"
    write_prompts(prompts, n)
    config = BatchConfig(servers=[url])
    fingerprint = subprocess.run(  # in a child: this process never loads transformers
        [
            sys.executable,
            "-c",
            "from tokview.batch.identity import vocab_fingerprint; from tokview.core.kimi_layout import "
            "kimi_tokenizer_dir; from tokview.core.tokenizer import load_tokenizer; "
            "print(vocab_fingerprint(load_tokenizer(kimi_tokenizer_dir())))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[-1]
    identity = {"model": "tokview-sim", "tokenizer": fingerprint, "profile": "kimi-k2.5"}
    settings = config.sample_settings(identity)
    key = settings_key(settings)
    # The ids are made in SQL, so this process stays small (a child's peak RSS starts from its parent's);
    # the first rows' ids are checked against the planner's.
    head = tmp / "head.jsonl"
    write_prompts(head, 3)
    expected = [i.sample_id for i in plan(read_prompts(head)[0], config, settings)[0]]
    ids = f"'s' || lpad(i::VARCHAR, 7, '0') || '@{key}_gen0'"
    db = tmp / "resume.duckdb"
    with Store(db) as store:
        store.execute(FILL.format(ids=ids, prompts="'s' || lpad(i::VARCHAR, 7, '0')", source=f"range({n}) t(i)"))
        made = [r[0] for r in store.query("SELECT sample_id FROM samples ORDER BY sample_id LIMIT 3")]
    assert made == expected[: len(made)], (made, expected)
    argv = [*TOKVIEW, "batch", str(prompts), "--server", url, "--db", str(db), "--summary-json"]
    # A resume follows a run: the run remembered its tokenizer's identity (batch/identity.py). "cold" is a
    # machine that never ran one with this tokenizer (a store copied from elsewhere): the tokenizer is loaded.
    cold_cache = tmp / "cold-cache"
    cold_cache.mkdir()
    for entry in (kimi_tokenizer_dir(), vocab_cache_file()):
        if entry.is_dir():
            shutil.copytree(entry, cold_cache / entry.name)
        elif entry.is_file():
            shutil.copy(entry, cold_cache / entry.name)
    tiny = tmp / "tiny.jsonl"
    write_prompts(tiny, 1)
    timed([*TOKVIEW, "batch", str(tiny), "--server", url, "--db", str(tmp / "tiny.duckdb"), "--workers", "1"])
    for label, env in (("after a run", None), ("cold", {**os.environ, "TOKVIEW_CACHE": str(cold_cache)})):
        runs = []
        for _ in range(repeats):
            (cold_cache / "run-identities.json").unlink(missing_ok=True)  # a cold run remembers it for the next
            runs.append(timed(argv, env))
        summary = json.loads(runs[-1][2].stdout) if runs[-1][2].stdout.strip() else {}
        walls = sorted(r[0] for r in runs)
        cpus = sorted(r[3] for r in runs)
        print(
            f"resume ({label}): {n} stored samples, `tokview batch` to 'nothing to do' in {walls[len(walls) // 2]:.2f} s"
            f" wall (median of {repeats}, range {walls[0]:.2f}-{walls[-1]:.2f}; goal < 2 s), CPU {cpus[0]:.2f}-"
            f"{cpus[-1]:.2f} s; resumed {summary.get('resumed')}, ok {summary.get('ok')}, input {summary.get('input')};"
            f" peak RSS {max(r[1] for r in runs):.0f} MB"
        )
    python_wall, _, _, _ = timed([sys.executable, "-c", "pass"])
    print(f"  (python start {python_wall:.2f} s; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")


def vocab_cache_file() -> Path:
    from tokview.batch.identity import cache_file

    return cache_file()


def bench_store(n: int, tmp: Path) -> None:
    db = tmp / "million.duckdb"
    t0 = time.perf_counter()
    with Store(db) as store:
        store.execute(FILL.format(ids="'p' || i || '@s_gen0'", prompts="'p' || i", source=f"range({n}) t(i)"))
    fill = time.perf_counter() - t0
    size = db.stat().st_size / 1e6
    stats_runs = [timed([*TOKVIEW, "stats", "--db", str(db)]) for _ in range(3)]
    assert all(r[2].returncode == 0 for r in stats_runs), stats_runs[0][2].stderr
    walls = sorted(r[0] for r in stats_runs)
    wall = walls[1]
    python_wall, _, _, _ = timed([sys.executable, "-c", "pass"])
    with Store(db) as store:
        t = time.perf_counter()
        store.stats()
        stats_in = time.perf_counter() - t
    pages = []
    for _ in range(5):
        t = time.perf_counter()
        with Store(db) as store:  # what the app does on start: open the store, count, read the first page
            store.count_samples()
            store.samples_page(limit=100)
        pages.append(time.perf_counter() - t)
    with Store(db) as store:
        t = time.perf_counter()
        store.samples_page(limit=100)
        page_only = time.perf_counter() - t
    print(f"store: {n} samples ({size:.0f} MB, filled in {fill:.0f} s)")
    print(
        f"  `tokview stats` {wall:.2f} s wall (median of 3, range {walls[0]:.2f}-{walls[-1]:.2f}; goal < 1 s; CPU "
        f"{min(r[3] for r in stats_runs):.2f}-{max(r[3] for r in stats_runs):.2f} s; python start {python_wall:.2f} s; "
        f"load average {os.getloadavg()[0]:.1f}); Store.stats() "
        f"{stats_in * 1000:.0f} ms"
    )
    print(
        f"  first page: open + count + 100 rows {1000 * sorted(pages)[2]:.0f} ms (median of 5, range "
        f"{1000 * min(pages):.0f}-{1000 * max(pages):.0f}; goal < 100 ms); "
        f"the page query alone {page_only * 1000:.0f} ms"
    )


def bench_memory(n: int, url: str, tmp: Path, run_s: float, workers: int) -> None:
    prompts = tmp / "million.jsonl"
    if not prompts.exists():
        write_prompts(prompts, n)
    db = tmp / f"mem-workers{workers}.duckdb"
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [
            *TOKVIEW,
            "batch",
            str(prompts),
            "--server",
            url,
            "--db",
            str(db),
            "--workers",
            str(workers),
            "--max-new-tokens",
            "40",
            "--concurrency",
            "8",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    peaks = PeakRss(proc.pid)
    parts = Path(str(db) + ".parts")
    started = None
    while proc.poll() is None and time.perf_counter() - t0 < 600:
        if started is None and parts.exists():  # the first part: samples are being generated
            started = time.perf_counter() - t0
        if started is not None and time.perf_counter() - t0 > started + run_s:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    os.wait4(proc.pid, 0)
    peak = peaks.stop()
    with Store(db) as store:
        stored = store.count_samples()
    print(
        f"memory: {n}-prompt batch, --workers {workers}: generating after {started or float('nan'):.1f} s, stopped "
        f"{run_s:.0f} s later with {stored} samples stored: peak RSS {peak:.0f} MB (the batch and its workers)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resume", type=int, default=100_000)
    parser.add_argument("--store", type=int, default=1_000_000)
    parser.add_argument("--prompts", type=int, default=1_000_000)
    parser.add_argument("--run-s", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=3, help="resumes timed per case")
    parser.add_argument("--workers", type=int, nargs="+", default=[1], help="--workers of the memory runs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        sim, url = start_sim()
        try:
            if args.resume:
                bench_resume(args.resume, url, tmp, args.repeats)
            if args.store:
                bench_store(args.store, tmp)
            if args.prompts:
                for workers in args.workers:
                    bench_memory(args.prompts, url, tmp, args.run_s, workers)
        finally:
            sim.kill()
            sim.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
