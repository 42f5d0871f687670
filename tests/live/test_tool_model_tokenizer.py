"""Fast tier (no torch, no server): the tool model's tokenizer keeps tokview's Kimi layout where it matters and
makes every chain the canonical encoding of its text (recordings/tools README §1), so a history turn the
template re-renders from the served text gives back exactly the served ids."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from live.make_tiny_kimi import (
    ANSWER_TEXT,
    DIM_QUERY,
    Q_ROUND,
    TOOL_ARGUMENTS,
    TOOL_CALL_ID,
    TOOL_REASONING,
    agent_program,
    agent_texts,
    agent_turns,
    byte_level_pieces,
    extend_tokenizer,
    tool_chains,
)
from tokview.core.kimi_layout import KIMI_SPECIAL_TOKENS, build_kimi_tokenizer_dir


def test_the_tool_tokenizer_encodes_each_chain_canonically_and_keeps_the_layout(tmp_path: Path) -> None:
    base = Tokenizer.from_file(str(build_kimi_tokenizer_dir(tmp_path / "base") / "tokenizer.json"))
    out = build_kimi_tokenizer_dir(tmp_path / "tools")
    extend_tokenizer(out)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tok.get_vocab_size() == base.get_vocab_size() == 163840
    for token_id, text in KIMI_SPECIAL_TOKENS.items():
        assert tok.token_to_id(text) == token_id
    assert [tok.id_to_token(i) for i in range(380)] == [base.id_to_token(i) for i in range(380)]
    chains = tool_chains(out)
    call, answer = chains["call"], chains["answer"]
    for text in (TOOL_REASONING, TOOL_CALL_ID, TOOL_ARGUMENTS, ANSWER_TEXT):
        ids = tok.encode(text).ids
        assert [tok.id_to_token(i) for i in ids] == byte_level_pieces(text), "one token per pre-token piece"
        assert tok.decode(ids) == text
        assert tok.encode(tok.decode(ids)).ids == ids
    decoded = tok.decode(call, skip_special_tokens=False)
    assert decoded == (
        f"{TOOL_REASONING}</think><|tool_calls_section_begin|><|tool_call_begin|>{TOOL_CALL_ID}"
        f"<|tool_call_argument_begin|>{TOOL_ARGUMENTS}<|tool_call_end|><|tool_calls_section_end|><|im_end|>"
    )
    assert tok.encode(decoded).ids == call, "the whole turn re-encodes to the served ids"
    assert set(call) & set(answer) == {163607, 163586}
    assert len(set(call[:-1])) == len(call) - 1
    assert len(set(answer)) == len(answer)
    assert len(set(call[:-1]) | set(answer[:-1])) < DIM_QUERY, "every source token has a hidden dimension"


def test_the_agent_model_turns_are_canonical_and_fit_one_program(tmp_path: Path) -> None:
    out = build_kimi_tokenizer_dir(tmp_path / "agent")
    extend_tokenizer(out, agent_texts())
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    turns = agent_turns(tok)
    for ids in turns:
        assert tok.encode(tok.decode(ids, skip_special_tokens=False)).ids == ids
    assert [ids.count(163597) for ids in turns] == [2, 1, 0], "two parallel calls, then one, then the answer"
    plain, round_branches, call_branches = agent_program(turns)
    assert set(round_branches) == {163606, 163607}
    assert 163599 in call_branches
    assert call_branches[163599] == {"A": 163597, "B": 163597, "C": 163596}
    assert len({*plain, *round_branches, *call_branches}) <= Q_ROUND
