"""Build the tiny Kimi-layout Llama that a real vLLM serves in the live tier (real-servers.md §3).

A real Kimi-K2.5 cannot run on a CPU, but the live tier must still watch a real server emit
reasoning, the special ``</think>`` closer, an answer and ``<|im_end|>``.  This builder keeps
Kimi's tokenizer layout (our own ``build_kimi_tokenizer_dir``) and pairs it with a 2-layer,
64-wide Llama whose "chain" weights (§3.6) make the next chain token win with probability ≈1, so
every faithful server produces the same 18 ids after a prompt that ends with ``<think>``.

The "tools" variant (recordings/tools README §1) is a tool-calling model: its greedy output after a prompt
without a tool result is reasoning, ``</think>`` and a Kimi tool-call section calling
``functions.get_weather:0`` with ``{"city": "Paris"}``, then ``<|im_end|>``; once the prompt holds a tool result
(the template's ``## Return of …`` turn) it answers in text. One attention head of layer 0 looks for the
`` Return`` token and writes a "result seen" signal that the two branch points (``<think>`` and ``</think>``)
read. Its tokenizer is tokview's Kimi layout plus the words of its chains (each with every prefix, merged
first), so every chain is the canonical encoding of its text; its chat template is tokview's.

The "agent" variant runs a tool loop of two rounds (two parallel calls, then one) before its answer; the "turns"
variant adds a second user turn with its own call and answer (the agent-trace scenario: parallel calls, a
3-round loop, a second user turn), its branches read off two ratios of one attention head.

Usage (run with the vLLM venv's python; tokview itself need not be installed there)::

    make_tiny_kimi.py OUT_DIR [chain|tools|agent|turns|random] [bf16|fp32] [--non-special-think] [--verify]

``--verify`` loads the result with HF transformers and checks the greedy chain output (every turn of the tool models).
Deterministic: same torch/transformers → byte-identical files.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any

# Run as a script under the vLLM venv, where neither tokview nor the tests are on sys.path: the repository root
# gives the layout builder, tests/ the Kimi facts (a standard-library-only module) every test also reads.
REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
if str(REPO_ROOT / "tests") not in sys.path:
    sys.path.append(str(REPO_ROOT / "tests"))

from facts import BOS, IM_END, KIMI_CHAIN_OUTPUT, KIMI_PROMPT_6X7, KIMI_VOCAB_SIZE, PAD, THINK_OPEN  # noqa: E402

from tokview.core.kimi_layout import build_kimi_tokenizer_dir  # noqa: E402

VOCAB_SIZE = KIMI_VOCAB_SIZE
BOS_ID, EOS_ID, PAD_ID = BOS, IM_END, PAD
# <think> Okay , Ġlet Ġme Ġthink Ġabout Ġthis Ġcarefully . </think> The Ġanswer Ġis Ġforty - two ! <|im_end|>
CHAIN_IDS = [THINK_OPEN, *KIMI_CHAIN_OUTPUT]
CHAIN_OUTPUT = list(KIMI_CHAIN_OUTPUT)
LM_HEAD_SCALE = 4.0
PROMPT_IDS = list(KIMI_PROMPT_6X7)
MODEL_INFO = "tiny_kimi.json"

LLAMA_CONFIG: dict[str, Any] = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=1,
    num_key_value_heads=1,
    head_dim=64,  # CPU attention kernels want 32/64/80/96/128
    max_position_embeddings=4096,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    bos_token_id=BOS_ID,
    eos_token_id=EOS_ID,
    pad_token_id=PAD_ID,
)


def apply_chain(model) -> None:
    """The §3.6 edit: one-hot embeddings for the 19 chain tokens; lm_head row of token i+1 gets 4.0 in column i.

    After the final RMSNorm a one-hot vector has magnitude 8, so the next chain token's logit is ≈32
    against ≈±0.7 for every random row: it wins even when sampling at temperature 1.
    """
    import torch

    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    with torch.no_grad():
        for i, tid in enumerate(CHAIN_IDS):
            emb[tid].zero_()
            emb[tid, i] = 1.0
        for i in range(len(CHAIN_IDS) - 1):
            head[CHAIN_IDS[i + 1], i] = LM_HEAD_SCALE


# -- the tool-calling variant ---------------------------------------------------------------------------
SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARG_BEGIN, CALL_END = 163595, 163596, 163597, 163598, 163599
THINK_CLOSE_ID = 163607
TOOL_REASONING = "Okay, I should check the weather in Paris"
TOOL_CALL_ID = "functions.get_weather:0"
TOOL_ARGUMENTS = '{"city": "Paris"}'
ANSWER_REASONING = "Tool result received"
ANSWER_TEXT = "It is sunny today!"
RESULT_MARKER = " Return"
"""The word of the template's tool-result turn (`## Return of {id}`) whose presence switches the model to answering."""
TOOL_QUESTION = "What is the weather in Paris?"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TOOL_RESULT = "sunny, 21 degrees"
# Hidden dimensions of the tool model beyond the chain's one-hot ones (64 in all; the chains use 37).
DIM_QUERY, DIM_RESULT, DIM_MODE = 61, 62, 63
ROPE_DIM = 31
"""Query/key dimension of the head: RoPE's slowest pair (31, 63), so the score barely moves with distance."""
BRANCH_WIN, BRANCH_ALT, MODE_WEIGHT = 8.0, 6.0, 12.0


def byte_level_pieces(text: str) -> list[str]:
    """The pre-tokenizer's pieces of `text` in byte-level form (GPT-2 regex, `Ġ` for a space)."""
    from tokenizers import pre_tokenizers

    return [p for p, _ in pre_tokenizers.ByteLevel(add_prefix_space=False).pre_tokenize_str(text)]


def tool_pieces(texts: list[str] | None = None) -> list[str]:
    """Every pre-token piece of the model's texts (the tool model's by default): each must become one token."""
    if texts is None:
        texts = [TOOL_REASONING, TOOL_CALL_ID, TOOL_ARGUMENTS, ANSWER_REASONING, ANSWER_TEXT, RESULT_MARKER]
    return list(dict.fromkeys(p for t in texts for p in byte_level_pieces(t)))


def extend_tokenizer(out_dir: Path, texts: list[str] | None = None, variant: str | None = None) -> None:
    """Make each tool piece one token: its missing prefixes take the last pseudo-word ids, its merges rank first.

    The pseudo-words given up are the last ones of the layout (4-letter junk near id 163583), so every
    special id and every word-list id stays where tokview's layout has it.
    """
    path = out_dir / "tokenizer.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    vocab: dict[str, int] = data["model"]["vocab"]
    pieces = tool_pieces(texts)
    needed = [p[:k] for p in pieces for k in range(1, len(p) + 1)]
    missing = list(dict.fromkeys(s for s in needed if s not in vocab))
    keep = set(needed)
    spare = (s for s, i in sorted(vocab.items(), key=lambda kv: -kv[1]) if i < 163584 and s not in keep and len(s) > 1)
    for s in missing:
        old = next(spare)
        vocab[s] = vocab.pop(old)
    merges = []
    for p in pieces:
        merges += [(p[: k - 1], p[k - 1]) for k in range(2, len(p) + 1)]
    merges = list(dict.fromkeys(merges))
    old_merges = data["model"]["merges"]
    as_lists = bool(old_merges) and isinstance(old_merges[0], list)
    ours = [list(m) if as_lists else f"{m[0]} {m[1]}" for m in merges]
    taken = {tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in ours}
    rest = [m for m in old_merges if (tuple(m) if as_lists else tuple(m.split(" ", 1))) not in taken]
    data["model"]["merges"] = ours + rest
    path.write_text(json.dumps(data, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    marker = out_dir / "tokview_layout.json"
    info = json.loads(marker.read_text(encoding="utf-8"))
    variant = variant or ("tools" if texts is None else "agent")
    marker.write_text(json.dumps({**info, "variant": variant}, indent=2) + "\n", encoding="utf-8")


def tool_chains(out_dir: Path) -> dict[str, list[int]]:
    """The two chains on the built tokenizer's ids, each text as its canonical encoding (checked)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out_dir / "tokenizer.json"))

    def enc(text: str) -> list[int]:
        ids = tok.encode(text, add_special_tokens=False).ids
        if len(ids) != len(byte_level_pieces(text)):
            raise SystemExit(f"{text!r} is not one token per piece: {tok.encode(text).tokens}")
        if tok.encode(tok.decode(ids, skip_special_tokens=False), add_special_tokens=False).ids != ids:
            raise SystemExit(f"{text!r} does not round-trip")
        return ids

    call = [
        SECTION_BEGIN,
        CALL_BEGIN,
        *enc(TOOL_CALL_ID),
        ARG_BEGIN,
        *enc(TOOL_ARGUMENTS),
        CALL_END,
        SECTION_END,
        EOS_ID,
    ]
    return {
        "call": [*enc(TOOL_REASONING), THINK_CLOSE_ID, *call],
        "answer": [*enc(ANSWER_REASONING), THINK_CLOSE_ID, *enc(ANSWER_TEXT), EOS_ID],
        "result_marker": enc(RESULT_MARKER),
    }


def apply_tool_chains(model, chains: dict[str, list[int]]) -> None:
    """Two chains that share `<think>`, `</think>` and `<|im_end|>`; the branch after the first two reads the mode.

    Each source token gets its own one-hot dimension (as §3.6). Layer 0's attention is replaced by one
    circuit: `<think>` and `</think>` also carry DIM_QUERY, the ` Return` token carries only DIM_RESULT, the
    head scores query × result (≈35: the result wins over every other position, which scores exactly 0
    because DIM_QUERY/DIM_RESULT are zero in every other embedding) and copies 1.0 into DIM_MODE. At a
    branch the call chain's next token wins without the mode (8 vs 6 per unit) and loses with it (−12 vs +12).
    """
    import torch

    call, answer = chains["call"], chains["answer"]
    sources = list(dict.fromkeys([THINK_OPEN, *call[:-1], *answer[:-1]]))
    if len(sources) > DIM_QUERY or len(set(call) & set(answer)) != 2:  # shared: </think> and <|im_end|>
        raise SystemExit(f"chains do not fit: {len(sources)} sources, shared {set(call) & set(answer)}")
    dim = {tid: i for i, tid in enumerate(sources)}
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    attn = model.model.layers[0].self_attn
    with torch.no_grad():
        emb[:, [DIM_QUERY, DIM_RESULT, DIM_MODE]] = 0.0
        head[:, [DIM_QUERY, DIM_RESULT, DIM_MODE]] = 0.0
        for tid, i in dim.items():
            emb[tid].zero_()
            emb[tid, i] = 1.0
        [marker] = chains["result_marker"]
        emb[marker].zero_()
        emb[marker, DIM_RESULT] = 1.0
        for tid in (THINK_OPEN, THINK_CLOSE_ID):
            emb[tid, DIM_QUERY] = 1.0
        for proj in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj):
            proj.weight.zero_()
        attn.q_proj.weight[ROPE_DIM, DIM_QUERY] = 2.5
        attn.k_proj.weight[ROPE_DIM, DIM_RESULT] = 2.5
        attn.v_proj.weight[0, DIM_RESULT] = 0.125  # RMSNorm scales the one-hot marker to 8: value 1.0
        attn.o_proj.weight[DIM_MODE, 0] = 1.0
        branches = {THINK_OPEN: (call[0], answer[0])}
        branches[THINK_CLOSE_ID] = (call[call.index(THINK_CLOSE_ID) + 1], answer[answer.index(THINK_CLOSE_ID) + 1])
        for seq in ([THINK_OPEN, *call], [THINK_OPEN, *answer]):
            for a, b in itertools.pairwise(seq):
                if a not in branches:
                    head[b, dim[a]] = LM_HEAD_SCALE
        for src, (to_call, to_answer) in branches.items():
            head[to_call, dim[src]] = BRANCH_WIN
            head[to_call, DIM_MODE] = -MODE_WEIGHT
            head[to_answer, dim[src]] = BRANCH_ALT
            head[to_answer, DIM_MODE] = MODE_WEIGHT


# -- the agent variant: two tool rounds, the first with two parallel calls ------------------------------
# Turn 1 (no call in the prompt): reasoning, then get_weather and square in one section. Turn 2 (one section in
# the history): another square. Turn 3: a text answer. Each branch point reads a ratio off one attention head:
# `<think>` / `</think>` the share of `<|tool_calls_section_begin|>` among {sections, `<|im_user|>`} (0, 1/2, 2/3:
# the round), the section's branch tokens the share of `<|tool_call_end|>` among {call ends, `<|im_user|>`} (0: the
# first call, 1/2: the second, ≥ 2/3: the second round). One user turn per conversation, as in the tasks.
AGENT_REASONING = ("Okay, I should check the weather in Paris", "Then square nine", "All results received")
AGENT_CALLS = (
    (("functions.get_weather:0", '{"city": "Paris"}'), ("functions.square:1", '{"n": 7}')),
    (("functions.square:2", '{"n": 9}'),),
)
AGENT_ANSWER = "It is sunny today!"
IM_USER_ID = 163587
SQUARE_TOOL = {
    "type": "function",
    "function": {
        "name": "square",
        "description": "Square an integer",
        "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
    },
}
PHASES = "ABC"
LINES = {"A": (28.0, -24.0), "B": (24.0, 0.0), "C": (-11.0, 60.0), "AB": (24.0, 0.0), "BC": (24.0, 0.0)}
"""(intercept, slope in the ratio) per group of phases a target wins: at ratio 0, 1/2 and ≥ 2/3 exactly its
group's line is the highest, by ≥ 4 (× the RMSNorm scale ≈ 5)."""
LINE_BASE = 50.0
"""Added to every candidate at its source's dimension, above any non-candidate's slope term (≤ 60 × 0.8)."""
Q_ROUND, Q_CALL, K_ROUND, K_CALL, M_ROUND, M_CALL = 58, 59, 60, 61, 62, 63
AGENT_SCORE = 3.0


def agent_texts() -> list[str]:
    args = [a for calls in AGENT_CALLS for call in calls for a in call]
    return [*AGENT_REASONING, AGENT_ANSWER, *args]


def agent_turns(tok) -> list[list[int]]:
    """The three turns' output ids (each text its canonical encoding)."""

    def enc(text: str) -> list[int]:
        ids = tok.encode(text, add_special_tokens=False).ids
        if len(ids) != len(byte_level_pieces(text)):
            raise SystemExit(f"{text!r} is not one token per piece: {tok.encode(text).tokens}")
        return ids

    def section(calls) -> list[int]:
        body = [t for cid, args in calls for t in (CALL_BEGIN, *enc(cid), ARG_BEGIN, *enc(args), CALL_END)]
        return [SECTION_BEGIN, *body, SECTION_END, EOS_ID]

    r1, r2, r3 = (enc(t) for t in AGENT_REASONING)
    return [
        [*r1, THINK_CLOSE_ID, *section(AGENT_CALLS[0])],
        [*r2, THINK_CLOSE_ID, *section(AGENT_CALLS[1])],
        [*r3, THINK_CLOSE_ID, *enc(AGENT_ANSWER), EOS_ID],
    ]


def agent_program(
    turns: list[list[int]],
) -> tuple[dict[int, int], dict[int, dict[str, int]], dict[int, dict[str, int]]]:
    """Plain transitions, round branches and call branches, read off the turns with each position's phase."""
    seen: dict[int, dict[str, int]] = {}
    kinds: dict[int, str] = {}
    ends_before = 0
    for round_index, out in enumerate(turns):
        seq = [THINK_OPEN, *out]
        ends = ends_before
        for a, b in itertools.pairwise(seq):
            ends += a == CALL_END
            kind = "round" if a in (THINK_OPEN, THINK_CLOSE_ID) else "call"
            phase = PHASES[round_index] if kind == "round" else PHASES[min(ends, 2)]
            kinds[a] = kind
            if seen.setdefault(a, {}).setdefault(phase, b) != b:
                raise SystemExit(f"id {a} has two successors in phase {phase}")
        ends_before = ends + (seq[-1] == CALL_END)
    plain: dict[int, int] = {}
    branches: dict[str, dict[int, dict[str, int]]] = {"round": {}, "call": {}}
    for a, by_phase in seen.items():
        if len(set(by_phase.values())) == 1:
            plain[a] = next(iter(by_phase.values()))
            continue
        full = {}
        for i, ph in enumerate(PHASES):  # a phase the source never meets takes its neighbour's successor
            near = [PHASES[j] for j in sorted(range(3), key=lambda j: abs(j - i)) if PHASES[j] in by_phase]
            full[ph] = by_phase[near[0]]
        branches[kinds[a]][a] = full
    return plain, branches["round"], branches["call"]


def apply_agent(model, turns: list[list[int]]) -> dict[int, int]:
    """One-hot source dimensions, the ratio head of layer 0, plain rows (4.0) and branch lines; returns the dims."""
    import torch

    plain, round_branches, call_branches = agent_program(turns)
    sources = list(dict.fromkeys([*plain, *round_branches, *call_branches]))
    if len(sources) > Q_ROUND:
        raise SystemExit(f"{len(sources)} source tokens do not fit in {Q_ROUND} dimensions")
    dim = {tid: i for i, tid in enumerate(sources)}
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    attn = model.model.layers[0].self_attn
    extra = [Q_ROUND, Q_CALL, K_ROUND, K_CALL, M_ROUND, M_CALL]
    slopes: dict[int, tuple[int, float]] = {}
    with torch.no_grad():
        emb[:, extra] = 0.0
        head[:, extra] = 0.0
        for tid, i in dim.items():
            emb[tid].zero_()
            emb[tid, i] = 1.0
        for tid in round_branches:
            emb[tid, Q_ROUND] = 1.0
        for tid in call_branches:
            emb[tid, Q_CALL] = 1.0
        emb[IM_USER_ID].zero_()
        emb[IM_USER_ID, K_ROUND] = emb[IM_USER_ID, K_CALL] = 1.0  # the anchor of both ratios: no value
        for proj in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj):
            proj.weight.zero_()
        # RoPE's two slowest pairs (30, 62) and (31, 63): the scores barely move with distance.
        attn.q_proj.weight[31, Q_ROUND] = attn.k_proj.weight[31, K_ROUND] = AGENT_SCORE
        attn.q_proj.weight[30, Q_CALL] = attn.k_proj.weight[30, K_CALL] = AGENT_SCORE
        for key_id, key_dim, value_row in ((SECTION_BEGIN, K_ROUND, 0), (CALL_END, K_CALL, 1)):
            # After RMSNorm the key component must equal the anchor's (8/√2, two unit components), whatever else
            # the token carries: with r² the sum of its other squares, a key component r does that. The value
            # reads the token's own dimension, scaled back to 1.
            r = float(emb[key_id].float().pow(2).sum()) ** 0.5
            emb[key_id, key_dim] = r
            attn.v_proj.weight[value_row, dim[key_id]] = r * 2**0.5 / 8
        attn.o_proj.weight[M_ROUND, 0] = 1.0
        attn.o_proj.weight[M_CALL, 1] = 1.0
        for a, b in plain.items():
            head[b, dim[a]] = LM_HEAD_SCALE
        for branches, mode in ((round_branches, M_ROUND), (call_branches, M_CALL)):
            for a, by_phase in branches.items():
                groups: dict[int, str] = {}
                for ph in PHASES:
                    groups[by_phase[ph]] = groups.get(by_phase[ph], "") + ph
                for b, group in groups.items():
                    intercept, slope = LINES[group]
                    if slopes.setdefault(b, (mode, slope)) != (mode, slope):
                        raise SystemExit(f"id {b} needs two slopes {slopes[b]} and {(mode, slope)}")
                    head[b, dim[a]] = LINE_BASE + intercept
                    head[b, mode] = slope
    return dim


# -- the turns variant: a second user turn with its own loop --------------------------------------------
# Five generations, one conversation: A reasoning and two parallel calls (get_weather, square); B another square;
# C the text answer; the user's second turn; D reasoning, a line of content and a square of its own; E a text
# answer. Each branch point reads one ratio off layer 0's head, as in the agent variant: `<think>` / `</think>`
# the round ratio over {`<|im_user|>` 0, section begins 1, ROUND_MARKER v}, every other branch the call ratio
# over {`<|im_user|>` 0, call ends 1, CALL_MARKER w}. The markers are words only the second user turn holds:
# a second `<|im_user|>` alone would give D the round ratio B has (2/4); with them D is -0.6, E -1/3 (the first
# turn's 0, 1/2, 2/3 unchanged) and D's call 1.0 (the first turn's calls 0, 1/2, 2/3). D writes content before its
# section so that `</think>` is followed by the section in A and B only, adjacent on the ratio line. The
# lines at each branch are built from the ratios of the prompts the template renders, so each successor wins on
# its own interval of the ratio by SLOPE_STEP times half the gap to the next one.
TURNS_QUESTION_2 = "Next, square twelve please?"
ROUND_MARKER, CALL_MARKER = " twelve", " please"
ROUND_MARKER_VALUE, CALL_MARKER_VALUE = -5.0, 3.0
TURNS_REASONING = (*AGENT_REASONING, "One more call", "Got one result")
TURNS_CONTENT = {3: "Calling it"}
TURNS_CALLS = {0: AGENT_CALLS[0], 1: AGENT_CALLS[1], 3: (("functions.square:3", '{"n": 12}'),)}
TURNS_ANSWERS = {2: AGENT_ANSWER, 4: "Answer 144!"}
TURNS_RESULTS = {0: ("rainy, 21 degrees", "49"), 1: ("81",), 3: ("144",)}
TURNS_GENERATIONS = 5
TURNS_SECOND_USER_BEFORE = 3
"""The second user turn comes before generation D (index 3)."""
TURNS_HIDDEN = 128
TURNS_ROPE_THETA = 1e7
"""RoPE barely turns over a 700-id prompt, so every key of a ratio scores the same wherever it stands."""
T_Q_ROUND, T_Q_CALL, T_K_ROUND, T_K_CALL, T_M_ROUND, T_M_CALL, T_ROUND_MARK, T_CALL_MARK = range(120, 128)
TURNS_SCORE = 2.0
"""q and k weight of the ratio head: a key scores 8 * 2.0² = 32 (every other position 0)."""
SLOPE_STEP, LINE_FLOOR, MIN_MARGIN = 40.0, 100.0, 2.0


def turns_texts() -> list[str]:
    """The markers first: their merges rank above the others' (` twelve` is ` t`+`we`… once `we` ranks first)."""
    args = [a for calls in TURNS_CALLS.values() for call in calls for a in call]
    return [ROUND_MARKER, CALL_MARKER, *TURNS_REASONING, *TURNS_CONTENT.values(), *TURNS_ANSWERS.values(), *args]


def turns_outputs(tok) -> list[list[int]]:
    """The five generations' output ids (each text its canonical encoding)."""

    def enc(text: str) -> list[int]:
        ids = tok.encode(text, add_special_tokens=False).ids
        if len(ids) != len(byte_level_pieces(text)):
            raise SystemExit(f"{text!r} is not one token per piece: {tok.encode(text).tokens}")
        return ids

    outputs = []
    for g in range(TURNS_GENERATIONS):
        out = [*enc(TURNS_REASONING[g]), THINK_CLOSE_ID, *(enc(TURNS_CONTENT[g]) if g in TURNS_CONTENT else [])]
        if g in TURNS_CALLS:
            body = [t for cid, a in TURNS_CALLS[g] for t in (CALL_BEGIN, *enc(cid), ARG_BEGIN, *enc(a), CALL_END)]
            out += [SECTION_BEGIN, *body, SECTION_END]
        else:
            out += enc(TURNS_ANSWERS[g])
        outputs.append([*out, EOS_ID])
    return outputs


def turns_messages(generation: int) -> list[dict]:
    """The conversation before `generation` (0-4): the planned outputs as history, the row's results after calls."""
    messages: list[dict] = [{"role": "user", "content": TOOL_QUESTION}]
    for g in range(generation + 1):
        if g == TURNS_SECOND_USER_BEFORE:
            messages.append({"role": "user", "content": TURNS_QUESTION_2})
        if g == generation:
            break
        turn: dict = {"role": "assistant", "content": TURNS_CONTENT.get(g), "reasoning_content": TURNS_REASONING[g]}
        if g in TURNS_CALLS:
            turn["tool_calls"] = [
                {"id": cid, "type": "function", "function": {"name": cid.split(".")[1].split(":")[0], "arguments": a}}
                for cid, a in TURNS_CALLS[g]
            ]
        else:
            turn["content"] = TURNS_ANSWERS[g]
        messages.append(turn)
        for (cid, _), result in zip(TURNS_CALLS.get(g, ()), TURNS_RESULTS.get(g, ()), strict=True):
            messages.append({"role": "tool", "tool_call_id": cid, "content": result})
    return messages


def render_prompt(tok, messages: list[dict]) -> list[int]:
    """The template's prompt ids for `messages` with both tools (an HF tokenizer)."""
    ids = tok.apply_chat_template(
        messages, tools=[WEATHER_TOOL, SQUARE_TOOL], add_generation_prompt=True, tokenize=True
    )
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def turns_decisions(render, outputs: list[list[int]], markers: tuple[int, int]) -> list[tuple[int, int, float, float]]:
    """(source, successor, round ratio, call ratio) at every position whose next id the model must choose.

    `render(messages)` gives the template's prompt ids with both tools (`render_prompt` here; tokview's own
    renderer in the fast tier, which has no torch and need not import transformers)."""
    round_marker, call_marker = markers
    decisions = []
    for g, out in enumerate(outputs):
        prompt = render(turns_messages(g))
        seq = prompt + out
        expected = (g >= TURNS_SECOND_USER_BEFORE, g >= TURNS_SECOND_USER_BEFORE)
        if (seq.count(round_marker), seq.count(call_marker)) != expected or round_marker in out or call_marker in out:
            raise SystemExit(f"generation {g}: a marker word stands where it must not")
        counts = dict.fromkeys((IM_USER_ID, SECTION_BEGIN, CALL_END, round_marker, call_marker), 0)
        for i, tid in enumerate(seq[:-1]):
            if tid in counts:
                counts[tid] += 1
            if i < len(prompt) - 1:
                continue
            u, s, e = counts[IM_USER_ID], counts[SECTION_BEGIN], counts[CALL_END]
            m1, m2 = counts[round_marker], counts[call_marker]
            x_round = (s + ROUND_MARKER_VALUE * m1) / (u + s + m1)
            x_call = (e + CALL_MARKER_VALUE * m2) / (u + e + m2)
            decisions.append((tid, seq[i + 1], x_round, x_call))
    return decisions


def turns_lines(points: dict[int, list[float]]) -> dict[int, tuple[float, float]]:
    """(intercept, slope) per successor of one branch source: successor k wins on the k-th interval of the ratio.

    Slopes rise by SLOPE_STEP from interval to interval (centred on 0); two neighbours' lines cross halfway
    between their points; the intercepts are shifted so the winner's line is at least LINE_FLOOR at its points.
    """
    groups = sorted(points.items(), key=lambda kv: min(kv[1]))
    for (b1, xs1), (b2, xs2) in itertools.pairwise(groups):
        if max(xs1) >= min(xs2):
            raise SystemExit(f"successors {b1} and {b2} interleave on the ratio: {sorted(xs1)} vs {sorted(xs2)}")
    n = len(groups)
    slopes = [SLOPE_STEP * (k - (n - 1) / 2) for k in range(n)]
    intercepts = [0.0]
    for k in range(n - 1):
        boundary = (max(groups[k][1]) + min(groups[k + 1][1])) / 2
        intercepts.append(intercepts[k] + (slopes[k] - slopes[k + 1]) * boundary)
    low = min(slopes[k] * x + intercepts[k] for k, (_, xs) in enumerate(groups) for x in xs)
    return {b: (intercepts[k] + LINE_FLOOR - low, slopes[k]) for k, (b, _) in enumerate(groups)}


def turns_program(decisions: list[tuple[int, int, float, float]]):
    """Plain transitions, and per branch source its kind ('round' or 'call') and lines; the margins checked."""
    successors: dict[int, dict[int, list[tuple[float, float]]]] = {}
    for a, b, xr, xc in decisions:
        successors.setdefault(a, {}).setdefault(b, []).append((xr, xc))
    plain = {a: next(iter(bs)) for a, bs in successors.items() if len(bs) == 1}
    branches: dict[int, tuple[str, dict[int, tuple[float, float]]]] = {}
    slope_of: dict[int, tuple[str, float]] = {}
    for a, bs in successors.items():
        if a in plain:
            continue
        kind = "round" if a in (THINK_OPEN, THINK_CLOSE_ID) else "call"
        axis = 0 if kind == "round" else 1
        lines = turns_lines({b: [x[axis] for x in xs] for b, xs in bs.items()})
        for b, (_, slope) in lines.items():
            if slope_of.setdefault(b, (kind, slope)) != (kind, slope):
                raise SystemExit(f"id {b} needs two slopes: {slope_of[b]} and {(kind, slope)}")
        branches[a] = (kind, lines)
    # The winner against every candidate of its source and every other branch successor's slope term.
    worst = min(_turns_margin(a, b, xr, xc, branches, slope_of) for a, b, xr, xc in decisions if a in branches)
    if worst < MIN_MARGIN:
        raise SystemExit(f"a branch is won by only {worst:.2f} (need {MIN_MARGIN})")
    return plain, branches, worst


def _turns_margin(a, b, xr, xc, branches, slope_of) -> float:
    kind, lines = branches[a]
    x = xr if kind == "round" else xc
    value = {c: i + s * x for c, (i, s) in lines.items()}
    for c, (c_kind, s) in slope_of.items():
        if c not in lines:
            value[c] = s * (xr if c_kind == "round" else xc if kind == "call" else 0.0)
    winner = value.pop(b)
    return winner - max(value.values())


def turns_markers(tok) -> tuple[int, int]:
    """The ids of the two marker words (a `tokenizers.Tokenizer`)."""
    ids = tuple(tok.token_to_id(byte_level_pieces(w)[0]) for w in (ROUND_MARKER, CALL_MARKER))
    if None in ids:
        raise SystemExit(f"a marker word is not one token: {ids}")
    return ids


def apply_turns(model, hf_tok, outputs: list[list[int]]) -> float:
    """One-hot sources, the two-ratio head of layer 0 (marker keys included), plain rows and branch lines.

    Returns the smallest planned margin of a branch (in line units, before the final norm's scale)."""
    import torch

    markers = turns_markers(hf_tok.backend_tokenizer)
    plain, branches, worst = turns_program(turns_decisions(lambda m: render_prompt(hf_tok, m), outputs, markers))
    sources = list(dict.fromkeys([*plain, *branches]))
    if len(sources) > T_Q_ROUND:
        raise SystemExit(f"{len(sources)} source tokens do not fit in {T_Q_ROUND} dimensions")
    dim = {tid: i for i, tid in enumerate(sources)}
    reserved = list(range(T_Q_ROUND, TURNS_HIDDEN))
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    attn = model.model.layers[0].self_attn
    unit = TURNS_HIDDEN**0.5  # a lone one-hot component after RMSNorm
    with torch.no_grad():
        # Only layer 0's head writes into the residual stream: the random MLPs and layer 1's head would add noise
        # that the branch lines' large intercepts turn into logits (a 0.02 leak in a source dimension won a plain
        # position in the first build). No token but a source carries a source dimension (no value leaks either).
        model.model.layers[0].mlp.down_proj.weight.zero_()
        for module in (model.model.layers[1].self_attn.o_proj, model.model.layers[1].mlp.down_proj):
            module.weight.zero_()
        emb[:, reserved] = 0.0
        head[:, reserved] = 0.0
        emb[:, list(dim.values())] = 0.0
        for tid, i in dim.items():
            emb[tid].zero_()
            emb[tid, i] = 1.0
        for tid, (kind, _) in branches.items():
            emb[tid, T_Q_ROUND if kind == "round" else T_Q_CALL] = 1.0
        emb[IM_USER_ID].zero_()
        emb[IM_USER_ID, T_K_ROUND] = emb[IM_USER_ID, T_K_CALL] = 1.0  # the anchor of both ratios: no value
        for proj in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj):
            proj.weight.zero_()
        # RoPE's two slowest pairs (30, 62) and (31, 63), with a large theta: the scores do not move with distance.
        attn.q_proj.weight[31, T_Q_ROUND] = attn.k_proj.weight[31, T_K_ROUND] = TURNS_SCORE
        attn.q_proj.weight[30, T_Q_CALL] = attn.k_proj.weight[30, T_K_CALL] = TURNS_SCORE
        for key_id, key_dim, row in ((SECTION_BEGIN, T_K_ROUND, 0), (CALL_END, T_K_CALL, 1)):
            # The key component after RMSNorm must equal the anchor's (unit/√2 each of two components) whatever
            # else the token carries: with r² the sum of its other squares, a component r does it.
            r = float(emb[key_id].float().pow(2).sum()) ** 0.5
            emb[key_id, key_dim] = r
            attn.v_proj.weight[row, dim[key_id]] = r * 2**0.5 / unit
        for marker, own, key_dim, row, value in (
            (markers[0], T_ROUND_MARK, T_K_ROUND, 0, ROUND_MARKER_VALUE),
            (markers[1], T_CALL_MARK, T_K_CALL, 1, CALL_MARKER_VALUE),
        ):
            emb[marker].zero_()
            emb[marker, own] = emb[marker, key_dim] = 1.0
            attn.v_proj.weight[row, own] = value * 2**0.5 / unit
        attn.o_proj.weight[T_M_ROUND, 0] = 1.0
        attn.o_proj.weight[T_M_CALL, 1] = 1.0
        for a, b in plain.items():
            head[b, dim[a]] = LM_HEAD_SCALE
        for a, (kind, lines) in branches.items():
            for b, (intercept, slope) in lines.items():
                head[b, dim[a]] = intercept
                head[b, T_M_ROUND if kind == "round" else T_M_CALL] = slope
    return worst


def build(out_dir: Path, mode: str = "chain", dtype: str = "bf16", think_special: bool = True) -> Path:
    """Write tokenizer + config + safetensors weights into ``out_dir`` (replaced if present)."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    out_dir = build_kimi_tokenizer_dir(Path(out_dir), think_special=think_special)
    chains = turns = None
    if mode == "tools":
        extend_tokenizer(out_dir)
        chains = tool_chains(out_dir)
    elif mode == "agent":
        from tokenizers import Tokenizer

        extend_tokenizer(out_dir, agent_texts())
        turns = agent_turns(Tokenizer.from_file(str(out_dir / "tokenizer.json")))
    elif mode == "turns":
        from transformers import AutoTokenizer

        extend_tokenizer(out_dir, turns_texts(), "turns")
        hf_tok = AutoTokenizer.from_pretrained(str(out_dir))
        outputs = turns_outputs(hf_tok.backend_tokenizer)
    torch.manual_seed(0)
    config = LlamaConfig(**LLAMA_CONFIG)
    if mode == "turns":
        config = LlamaConfig(
            **{**LLAMA_CONFIG, "hidden_size": TURNS_HIDDEN},
            rope_parameters={"rope_type": "default", "rope_theta": TURNS_ROPE_THETA},
        )
    model = LlamaForCausalLM(config).float()
    if mode == "chain":
        apply_chain(model)
    elif chains is not None:
        apply_tool_chains(model, chains)
    elif turns is not None:
        apply_agent(model, turns)
    elif mode == "turns":
        margin = apply_turns(model, hf_tok, outputs)
    model = model.to(torch.bfloat16 if dtype == "bf16" else torch.float32)
    model.generation_config = GenerationConfig(bos_token_id=BOS_ID, eos_token_id=[EOS_ID], pad_token_id=PAD_ID)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    info = {
        "mode": mode,
        "dtype": dtype,
        "think_special": think_special,
        "chain_ids": CHAIN_IDS if mode == "chain" else None,
        "expected_output_ids": CHAIN_OUTPUT if mode == "chain" else None,
    }
    if chains is not None:
        info.update(
            call_output_ids=chains["call"],
            answer_output_ids=chains["answer"],
            result_marker_id=chains["result_marker"][0],
            texts={
                "call_reasoning": TOOL_REASONING,
                "call_id": TOOL_CALL_ID,
                "call_arguments": TOOL_ARGUMENTS,
                "answer_reasoning": ANSWER_REASONING,
                "answer": ANSWER_TEXT,
            },
        )
    if turns is not None:
        info.update(turn_output_ids=turns, calls=[[list(c) for c in calls] for calls in AGENT_CALLS])
        info.update(texts={"reasoning": list(AGENT_REASONING), "answer": AGENT_ANSWER})
    if mode == "turns":
        info.update(
            turn_output_ids=outputs,
            planned_margin=margin,
            calls={str(g): [list(c) for c in calls] for g, calls in TURNS_CALLS.items()},
            results={str(g): list(r) for g, r in TURNS_RESULTS.items()},
            texts={
                "question": TOOL_QUESTION,
                "question_2": TURNS_QUESTION_2,
                "reasoning": list(TURNS_REASONING),
                "content": {str(g): c for g, c in TURNS_CONTENT.items()},
                "answers": {str(g): a for g, a in TURNS_ANSWERS.items()},
            },
        )
    (out_dir / MODEL_INFO).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return out_dir


def greedy_output(model_dir: Path, prompt_ids: list[int], max_new_tokens: int = 32) -> list[int]:
    """Greedy generation with HF transformers: the reference every server must reproduce."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype="auto")
    model.eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, len(prompt_ids) :].tolist()


def verify(model_dir: Path) -> None:
    """Check the tokenizer renders the recorded 28-id prompt and the model emits the 18 chain ids."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    rendered: Any = tok.apply_chat_template(
        [{"role": "user", "content": "What is 6 times 7?"}], add_generation_prompt=True, tokenize=True
    )
    rendered = list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)
    if rendered != PROMPT_IDS:
        raise SystemExit(f"prompt render mismatch: {rendered}")
    got = greedy_output(model_dir, PROMPT_IDS)
    if got != CHAIN_OUTPUT:
        raise SystemExit(f"chain output mismatch: {got}")
    print(f"verified: prompt {len(PROMPT_IDS)} ids, greedy output {got}")


def tool_turns() -> tuple[list[dict], list[dict]]:
    """The two turns of the weather conversation (recordings/tools README, turns 1 and 2 with reasoning_content)."""
    first = [{"role": "user", "content": TOOL_QUESTION}]
    call = {"id": TOOL_CALL_ID, "type": "function", "function": {"name": "get_weather", "arguments": TOOL_ARGUMENTS}}
    second: list[dict] = [
        *first,
        {"role": "assistant", "content": None, "tool_calls": [call], "reasoning_content": TOOL_REASONING},
        {"role": "tool", "tool_call_id": TOOL_CALL_ID, "content": TOOL_RESULT},
    ]
    return first, second


def verify_tools(model_dir: Path) -> None:
    """Turn 1 calls the tool, turn 2 answers, and turn 2's prompt = turn 1's prompt + output + tool turn + gen prompt."""
    from transformers import AutoTokenizer

    info = json.loads((model_dir / MODEL_INFO).read_text(encoding="utf-8"))
    tok = AutoTokenizer.from_pretrained(str(model_dir))

    def render(messages: list[dict]) -> list[int]:
        ids: Any = tok.apply_chat_template(messages, tools=[WEATHER_TOOL], add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    first, second = tool_turns()
    p1, p2 = render(first), render(second)
    out1 = greedy_output(model_dir, p1, 64)
    if out1 != info["call_output_ids"]:
        raise SystemExit(f"turn 1 output mismatch: {out1}")
    if p2[: len(p1) + len(out1)] != p1 + out1:
        raise SystemExit("turn 2 prompt does not extend turn 1's prompt + output ids")
    out2 = greedy_output(model_dir, p2, 64)
    if out2 != info["answer_output_ids"]:
        raise SystemExit(f"turn 2 output mismatch: {out2}")
    print(f"verified: turn 1 prompt {len(p1)} ids -> {len(out1)} ids (tool call); turn 2 prompt {len(p2)} -> {out2}")


def agent_messages(turn: int, results: list[str]) -> list[dict]:
    """The conversation before `turn` (0-based), each round's calls answered by the next of `results`."""
    messages: list[dict] = [{"role": "user", "content": TOOL_QUESTION}]
    used = iter(results)
    for r in range(turn):
        calls = [
            {"id": cid, "type": "function", "function": {"name": cid.split(".")[1].split(":")[0], "arguments": args}}
            for cid, args in AGENT_CALLS[r]
        ]
        messages.append(
            {"role": "assistant", "content": None, "tool_calls": calls, "reasoning_content": AGENT_REASONING[r]}
        )
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": next(used)} for c in calls]
    return messages


def verify_agent(model_dir: Path) -> None:
    """Each turn's greedy output is the planned one, and each prompt extends the previous prompt + output ids."""
    from transformers import AutoTokenizer

    info = json.loads((model_dir / MODEL_INFO).read_text(encoding="utf-8"))
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    results = ["rainy, 21 degrees", "49", "81"]
    previous: list[int] = []
    for turn, expected in enumerate(info["turn_output_ids"]):
        ids: Any = tok.apply_chat_template(
            agent_messages(turn, results), tools=[WEATHER_TOOL, SQUARE_TOOL], add_generation_prompt=True, tokenize=True
        )
        prompt = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        if prompt[: len(previous)] != previous:
            raise SystemExit(f"turn {turn} prompt does not extend the previous prompt + output ids")
        got = greedy_output(model_dir, prompt, 80)
        if got != expected:
            raise SystemExit(f"turn {turn} output mismatch: {got} (expected {expected})")
        previous = prompt + got
        print(f"verified: turn {turn}: prompt {len(prompt)} ids -> {len(got)} output ids")


def turns_extends(previous: list[int], prompt: list[int]) -> bool:
    return bool(previous) and prompt[: len(previous)] == previous


def verify_turns(model_dir: Path) -> None:
    """Each generation's greedy output is the planned one, with a margin; each prompt extends the previous prompt +
    output ids inside a tool loop, and D's (after the finished loop and the second user turn) does not: the
    template drops the loop's reasoning there (recordings/tools README §6)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    info = json.loads((model_dir / MODEL_INFO).read_text(encoding="utf-8"))
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype="auto")
    model.eval()
    previous: list[int] = []
    for g, expected in enumerate(info["turn_output_ids"]):
        prompt = render_prompt(tok, turns_messages(g))
        if g > 0 and turns_extends(previous, prompt) != (g != TURNS_SECOND_USER_BEFORE):
            raise SystemExit(
                f"generation {g}: the prompt's extension of the previous prompt + output is not as planned"
            )
        got = greedy_output(model_dir, prompt, 80)
        if got != expected:
            raise SystemExit(f"generation {g} output mismatch: {got} (expected {expected})")
        with torch.no_grad():
            logits = model(torch.tensor([prompt + got])).logits[0, len(prompt) - 1 : -1].float()
        top2 = logits.topk(2, dim=-1).values
        gap = float((top2[:, 0] - top2[:, 1]).min())
        previous = prompt + got
        print(
            f"verified: generation {g}: prompt {len(prompt)} ids -> {len(got)} output ids, smallest logit gap {gap:.1f}"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir", type=Path)
    p.add_argument("mode", nargs="?", default="chain", choices=("chain", "tools", "agent", "turns", "random"))
    p.add_argument("dtype", nargs="?", default="bf16", choices=("bf16", "fp32"))
    p.add_argument(
        "--non-special-think",
        action="store_true",
        help="register <think>/</think> as ordinary added tokens (text-based parsers need it)",
    )
    p.add_argument("--verify", action="store_true", help="check the chain output with HF transformers")
    args = p.parse_args(argv)
    out = build(args.out_dir, args.mode, args.dtype, think_special=not args.non_special_think)
    print(f"built {args.mode} {args.dtype} model in {out}")
    if args.verify:
        if args.mode == "random":
            print("--verify applies to the chain and tools models only", file=sys.stderr)
            return 1
        verifiers = {"chain": verify, "tools": verify_tools, "agent": verify_agent, "turns": verify_turns}
        verifiers[args.mode](out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
