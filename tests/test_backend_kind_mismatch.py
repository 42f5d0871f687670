"""A `--backend` (batch) or `--kind` (proxy) naming the other server than the one its info endpoints say it is is
refused before any generation, in one line naming the flag: a batch on vLLM with `--backend sglang` sent every
prompt to SGLang's /generate, a 404 each, and exited 3; a proxy with `--kind sglang` in front of vLLM recorded its
streamed chats as failures without ids."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tokview.cli import main
from tokview.errors import ExitCode
from tokview.servers.info import ServerInfo
from tokview.servers.registry import kind_mismatch
from tokview.sim import SimConfig, start_simulator

OTHER = {"vllm": "sglang", "sglang": "vllm"}
NAME = {"vllm": "vLLM", "sglang": "SGLang"}


@pytest.fixture(scope="module", params=["vllm", "sglang"])
def sim(request) -> Iterator[Any]:
    with start_simulator(SimConfig(kind=request.param)) as running:
        yield running


def test_a_batch_with_the_other_backend_fails_before_any_generation(sim, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TOKVIEW_DEBUG", raising=False)
    kind = sim.cfg.kind
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "messages": [{"role": "user", "content": "hi"}]}\n')
    db = tmp_path / "s.duckdb"
    code = main(["batch", str(prompts), "--server", sim.url, "--db", str(db), "--backend", OTHER[kind]])
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE and err.count("\n") == 1  # the flag is wrong, not the server down (exit 2)
    assert "unreachable" not in err
    assert f"is {NAME[kind]} " in err and f"not {NAME[OTHER[kind]]} as --backend says" in err
    assert f"pass --backend {kind}" in err
    assert not db.exists()  # nothing made: no run, no failures


def test_the_kinds_own_backend_and_sglang_chat_still_run(sim, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TOKVIEW_DEBUG", raising=False)
    kind = sim.cfg.kind
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "messages": [{"role": "user", "content": "hi"}]}\n')
    backends = [kind, "sglang-chat"] if kind == "sglang" else [kind]
    for n, backend in enumerate(backends):
        db = tmp_path / f"s{n}.duckdb"
        assert main(["batch", str(prompts), "--server", sim.url, "--db", str(db), "--backend", backend]) == 0


def test_a_proxy_with_the_other_kind_is_refused_at_start(sim, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TOKVIEW_DEBUG", raising=False)
    kind = sim.cfg.kind
    db = tmp_path / "p.duckdb"
    code = main(["proxy", "--server", sim.url, "--kind", OTHER[kind], "--db", str(db), "--listen", "127.0.0.1:0"])
    err = capsys.readouterr().err
    assert code != 0 and err.count("\n") == 1
    assert f"not {NAME[OTHER[kind]]} as --kind says" in err and f"pass --kind {kind}" in err
    assert not db.exists()


def test_a_kind_inferred_from_the_raw_probe_alone_is_not_held_against_the_flag():
    """A gateway (or a fake) answering every path passes either raw probe: only what the info endpoints say is
    sure enough to refuse the flag."""
    inferred = ServerInfo(url="http://x", kind="sglang")
    assert kind_mismatch("vllm", inferred, "--backend") is None
    said = ServerInfo(url="http://x", kind="sglang", kind_said=True, version="0.5.23")
    assert kind_mismatch("vllm", said, "--backend") == (
        "http://x is SGLang 0.5.23 (as it says), not vLLM as --backend says: drop --backend (the kind the server says "
        "is used) or pass --backend sglang"
    )
    assert kind_mismatch("sglang", said, "--backend") is None


def test_a_mixed_fleet_with_one_backend_is_refused_naming_the_other_kind(tmp_path, capsys, monkeypatch):
    """`--server <vLLM> --server <SGLang> --backend vllm` dropped the SGLang one at the probe without a word and ran
    on the rest: the flag is refused instead (without --backend, each server is spoken to as its own kind)."""
    monkeypatch.delenv("TOKVIEW_DEBUG", raising=False)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "messages": [{"role": "user", "content": "hi"}]}\n')
    with start_simulator(SimConfig(kind="vllm")) as vllm, start_simulator(SimConfig(kind="sglang")) as sglang:
        servers = ["--server", vllm.url, "--server", sglang.url]
        db = tmp_path / "s.duckdb"
        code = main(["batch", str(prompts), *servers, "--db", str(db), "--backend", "vllm"])
        err = capsys.readouterr().err
        assert code == ExitCode.USAGE and err.count("\n") == 1, err
        assert f"{sglang.url} is SGLang" in err and "pass --backend sglang" in err
        assert not db.exists()
        assert main(["batch", str(prompts), *servers, "--db", str(db)]) == 0
