"""`tokview score` reads a few samples' output ids back on the target (`/detokenize`) before scoring anything.

A target of another vocabulary accepts the ids and scores them: each NLL and `off_policy` finding was garbage, and
the only comparison (ids named in the answer against ids sent) cannot tell. Simulators of two vocabularies (the
Kimi layout that made the samples, Qwen3's as the wrong target) on real sockets."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from builders import kimi, make_capture, profile
from prompt_files import prompts_file

from tokview.batch import BatchConfig, run_batch
from tokview.batch.inputs import InputError
from tokview.batch.scoring import ScoreConfig, run_score
from tokview.core.analysis import analyze
from tokview.sim import SimConfig, start_simulator
from tokview.store import Store


async def _made_on_kimi(tmp_path, kind: str) -> Store:
    store = Store(tmp_path / "s.duckdb")
    with start_simulator(SimConfig(kind=kind)) as sim:
        config = BatchConfig(servers=[sim.url], prompts_path=prompts_file(tmp_path / "p.jsonl", 4), max_new_tokens=60)
        summary = await run_batch(config, store)
    assert summary.ok == 4, summary.render()
    return store


def _scored(store: Store) -> int:
    return store.query("SELECT count(*) FROM samples WHERE target_score IS NOT NULL")[0][0]


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
async def test_a_target_of_another_vocabulary_is_refused_before_anything_is_scored(tmp_path, qwen_tok_dir, kind):
    with await _made_on_kimi(tmp_path, kind) as store:
        with start_simulator(SimConfig(kind=kind, tokenizer_dir=qwen_tok_dir)) as other:
            with pytest.raises(InputError, match=r"reads the samples' ids as other text .*--any-vocabulary") as refused:
                await run_score(ScoreConfig(servers=[other.url]), store)
            assert "3 of 3 samples told differ" in str(refused.value)
            assert _scored(store) == 0
            anyway = await run_score(ScoreConfig(servers=[other.url], any_vocabulary=True, retries=0), store)
        assert anyway.ok + anyway.failed == 4 and anyway.vocabulary is None
        with start_simulator(SimConfig(kind=kind)) as same:  # the vocabulary the samples were made with
            summary = await run_score(ScoreConfig(servers=[same.url], rescore=True), store)
    assert (summary.ok, summary.failed, summary.vocabulary) == (4, 0, None), summary.render()
    assert "vocabulary" not in summary.render()


async def test_samples_without_an_answer_text_are_scored_and_said_unchecked(tmp_path):
    """Imported samples may carry no text: nothing to read back, so the summary says the check did not run."""
    with Store(tmp_path / "s.duckdb") as store:
        for k in range(2):
            capture = make_capture(f"question {k}")
            capture.text = capture.content = capture.reasoning = None
            store.put_sample(f"s{k}@x_gen0", f"s{k}", "imported", capture, analyze(capture, profile(), kimi()))
        with start_simulator(SimConfig(kind="vllm")) as sim:
            summary = await run_score(ScoreConfig(servers=[sim.url]), store)
    assert (summary.ok, summary.failed) == (2, 0)
    assert summary.vocabulary is not None
    assert "vocabulary not checked: the 2 sample(s) looked at have too few words to tell" in summary.render()


async def test_the_cli_refuses_another_vocabulary_in_one_line_and_exits_1(tmp_path, qwen_tok_dir):
    with await _made_on_kimi(tmp_path, "vllm") as store:
        db = store.path
    with start_simulator(SimConfig(kind="vllm", tokenizer_dir=qwen_tok_dir)) as other:
        argv = [sys.executable, "-m", "tokview", "score", "--db", str(db), "--server", other.url, "--summary-json"]
        refused = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        anyway = subprocess.run(
            [*argv, "--any-vocabulary", "--retries", "0"], capture_output=True, text=True, timeout=120
        )
    assert refused.returncode == 1, refused.stderr
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith("tokview: error: the target reads the samples' ids as other text"), refused.stderr
    assert "Traceback" not in refused.stderr
    assert anyway.returncode in (0, 3), anyway.stderr
    assert json.loads(anyway.stdout)["vocabulary"] is None


def test_an_answer_reads_as_its_ids_with_special_tokens_kept_or_skipped_on_either_side():
    from tokview.batch.answer_words import reads_as

    answer = "Okay, the user asks for six times seven.</think>Six groups of seven make forty-two.<|im_end|>"
    skipped = "Okay, the user asks for six times seven.Six groups of seven make forty-two."
    assert reads_as(answer, answer) and reads_as(answer, skipped) and reads_as(skipped, answer)
    kimi_calls = 'functions.read:0{"path": "a.py"}functions.read:1{"path": "b.py"}'  # a raw text: specials skipped
    kimi_ids = (
        '<|tool_calls_section_begin|><|tool_call_begin|>functions.read:0<|tool_call_argument_begin|>{"path": "a.py"}'
        '<|tool_call_end|><|tool_call_begin|>functions.read:1<|tool_call_argument_begin|>{"path": "b.py"}'
        "<|tool_call_end|><|tool_calls_section_end|>"
    )
    assert reads_as(kimi_calls, kimi_ids)
    harmony = "<|channel|>analysis<|message|>User asks 6x7. Easy.<|end|><|start|>assistant<|channel|>final<|message|>42"
    assert reads_as("analysisUser asks 6x7. Easy.assistantfinal42", harmony)
    assert reads_as("Six groups  of\nseven make it", " Six groups of seven make it ")  # a decode's clean-up
    gibberish = " clpcmh cnacns colcpd cpwcqo crhcrz cssctk t\ufffdA\ufffdAndA pOAu ApeA el asA ence<|im_end|>"
    assert reads_as(answer, gibberish) is False
    assert reads_as("42 User asks 6x7. Easy.", harmony), "Harmony's chat fields: reasoning and content apart"
    assert reads_as("\n" * 16, "any text at all") is None, "a blank answer is in any text: it tells nothing"
    assert reads_as("B", "B") is None
    start = "Okay, let me think about this carefully. Six groups of seven"
    assert reads_as(start + " make forty-two, and more words follow here", start, whole=False), "a long output's start"


async def test_a_long_output_is_probed_by_its_start(tmp_path, qwen_tok_dir):
    """Outputs past 8,192 ids were never probed: a store of long reasoning traces was scored on another vocabulary and
    the summary said no sample had text."""
    store = Store(tmp_path / "long.duckdb")
    with start_simulator(SimConfig(kind="vllm", output_tokens=2500)) as sim:
        config = BatchConfig(servers=[sim.url], prompts_path=prompts_file(tmp_path / "p.jsonl", 2), max_new_tokens=2500)
        assert (await run_batch(config, store)).ok == 2
    with store, start_simulator(SimConfig(kind="vllm", tokenizer_dir=qwen_tok_dir)) as other:
        assert store.query("SELECT min(output_len) FROM samples")[0][0] > 1024
        with pytest.raises(InputError, match="reads the samples' ids as other text"):
            await run_score(ScoreConfig(servers=[other.url]), store)


async def test_a_blank_answer_does_not_let_another_vocabulary_through(tmp_path, qwen_tok_dir):
    with await _made_on_kimi(tmp_path, "vllm") as store:
        capture = make_capture("blank")
        capture.text, capture.content, capture.reasoning = "\n" * 40, None, None
        store.put_sample("blank@x_gen0", "blank", "imported", capture, analyze(capture, profile(), kimi()))
        with start_simulator(SimConfig(kind="vllm", tokenizer_dir=qwen_tok_dir)) as other:
            with pytest.raises(InputError, match="reads the samples' ids as other text"):
                await run_score(ScoreConfig(servers=[other.url]), store)


def test_a_tool_calls_name_and_arguments_are_part_of_what_the_ids_are_read_as():
    """A long call's ids (a file written through a tool) read as its arguments, which no text field holds."""
    from tokview.batch.answer_words import answer_text, reads_as
    from tokview.core.record import Capture

    code = "def handler(request):\n    return respond(compute_total(request.items))\n" * 20
    capture = Capture(
        prompt_ids=[1],
        output_ids=[2] * 2000,
        reasoning="I write the file.",
        tool_calls=[{"id": "c0", "name": "write_file", "arguments": json.dumps({"path": "a.py", "content": code})}],
    )
    decoded = (
        '<think>I write the file.</think><tool_call>{"name": "write_file", "arguments": {"path": "a.py", ' + code[:300]
    )
    assert reads_as(answer_text(capture), decoded, whole=False)


def test_the_samples_told_decide_by_majority_not_the_first_that_agrees(tmp_path):
    """An answer of digits reads alike in many vocabularies: one such sample let a target through after two others
    had read as other text. The target here is a stand-in that reads prose as other text and digits as digits."""
    import asyncio

    from tokview.batch.vocabulary_probe import check_vocabulary
    from tokview.store.export_rows import Selection

    prose = "Okay, let me think about this carefully. Six groups of seven make forty-two."
    texts = {"a@x_gen0": prose, "b@x_gen0": prose, "c@x_gen0": "1024 2048 4096 8192 16384 32768"}
    with Store(tmp_path / "s.duckdb") as store:
        for sample_id, text in texts.items():
            capture = make_capture(sample_id)
            capture.text, capture.content, capture.reasoning = text, None, None
            store.put_sample(sample_id, sample_id[0], "imported", capture, analyze(capture, profile(), kimi()))
        asked = iter(r[0] for r in store.query("SELECT sample_id FROM samples WHERE output_len >= 4 LIMIT 20"))

        class Target:
            async def call(self, fn):
                sample = next(asked)  # the probe asks in the order the store finds them
                return texts[sample] if sample.startswith("c") else " clpcmh cnacns colcpd cpwcqo crhcrz cssctk"

        with pytest.raises(InputError, match="2 of 3 samples told differ"):
            asyncio.run(check_vocabulary(store, Target(), Selection("all"), "auto"))


def test_tool_call_arguments_are_read_as_written_with_escapes_or_not():
    """A parser returns the arguments re-dumped (`北京`) where the ids spell `\\u5317\\u4eac`: the model's own vocabulary was
    refused for such calls."""
    from tokview.batch.answer_words import answer_text, reads_as
    from tokview.core.record import Capture

    arguments = json.dumps({"query": "北京明天天气"}, ensure_ascii=False)
    capture = Capture(
        prompt_ids=[1], output_ids=[2] * 20, tool_calls=[{"id": "c", "name": "search", "arguments": arguments}]
    )
    decoded = '<tool_call>{"name": "search", "arguments": {"query": "\\u5317\\u4eac\\u660e\\u5929\\u5929\\u6c14"}}</tool_call>'
    assert reads_as(answer_text(capture), decoded)
