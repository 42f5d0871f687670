"""`tokview proxy` against a direct connection and a bare pass-through forwarder, in one run (issue 24 item 5).

    python benchmarks/bench_proxy.py [--requests 200] [--streams 30] [--concurrent 64] [--total 256]
                                     [--output-tokens 256] [--rounds 3]

Upstream: `replay_server.py` in front of `tokview sim --output-tokens N` (JSON answers replayed from one
pre-encoded body, cached from a request with `return_token_ids`, so every target gets the ids in its JSON
answers and only the proxy takes them out; streams come from the simulator itself). Four targets, each its
own process: the upstream itself (direct), a bare forwarder (`bare_forwarder.py`: aiohttp server and client,
raw bytes through, nothing parsed), the proxy not recording ("front": ids injected and stripped, nothing
stored) and `tokview proxy` recording into a fresh store (every finding, sessions, parts landed). Throughput
rounds alternate the targets so a busy shared machine hurts them all alike.

Printed: added latency per request (p50, p99 over sequential non-streamed requests, one to each target in
turn, so a shared box's bursts of load fall on all of them alike), added time per streamed chunk (median
stream time minus direct's, over the chunks; streams also in turn), CPU per request of the forwarder
and of the proxy (their process CPU over the sequential requests; the proxy's recorder process, which
parses, analyses and lands, apart and then added), and throughput (streams/s) at
`--concurrent` concurrent streams (each target loaded from its own aiohttp session: see `concurrent`); then
the goals and whether each is met. For the throughput phase it
also prints the CPU each process spent per stream (the client, the upstream: replay server + simulator,
the forwarder, the proxy's recorder) and the box's CPU use: when the direct run already keeps every core
busy, a forwarder can only reach direct's throughput by using no CPU at all, and the ceiling is
(client + upstream) / (client + upstream + forwarder [+ recorder]) of direct. The proxy's recorder runs at a
lower priority and may fall behind in a round: the catch-up time (from the round's last response to the
recorder's last CPU use, its last landing: `caught_up`) and the peak of its backlog (the proxy's own last
line) are printed beside the throughput, since a throughput bought by recording later must say so.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from replay_server import replay_servers, server_cpu_s

TARGETS: dict[str, tuple[str, int | None]] = {}
UPSTREAM_PID: dict[str, int] = {}
ERRORS: dict[str, int] = {}
LAST_ERROR: dict[str, str] = {}
FRONT_ONLY = (
    "import sys; from tokview.proxy.serve import ProxyConfig, serve_forever; "
    "sys.exit(serve_forever(ProxyConfig([{upstream!r}], listen='127.0.0.1:{port}', db=None)))"
)
"""The proxy forwarding without recording (ids still injected and stripped): what its front costs alone."""
GOALS = {"p50_ms": 1.0, "chunk_ms": 0.3, "p99_ms": 5.0, "throughput_x": 0.9, "cpu_x": 1.5}


# -- measuring ---------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{url}: the process exited with {proc.returncode}")
        try:
            if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise SystemExit(f"{url} did not answer")


def body(n: int, tokens: int, stream: bool) -> dict[str, Any]:
    return {
        "model": "tokview-sim",
        "messages": [{"role": "user", "content": f"benchmark question {n}"}],
        "max_tokens": tokens,
        "temperature": 0,
        "stream": stream,
    }


async def one(client: httpx.AsyncClient, url: str, payload: dict[str, Any]) -> tuple[float, int]:
    """(seconds to the last byte, chunks received)."""
    started = time.perf_counter()
    if not payload["stream"]:
        response = await client.post(url + "/v1/chat/completions", json=payload)
        assert response.status_code == 200, response.text[:200]
        return time.perf_counter() - started, 1
    chunks = 0
    async with client.stream("POST", url + "/v1/chat/completions", json=payload) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            chunks += line.startswith("data:")
    return time.perf_counter() - started, chunks


async def sequential(
    client: httpx.AsyncClient, url: str, n: int, tokens: int, stream: bool, base: int
) -> list[tuple[float, int]]:
    return [await one(client, url, body(base + i, tokens, stream)) for i in range(n)]


async def concurrent(session: aiohttp.ClientSession, url: str, total: int, width: int, tokens: int, base: int) -> float:
    """Streams per second with `width` streams open at once, read line by line as a harness would.

    The load comes from aiohttp (speculators' client), one session per target: httpx's connection pool walks every
    pooled connection (a `poll()` on each idle one) whenever a request is queued or released (encode/httpcore#1035,
    encode/httpx#3215), so at 64 concurrent streams its own CPU grows with how long each stream takes and how warm
    its pool already is: 1.6 ms per stream in a fresh pool, 8–9 ms in the next round against the same upstream.
    Measured with it, the slower target pays more client CPU on a 2-core box and the figure is the client's, not
    the forwarder's."""
    todo = iter(range(total))

    async def worker() -> None:
        for i in todo:
            try:
                async with session.post(url + "/v1/chat/completions", json=body(base + i, tokens, True)) as response:
                    assert response.status == 200, response.status
                    chunks = 0
                    async for line in response.content:
                        chunks += line.startswith(b"data:")
                    assert chunks > 0, "no chunks"
            except (aiohttp.ClientError, AssertionError) as exc:  # counted and said, never a crashed benchmark
                ERRORS[url] = ERRORS.get(url, 0) + 1
                LAST_ERROR[url] = f"{type(exc).__name__}: {exc}"

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(width)))
    return total / (time.perf_counter() - started)


def sim_pid() -> int | None:
    """The simulator behind the replay server (a child of this process)."""
    me = os.getpid()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmd = (stat.parent / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(fields[1]) == me and b"sim" in cmd and b"tokview" in cmd:
            return int(stat.parent.name)
    return None


def box_cpu_s() -> float:
    """CPU seconds every process on the machine has used (busy time summed over the cores)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    ticks = [int(f) for f in fields]
    busy = sum(ticks) - ticks[3] - ticks[4]  # all but idle and iowait
    return busy / os.sysconf("SC_CLK_TCK")


def children_cpu_s(pid: int) -> float:
    """CPU seconds of a process's children (the proxy's recorder process; multiprocessing's resource tracker)."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            total += server_cpu_s(int(stat.parent.name))
    return total


async def settled(pid: int, quiet_s: float = 0.6) -> None:
    """Wait until the proxy's recorder process has used no CPU for `quiet_s` (it has recorded what it was handed)."""
    last = children_cpu_s(pid)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        await asyncio.sleep(quiet_s)
        now = children_cpu_s(pid)
        if now - last < 0.02:
            return
        last = now


CATCH_UP_QUIET_S = 2.5
"""How long the recorder must use no CPU to count as caught up: longer than the gap between its landings under
load (`proxy.recorder.LAND_BUSY_S`), so its last landing is seen."""


async def caught_up(pid: int, since: float) -> float:
    """Seconds from `since` (the round's last response) to the recorder process's last CPU use (its last landing),
    read every 50 ms; a rise of 20 ms of CPU counts as work (the counts thread's wake-ups do not)."""
    last = children_cpu_s(pid)
    worked_at = since
    deadline = time.perf_counter() + 300
    while time.perf_counter() - worked_at < CATCH_UP_QUIET_S and time.perf_counter() < deadline:
        await asyncio.sleep(0.05)
        now = children_cpu_s(pid)
        if now - last >= 0.02:
            worked_at, last = time.perf_counter(), now
    return max(0.0, worked_at - since)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def measure(targets: dict[str, tuple[str, int | None]], args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {
        name: {
            "lat": [],
            "stream": [],
            "chunks": [],
            "cpu": 0.0,
            "cpu_rec": 0.0,
            "tput": [],
            "phase": [],
            "catch_up": [],
        }
        for name in targets
    }
    upstream_pids = [p for p in (UPSTREAM_PID.get("replay"), sim_pid()) if p]
    limits = httpx.Limits(max_connections=args.concurrent * 2, max_keepalive_connections=args.concurrent * 2)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        # the replay server caches the first answer it replays: one with ids, as the proxy asks for them
        warm = {**body(0, args.output_tokens, False), "return_token_ids": True}
        assert (await client.post(targets["direct"][0] + "/v1/chat/completions", json=warm)).status_code == 200
        for url, _ in targets.values():  # warm connections and caches
            await sequential(client, url, 5, args.output_tokens, False, 0)
            await sequential(client, url, 2, args.output_tokens, True, 0)
        # one request to each target in turn: a shared box's bursts of load then fall on every target alike
        cpu0 = {name: server_cpu_s(pid) if pid else 0.0 for name, (_, pid) in targets.items()}
        rec0 = {name: children_cpu_s(pid) if pid else 0.0 for name, (_, pid) in targets.items()}
        for i in range(args.requests):
            for name, (url, _) in targets.items():
                out[name]["lat"].append((await one(client, url, body(1000 + i, args.output_tokens, False)))[0])
        for name, (_, pid) in targets.items():
            if pid:
                await settled(pid)  # the recorder has finished these before its CPU is read
                out[name]["cpu"] = server_cpu_s(pid) - cpu0[name]
                out[name]["cpu_rec"] = children_cpu_s(pid) - rec0[name]
        for i in range(args.streams):
            for name, (url, _) in targets.items():
                took, chunks = await one(client, url, body(50_000 + i, args.output_tokens, True))
                out[name]["stream"].append(took)
                out[name]["chunks"].append(chunks)
    sessions = {name: aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=args.concurrent)) for name in targets}
    try:
        for name, (url, pid) in targets.items():  # every session's pool full before the first round
            await concurrent(sessions[name], url, args.concurrent, args.concurrent, args.output_tokens, 90_000)
            if pid:
                await settled(pid)  # the proxy's recorder has recorded the warm-up before the rounds
        for r in range(args.rounds):
            for name, (url, pid) in targets.items():
                before = _cpu_now(pid, upstream_pids)
                out[name]["tput"].append(
                    await concurrent(
                        sessions[name], url, args.total, args.concurrent, args.output_tokens, 100_000 * (r + 1)
                    )
                )
                after = _cpu_now(pid, upstream_pids)
                if pid:
                    if name == "proxy":
                        out[name]["catch_up"].append(await caught_up(pid, after["wall"]))
                    await settled(pid)  # its recorder's share of these streams, too
                    after["recorder"] = children_cpu_s(pid)
                out[name]["phase"].append({k: (after[k] - before[k]) / args.total for k in after})
    finally:
        for session in sessions.values():
            await session.close()
    return out


def _cpu_now(pid: int | None, upstream_pids: list[int]) -> dict[str, float]:
    return {
        "client": time.process_time(),
        "upstream": sum(server_cpu_s(p) for p in upstream_pids),
        "forwarder": server_cpu_s(pid) if pid else 0.0,
        "recorder": children_cpu_s(pid) if pid else 0.0,
        "box": box_cpu_s(),
        "wall": time.perf_counter(),
    }


def report(out: dict[str, dict[str, Any]], args: argparse.Namespace, recorded: int, backlog: str | None) -> None:
    direct = out["direct"]
    n_seq = len(direct["lat"])
    print(
        f"\nupstream: replay server + tokview sim, {args.output_tokens} output tokens; {n_seq} sequential requests, "
        f"{len(direct['stream'])} sequential streams, {args.total} streams at {args.concurrent} concurrent "
        f"(x{args.rounds}, the median round)"
    )
    print(
        f"{'target':8} {'p50 ms':>8} {'p99 ms':>8} {'stream ms':>10} {'chunks':>7} {'CPU ms/req':>11} {'streams/s':>10}"
    )
    rows = {}
    for name, m in out.items():
        rows[name] = {
            "p50": pct(m["lat"], 0.5) * 1000,
            "p99": pct(m["lat"], 0.99) * 1000,
            "stream": statistics.median(m["stream"]) * 1000,
            "chunks": statistics.median(m["chunks"]),
            "cpu": m["cpu"] / len(m["lat"]) * 1000,
            "cpu_rec": m["cpu_rec"] / len(m["lat"]) * 1000,
            "tput": statistics.median(m["tput"]),
        }
        r = rows[name]
        cpu = f"{r['cpu']:.3f}" if name != "direct" else "-"
        print(
            f"{name:8} {r['p50']:8.2f} {r['p99']:8.2f} {r['stream']:10.1f} {r['chunks']:7.0f} {cpu:>11} {r['tput']:10.1f}"
        )
    d, b, p = rows["direct"], rows["bare"], rows["proxy"]

    def figures_of(r: dict[str, float], recorder: bool) -> dict[str, float]:
        cpu = r["cpu"] + (r["cpu_rec"] if recorder else 0.0)
        return {
            "p50_ms": r["p50"] - d["p50"],
            "p99_ms": r["p99"] - d["p99"],
            "chunk_ms": (r["stream"] - d["stream"]) / max(1.0, d["chunks"]),
            "throughput_x": r["tput"] / d["tput"],
            "cpu_x": r["cpu"] / b["cpu"] if b["cpu"] else float("inf"),
            "cpu_all_x": cpu / b["cpu"] if b["cpu"] else float("inf"),
        }

    figures = figures_of(p, True)
    others = {name: figures_of(rows[name], False) for name in ("front", "bare")}
    for url, n in ERRORS.items():
        name = next((k for k, (u, _) in TARGETS.items() if u == url), url)
        print(f"{n} concurrent streams failed at {name} (last: {LAST_ERROR[url]})")
    print(
        f"\nproxy recorded {recorded} samples in this run (every request, findings and sessions included); "
        f"CPU ms/request: forwarding process {p['cpu']:.3f}, its recorder process {p['cpu_rec']:.3f} "
        f"(parsing, sessions, analysis, parts, landings)"
    )
    catch_up = out["proxy"]["catch_up"]
    print(
        f"proxy recorder: caught up {statistics.median(catch_up):.2f} s after a round's last response (median; "
        f"rounds {', '.join(f'{c:.2f}' for c in catch_up)} s: to its last CPU use, its last landing); "
        + (backlog or "its backlog never built up (the proxy said no peak)")
    )
    print(
        f"\nthroughput phase ({args.concurrent} concurrent), CPU ms per stream (of the round the box was least busy in)"
    )
    print(f"{'target':8} {'client':>7} {'upstream':>9} {'forwarder':>10} {'recorder':>9} {'box busy':>9}")
    ceilings = {}
    for name, m in out.items():
        phase = min(m["phase"], key=lambda c: c["box"])
        ms = {k: v * 1000 for k, v in phase.items()}
        busy = phase["box"] / phase["wall"]
        print(
            f"{name:8} {ms['client']:7.2f} {ms['upstream']:9.2f} {ms['forwarder']:10.2f} {ms['recorder']:9.2f} "
            f"{busy:8.2f}c"
        )
        ceilings[name] = ms
    base = ceilings["direct"]["client"] + ceilings["direct"]["upstream"]
    for name in ("bare", "front", "proxy"):
        c = ceilings[name]
        print(
            f"  {name}: if the cores are the limit, at most {base / (base + c['forwarder'] + c['recorder']):.2f}× direct "
            f"(direct's client + upstream {base:.2f} ms per stream, plus its {c['forwarder'] + c['recorder']:.2f} ms)"
        )
    print(f"\n{'goal (front: the proxy not recording)':38} {'proxy':>9} {'front':>9} {'bare':>9}  proxy met")
    labels = {
        "p50_ms": ("added p50 per request ≤ 1 ms", "≤"),
        "p99_ms": ("added p99 per request ≤ 5 ms", "≤"),
        "chunk_ms": ("added per streamed chunk ≤ 0.3 ms", "≤"),
        "throughput_x": ("throughput ≥ 0.9× direct", "≥"),
        "cpu_x": ("CPU/request ≤ 1.5× bare forwarder", "≤"),
        "cpu_all_x": ("  the same with its recorder process", "≤"),
    }
    for key, (label, way) in labels.items():
        value, goal = figures[key], GOALS[key.replace("_all", "")]
        met = value <= goal if way == "≤" else value >= goal
        other = " ".join(f"{o[key]:9.3f}" if key != "cpu_all_x" else f"{'':9}" for o in others.values())
        print(f"{label:38} {value:9.3f} {other}  {'yes' if met else 'NO'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--streams", type=int, default=30)
    parser.add_argument("--concurrent", type=int, default=64)
    parser.add_argument("--total", type=int, default=256)
    parser.add_argument("--output-tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3, help="throughput rounds per target (the median is kept)")
    args = parser.parse_args()
    py = sys.executable
    with replay_servers(args.output_tokens) as (upstream, replay_pid), tempfile.TemporaryDirectory() as tmp:
        UPSTREAM_PID["replay"] = replay_pid
        bare_port, front_port, proxy_port = free_port(), free_port(), free_port()
        forwarder = str(Path(__file__).resolve().parent / "bare_forwarder.py")
        bare = subprocess.Popen(
            [py, forwarder, "--port", str(bare_port), "--upstream", upstream], stderr=subprocess.DEVNULL
        )
        front = subprocess.Popen(
            [py, "-c", FRONT_ONLY.format(upstream=upstream, port=front_port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        db = str(Path(tmp) / "bench.duckdb")
        log = open(Path(tmp) / "proxy.log", "w")  # noqa: SIM115 (closed with the run)
        proxy = subprocess.Popen(
            [py, "-m", "tokview", "proxy", "--server", upstream, "--listen", f"127.0.0.1:{proxy_port}", "--db", db],
            stderr=log,
        )
        try:
            wait_http(f"http://127.0.0.1:{bare_port}", bare)
            wait_http(f"http://127.0.0.1:{front_port}", front)
            wait_http(f"http://127.0.0.1:{proxy_port}", proxy)
            targets = {
                "direct": (upstream, None),
                "bare": (f"http://127.0.0.1:{bare_port}", bare.pid),
                "front": (f"http://127.0.0.1:{front_port}", front.pid),
                "proxy": (f"http://127.0.0.1:{proxy_port}", proxy.pid),
            }
            TARGETS.update(targets)
            out = asyncio.run(measure(targets, args))
        finally:
            for p in (bare, front, proxy):
                p.terminate()
            for p in (bare, front, proxy):
                try:
                    p.wait(300)  # the proxy lands what its recorder still holds before it exits
                except subprocess.TimeoutExpired:
                    p.kill()
        log.close()
        said = (Path(tmp) / "proxy.log").read_text().splitlines()
        if ERRORS:
            print("the proxy said:", *said[-15:], sep="\n  ")
        from tokview.store import Store

        with Store(db) as store:
            recorded = store.count_samples()
    backlog = next((line.split(": ", 1)[1] for line in said if "backlog peaked" in line), None)
    report(out, args, recorded, backlog)
    print(f"load average during the run: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
