"""Numbers and provenance an export, `stats`, `show` and a run's record give, against what the store holds (a sweep
recomputed each from the store): a usage total, a manifest's sampling settings, the servers a run met, a run's mean
acceptance length, the ids `show` lists, and the id of a Parquet row without one."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
from builders import kimi, make_capture, profile, put

from tokview.batch.inputs import iter_parquet
from tokview.cli import main
from tokview.core.prompts import prompt_id_for
from tokview.export import export
from tokview.store import Store


def test_an_exported_usage_total_is_prompt_plus_completion(store, tmp_path):
    """A capture keeps the server's two counts, not its sum: every speculators row said total_tokens null."""
    cap = make_capture()
    cap.usage = {"prompt_tokens": len(cap.prompt_ids), "completion_tokens": len(cap.output_ids)}
    put(store, "q", cap)
    export(store, "speculators", tmp_path / "s.jsonl", select="all", tokenizer=kimi(), profile=profile())
    (row,) = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    usage = row["metadata"]["usage"]
    assert (
        usage["total_tokens"]
        == len(cap.prompt_ids) + len(cap.output_ids)
        == sum(usage[k] for k in ("prompt_tokens", "completion_tokens"))
    )


def test_the_manifest_lists_each_sampling_setting_once_not_each_chain_turn(store, tmp_path):
    """A chain turn's own record rides its settings: a 480-sample chain run listed 441 "sampling" entries."""
    for turn in range(3):
        cap = make_capture(question=f"q{turn}")
        cap.settings = {**cap.settings, "chain": {"conversation": "c", "turn": turn, "previous_len": 10 * turn}}
        put(store, f"c{turn}", cap)
    result = export(store, "speculators", tmp_path / "s.jsonl", select="all", tokenizer=kimi(), profile=profile())
    assert len(result.manifest["sampling"]) == 1
    assert "chain" not in result.manifest["sampling"][0]


def test_a_run_lists_every_server_it_met_through_resumes_and_merges(tmp_path):
    """A run resumed against another server kept only the last one's version and features; a merge kept whichever
    shard's record landed first."""
    first = [{"url": "http://127.0.0.1:1", "kind": "vllm", "version": "0.31"}]
    second = [{"url": "http://127.0.0.1:2", "kind": "vllm", "version": "0.32"}]
    with Store(tmp_path / "a.duckdb") as a:
        a.put_run("r", settings={"t": 0}, server_info=first)
        a.put_run("r", settings={"t": 0}, server_info=second)  # a resume on another server
        resumed = a.run("r")["server_info"]
    assert [s["url"] for s in resumed] == ["http://127.0.0.1:2", "http://127.0.0.1:1"]  # the latest first
    for name, info in (("s1", first), ("s2", second)):
        with Store(tmp_path / f"{name}.duckdb") as shard:
            shard.put_run("r", settings={"t": 0}, server_info=info)
    merged = []
    for order in (("s1", "s2"), ("s2", "s1")):
        target = tmp_path / f"m{''.join(order)}.duckdb"
        with Store(target) as m:
            for name in order:
                m.merge(tmp_path / f"{name}.duckdb")
            merged.append(m.run("r")["server_info"])
    assert [m[0]["url"] for m in merged] == ["http://127.0.0.1:1", "http://127.0.0.1:2"]  # the target's first
    assert sorted(map(str, merged[0])) == sorted(map(str, merged[1])) == sorted(map(str, resumed))


def test_a_runs_acceptance_length_is_the_stores_figure(tmp_path, capsys):
    """`stats` said 2.67 for the store and 2.68 for its only run: the run's was a mean of each sample's."""
    db = tmp_path / "acc.duckdb"
    with Store(db) as store:
        for name, steps, accepted in (("long", 100, 200), ("short", 2, 0)):
            cap = make_capture(question=name)
            cap.spec_decode = {"schema": "vllm-summary", "steps": steps, "accepted": accepted, "drafted": 3 * steps}
            put(store, name, cap)
    assert main(["stats", "--db", str(db), "--json"]) == 0
    whole = json.loads(capsys.readouterr().out)["spec_decode"]["mean_acceptance_length"]
    assert main(["stats", "--db", str(db), "--by", "run", "--json"]) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    assert whole == run["acceptance"]["mean_acceptance_length"] == 1 + 200 / 102


def test_samples_without_an_accepted_count_weigh_nothing_in_acceptance(tmp_path, capsys):
    """An older SGLang build reports steps without an accepted count: read as 0 accepted, its run said 1.00 where
    there is no figure, and the store's figure was pulled down."""
    db = tmp_path / "old.duckdb"
    with Store(db) as store:
        cap = make_capture(question="new build")
        cap.spec_decode = {"schema": "sglang", "steps": 10, "accepted": 20, "drafted": 30}
        put(store, "new", cap, run_id="new")
        old = make_capture(question="old build")
        old.spec_decode = {"schema": "sglang", "steps": 18, "accepted": None, "drafted": None}
        put(store, "old", old, run_id="old")
    assert main(["stats", "--db", str(db), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["spec_decode"]["mean_acceptance_length"] == 3.0
    assert main(["stats", "--db", str(db), "--by", "run", "--json"]) == 0
    runs = {r["run"]: r["acceptance"]["mean_acceptance_length"] for r in json.loads(capsys.readouterr().out)["runs"]}
    assert runs == {"new": 3.0, "old": None}


def test_show_of_a_sample_with_no_output_names_no_impossible_range(store, tmp_path, capsys):
    cap = make_capture()
    cap.output_ids, cap.usage = [], {"prompt_tokens": len(cap.prompt_ids), "completion_tokens": 0}
    sid = put(store, "empty", cap)
    store.close()
    assert main(["show", sid, "--db", str(store.path)]) == 0
    out = capsys.readouterr().out
    assert f"ids: none from {len(cap.prompt_ids)}" in out
    assert f"ids {len(cap.prompt_ids)}..{len(cap.prompt_ids) - 1}" not in out


def test_a_parquet_row_without_an_id_is_known_by_its_own_fields(tmp_path: Path):
    """Parquet has no absent keys: a row without `id` took a null for each column another row has, so its hash (its
    prompt id) changed with the file's other rows, and the prompt was generated and exported a second time."""
    con = duckdb.connect()
    alone, beside = tmp_path / "alone.parquet", tmp_path / "beside.parquet"
    con.execute(f"COPY (SELECT 'hello' AS prompt) TO '{alone}' (FORMAT parquet)")
    con.execute(
        f"COPY (SELECT * FROM (VALUES (NULL, 'hello'), ('x1', 'other')) t(id, prompt)) TO '{beside}' (FORMAT parquet)"
    )
    (only,) = [row for _, row in iter_parquet(alone)]
    first = next(row for _, row in iter_parquet(beside))
    assert prompt_id_for(first) == prompt_id_for(only) == prompt_id_for({"prompt": "hello"})


def test_truncated_counts_the_samples_flagged_truncated(tmp_path, capsys):
    """A whole turn whose stop id was its last allowed id says `length` on SGLang: no `truncated` finding, yet `stats`
    (and the batch summary) counted it truncated by its finish_reason."""
    db = tmp_path / "t.duckdb"
    with Store(db) as store:
        whole = make_capture(question="whole", finish_reason="length")  # ends with its stop id
        put(store, "whole", whole)
        put(store, "cut", make_capture(question="cut", finish_reason="length", stop=False))
    assert main(["stats", "--db", str(db), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["truncated"] == 1
    assert main(["stats", "--db", str(db), "--by", "run", "--json"]) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    assert run["truncated"] == 1


def test_a_damaged_server_list_gives_way_to_a_good_one_either_side():
    from tokview.store.sample_rows import servers_union

    good, damaged = '[{"url": "http://a"}]', '[{"url": broken'
    assert json.loads(servers_union(damaged, good) or "") == [{"url": "http://a"}]
    assert json.loads(servers_union(good, damaged) or "") == [{"url": "http://a"}]
