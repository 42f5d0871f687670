"""`tokview merge` of stores `tokview proxy` recorded: a proxy run records what merge compares (served model,
vocabulary, special ids, profile) as batch does. Before, its run named none of them: a proxy store and a batch store
of the same model and tokenizer were refused in either order ("holds samples of profile kimi-k2.5, … holds model
tokview-sim, tokenizer …"), and two proxy stores of different tokenizers merged silently."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tokview.cli import main
from tokview.core.resolve import load_tokenizer_and_profile
from tokview.errors import ExitCode
from tokview.proxy.serve import ProxyConfig, start_proxy
from tokview.sim import SimConfig, start_simulator
from tokview.store import Store

CHAT = {"messages": [{"role": "user", "content": "What is 17 times 3?"}], "max_tokens": 40, "temperature": 0}


def _proxied(sim_url: str, db: Path, tokenizer_dir: Path | None, profile: str | None) -> None:
    tok, prof = load_tokenizer_and_profile(tokenizer_dir, profile)
    config = ProxyConfig([sim_url], listen="127.0.0.1:0", db=str(db), tokenizer=tok, profile=prof)
    with start_proxy(config) as proxy:
        model = httpx.get(sim_url + "/v1/models").json()["data"][0]["id"]
        assert httpx.post(proxy.url + "/v1/chat/completions", json={**CHAT, "model": model}).status_code == 200


def _merge(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["merge", *args])
    return code, capsys.readouterr().err


def test_a_proxy_store_merges_with_a_batch_store_of_its_model(tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "q", "messages": CHAT["messages"]}) + "\n")
    with start_simulator(SimConfig(kind="vllm")) as sim:
        _proxied(sim.url, tmp_path / "proxy.duckdb", None, None)
        args = ["batch", str(prompts), "--server", sim.url, "--db", str(tmp_path / "batch.duckdb"), "--workers", "1"]
        assert main(args) == ExitCode.OK
    capsys.readouterr()
    for order in (("batch", "proxy"), ("proxy", "batch")):
        into = tmp_path / f"{order[0]}-first.duckdb"
        code, err = _merge(capsys, *(str(tmp_path / f"{name}.duckdb") for name in order), "--into", str(into))
        assert code == ExitCode.OK, err
        with Store(into) as store:
            assert store.query("SELECT count(*) FROM samples") == [(2,)]


def test_proxy_stores_of_two_tokenizers_are_refused(tmp_path, capsys, glm_tok_dir):
    with (
        start_simulator(SimConfig(kind="vllm")) as kimi,
        start_simulator(SimConfig(kind="vllm", tokenizer_dir=glm_tok_dir)) as glm,
    ):
        _proxied(kimi.url, tmp_path / "k.duckdb", None, "plain")
        _proxied(glm.url, tmp_path / "g.duckdb", glm_tok_dir, "plain")
    capsys.readouterr()
    code, err = _merge(capsys, str(tmp_path / "k.duckdb"), str(tmp_path / "g.duckdb"), "--into", str(tmp_path / "m"))
    assert code == ExitCode.USAGE, err
    last = err.strip().splitlines()[-1]  # the first source merged, then one line that says so
    assert last.endswith(f"merge refused; kept from the stores merged before: {tmp_path / 'k.duckdb'}"), err
    three = [str(tmp_path / name) for name in ("g.duckdb", "k.duckdb", "k.duckdb")]
    code, err = _merge(capsys, *three, "--into", str(tmp_path / "n"))
    assert code == ExitCode.USAGE, err  # the third was never tried: said, where it went unsaid
    assert (
        err.strip()
        .splitlines()[-1]
        .endswith(f"merge refused; kept from the stores merged before: {three[0]}; not tried: {three[2]}")
    ), err


def _as_recorded_before(db: Path) -> None:
    """The store's proxy runs as a tokview before this change wrote them: no model, tokenizer or special ids."""
    with Store(db) as store:
        for run_id, settings in store.query("SELECT run_id, settings FROM runs"):
            old = {k: v for k, v in json.loads(settings).items() if k in ("mode", "listen")}
            store.write([("UPDATE runs SET settings = ? WHERE run_id = ?", [json.dumps(old), run_id])])


def test_proxy_runs_recorded_before_their_identity_still_merge_with_new_ones(tmp_path, capsys):
    """A store holding an old proxy run and a new one was refused ("mixes 2 models/tokenizers/profiles"), and so
    was an old proxy store beside a new one: an old run is known by its profile alone."""
    with start_simulator(SimConfig(kind="vllm")) as sim:
        _proxied(sim.url, tmp_path / "mixed.duckdb", None, None)
        _as_recorded_before(tmp_path / "mixed.duckdb")
        _proxied(sim.url, tmp_path / "mixed.duckdb", None, None)  # a new run into the same store
        _proxied(sim.url, tmp_path / "new.duckdb", None, None)
        _proxied(sim.url, tmp_path / "other.duckdb", None, "plain")
        _as_recorded_before(tmp_path / "other.duckdb")
    capsys.readouterr()
    code, err = _merge(capsys, str(tmp_path / "mixed.duckdb"), "--into", str(tmp_path / "a.duckdb"))
    assert code == ExitCode.OK, err
    code, err = _merge(
        capsys, str(tmp_path / "new.duckdb"), str(tmp_path / "mixed.duckdb"), "--into", str(tmp_path / "b")
    )
    assert code == ExitCode.OK, err
    code, err = _merge(capsys, str(tmp_path / "other.duckdb"), "--into", str(tmp_path / "b"))
    assert code == ExitCode.USAGE and err.strip().endswith("merge refused"), err  # another profile: refused still


def test_a_source_of_two_models_is_refused_beside_old_proxy_runs_too(tmp_path, capsys):
    """Old proxy runs are known by their profile alone: a source mixing two models was taken into such a target (it
    conflicted with nothing there), though refused into an empty one."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "q", "messages": CHAT["messages"]}) + "\n")
    with (
        start_simulator(SimConfig(kind="vllm")) as one,
        start_simulator(SimConfig(kind="vllm", model_name="other-model")) as two,
    ):
        _proxied(one.url, tmp_path / "old.duckdb", None, None)
        _as_recorded_before(tmp_path / "old.duckdb")
        for sim in (one, two):
            args = ["batch", str(prompts), "--server", sim.url, "--db", str(tmp_path / "mixed.duckdb")]
            assert main([*args, "--workers", "1"]) == ExitCode.OK
    capsys.readouterr()
    code, err = _merge(capsys, str(tmp_path / "mixed.duckdb"), "--into", str(tmp_path / "old.duckdb"))
    assert code == ExitCode.USAGE and err.strip().endswith("merge refused"), err
    with Store(tmp_path / "old.duckdb") as store:
        assert store.query("SELECT count(*) FROM samples") == [(1,)]
