"""Every export format, read back by the trainers' own rules, against the ids the store holds.

The rules are written out here from the trainers' code (SpecForge a6b6b02 `specforge/data/parse.py`
`GeneralParser.parse` + `preprocessing.build_eagle3_dataset`; speculators c05b95b
`data_generation/preprocessing.py` `_passthrough_pretokenized` and `_render_boundary_rows`), on the
raw Hugging Face tokenizer, independently of tokview's own `export.rerender`: the export is right
when a trainer reading it trains on the served ids with a mask of exactly the generated ids, and the
manifest's `rerender` counts agree with what these rules find.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import duckdb
import pytest

from tokview.core.analysis import analyze
from tokview.core.record import Capture, sample_id_for
from tokview.export import ExportError, export
from tokview.store import Store

HISTORY = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "Hello world !"}]


class Family:
    """Builds served captures for one tokenizer the way its server would have made them."""

    def __init__(self, tok, prof):
        self.tok, self.p = tok, prof

    def capture(
        self,
        question: str,
        answer: str,
        *,
        thinking: bool = True,
        history=(),
        split: bool = False,
        reasoning: str = "Okay , let me think",
    ) -> Capture:
        messages = list(history) + [{"role": "user", "content": question}]
        kwargs = self.p.template_kwargs(thinking)
        prompt = self.tok.render(messages, template_kwargs=kwargs)
        words = self.tok.encode(answer)
        if split:  # a split the tokenizer would not choose: every character its own id
            words = [i for ch in answer for i in self.tok.encode(ch)]
            assert words != self.tok.encode(answer)
        output: list[int] = []
        if thinking:
            if self.p.prefills_opener:
                output = self.tok.encode(reasoning) + [self.p.think_close_id]
            else:  # Qwen3 writes "<think>\n…\n</think>\n\n" itself
                output = (
                    [self.p.think_open_id]
                    + self.tok.encode(f"\n{reasoning}\n")
                    + [self.p.think_close_id]
                    + self.tok.encode("\n\n")
                )
        output += words + [self.p.stop_ids[0]]
        return Capture(
            prompt_ids=prompt,
            output_ids=output,
            finish_reason="stop",
            messages=messages,
            settings={"temperature": 0.0, "thinking": thinking, "chat_template_kwargs": kwargs},
            endpoint="vllm-chat",
            server_url="http://127.0.0.1:8000",
            server_kind="vllm",
        )


def _store(path: Path, fam: Family) -> Store:
    store = Store(path)
    store.put_run("run1", profile=fam.p.name, tokenizer_hash=fam.tok.fingerprint())
    cases = {
        "plain": fam.capture("what is the answer", "The answer is forty - two"),
        "multi": fam.capture("why", "because", history=HISTORY),
        "split": fam.capture("what is the answer", "The answer is forty - two", split=True),
    }
    for prompt_id, cap in cases.items():
        turn = 1 if prompt_id == "multi" else None
        store.put_sample(
            sample_id_for(prompt_id, cap.settings, 0, turn),
            prompt_id,
            "run1",
            cap,
            analyze(cap, fam.p, fam.tok),
            gen_index=0,
            turn=turn,
            profile=fam.p.name,
        )
    return store


@pytest.fixture(params=["kimi", "qwen3"])
def family(request, kimi_tok, kimi_profile, qwen_tok, qwen_profile, tmp_path):
    fam = Family(kimi_tok, kimi_profile) if request.param == "kimi" else Family(qwen_tok, qwen_profile)
    store = _store(tmp_path / "c.duckdb", fam)
    yield fam, store
    store.close()


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _served(store: Store) -> dict[str, tuple[list[int], list[int], list[str]]]:
    """sample id → (served ids, served mask: 0 per prompt id, 1 per generated id, finding codes)."""
    out = {}
    for sid, prompt, output, codes in store.query("SELECT sample_id, prompt_ids, output_ids, codes FROM samples"):
        out[sid] = (list(prompt) + list(output), [0] * len(prompt) + [1] * len(output), list(codes))
    return out


# -- the trainers' rules, written out ----------------------------------------------------------------------


def specforge_build(row: dict, template: dict, hf_tok) -> tuple[list[int], list[int]]:
    """SpecForge build_eagle3_dataset (train_only_last_turn: true) on one conversation row."""
    keys = {"role", "content", "tool_calls"}
    if template["parser_type"] == "thinking":
        keys |= {"reasoning_content", "name", "tool_call_id"}
    conv = []
    for m in row["conversations"]:
        role = {"human": "user", "gpt": "assistant"}.get(m.get("role", m.get("from", "")), m.get("role", m.get("from")))
        conv.append(
            {
                **{k: v for k, v in m.items() if k not in ("from", "value")},
                "role": role,
                "content": m.get("content") or m.get("value") or "",
            }
        )
    messages = []
    if conv[0]["role"] == "system":
        messages.append({"role": "system", "content": conv.pop(0)["content"]})
    elif template["system_prompt"]:
        messages.append({"role": "system", "content": template["system_prompt"]})
    messages += [{k: v for k, v in m.items() if k in keys} for m in conv]
    kwargs = {k: v for k, v in row.items() if k not in ("conversations", "id", "tools")}  # extra columns → kwargs
    if template["parser_type"] == "thinking" and template["enable_thinking"]:
        kwargs["enable_thinking"] = True
    text = hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=False, **kwargs)
    return specforge_mask(text, template, hf_tok)


def specforge_mask(text: str, template: dict, hf_tok) -> tuple[list[int], list[int]]:
    ids = hf_tok(text, add_special_tokens=False)["input_ids"]
    mask = [0] * len(ids)
    eot = re.escape(template["end_of_turn_token"])
    pattern = re.escape(template["assistant_header"]) + r"([\s\S]*?(?:" + eot + "|$))"
    match = list(re.finditer(pattern, text, re.DOTALL))[-1]
    start = len(hf_tok.encode(text[: match.start(1)], add_special_tokens=False))
    end = len(hf_tok.encode(text[: match.end(1)], add_special_tokens=False))
    mask[start:end] = [1] * (end - start)
    return ids, mask


def speculators_render(conversation: list[dict], hf_tok, kwargs: dict) -> list[tuple[list[int], list[int]]]:
    """speculators prepare_data.py --render-endpoint (`_render_boundary_rows`): a row per assistant turn."""
    conv = []
    for t in conversation:
        speaker = t.get("from", t.get("role"))
        role = {"human": "user", "gpt": "assistant"}.get(speaker, speaker) if speaker is not None else None
        turn = {"role": role, "content": t.get("value") or t.get("content") or ""}
        if t.get("thinking") or t.get("reasoning_content"):
            turn["thinking"] = turn["reasoning_content"] = t.get("thinking") or t.get("reasoning_content")
        conv.append(turn)

    def render(msgs, gen):
        text = hf_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen, **kwargs)
        return hf_tok(text, add_special_tokens=False)["input_ids"]

    rows = []
    for j in (j for j, t in enumerate(conv) if t["role"] == "assistant" and j > 0):
        prompt, full = render(conv[:j], True), render(conv[: j + 1], False)
        boundary = (
            len(prompt)
            if full[: len(prompt)] == prompt
            else next(i for i, (a, b) in enumerate(zip(prompt, full)) if a != b)
        )
        rows.append((full, [0] * boundary + [1] * (len(full) - boundary)))
    return rows


def _render_exact(rows: list[tuple[list[int], list[int]]], served: tuple[list[int], list[int], list[str]]) -> bool:
    """One supervised row, the served one: a history turn's row trains on answers this run never served."""
    return bool(rows) and _exact(rows[-1], served) and not any(any(mask) for _, mask in rows[:-1])


def _exact(got: tuple[list[int], list[int]], served: tuple[list[int], list[int], list[str]]) -> bool:
    """The served ids and mask, allowing template text after the last end-of-turn that is never supervised."""
    ids, mask = got
    n = len(served[0])
    return ids[:n] == served[0] and mask[:n] == served[1] and not any(mask[n:])


# -- the tests -----------------------------------------------------------------------------------------


def test_pretokenized_formats_are_exact_even_for_a_non_canonical_split(family, tmp_path):
    fam, store = family
    served = _served(store)
    assert "retokenize_drift" in served[next(s for s in served if s.startswith("split"))][2]
    assert not [s for s, v in served.items() if "retokenize_drift" in v[2] and not s.startswith("split")]
    result = export(store, "speculators", tmp_path / "s.jsonl", select="all", tokenizer=fam.tok, profile=fam.p)
    rows = _jsonl(tmp_path / "s.jsonl")
    for row in rows:  # speculators _passthrough_pretokenized and SpecForge prepare_prompt_tasks: as they are
        ids, mask, _ = served[row["metadata"]["tokview_sample_id"]]
        assert (row["input_ids"], row["loss_mask"]) == (ids, mask)
    assert len(rows) == 3
    assert result.retokenize_drift == 1
    assert result.manifest["counts"]["retokenize_drift"] == 1
    export(store, "parquet", tmp_path / "p.parquet", select="all", tokenizer=fam.tok, profile=fam.p)
    for sid, ids, mask in (
        duckdb.connect()
        .execute(f"SELECT sample_id, input_ids, loss_mask FROM read_parquet('{tmp_path / 'p.parquet'}')")
        .fetchall()
    ):
        assert (ids, mask) == served[sid][:2]


@pytest.mark.parametrize("fmt", ["specforge", "sharegpt"])
def test_text_formats_rerender_to_the_served_ids_except_a_non_canonical_split(family, tmp_path, fmt):
    fam, store = family
    served = _served(store)
    out = tmp_path / f"{fmt}.jsonl"
    result = export(store, fmt, out, select="all", tokenizer=fam.tok, profile=fam.p)
    template = json.loads(result.template_path.read_text()) if fmt == "specforge" else result.template
    assert set(template) == {
        "assistant_header",
        "user_header",
        "system_prompt",
        "end_of_turn_token",
        "parser_type",
        "assistant_pattern_type",
        "enable_thinking",
        "ignore_token",
    }  # SpecForge's ChatTemplate
    assert template["system_prompt"] is None
    by_sample = {}
    for row, sid in zip(_jsonl(out), sorted(served, key=lambda s: (s.split("@")[0].split("#")[0], s))):
        by_sample[sid] = row
    specforge_exact = {
        sid: _exact(specforge_build(row, template, fam.tok.tok), served[sid]) for sid, row in by_sample.items()
    }
    kwargs = fam.p.template_kwargs(True)
    render_rows = {sid: speculators_render(row["conversations"], fam.tok.tok, kwargs) for sid, row in by_sample.items()}
    render_exact = {sid: _render_exact(rows, served[sid]) for sid, rows in render_rows.items()}
    for sid in by_sample:
        drift = "retokenize_drift" in served[sid][2]
        assert specforge_exact[sid] is not drift, sid  # exact unless the output's split is not the tokenizer's
    rerender = result.manifest["rerender"]
    assert rerender["specforge"]["exact"] == sum(specforge_exact.values()) == 2
    assert rerender["speculators_render"]["exact"] == sum(render_exact.values())
    assert rerender["specforge"]["first_differing_ids"] == ["split"]
    if fam.p.name == "qwen3":  # Qwen3 writes "<|im_end|>\n": the render path supervises a "\n" never generated
        assert sum(render_exact.values()) == 0
    else:  # the multi-turn row's own turn is exact, but the trainer also supervises its history's answer
        multi = next(sid for sid in by_sample if sid.startswith("multi"))
        assert len(render_rows[multi]) == 2
        assert _exact(render_rows[multi][-1], served[multi])
        assert sum(render_exact.values()) == 1
        assert rerender["speculators_render"]["history_supervised"] == 1


def test_specforge_builtin_kimi_templates_do_not_reproduce_the_served_ids(kimi_tok, kimi_profile, tmp_path):
    """What the manifest warns about, shown with SpecForge's own kimi-k2-thinking / -instruct entries."""
    fam = Family(kimi_tok, kimi_profile)
    with _store(tmp_path / "k.duckdb", fam) as store:
        served = _served(store)
        result = export(
            store, "specforge", tmp_path / "sf.jsonl", select="all", tokenizer=kimi_tok, profile=kimi_profile
        )
        rows = _jsonl(tmp_path / "sf.jsonl")
    builtin_thinking = {
        "assistant_header": "<|im_assistant|>assistant<|im_middle|>",
        "user_header": "<|im_start|>user\n",
        "system_prompt": "You are a helpful assistant.",
        "end_of_turn_token": "<|im_end|>",
        "parser_type": "thinking",
        "enable_thinking": True,
    }
    builtin_instruct = {**builtin_thinking, "parser_type": "general", "enable_thinking": False}
    plain = next(r for r in rows if r["id"] == "plain")
    sid = next(s for s in served if s.startswith("plain"))
    ids, mask = specforge_build(plain, builtin_thinking, kimi_tok.tok)
    assert len(ids) > len(served[sid][0])
    assert not _exact((ids, mask), served[sid])  # a system turn injected
    ids, mask = specforge_build(plain, builtin_instruct, kimi_tok.tok)
    assert sum(mask) < sum(served[sid][1])  # reasoning dropped: fewer supervised ids
    assert _exact(specforge_build(plain, json.loads(result.template_path.read_text()), kimi_tok.tok), served[sid])
    assert any("kimi-k2-thinking" in w for w in result.manifest["warnings"])


def test_speculators_text_through_specforge_preformatted(family, tmp_path):
    fam, store = family
    served = _served(store)
    result = export(store, "speculators", tmp_path / "s.jsonl", select="all", tokenizer=fam.tok, profile=fam.p)
    exact = 0
    for row in _jsonl(tmp_path / "s.jsonl"):
        exact += _exact(
            specforge_mask(row["text"], result.template, fam.tok.tok), served[row["metadata"]["tokview_sample_id"]]
        )
    assert result.manifest["rerender"]["specforge_preformatted_text"]["exact"] == exact == 2


def test_kimi_inline_on_qwen3_rerenders_and_audits_as_structure(qwen_tok, qwen_profile, tmp_path):
    from tokview.export.audit import audit
    from tokview.store import SampleFilter

    fam = Family(qwen_tok, qwen_profile)
    with _store(tmp_path / "q.duckdb", fam) as store:
        served = _served(store)
        result = export(
            store, "kimi-inline", tmp_path / "ki.jsonl", select="all", tokenizer=qwen_tok, profile=qwen_profile
        )
    rows = _jsonl(tmp_path / "ki.jsonl")
    assert all(r["conversations"][-1]["content"].startswith("<think>") for r in rows)
    assert "reasoning_content" not in rows[0]["conversations"][-1]
    exact = sum(
        _exact(specforge_build(r, result.template, qwen_tok.tok), served[s])
        for r, s in zip(rows, sorted(served, key=lambda s: (s.split("@")[0].split("#")[0], s)))
    )
    assert result.manifest["rerender"]["specforge"]["exact"] == exact == 2
    # auditing our own kimi-inline export reads <think>…</think> in content as structure
    with Store(tmp_path / "a.duckdb") as s2:
        report = audit(s2, tmp_path / "ki.jsonl", tokenizer=qwen_tok, profile=qwen_profile)
        pages = {r.prompt_id: r for r in s2.samples_page(SampleFilter(run_id="audit-ki"), limit=10)}
        audited = s2.load_sample(pages["plain"].sample_id).capture
    assert report.imported == 3
    assert "literal_think_text" not in report.by_code
    plain = next(v for s, v in served.items() if s.startswith("plain"))
    assert audited.prompt_ids + audited.output_ids == plain[0]  # the served ids, think block as structure
    assert not [c for c in pages["plain"].codes if c in ("literal_think_text", "think_close_repeated")]


def test_export_summary_counts_drift_and_rows_a_rerender_changes(kimi_tok, kimi_profile, tmp_path, capsys):
    from tokview.cli import main

    _store(tmp_path / "k.duckdb", Family(kimi_tok, kimi_profile)).close()
    code = main(
        [
            "export",
            "--db",
            str(tmp_path / "k.duckdb"),
            "--format",
            "specforge",
            "--select",
            "all",
            "--out",
            str(tmp_path / "sf.jsonl"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 0
    assert "retokenize_drift: 1 of 3 exported samples are exact only through pre-tokenized paths" in err
    assert (
        "specforge 2/3 exact (1 ids_differ); speculators_render 1/3 exact (1 ids_differ, 1 history_supervised)" in err
    )
    manifest = json.loads((tmp_path / "sf.manifest.json").read_text())
    assert manifest["counts"]["retokenize_drift"] == 1
    assert "1 of 3 rows carry retokenize_drift" in manifest["trainers"]["retokenize_drift"]


def test_specforge_refuses_in_one_line_when_no_template_can_express_the_served_layout(kimi_tok, kimi_profile, tmp_path):
    import copy

    from tokview.core.tokenizer import TokenizerAdapter

    # a template whose generation prompt pre-fills <think> but whose assistant turns render without it: no
    # assistant_header both starts the mask at the first generated id and matches a rendered turn
    tok = copy.deepcopy(kimi_tok.tok)
    tok.chat_template = kimi_tok.chat_template.replace(
        "{%- if message.reasoning_content -%}<think>{{ message.reasoning_content }}</think>"
        "{%- else -%}<think></think>{%- endif -%}",
        "",
    )
    odd = TokenizerAdapter(tok, source=kimi_tok.source)
    with _store(tmp_path / "k.duckdb", Family(kimi_tok, kimi_profile)) as store, pytest.raises(ExportError) as err:
        export(store, "specforge", tmp_path / "sf.jsonl", select="all", tokenizer=odd, profile=kimi_profile)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("--format specforge refused: no SpecForge ChatTemplate")
    assert "renders differently from the served generation prompt" in message
    assert not list(tmp_path.glob("sf*"))


def test_a_plain_models_samples_get_a_template_without_reasoning(tmp_path):
    from plain_tokenizer import build_plain_tokenizer_dir

    from tokview.core.profiles import detect_profile
    from tokview.core.tokenizer import load_tokenizer

    tok = load_tokenizer(build_plain_tokenizer_dir(tmp_path / "plain-tok"))
    plain = detect_profile(tok)
    messages = [{"role": "user", "content": "hi"}]
    cap = Capture(
        prompt_ids=tok.render(messages),
        output_ids=tok.encode("hello there") + [plain.stop_ids[0]],
        finish_reason="stop",
        messages=messages,
        settings={"temperature": 0.0},
        endpoint="vllm-chat",
    )
    with Store(tmp_path / "p.duckdb") as store:
        store.put_sample("p@x_gen0", "p", None, cap, analyze(cap, plain, tok), gen_index=0, profile=plain.name)
        result = export(store, "specforge", tmp_path / "sf.jsonl", select="all", tokenizer=tok, profile=plain)
    row = _jsonl(tmp_path / "sf.jsonl")[0]
    assert "reasoning_content" not in row["conversations"][-1]
    assert _exact(
        specforge_build(row, json.loads(result.template_path.read_text()), tok.tok),
        (cap.input_ids, [0] * len(cap.prompt_ids) + [1] * len(cap.output_ids), []),
    )
    assert result.manifest["rerender"]["specforge"]["exact"] == 1


def test_rows_longer_than_a_trainers_default_length_are_counted_and_the_exact_command_names_the_length(
    kimi_tok, kimi_profile, tmp_path
):
    """Both trainers cut a row to their maximum length (speculators `input_ids[:seq_length]`, SpecForge
    `data.max_length`, 2048 by default): the cut row still looks healthy but never trains its answer's end."""
    fam = Family(kimi_tok, kimi_profile)
    long_cap = fam.capture("tell me a long story", "and then " * 1100)
    with Store(tmp_path / "long.duckdb") as store:
        store.put_run("run1", profile=fam.p.name, tokenizer_hash=fam.tok.fingerprint())
        for prompt_id, cap in (("long", long_cap), ("short", fam.capture("hi", "hello"))):
            sid = sample_id_for(prompt_id, cap.settings, 0, None)
            store.put_sample(sid, prompt_id, "run1", cap, analyze(cap, fam.p, fam.tok), gen_index=0, profile=fam.p.name)
        served = _served(store)
        result = export(store, "speculators", tmp_path / "s.jsonl", tokenizer=fam.tok, profile=fam.p)
    longest = max(len(ids) for ids, _, _ in served.values())
    assert 2048 < longest < 8192
    rows = {r["metadata"]["tokview_sample_id"]: r for r in _jsonl(tmp_path / "s.jsonl")}
    long_sid = next(s for s in served if s.startswith("long"))
    cut = rows[long_sid]["loss_mask"][:2048]  # what SpecForge's default keeps of the row
    assert sum(cut) < len(long_cap.output_ids)  # the answer's end (the stop id) would never be trained
    m = result.manifest
    assert m["max_length"] == {
        "longest_row_ids": longest,
        "speculators": {"setting": "--seq-length", "default": 8192, "rows_longer": 0},
        "specforge": {"setting": "data.max_length", "default": 2048, "rows_longer": 1},
    }
    assert f"data.prompts_path=s.jsonl data.max_length={longest} " in m["trainers"]["specforge"]["exact"]
    assert "--seq-length" not in m["trainers"]["speculators"]["exact"]  # 8192 holds every row
    assert any(
        w.startswith("1 of 2 rows are longer than specforge's default data.max_length 2048")
        and f"at least {longest}" in w
        for w in m["warnings"]
    )


def test_a_kimi_inline_row_cut_inside_its_reasoning_has_no_closer_the_model_never_wrote(
    qwen_tok, qwen_profile, tmp_path
):
    """The `kimi-inline` writer put `</think>` after every reasoning: a sample cut at its max tokens inside its
    reasoning (exported with `--select all`) became `<think>…</think>` with an empty answer, a closer a trainer's
    tokenizer turns into an id the model never produced there. The row is `<think>…` as cut, with `truncated`."""
    from tokview.export.audit import audit, split_inline
    from tokview.store import SampleFilter

    assert split_inline("<think>\nOkay", qwen_profile) == ("\nOkay", "")  # reasoning that never ended
    fam = Family(qwen_tok, qwen_profile)
    cut = fam.capture("what is the answer", "unused")
    cut.output_ids = [qwen_profile.think_open_id, *qwen_tok.encode("\nOkay , let me think about")]
    cut.finish_reason = "length"
    whole = fam.capture("why", "because")
    with Store(tmp_path / "src.duckdb") as store:
        store.put_run("run1", profile=qwen_profile.name, tokenizer_hash=qwen_tok.fingerprint())
        for prompt_id, cap in (("cut", cut), ("whole", whole)):
            sid = sample_id_for(prompt_id, cap.settings, 0, None)
            store.put_sample(sid, prompt_id, "run1", cap, analyze(cap, qwen_profile, qwen_tok), gen_index=0)
        export(store, "kimi-inline", tmp_path / "ki.jsonl", select="all", tokenizer=qwen_tok, profile=qwen_profile)
    rows = {r["id"].split("_")[0].split("#")[0]: r for r in _jsonl(tmp_path / "ki.jsonl")}
    assert rows["cut"]["conversations"][-1]["content"] == "<think>\nOkay , let me think about"
    assert rows["cut"]["truncated"] is True
    assert rows["whole"]["conversations"][-1]["content"] == "<think>\nOkay , let me think\n</think>\n\nbecause"
    assert "truncated" not in rows["whole"]
    with Store(tmp_path / "a.duckdb") as s2:
        audit(s2, tmp_path / "ki.jsonl", tokenizer=qwen_tok, profile=qwen_profile)
        pages = {r.prompt_id: r for r in s2.samples_page(SampleFilter(run_id="audit-ki"), limit=10)}
        read_back = s2.load_sample(pages["cut"].sample_id)
    assert read_back.capture.output_ids == cut.output_ids  # as served: no closer, no stop
    assert "truncated" in [f.code for f in read_back.findings]


def test_a_kimi_inline_row_that_stopped_inside_its_reasoning_is_audited_without_a_closer(
    qwen_tok, qwen_profile, tmp_path
):
    """A sample whose model stopped inside its reasoning (its stop id, no closer: `think_close_missing`), exported
    with `--select all`, is `<think>…` without `truncated`: the audit read its opener as typed text. It reads it as
    reasoning that never ended, so the audit finds what the store found."""
    from tokview.export.audit import audit
    from tokview.store import SampleFilter

    fam = Family(qwen_tok, qwen_profile)
    stopped = fam.capture("what is the answer", "unused")
    stopped.output_ids = [qwen_profile.think_open_id, *qwen_tok.encode("\nOkay , let me"), qwen_profile.stop_ids[0]]
    with Store(tmp_path / "src.duckdb") as store:
        store.put_run("run1", profile=qwen_profile.name, tokenizer_hash=qwen_tok.fingerprint())
        sid = sample_id_for("stopped", stopped.settings, 0, None)
        findings = analyze(stopped, qwen_profile, qwen_tok)
        store.put_sample(sid, "stopped", "run1", stopped, findings, gen_index=0)
        export(store, "kimi-inline", tmp_path / "ki.jsonl", select="all", tokenizer=qwen_tok, profile=qwen_profile)
    [row] = _jsonl(tmp_path / "ki.jsonl")
    assert row["conversations"][-1]["content"] == "<think>\nOkay , let me" and "truncated" not in row
    with Store(tmp_path / "a.duckdb") as s2:
        audit(s2, tmp_path / "ki.jsonl", tokenizer=qwen_tok, profile=qwen_profile)
        [page] = s2.samples_page(SampleFilter(run_id="audit-ki"), limit=10)
        read_back = s2.load_sample(page.sample_id)
    assert read_back.capture.output_ids == stopped.output_ids
    assert "think_close_missing" in page.codes and "literal_think_text" not in page.codes
