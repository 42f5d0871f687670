"""A batch whose tokenizer is not the served model's stops at its first answers (`batch/vocabulary_guard.py`).

Two user passes met it: tokview's Kimi-layout default tokenizer against a Qwen3 server stored every answer flagged
(`think_open_missing`), exit 0, and a big run would have spent its hours so. Simulators of the two vocabularies on
real sockets; the check reads the answers the run gets anyway (no request is added)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from builders import kimi, make_capture

from tokview.batch import BatchConfig, run_batch
from tokview.batch.answer_words import reads_as
from tokview.batch.vocabulary_guard import AnswerVocabularyCheck
from tokview.sim import SimConfig, start_simulator
from tokview.store import Store


def _prompts(path: Path, n: int) -> Path:
    rows = [
        {"id": f"p{k}", "messages": [{"role": "user", "content": f"Say something about rivers, {k}"}]} for k in range(n)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _batch(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tokview", "batch", *argv], capture_output=True, text=True, timeout=120
    )


def test_the_default_kimi_tokenizer_against_a_qwen3_server_stops_at_its_first_answers(tmp_path, qwen_tok_dir):
    prompts, db = _prompts(tmp_path / "p.jsonl", 60), tmp_path / "s.duckdb"
    with start_simulator(SimConfig(kind="vllm", tokenizer_dir=qwen_tok_dir, profile="qwen3")) as sim:
        run = _batch(str(prompts), "--server", sim.url, "--db", str(db), "--mode", "chat", "--concurrency", "2")
        assert run.returncode == 1, run.stderr
        assert "Traceback" not in run.stderr
        stopped = next(line for line in run.stderr.splitlines() if line.strip().startswith("stopped:"))
        assert "the server's answers read as other text with tokview's default Kimi-layout tokenizer" in stopped
        assert "3 of 3 answers told differ" in stopped and "--any-vocabulary" in stopped
        assert "re-run the same command" not in stopped  # the same command would stop again
        assert "the answers so far are kept in run batch-" in stopped
        with Store(db) as store:
            kept = store.query("SELECT count(*) FROM samples")[0][0]
        assert 3 <= kept < 60  # what was answered is kept; the rest was never asked for

        anyway = _batch(
            str(prompts), "--server", sim.url, "--db", str(tmp_path / "anyway.duckdb"), "--mode", "chat",
            "--any-vocabulary", "--summary-json",
        )  # fmt: skip
    assert anyway.returncode == 0, anyway.stderr
    summary = json.loads(anyway.stdout)
    assert (summary["ok"], summary["stopped"]) == (60, None)


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
async def test_a_qwen3_tokenizer_against_the_kimi_simulator_stops_in_raw_mode_too(tmp_path, qwen_tok_dir, kind):
    """Raw mode sends the tokenizer's ids; the Kimi vocabulary holds Qwen3's, so the server answers (as text of
    its own): the answers tell, not a failure."""
    with start_simulator(SimConfig(kind=kind)) as sim, Store(tmp_path / "s.duckdb") as store:
        config = BatchConfig(
            servers=[sim.url], prompts_path=_prompts(tmp_path / "p.jsonl", 40), tokenizer_dir=qwen_tok_dir,
            profile="qwen3", concurrency=2, max_new_tokens=60,
        )  # fmt: skip
        summary = await run_batch(config, store)
    assert summary.stopped is not None and "read as other text with --tokenizer" in summary.stopped, summary.render()
    assert summary.ok < 40 and summary.abandoned > 0
    assert summary.exit_code == 1


async def test_the_served_models_tokenizer_never_stops_a_run(tmp_path, qwen_tok_dir):
    with start_simulator(SimConfig(kind="sglang", tokenizer_dir=qwen_tok_dir, profile="qwen3")) as sim:
        with Store(tmp_path / "s.duckdb") as store:
            config = BatchConfig(
                servers=[sim.url], prompts_path=_prompts(tmp_path / "p.jsonl", 12), tokenizer_dir=qwen_tok_dir,
                profile="qwen3", mode="chat", max_new_tokens=60,
            )  # fmt: skip
            summary = await run_batch(config, store)
    assert (summary.ok, summary.stopped) == (12, None), summary.render()


async def test_a_run_done_before_three_answers_were_told_still_says_it(tmp_path, qwen_tok_dir):
    """One prompt: the run ends before `TOLD` answers; the one that read as other text still fails the run."""
    with start_simulator(SimConfig(kind="vllm")) as sim, Store(tmp_path / "s.duckdb") as store:
        config = BatchConfig(
            servers=[sim.url], prompts_path=_prompts(tmp_path / "p.jsonl", 1), tokenizer_dir=qwen_tok_dir,
            profile="qwen3", max_new_tokens=60,
        )  # fmt: skip
        summary = await run_batch(config, store)
    assert summary.ok == 1
    assert summary.stopped is not None and "1 of 1 answer told differs" in summary.stopped


def _answer(text: str, ids: list[int]):
    capture = make_capture("q")
    capture.output_ids, capture.text, capture.reasoning, capture.content, capture.tool_calls = (
        ids,
        text,
        None,
        None,
        None,
    )
    return capture


def test_the_check_decides_by_the_majority_of_the_answers_told_and_skips_short_ones():
    tok = kimi()
    said = "rivers flow down mountains into quiet valleys"
    own = tok.encode(said)
    check = AnswerVocabularyCheck("--tokenizer X")
    assert check.see(_answer("ok", tok.encode("ok")), tok) is None and check.told == 0  # too few words to tell
    assert check.see(_answer(said, own), tok) is None
    assert check.see(_answer(said, list(reversed(own))[:2]), tok) is None  # one disagreeing of two
    assert check.see(_answer(said, own), tok) is None  # two of three agree: no stop
    assert check.told == 3 and check.verdict() is None
    assert check.see(_answer(said, [1, 2, 3]), tok) is None and check.told == 3  # decided: later answers unread


def test_ids_the_tokenizer_cannot_decode_read_as_none_of_the_words():
    check = AnswerVocabularyCheck("--tokenizer X")
    for _ in range(3):
        stop = check.see(_answer("rivers flow down mountains", [10**9]), kimi())
    assert stop is not None and "3 of 3 answers told differ" in stop and "decode as ''" in stop


def test_a_parsers_words_found_inside_the_markup_of_the_ids_agree():
    """Qwen3-Coder's calls spell the function and parameter names inside tags (`<function=get_weather>`): a check
    that took the tags out found none of the call's words and stopped a run on the served model's own tokenizer."""
    said = 'Okay, let me think. get_weather {"city": "Paris", "days": 6}'
    ids_read = (
        "<think>\nOkay, let me think.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
        "</parameter>\n<parameter=days>\n6\n</parameter>\n</function>\n</tool_call>"
    )
    assert reads_as(said, ids_read) is True
    assert reads_as(said, ids_read, whole=False) is True
    assert reads_as(said, "dgyk adlbcpmon etcrv yym tu yzg nu hj aavknaw kfx") is False


def _proxied(sim_url: str, tmp_path: Path, tokenizer, profile) -> list[str]:
    """Four chat answers through a proxy recording with `tokenizer`: what the proxy said."""
    import httpx

    from tokview.proxy.serve import ProxyConfig, start_proxy

    said: list[str] = []
    config = ProxyConfig(
        [sim_url], listen="127.0.0.1:0", db=str(tmp_path / "p.duckdb"), tokenizer=tokenizer, profile=profile,
        say=said.append, record_in="thread",
    )  # fmt: skip
    with start_proxy(config) as proxy:
        for k in range(4):
            ask = {"model": "tokview-sim", "messages": [{"role": "user", "content": f"rivers {k}"}], "max_tokens": 60}
            assert httpx.post(proxy.url + "/v1/chat/completions", json=ask, timeout=30).status_code == 200
    with Store(tmp_path / "p.duckdb") as store:  # recorded all the same: the ids are exact whatever the tokenizer
        assert store.query("SELECT count(*) FROM samples")[0][0] == 4
    return said


def test_the_proxy_says_once_that_its_tokenizer_reads_the_answers_as_other_text(tmp_path, qwen_tok_dir):
    from tokview.core.profiles import get_profile
    from tokview.core.tokenizer import load_tokenizer

    with start_simulator(SimConfig(kind="vllm", tokenizer_dir=qwen_tok_dir, profile="qwen3")) as sim:
        wrong = _proxied(sim.url, tmp_path / "wrong", kimi(), get_profile("kimi-k2.5"))
        right = _proxied(sim.url, tmp_path / "right", load_tokenizer(qwen_tok_dir), get_profile("qwen3"))
    told = [line for line in wrong if "read as other text" in line]
    assert len(told) == 1 and told[0].startswith("tokview proxy: the server's answers read as other text with ")
    assert "restart the proxy with the served model's tokenizer folder" in told[0]
    assert not [line for line in right if "other text" in line]


def test_a_dual_capture_is_read_by_its_chat_paths_ids():
    """A dual capture's text fields are its chat path's, another answer than the raw path's ids at temperature 1:
    read against `output_ids`, a sound `--mode dual` run would stop as another vocabulary."""
    tok = kimi()
    said = "rivers flow down mountains into quiet valleys"
    other = tok.encode("bright stars shine over distant frozen oceans")
    capture = _answer(said, other)
    capture.endpoint, capture.parsed_output_ids = "dual", tok.encode(said)
    check = AnswerVocabularyCheck("--tokenizer X")
    for _ in range(3):
        assert check.see(capture, tok) is None
    assert (check.agreed, check.told) == (3, 3)
    capture.parsed_output_ids = None  # the chat path returned no ids: nothing its text speaks of
    fresh = AnswerVocabularyCheck("--tokenizer X")
    assert fresh.see(capture, tok) is None and fresh.told == 0


@pytest.mark.parametrize(
    ("said", "ids_read"),
    [
        (  # a parser re-dumps arguments without escapes; the ids spell them escaped, or the other way round
            'get_weather {"query": "今天北京天气怎么样", "city": "北京市朝阳区"}',
            '<tool_call>\n{"name": "get_weather", "arguments": {"query": "\\u4eca\\u5929\\u5317\\u4eac\\u5929\\u6c14'
            '\\u600e\\u4e48\\u6837", "city": "\\u5317\\u4eac\\u5e02\\u671d\\u9633\\u533a"}}\n</tool_call>',
        ),
        (
            'get_weather {"query": "\\u4eca\\u5929 M\\u00fcnchen Caf\\u00e9 Z\\u00fcrich"}',
            '<tool_call>\n{"name": "get_weather", "arguments": {"query": "今天 München Café Zürich"}}\n</tool_call>',
        ),
        (  # an XML layout's ids hold the line breaks the re-dumped JSON escapes
            'run {"code": "import os\\nimport sys\\nprint(os)\\nprint(sys)\\nvalue = 1\\nreturn value"}',
            "<tool_call>\n<function=run>\n<parameter=code>\nimport os\nimport sys\nprint(os)\nprint(sys)\nvalue = 1\n"
            "return value\n</parameter>\n</function>\n</tool_call>",
        ),
        (  # backslashes that are text: read as escapes, `\frac`, `C:\new` and `"\nTotal"` lost their words
            'write {"path": "C:\\\\new\\\\folder\\\\test.txt", "tex": "\\\\frac{a}{b} \\\\beta", "code": '
            '"print(\\"\\\\nTotal\\")"}',
            "<tool_call>\n<function=write>\n<parameter=path>\nC:\\new\\folder\\test.txt\n</parameter>\n"
            '<parameter=tex>\n\\frac{a}{b} \\beta\n</parameter>\n<parameter=code>\nprint("\\nTotal")\n'
            "</parameter>\n</function>\n</tool_call>",
        ),
    ],
    ids=["chinese", "latin1", "code", "backslashes"],
)
def test_arguments_read_the_same_however_their_escapes_are_written(said, ids_read):
    """An escaped copy of the arguments beside them added words no ids spell (`u5317`): a correct run whose calls
    held non-ASCII text stopped as another vocabulary."""
    assert reads_as(said, ids_read) is True
    assert reads_as(said, ids_read, whole=False) is True


def test_an_answer_the_server_said_nothing_of_tells_nothing():
    """A long answer (past the ids read back) whose server text is empty read as disagreeing: the decode's words were
    looked for in nothing."""
    decoded = " ".join(f"word{k}" for k in range(400))
    assert reads_as("", decoded, whole=False) is None
    assert reads_as("ok", decoded, whole=False) is None
    assert reads_as("word1 word2 word3 word4", decoded, whole=False) is False  # said, and not these words


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_raw_prompts_a_server_refuses_every_one_of_point_at_the_tokenizer(tmp_path, qwen_tok_dir, kind):
    """Raw mode (the default) sends the local tokenizer's ids: Kimi's past Qwen3's vocabulary were refused, 6 of 6
    failed with the server's words alone and nothing named the tokenizer."""
    prompts, db = _prompts(tmp_path / "p.jsonl", 6), tmp_path / "s.duckdb"
    with start_simulator(SimConfig(kind=kind, tokenizer_dir=qwen_tok_dir, profile="qwen3")) as sim:
        run = _batch(str(prompts), "--server", sim.url, "--db", str(db))
    assert run.returncode == 3, run.stderr
    assert (
        "note: the server refused every request's prompt ids, which the local tokenizer rendered: is --tokenizer"
        in (run.stderr)
    )


def test_a_run_with_answers_or_other_failures_names_no_tokenizer():
    from tokview.batch import BatchSummary

    refused = {"HTTP 400 from POST /v1/completions: prompt must be … token ids in [0, 151669)": 2}
    assert (
        "refused every request's prompt ids"
        in BatchSummary(run_id="r", input=2, failed=2, failures_by_reason=refused).render()
    )
    assert "refused every" not in BatchSummary(run_id="r", input=3, ok=1, failed=2, failures_by_reason=refused).render()
    other = {**refused, "HTTP 503 from POST /v1/completions: busy": 1}
    assert "refused every" not in BatchSummary(run_id="r", input=3, failed=3, failures_by_reason=other).render()
    logprobs = {"HTTP 400 from POST /v1/completions: Requested sample logprobs of 50, more than max allowed: 20": 2}
    assert "refused every" not in BatchSummary(run_id="r", input=2, failed=2, failures_by_reason=logprobs).render()
    chat = {"HTTP 400 from POST /v1/chat/completions: bad tools": 2}
    assert "refused every" not in BatchSummary(run_id="r", input=2, failed=2, failures_by_reason=chat).render()
