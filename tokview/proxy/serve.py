"""Start a proxy: check where it may listen, find out what each upstream is, open the store, serve.

Safe by default: it listens on a loopback address; any other address needs `allow_remote` and a key
(`TOKVIEW_PROXY_KEY`) that every client must present. Upstream credentials come from the environment
and the server URL, as for `tokview batch`; a client's own Authorization header is forwarded instead
when it sends one (a proxy key is never forwarded), and never stored.
"""

from __future__ import annotations

import asyncio
import base64
import gc
import ipaddress
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tokview.default_store import DEFAULT_DB
from tokview.errors import ExitCode, UserError
from tokview.proxy.app import PROBE_AGAIN_S, ProxyApp, Upstream
from tokview.proxy.recorder import Recorder
from tokview.proxy.recorder_store import open_recorder_here
from tokview.proxy.wire import FrontServer

if TYPE_CHECKING:
    from tokview.core.profiles import ModelProfile
    from tokview.core.tokenizer import TokenizerAdapter
    from tokview.proxy.recorder_process import RecorderProcess

PROXY_KEY_ENV = "TOKVIEW_PROXY_KEY"
DEFAULT_LISTEN = "127.0.0.1:8900"
SWITCH_INTERVAL_S = 0.0002
RECORDER_NICENESS = 10
"""How much lower the recorder process's priority is than the forwarding's (`lower_priority`)."""
GRACE_S = 2.0
"""How long a stopping proxy lets the answers in flight finish."""


@dataclass
class ProxyConfig:
    servers: list[str]
    listen: str = DEFAULT_LISTEN
    db: str | None = DEFAULT_DB
    """None: forward only, record nothing (the benchmark's bare mode)."""
    tokenizer: TokenizerAdapter | None = None
    profile: ModelProfile | None = None
    allow_remote: bool = False
    key: str | None = None
    kind: str = "auto"
    """auto (detected like `tokview batch` does), vllm or sglang."""
    run_id: str = field(default_factory=lambda: "proxy-" + time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6])
    say: Callable[[str], None] | None = None
    timeout: float = 30.0
    """Seconds per start-up probe of an upstream (`--timeout`): one that accepts and never answers is said in
    two of them. Forwarded requests have none of the proxy's own: the harness's timeout governs them, as it
    would without the proxy (a client that gives up cancels its upstream request)."""
    lock_timeout: float = 10.0
    """How long a landing of the recorder waits for a store another process holds (then it records on into parts
    and tries again later)."""
    record_in: str = "auto"
    """Where recording runs: "process" (a child of its own: `tokview proxy`), "thread" (this process, on
    threads: the tests' proxies, which start faster), or "auto" (process when serving in the foreground)."""


def listen_address(text: str) -> tuple[str, int]:
    """`HOST:PORT` (IPv6 in brackets) as a pair; UserError for anything else."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdecimal() or not host:
        raise UserError(f"--listen {text!r}: expected HOST:PORT, e.g. 127.0.0.1:8900")
    if int(port) > 65535:
        raise UserError(f"--listen {text!r}: port {int(port)} is out of range (0 to 65535; 0 picks a free one)")
    return host.strip("[]"), int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_listen(config: ProxyConfig) -> tuple[str, int]:
    """Where to listen, refused unless loopback or explicitly allowed with a key (one a header can carry)."""
    key = config.key
    if key is not None and not (key.isascii() and key.isprintable() and key == key.strip()):
        raise UserError(
            f"{PROXY_KEY_ENV} must be printable ASCII with no spaces around it: an HTTP header cannot carry it "
            "otherwise, and every client would be refused (a key read from a file often ends in a newline)"
        )
    host, port = listen_address(config.listen)
    if is_loopback(host):
        return host, port
    if not config.allow_remote:
        raise UserError(
            f"--listen {config.listen}: the proxy listens only on a loopback address unless --allow-remote is given "
            f"(and then every client must present the key in {PROXY_KEY_ENV})"
        )
    if not config.key:
        raise UserError(f"--allow-remote needs a key: set {PROXY_KEY_ENV} (clients send it as their bearer token)")
    return host, port


def upstream_auth(url: str) -> str | None:
    """The Authorization the batch would send this server: the URL's user:password, else TOKVIEW_API_KEY."""
    from tokview.servers.urls import api_key_from_env, parse_server_url

    parts = parse_server_url(url)
    if parts.auth is not None:
        return "Basic " + base64.b64encode(f"{parts.auth[0]}:{parts.auth[1]}".encode()).decode("ascii")
    key = api_key_from_env()
    return f"Bearer {key}" if key else None


async def _detect(url: str, kind: str, profile: ModelProfile | None, timeout: float) -> Upstream:
    from tokview.servers.features import detect, unknown_server
    from tokview.servers.http import ServerClient
    from tokview.servers.registry import kind_mismatch
    from tokview.servers.retry import RetryPolicy

    client = ServerClient(url, timeout=timeout, concurrency=2)
    try:  # ServerUnreachable goes up as the TokviewError it is: "server unreachable: …", its exit code
        info = await detect(client, RetryPolicy(retries=1, backoff=0.2), profile)
    finally:
        await client.aclose()
    found = info.kind if kind == "auto" else kind
    if (why := kind_mismatch(kind, info, "--kind")) is not None:  # its streamed chat was recorded without ids
        raise UserError(why)
    if found not in ("vllm", "sglang"):
        raise UserError(unknown_server(info, "give the server's root URL, or --kind vllm|sglang"))
    return Upstream(info.url, found, upstream_auth(url), info.stamp() | {"server_kind": found}, info.max_model_len)


def detect_upstreams(config: ProxyConfig) -> list[Upstream]:
    from tokview.servers.urls import validate_server_url

    for url in config.servers:
        validate_server_url(url)  # BadServerURL: one line, credentials masked, before any connection

    async def all_of() -> list[Upstream | BaseException]:
        probes = (_detect(u, config.kind, config.profile, config.timeout) for u in config.servers)
        return list(await asyncio.gather(*probes, return_exceptions=True))

    return _with_dead_passed_over(config, asyncio.run(all_of()))


def _with_dead_passed_over(config: ProxyConfig, found: list[Upstream | BaseException]) -> list[Upstream]:
    """The upstreams, a server that did not answer at start kept to be passed over until it does (`ProxyApp`): one
    node of a fleet down stopped the proxy from starting at all. It takes the kind the others are (or `--kind`); with
    no server answering, or answering servers of two kinds, the start fails as it did."""
    from tokview.servers.errors import ServerUnreachable
    from tokview.servers.urls import parse_server_url

    for error in found:
        if isinstance(error, BaseException) and not isinstance(error, ServerUnreachable):
            raise error  # a refusal (another kind than --kind, not a vLLM or SGLang): the start fails on it
    live = [u for u in found if isinstance(u, Upstream)]
    kinds = {u.kind for u in live} if config.kind == "auto" else {config.kind}
    dead = [(url, e) for url, e in zip(config.servers, found, strict=True) if isinstance(e, BaseException)]
    if dead and (not live or len(kinds) != 1):
        raise dead[0][1]
    (kind,) = kinds if dead else (None,)
    out = []
    for url, probed in zip(config.servers, found, strict=True):
        if isinstance(probed, Upstream):
            out.append(probed)
            continue
        clean = parse_server_url(url).url
        out.append(Upstream(clean, str(kind), upstream_auth(url), {"server_kind": kind}, None, down=str(probed)))
    return out


def open_recorder(config: ProxyConfig, upstreams: list[Upstream]) -> Recorder | RecorderProcess | None:
    """The recorder: in a child process (`recorder_process`) or on this process's threads."""
    if config.db is None:
        return None
    source = getattr(config.tokenizer, "source", None)
    if config.record_in == "process" and (config.tokenizer is None or source is not None):
        from dataclasses import replace

        from tokview.proxy.recorder_process import ChildSpec, RecorderProcess

        spec = ChildSpec(
            replace(config, tokenizer=None, say=None),
            upstreams,
            None if source is None else str(source),
            spool_dir=spool_dir_for(config.db, config.run_id),
        )
        try:
            process = RecorderProcess(spec, config.say or _say_on_stderr)
        except BaseException:  # refused (no DuckDB file, a held store): no folder of its own left beside the store
            if spec.spool_dir is not None:
                from tokview.proxy.spool_folder import discard

                discard(spec.spool_dir)
            raise
        if process.process.pid is not None:  # started (RecorderProcess waits until it is ready)
            lower_priority(process.process.pid)
        return process
    return open_recorder_here(config, upstreams, config.tokenizer, config.say)


def spool_dir_for(db: str, run_id: str = "") -> str | None:
    """A new folder beside the store for the answers the recorder process is behind on (`recorder_process`,
    `spool_folder`): on the store's disk, not in /tmp, which is often memory. None when it cannot be made there
    (the backlog then waits in memory; the store's own error says what is wrong with its folder)."""
    from tokview.proxy.spool_folder import make

    return make(db, run_id)


def lower_priority(pid: int) -> None:
    """Make the recorder process (each of its threads) yield the CPU to everything at normal priority.

    Its analysis costs several times the forwarding's CPU per request (3–8 ms against 0.2–0.4 ms on the
    benchmark): on a box whose cores are all busy, at equal priority it took them from the forwarding loop
    and from the upstream server, and the harness's throughput with them (0.38× direct at 64 streams on 2
    cores). Lowered, it records with the CPU left over and catches up when the load eases; nothing it was
    handed is dropped. Threads it starts later inherit the priority."""
    if not hasattr(os, "setpriority"):
        return
    try:
        tasks = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        tasks = [pid]
    for tid in tasks:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + RECORDER_NICENESS))
        except OSError:  # gone, or not ours to change: it records at normal priority
            pass


def _say_on_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class RunningProxy:
    """A proxy serving on a thread: `url`, `recorder`; `stop()` ends it and lands what it recorded."""

    def __init__(self, server: Serving, thread: threading.Thread, app: ProxyApp, url: str) -> None:
        self._server, self._thread, self.app, self.url = server, thread, app, url
        self.recorder = app.recorder
        self._stopped = False

    def stop(self) -> None:
        """Stop serving (the answers in flight finish, for up to 2 s), then write and land the records. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self._server.stop_soon()
        self._thread.join(timeout=10)
        if self.recorder is not None:
            self.recorder.close()


class Serving:
    """The proxy's front on one listening socket, served on a loop until `stop_soon` (any thread) or a signal."""

    def __init__(self, app: ProxyApp, sock: socket.socket) -> None:
        self.app, self.sock = app, sock
        self.started = False
        self.hurried: int | None = None
        """The second signal, come while answers in flight had their grace: the proxy leaves without waiting more."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None

    def stop_soon(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)

    async def serve(self, signals: bool = False) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self._loop.set_exception_handler(_quiet_accept_errors())
        if signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._loop.add_signal_handler(sig, self._stop.set)
        front = FrontServer(self.app, admit=self.app.admit)
        try:
            await front.start(self.sock)
            self.started = True
            await self._stop.wait()
            hurry = asyncio.Event()
            if signals:  # a second Ctrl-C ends the grace (it set the stop event again, unnoticed, before)
                for sig in (signal.SIGINT, signal.SIGTERM):
                    self._loop.add_signal_handler(sig, self._hurry, hurry, sig)
            await front.shutdown(GRACE_S, hurry)
        finally:
            await self.app.aclose()

    def _hurry(self, hurry: asyncio.Event, sig: int) -> None:
        self.hurried = sig
        hurry.set()


ACCEPT_ERROR_EVERY_S = 10.0
"""How often an accept the system refuses (out of file descriptors) is logged: asyncio logs it once per waiting
connection on every wake-up of the listening socket (~1,000 tracebacks a second, 29 MB of log in 7 s)."""


def _quiet_accept_errors() -> Callable[[asyncio.AbstractEventLoop, dict[str, Any]], None]:
    """The loop's exception handler: the default one, but an accept the system refuses is said at most every
    ACCEPT_ERROR_EVERY_S, in one line that says what to do."""
    last = [-ACCEPT_ERROR_EVERY_S]

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        error = context.get("exception")
        if isinstance(error, OSError) and "accept" in str(context.get("message", "")):
            now = time.monotonic()
            if now - last[0] >= ACCEPT_ERROR_EVERY_S:
                last[0] = now
                print(
                    f"tokview proxy: cannot accept a connection: {error.strerror or error} (raise `ulimit -n`: "
                    f"each request in flight holds two file descriptors); said at most every "
                    f"{ACCEPT_ERROR_EVERY_S:g} s",
                    file=sys.stderr,
                )
            return
        loop.default_exception_handler(context)

    return handle


def raise_open_file_limit() -> None:
    """The soft limit on open files up to the hard one (at most 65,536): a proxy holds two a request in flight, and a
    shell's usual 1,024 runs out at ~500 concurrent streams, where vLLM raises its own."""
    try:
        import resource
    except ImportError:  # not on this platform
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 65_536 if hard == resource.RLIM_INFINITY else min(hard, 65_536)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):  # a container may refuse: the proxy runs with what it has
            pass


def run_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run the serving loop: uvloop's when it is installed (vLLM's and SGLang's environments ship it),
    else asyncio's."""
    try:
        import uvloop
    except ImportError:
        uvloop = None  # run outside the except: every error in the loop chained this ImportError in its traceback
    if uvloop is None:
        asyncio.run(main)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main)


def _bind(host: str, port: int) -> socket.socket:
    """The socket bound to HOST:PORT, not listening yet (`_listening` starts that): a one-line UserError when the
    address is taken or unknown."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # accepted sockets inherit it: no Nagle wait
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def _listening(config: ProxyConfig) -> tuple[ProxyApp, socket.socket, str]:
    """The app, its socket and host: bound before the app is built, listening once it is. So a bind that fails (an
    address in use) ends the proxy before its recorder child starts or its store is made (bound after them, the
    child kept `tokview proxy` from exiting after its one-line error, and the store held an empty run), and a
    client connecting while the app loads is refused, as before, rather than left waiting."""
    host, port = check_listen(config)
    sock = _bind(host, port)
    try:
        app = build(config)
    except BaseException:
        sock.close()
        raise
    sock.listen(1024)
    return app, sock, host


def _url_host(host: str) -> str:
    """The host as a URL spells it: an IPv6 address in brackets (`http://[::1]:8900`)."""
    return f"[{host}]" if ":" in host else host


def build(config: ProxyConfig) -> ProxyApp:
    if config.db is not None and (config.tokenizer is None or config.profile is None):
        from tokview.core.resolve import load_tokenizer_and_profile  # what `tokview proxy` loads with no flags

        config.tokenizer, config.profile = load_tokenizer_and_profile(
            tokenizer=config.tokenizer, model_profile=config.profile
        )
    upstreams = detect_upstreams(config)
    recorder = open_recorder(config, upstreams)

    given = {id(up): url for up, url in zip(upstreams, config.servers, strict=True)}  # with its credentials

    async def probe(up: Upstream) -> Upstream:  # an upstream back after failing to connect, detected again
        url = given.get(id(up), up.url)
        return await _detect(url, config.kind, config.profile, min(config.timeout, PROBE_AGAIN_S))

    say = config.say or _say_on_stderr
    return ProxyApp(upstreams, recorder, profile=config.profile, key=config.key, say=say, probe=probe)


@contextmanager
def start_proxy(config: ProxyConfig) -> Iterator[RunningProxy]:
    """Serve on a background thread (tests, the benchmark): yields once it accepts connections."""
    app, sock, host = _listening(config)
    server = Serving(app, sock)

    def run() -> None:
        run_loop(server.serve())

    thread = threading.Thread(target=run, name="tokview-proxy", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.005)
    running = RunningProxy(server, thread, app, f"http://{_url_host(host)}:{sock.getsockname()[1]}")
    try:
        yield running
    finally:
        running.stop()
        sock.close()


def serve_forever(config: ProxyConfig) -> int:
    """`tokview proxy`: serve in the foreground until Ctrl-C or SIGTERM, then land what was recorded."""
    say = config.say or print
    if config.record_in == "auto":
        config.record_in = "process"
    if config.record_in == "thread":
        # The writer thread analyses in Python while the loop forwards: with the default 5 ms switch interval a
        # request arriving during an analysis waited up to 5 ms for the GIL; 0.2 ms bounds that wait.
        sys.setswitchinterval(SWITCH_INTERVAL_S)
    raise_open_file_limit()
    app, sock, host = _listening(config)
    # The tokenizer's vocabulary and the loaded modules are millions of objects that live as long as the
    # proxy: frozen, the collector stops walking them in the pauses a request would wait through.
    gc.freeze()
    server = Serving(app, sock)
    where = f"http://{_url_host(host)}:{sock.getsockname()[1]}"
    for upstream in app.upstreams:
        said = f" (NOT ANSWERING at start, passed over until it does: {upstream.down})" if upstream.down else ""
        say(f"tokview proxy: {where}/v1 → {upstream.kind} {upstream.url}{said}")
    if app.recorder is not None:
        say(f"tokview proxy: recording into {config.db} (run {config.run_id})")
    if config.key:
        say(f"tokview proxy: clients must present the key from {PROXY_KEY_ENV}")

    terminated = False
    try:
        run_loop(server.serve(signals=True))
    finally:
        sock.close()
        if app.recorder is not None:
            previous = signal.signal(signal.SIGTERM, _terminate)  # the loop's handlers are gone with it
            try:
                app.recorder.close(leave=server.hurried is not None)
            except KeyboardInterrupt as exc:
                if server.hurried != signal.SIGTERM and not isinstance(exc, Terminated):
                    raise  # the CLI's "interrupted", exit 130
                terminated = True  # 128 + SIGTERM, what a service manager expects of a second stop
            finally:
                signal.signal(signal.SIGTERM, previous)
            if not terminated:  # else the recorder goes on: its counts are not the last
                _say_counts(app.recorder, say)
                if app.unrecorded:
                    paths = ", ".join(f"{path} ×{n}" for path, n in sorted(app.unrecorded.items()))
                    say(f"tokview proxy: {sum(app.unrecorded.values())} NOT recorded on other endpoints ({paths})")
            # A thread recorder waits out a second stop (its threads die with the process) and lands everything;
            # the exit still says the stop was hurried, as the recorder process's does.
            if server.hurried == signal.SIGINT and not terminated:
                raise KeyboardInterrupt  # the CLI's "interrupted", exit 130
            terminated = terminated or server.hurried == signal.SIGTERM
    if terminated:
        print("tokview: terminated", file=sys.stderr)  # as the CLI says "interrupted" for a second Ctrl-C
        return ExitCode.TERMINATED
    return ExitCode.OK if app.recorder is None or app.recorder.recording else ExitCode.FAILURES


class Terminated(KeyboardInterrupt):
    """A SIGTERM while the proxy waits for its recorder: it stops waiting, as a Ctrl-C does, and exits 143."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated


def _say_counts(rec: Recorder | RecorderProcess, say: Callable[[str], None]) -> None:
    said = f"tokview proxy: {_count(rec.recorded, 'generation')} recorded, {rec.failed} refused/abandoned/without ids"
    say(said + (f", {rec.not_recorded} NOT recorded" if rec.not_recorded else ""))
    backlog = rec.backlog_said() if not isinstance(rec, Recorder) else None
    if backlog is not None:
        say(f"tokview proxy: {backlog}")


def _count(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def key_from_env() -> str | None:
    return os.environ.get(PROXY_KEY_ENV) or None
