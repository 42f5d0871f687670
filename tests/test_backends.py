"""The backend protocol: every endpoint family registered once and speaking through one interface, the
simulator and the capture clients free of each other's private helpers, no import cycles, no switch on a
server's name where the registry answers, and the doctor's one renderer.

The behaviour tests run each registered class against the simulator of its kind over real sockets.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Any

import pytest

from tokview.core.profiles import get_profile
from tokview.servers.backend import Backend, Call, Probe
from tokview.servers.doctor import SYMBOLS, DoctorReport
from tokview.servers.doctor_context import DoctorCheck
from tokview.servers.features import ask, detect
from tokview.servers.http import ServerClient
from tokview.servers.info import ServerInfo
from tokview.servers.registry import BACKEND_NAMES, CHOICES, ENDPOINTS, choose, for_kind, server_name
from tokview.servers.request import resolve_settings
from tokview.servers.retry import RetryPolicy
from tokview.sim import SimConfig, start_simulator

ROOT = Path(__file__).resolve().parents[1] / "tokview"
PAIRS = {("sglang", "generate"), ("sglang", "chat"), ("vllm", "chat"), ("vllm", "completions")}
KIMI = get_profile("kimi-k2.5")
QUESTION = [{"role": "user", "content": "What is 6 times 7?"}]
RECORDED_ENDPOINT = {
    ("sglang", "generate"): "sglang-generate",
    ("sglang", "chat"): "sglang-chat",
    ("vllm", "chat"): "vllm-chat",
    ("vllm", "completions"): "vllm-completions",
}


# -- the registry -------------------------------------------------------------------------------
def test_every_backend_endpoint_pair_is_registered_once() -> None:
    assert set(ENDPOINTS) == PAIRS
    assert len(ENDPOINTS) == len(PAIRS)
    assert len({type(b) for b in ENDPOINTS.values()}) == len(PAIRS)  # one class per endpoint family
    for key, backend in ENDPOINTS.items():
        assert backend.key == key


@pytest.mark.parametrize("key", sorted(PAIRS))
def test_each_backend_implements_the_protocol(key: tuple[str, str]) -> None:
    backend = ENDPOINTS[key]
    cls = type(backend)
    assert isinstance(backend, Backend)
    assert not inspect.isabstract(cls)
    for method in ("capture", "stream", "probe"):
        impl = getattr(cls, method)
        assert impl is not getattr(Backend, method), f"{cls.__name__} does not implement {method}"
        assert inspect.iscoroutinefunction(impl)
        assert list(inspect.signature(impl).parameters) == list(inspect.signature(getattr(Backend, method)).parameters)
    for attr in ("server", "server_name", "endpoint", "path", "ids_field", "exact_ids", "recorded_as"):
        assert getattr(cls, attr, None) is not None, f"{cls.__name__}.{attr} is not set"
    assert backend.path.startswith("/")
    assert server_name(backend.server) == backend.server_name
    assert backend.recorded_as == RECORDED_ENDPOINT[key]  # a stored field: never renamed


def test_choices_pair_a_raw_path_with_a_chat_path_of_one_server() -> None:
    assert BACKEND_NAMES == ("auto", "sglang", "sglang-chat", "vllm")  # what --backend takes, in its order
    for name, choice in CHOICES.items():
        assert choice.raw.exact_ids, name
        assert not choice.chat.exact_ids, name
        assert choice.raw.server == choice.chat.server == choice.server
    assert CHOICES["sglang-chat"].chat_only
    assert not CHOICES["sglang"].chat_only
    info = ServerInfo(url="http://127.0.0.1:1", kind="vllm")
    assert choose("auto", info) is CHOICES["vllm"]
    assert choose("sglang", info) is CHOICES["sglang"]
    assert {b.key for b in for_kind("unknown")} == PAIRS
    assert {b.key for b in for_kind("sglang")} == {("sglang", "generate"), ("sglang", "chat")}


def test_only_raw_backends_score() -> None:
    """Scoring needs the target's logprob of ids we send: the raw paths override `score`, chat cannot."""
    for backend in ENDPOINTS.values():
        overrides = type(backend).score is not Backend.score
        assert overrides == backend.exact_ids, backend.key


# -- each class against the simulator of its kind -----------------------------------------------
@pytest.mark.parametrize("key", sorted(PAIRS))
async def test_each_backend_captures_streams_and_probes_on_the_simulator(kimi_tok: Any, key: tuple[str, str]) -> None:
    backend = ENDPOINTS[key]
    settings = resolve_settings({"temperature": 0.0, "max_new_tokens": 64, "seed": 1, "thinking": True}, KIMI)
    prompt_ids = kimi_tok.render(QUESTION, template_kwargs=settings["chat_template_kwargs"])
    with start_simulator(SimConfig(kind=backend.server)) as sim:
        client = ServerClient(sim.url, timeout=5.0, concurrency=2)
        try:
            info = await detect(client, RetryPolicy(retries=1, backoff=0.01), KIMI)
            assert info.kind == backend.server
            call = Call(settings, messages=QUESTION, prompt_ids=None if not backend.exact_ids else prompt_ids)
            plain = await backend.capture(client, info, call)
            streamed = await backend.stream(client, info, Call(settings, QUESTION, call.prompt_ids, stream=True))
            fresh = ServerInfo(url=info.url, kind=info.kind, model=info.model)
            probe = Probe(client, lambda fn: ask(RetryPolicy(retries=0), fn), fresh, {}, list(prompt_ids))
            await backend.probe(probe)
        finally:
            await client.aclose()
    for got in (plain, streamed):
        assert got.capture.endpoint == RECORDED_ENDPOINT[key]
        assert got.capture.prompt_ids == prompt_ids  # the served prompt is the locally rendered one
        assert got.capture.output_ids
        assert got.returned_ids == got.capture.output_ids
        assert got.capture.server_kind == backend.server
    assert streamed.capture.output_ids == plain.capture.output_ids  # same seed, same ids either way
    assert fresh.features, "the probe recorded nothing"
    assert backend.recognises(fresh.features) == backend.exact_ids


@pytest.mark.parametrize(
    ("kind", "raw_path", "other_raw_path"),
    [("sglang", "/generate", "/v1/completions"), ("vllm", "/v1/completions", "/generate")],
)
async def test_the_probe_asks_only_the_endpoints_of_the_kind_it_found(
    kind: str, raw_path: str, other_raw_path: str
) -> None:
    """The chat probe runs once (both servers' chat classes share it); the raw probe is the kind's own."""
    with start_simulator(SimConfig(kind=kind)) as sim:
        client = ServerClient(sim.url, timeout=5.0, concurrency=2)
        try:
            info = await detect(client, RetryPolicy(retries=0), KIMI)
        finally:
            await client.aclose()
        asked = dict(sim.stats.requests)
    assert info.kind == kind
    assert asked.get("/v1/chat/completions") == 1
    assert asked.get(raw_path) == 1
    assert other_raw_path not in asked
    assert info.features["chat_ids_field"]
    assert info.features["generate_ids" if kind == "sglang" else "completions_ids"]


# -- the code's shape ---------------------------------------------------------------------------
def modules(*packages: str) -> dict[str, Path]:
    return {
        "tokview." + ".".join(p.relative_to(ROOT).with_suffix("").parts): p
        for package in packages
        for p in sorted((ROOT / package).glob("*.py"))
    }


def private_imports(path: Path) -> list[str]:
    """`from tokview.x import _name`, and `module._name` on a tokview module imported by name."""
    tree = ast.parse(path.read_text())
    found, module_aliases = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tokview"):
            for alias in node.names:
                if alias.name.startswith("_"):
                    found.append(f"from {node.module} import {alias.name}")
                module_aliases.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            module_aliases.update(a.asname or a.name for a in node.names if a.name.startswith("tokview"))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in module_aliases
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            found.append(f"{node.value.id}.{node.attr}")
    return found


def test_no_server_or_sim_module_imports_another_modules_private_helpers() -> None:
    offenders = {name: hits for name, path in modules("servers", "sim").items() if (hits := private_imports(path))}
    assert offenders == {}


def test_the_private_import_check_sees_both_forms(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from tokview.sim.sglang import _meta\nfrom tokview.sim import faults\nfaults._hidden()\n")
    assert private_imports(bad) == ["from tokview.sim.sglang import _meta", "faults._hidden"]


def module_imports(path: Path, known: set[str]) -> set[str]:
    """Modules of `known` this one imports anywhere: at the top, under TYPE_CHECKING or inside a function
    (a cycle hidden in a lazy import or a type-only import is still two modules that need each other)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.update(m for m in (node.module, *(f"{node.module}.{a.name}" for a in node.names)) if m in known)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
    return out


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt] if nxt in path else [node, nxt]
            if nxt not in state and (cycle := visit(nxt, [*path, nxt])):
                return cycle
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start, [start])):
            return cycle
    return None


def test_no_import_cycle_in_servers_or_sim() -> None:
    mods = modules("servers", "sim")
    graph = {name: module_imports(path, set(mods)) - {name} for name, path in mods.items()}
    assert find_cycle(graph) is None
    assert "tokview.servers.doctor" not in graph["tokview.servers.doctor_checks"]
    assert "tokview.sim.sglang" not in graph["tokview.sim.sglang_chat"]


def test_the_cycle_check_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


SERVER_NAMES = {"sglang", "sglang-chat", "vllm"}


def name_switches(path: Path) -> list[int]:
    """Lines comparing something with a server or backend name (`== "vllm"`, `in ("sglang", …)`)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        for operand in [node.left, *node.comparators]:
            values = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]
            if any(isinstance(v, ast.Constant) and v.value in SERVER_NAMES for v in values):
                lines.append(node.lineno)
    return lines


@pytest.mark.parametrize(
    "module", ["capture", "doctor", "doctor_checks", "doctor_context", "features", "score", "registry", "pool"]
)
def test_no_switch_on_server_names_where_the_registry_answers(module: str) -> None:
    assert name_switches(ROOT / "servers" / f"{module}.py") == []


def test_no_switch_on_server_names_in_batch() -> None:
    assert {p.name: hits for p in sorted((ROOT / "batch").glob("*.py")) if (hits := name_switches(p))} == {}


def test_the_switch_check_sees_a_switch(tmp_path: Path) -> None:
    code = tmp_path / "c.py"
    code.write_text('a = b == "vllm"\nc = d in ("sglang", "x")\ne = f == "auto"\n')
    assert name_switches(code) == [1, 2]


def test_nothing_outside_the_adapter_reaches_into_its_tokenizer() -> None:
    """`TokenizerAdapter.tok` is the adapter's business: callers use its methods."""
    reach = []
    for path in sorted(ROOT.rglob("*.py")):
        if path == ROOT / "core" / "tokenizer.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "tok":
                reach.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert reach == []


def test_the_adapter_gives_what_its_callers_reached_into_tok_for(kimi_tok: Any) -> None:
    """A prompt's "<think>" is the special id (what /tokenize and completions do with text); a dataset's
    typed "<think>" stays ordinary ids; the vocabulary lists every token."""
    assert kimi_tok.encode_prompt("hi <think>")[-1] == KIMI.think_open_id
    literal = kimi_tok.encode_literal("hi <think>")
    assert KIMI.think_open_id not in literal
    assert kimi_tok.decode(literal) == "hi <think>"
    assert kimi_tok.encode_literal("") == []
    tokens = kimi_tok.vocab_tokens()
    assert len(tokens) == kimi_tok.vocab_size
    assert "<think>" in tokens


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
def test_the_simulator_tokenizes_text_prompts_through_the_adapter(kimi_tok: Any, kind: str) -> None:
    import httpx

    with start_simulator(SimConfig(kind=kind)) as sim:
        got = httpx.post(f"{sim.url}/tokenize", json={"prompt": "hi <think>"}).json()["tokens"]
        bad = httpx.post(f"{sim.url}/tokenize", json={"prompt": 3})
    assert got == kimi_tok.encode_prompt("hi <think>")
    assert bad.status_code == 400
    assert "give prompt (a string) or messages" in bad.text


# -- the doctor report's one renderer -----------------------------------------------------------
def report_with_every_status() -> DoctorReport:
    checks = [DoctorCheck(status, f"{status} check", f"{status} detail") for status in ("ok", "fail", "warn", "skip")]
    checks[2].recommendation = "do this"
    info = ServerInfo(url="http://127.0.0.1:1")
    return DoctorReport(url=info.url, info=info, profile=KIMI, tokenizer_name=None, checks=checks)


def test_every_status_has_its_own_mark_and_style() -> None:
    report = report_with_every_status()
    lines = {line.text.split(" ", 1)[1]: line for line in report.lines() if " check: " in line.text}
    marks = {title: line.text[0] for title, line in lines.items()}
    assert marks == {
        "ok check: ok detail": "✓",
        "fail check: fail detail": "✗",
        "warn check: warn detail": "!",
        "skip check: skip detail": "-",
    }
    assert len({line.style for line in lines.values()}) == 4  # the app colours each status differently
    assert SYMBOLS == {"ok": "✓", "fail": "✗", "warn": "!", "skip": "-"}


def test_the_cli_text_and_the_app_rich_text_are_one_rendering() -> None:
    report = report_with_every_status()
    rich = report.render_rich()
    assert rich.plain == report.render_text()
    assert "    → do this" in report.render_text()
    assert report.render_text().endswith("problems found (✗ above)")
    warn_at = rich.plain.index("! warn check")
    assert any(span.start <= warn_at < span.end and "yellow" in str(span.style) for span in rich.spans)
