"""Datasets as other pipelines ship them, read by `audit` and `batch` (a user pass over peers' datasets).

- A Hermes tool turn of two `<tool_response>` blocks parses as two messages: the audit read the last answer's raw turn
  by the parsed index, past the end (`internal error: IndexError`, every row lost) or onto another turn.
- A `system` beside `conversations`/`messages` (LLaMA-Factory's ShareGPT rows) was read only beside `prompt`: rows were
  audited and generated without their system prompt, and nothing said so.
- A compressed file, a Parquet file named `.jsonl` and a JSON array were each read line by line as bad rows."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tokview.cli import main
from tokview.core.prompts import PromptError, parse_row
from tokview.store import Store

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "w",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
CALLS = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
)
RESULTS = '<tool_response>\n{"t": 20}\n</tool_response>\n<tool_response>\n{"t": 25}\n</tool_response>'


def _hermes(answer: dict[str, str], *after: dict[str, str]) -> dict[str, object]:
    turns = [{"from": "human", "value": "Weather in Paris and Rome?"}, {"from": "gpt", "value": CALLS}]
    return {
        "id": "h",
        "tools": json.dumps(TOOLS),
        "conversations": [*turns, {"from": "tool", "value": RESULTS}, answer, *after],
    }


def _write(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _codes(db: Path) -> dict[str, set[str]]:
    with Store(db) as store:
        rows = store.query("SELECT sample_id, code FROM findings")
    out: dict[str, set[str]] = {}
    for sample_id, code in rows:
        out.setdefault(sample_id.split("@")[0], set()).add(code)
    return out


def test_a_hermes_tool_turn_of_two_results_is_audited_with_its_answers_own_reasoning(tmp_path, qwen_tok_dir):
    last = _hermes({"from": "gpt", "value": "Paris 20, Rome 25.", "reasoning_content": "Both fetched."})
    # a user turn after the answer: the index then fell on another turn, which had no reasoning key
    middle = _hermes(
        {"from": "gpt", "value": "Paris 20, Rome 25.", "reasoning_content": "Both fetched."},
        {"from": "human", "value": "Thanks, and tomorrow?"},
        {"from": "gpt", "value": "Ask me tomorrow.", "reasoning_content": "No forecast tool for that."},
    )
    middle["id"] = "m"
    data, db = _write(tmp_path / "hermes.jsonl", [last, middle]), tmp_path / "a.duckdb"
    assert main(["audit", str(data), "--tokenizer", str(qwen_tok_dir), "--db", str(db)]) == 0
    codes = _codes(db)
    assert set(codes) == {"h", "m"}
    assert not {"reasoning_field_missing", "empty_reasoning"} & (codes["h"] | codes["m"]), codes


def test_a_system_beside_the_conversation_is_its_first_turn():
    turns = [{"from": "human", "value": "Q"}, {"from": "gpt", "value": "A"}]
    row = parse_row({"system": "Be terse.", "conversations": turns})
    assert row.messages[0] == {"role": "system", "content": "Be terse."}
    same = parse_row(
        {"system": "Be terse.", "messages": [{"role": "system", "content": "Be terse."}, *row.messages[1:]]}
    )
    assert [m["role"] for m in same.messages] == ["system", "user", "assistant"]  # not twice
    assert parse_row({"system": "", "conversations": turns}).messages[0]["role"] == "user"
    with pytest.raises(PromptError, match="`system` and the conversation's own system turn differ"):
        parse_row({"system": "Be terse.", "messages": [{"role": "system", "content": "Be kind."}, *row.messages[1:]]})
    with pytest.raises(PromptError, match="`system` must be a string"):
        parse_row({"system": ["Be terse."], "conversations": turns})


def test_audit_and_batch_render_the_system_beside_the_conversation(tmp_path, vllm_sim):
    """The same conversation with its system turn written in it and as a `system` key: the same prompt ids."""
    turns = [{"from": "human", "value": "What is two and two?"}, {"from": "gpt", "value": "Four."}]
    inside = {"id": "in", "conversations": [{"from": "system", "value": "Be terse."}, *turns]}
    beside = {"id": "by", "system": "Be terse.", "conversations": turns}
    none = {"id": "no", "conversations": turns}
    data, db = _write(tmp_path / "sys.jsonl", [inside, beside, none]), tmp_path / "a.duckdb"
    assert main(["audit", str(data), "--db", str(db)]) == 0
    prompts = tmp_path / "p.jsonl"
    _write(prompts, [{**inside, "conversations": inside["conversations"][:2]}, {**beside, "conversations": turns[:1]}])
    assert main(["batch", str(prompts), "--server", vllm_sim.url, "--db", str(db), "--max-new-tokens", "8"]) == 0
    with Store(db) as store:
        rows = store.query("SELECT sample_id, run_id, prompt_ids FROM samples")
    ids = {(sample_id.split("@")[0], run_id.split("-")[0]): list(prompt) for sample_id, run_id, prompt in rows}
    assert ids["in", "audit"] == ids["by", "audit"] != ids["no", "audit"]
    assert ids["in", "batch"] == ids["by", "batch"]


@pytest.mark.parametrize("command", ["audit", "batch"])
def test_a_compressed_parquet_or_array_file_named_as_jsonl_is_one_line(tmp_path, command, capsys):
    row = {"id": "a", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    gz = tmp_path / "rows.jsonl.gz"
    gz.write_bytes(gzip.compress((json.dumps(row) + "\n").encode()))
    parquet = tmp_path / "rows.jsonl"
    parquet.write_bytes(b"PAR1" + b"\x00" * 64 + b"PAR1")
    array = tmp_path / "rows.json"
    array.write_text(json.dumps([row, row], indent=2))
    said = {
        gz: "is gzip-compressed, not JSONL text: decompress it first (e.g. `gunzip -k ",
        parquet: "is a Parquet file: give it a .parquet suffix",
        array: "is a JSON array, not JSONL (one JSON object per line): convert it, e.g. `jq -c '.[]'",
    }
    for path, words in said.items():
        extra = ["--server", "http://127.0.0.1:9"] if command == "batch" else []
        assert main([command, str(path), "--db", str(tmp_path / "s.duckdb"), *extra]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err


@pytest.mark.parametrize("tokenizer", ["kimi", "qwen3"])
def test_content_that_closes_reasoning_it_never_opened_is_reasoning_and_answer(tmp_path, qwen_tok_dir, tokenizer):
    """Pitfall P1's row (`reasoning</think>answer`: no reasoning parser, a pre-filled opener) was read as text:
    `think_close_repeated` (Qwen3) or `literal_think_text` (Kimi), though a trainer reads reasoning and answer."""
    ask = {"role": "user", "content": "What is 6 times 7?"}
    rows = [
        {"id": "p1", "messages": [ask, {"role": "assistant", "content": "6*7 is 42.</think>The answer is 42."}]},
        {"id": "field", "messages": [ask, {"role": "assistant", "content": "The answer is 42.", "reasoning_content": "6*7 is 42."}]},
        {"id": "typed", "messages": [ask, {"role": "assistant", "content": "Close it with </think> and then </think>."}]},
    ]  # fmt: skip
    data, db = _write(tmp_path / "p1.jsonl", rows), tmp_path / "a.duckdb"
    flags = ["--tokenizer", str(qwen_tok_dir)] if tokenizer == "qwen3" else []
    assert main(["audit", str(data), "--db", str(db), *flags]) == 0
    with Store(db) as store:
        out = {s.split("@")[0]: list(ids) for s, ids in store.query("SELECT sample_id, output_ids FROM samples")}
    assert out["p1"] == out["field"]
    errors = {c for c in _codes(db)["p1"]} & {"think_close_repeated", "literal_think_text", "empty_reasoning"}
    assert not errors
    assert out["typed"] != out["field"]  # two closers: text as typed, not split


def test_an_audit_names_what_it_read_with_and_doubts_a_tokenizer_no_row_agrees_with(tmp_path, qwen_tok_dir, capsys):
    """Qwen3 speculators rows audited without `--tokenizer` (the Kimi layout holds every Qwen3 id) said "0 invalid",
    exit 0, and never named the tokenizer."""
    from tokview.core.tokenizer import load_tokenizer

    qwen = load_tokenizer(qwen_tok_dir)
    rows = []
    for k in range(3):
        prompt = qwen.render([{"role": "user", "content": f"What is {k} plus {k}?"}])
        answer = qwen.encode(f"<think>\nAdd them.\n</think>\n\nIt is {2 * k}.<|im_end|>")
        ids = [*prompt, *answer]
        rows.append(
            {
                "id": f"r{k}",
                "input_ids": ids,
                "loss_mask": [0] * len(prompt) + [1] * len(answer),
                "text": qwen.decode(ids),
            }
        )
    data = _write(tmp_path / "spec.jsonl", rows)
    assert main(["audit", str(data), "--db", str(tmp_path / "a.duckdb")]) == 0
    out = capsys.readouterr().out
    assert "  read with tokview's default Kimi-layout tokenizer, profile kimi-k2.5" in out
    assert "note: every row holds a `text` that is not its ids decoded: is --tokenizer the dataset's model's?" in out
    assert main(["audit", str(data), "--db", str(tmp_path / "b.duckdb"), "--tokenizer", str(qwen_tok_dir)]) == 0
    out = capsys.readouterr().out
    assert f"  read with the tokenizer of {qwen_tok_dir}, profile qwen3" in out and "note: every row" not in out


@pytest.mark.parametrize("max_new_tokens", ["36", "90"])
def test_an_audit_of_a_text_export_finds_the_samples_cut_at_their_max_tokens(tmp_path, vllm_sim, max_new_tokens):
    """Text rows held no sign of the cut: an audit of a `--select all` export found 12 of 21 truncated samples, each
    as `empty_answer` (a closer and a stop made up), and none cut inside its answer. 36 ids end inside the reasoning
    of the simulator's answers, 90 inside some answers."""
    prompts = _write(
        tmp_path / "p.jsonl",
        [{"id": f"p{k}", "messages": [{"role": "user", "content": f"Question {k} about rivers"}]} for k in range(12)],
    )
    db = tmp_path / "s.duckdb"
    main(["batch", str(prompts), "--server", vllm_sim.url, "--db", str(db), "--max-new-tokens", max_new_tokens])
    with Store(db) as store:
        cut = {s.split("@")[0] for (s,) in store.query("SELECT sample_id FROM findings WHERE code = 'truncated'")}
    assert cut
    for fmt in ("specforge", "sharegpt", "speculators"):
        out, audited = tmp_path / f"{fmt}.jsonl", tmp_path / f"{fmt}.duckdb"
        assert main(["export", "--db", str(db), "--format", fmt, "--select", "all", "--out", str(out)]) == 0
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        if fmt != "speculators":
            assert {r["id"].split("_gen")[0] for r in rows if r.get("truncated") is True} == cut
        assert main(["audit", str(out), "--db", str(audited)]) == 0
        found = {k for k, codes in _codes(audited).items() if "truncated" in codes}
        assert {k.split("_gen")[0] for k in found} == cut, fmt
        reasoning_cut = {k for k, codes in _codes(audited).items() if "think_close_missing" in codes}
        assert not {k for k, codes in _codes(audited).items() if "empty_answer" in codes} & reasoning_cut


def test_a_boolean_loss_mask_reads_as_zeros_and_ones(tmp_path):
    """A Parquet `bool` mask (as HF datasets write one) was refused on every row: "loss_mask[0] = false"."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tokview.core.kimi_layout import kimi_tokenizer_dir
    from tokview.core.tokenizer import load_tokenizer

    kimi = load_tokenizer(kimi_tokenizer_dir())
    prompt = kimi.render([{"role": "user", "content": "What is two and two?"}])
    answer = kimi.encode("Four.</think>It is four.<|im_end|>")
    mask = [False] * len(prompt) + [True] * len(answer)
    ints, bools = tmp_path / "ints.parquet", tmp_path / "bools.parquet"
    pq.write_table(pa.table({"id": ["a"], "input_ids": [prompt + answer], "loss_mask": [[int(m) for m in mask]]}), ints)
    pq.write_table(pa.table({"id": ["a"], "input_ids": [prompt + answer], "loss_mask": [mask]}), bools)
    for path in (ints, bools):
        assert main(["audit", str(path), "--db", str(tmp_path / f"{path.stem}.duckdb")]) == 0
    with Store(tmp_path / "ints.duckdb") as a, Store(tmp_path / "bools.duckdb") as b:
        assert a.query("SELECT prompt_ids, output_ids FROM samples") == b.query(
            "SELECT prompt_ids, output_ids FROM samples"
        )
        assert len(b.query("SELECT * FROM samples")) == 1


def test_an_audit_names_its_invalid_rows_by_line(tmp_path, capsys):
    ask = {"role": "user", "content": "What is 6 times 7?"}
    good = {"messages": [ask, {"role": "assistant", "content": "42.", "reasoning_content": "6*7 is 42."}]}
    cut = {"messages": [ask, {"role": "assistant", "content": "", "reasoning_content": "6*7 is"}], "truncated": True}
    data = _write(tmp_path / "rows.jsonl", [good, cut, good | {"id": "again"}])
    assert main(["audit", str(data), "--db", str(tmp_path / "a.duckdb")]) == 0
    out = capsys.readouterr().out
    assert "  invalid: line 2 (think_close_missing, truncated) (`tokview show SAMPLE_ID` explains one;" in out
    assert main(["audit", str(data), "--db", str(tmp_path / "b.duckdb"), "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)["invalid_rows"]
    assert listed["line"] == 2 and listed["codes"] == ["think_close_missing", "truncated"]
    assert main(["show", listed["sample_id"], "--db", str(tmp_path / "b.duckdb")]) == 0


def test_a_mask_that_leaves_the_stop_out_raises_no_doubt_about_the_tokenizer(tmp_path, qwen_tok_dir, capsys):
    """Rows masking their `<|im_end|>` out (the stop is left unsupervised, as many pipelines do) were told "every row
    ends without a stop id: is --tokenizer the dataset's model's?" with the dataset's own tokenizer."""
    from tokview.core.tokenizer import load_tokenizer

    qwen = load_tokenizer(qwen_tok_dir)
    rows = []
    for k in range(3):
        prompt = qwen.render([{"role": "user", "content": f"What is {k} plus {k}?"}])
        answer = qwen.encode(f"<think>\nAdd them.\n</think>\n\nIt is {2 * k}.")
        stop = qwen.encode("<|im_end|>\n")
        ids = [*prompt, *answer, *stop]
        mask = [0] * len(prompt) + [1] * len(answer) + [0] * len(stop)
        rows.append({"id": f"r{k}", "input_ids": ids, "loss_mask": mask})
    data = _write(tmp_path / "spec.jsonl", rows)
    assert main(["audit", str(data), "--db", str(tmp_path / "a.duckdb"), "--tokenizer", str(qwen_tok_dir)]) == 0
    out = capsys.readouterr().out
    assert "3 rows mask ids after their last supervised id" in out and "note: every row" not in out
