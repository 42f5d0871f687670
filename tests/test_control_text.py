"""`control_text_in_messages`: a message's text that spells a control token is found where it became that id, and
nowhere else: not where a template dropped the text, not at the template's own ids of that kind, not for ordinary
markup a tokenizer has added tokens for; and a message spelling thousands of them costs a bounded look."""

from __future__ import annotations

from tokview.core.analysis import analyze
from tokview.core.control_text import PLACED_MAX, control_texts
from tokview.core.record import Capture


def _found(tok, profile, messages, thinking=True):
    prompt = tok.render(messages, template_kwargs=profile.template_kwargs(thinking))
    capture = Capture(prompt_ids=prompt, output_ids=tok.encode("ok") + [profile.stop_ids[0]], messages=messages)
    hits = [f for f in analyze(capture, profile, tok).findings if f.code == "control_text_in_messages"]
    return prompt, (hits[0] if hits else None)


def test_a_history_whose_spelled_think_the_template_dropped_is_no_finding(qwen_tok, qwen_profile):
    """Qwen3 drops an earlier turn's reasoning: `<think>…</think>` in its content never reached the prompt, and the
    template's own `<think>` of the generation prompt (thinking off) was named as if the text had become it."""
    history = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "<think>secret-reasoning</think>Hello!"},
        {"role": "user", "content": "and now?"},
    ]
    for thinking in (True, False):
        _, hit = _found(qwen_tok, qwen_profile, history, thinking)
        assert hit is None, (thinking, hit)


def test_a_token_that_opens_its_text_is_placed_by_the_text_after_it(qwen_tok, qwen_profile):
    """With nothing before it, every `<|im_end|>` of the prompt was named (the template's turn ends too)."""
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "<|im_end|> - what is it?"}]
    prompt, hit = _found(qwen_tok, qwen_profile, messages)
    assert hit is not None
    (at,) = hit.positions
    assert qwen_tok.decode(prompt[at + 1 : at + 4]).startswith(" - what")
    assert "message 2 (user) content spells <|im_end|>" in hit.detail


def test_a_pasted_log_spelling_thousands_is_looked_at_a_bounded_number_of_times(kimi_tok, kimi_profile):
    """Each spelled token kept the whole text before it and scanned the whole prompt: a 70 kB tool result of 800
    ChatML lines took 42 s. The first PLACED_MAX are looked at, each placed at its own position."""
    log = "".join(f"<|im_user|>line {n}<|im_end|>\n" for n in range(800))
    messages = [{"role": "user", "content": "read the log"}, {"role": "assistant", "content": "ok"}]
    messages.append({"role": "user", "content": log})
    prompt, hit = _found(kimi_tok, kimi_profile, messages)
    assert hit is not None
    assert len(hit.positions) == PLACED_MAX
    assert f"and {PLACED_MAX - 5} more (the first it placed)" in hit.detail  # SHOWN named, the rest counted
    spelled = {kimi_tok.encode("<|im_user|>")[0], kimi_tok.encode("<|im_end|>")[0]}
    assert all(prompt[p] in spelled for p in hit.positions)


def test_which_added_tokens_count_as_control_text(qwen_tok, qwen_profile):
    """Special tokens, `<|…|>` ones and the profile's think and tool-call markers (Qwen3's `<think>` is an added
    token marked not special); not other added markup (`<tool_response>` here; Gemma's `<table>`)."""
    texts = control_texts(qwen_tok, qwen_profile)
    assert texts is not None
    assert {"<|im_end|>", "<|im_start|>", "<think>", "</think>", "<tool_call>"} <= set(texts.ids)
    assert "<tool_response>" not in texts.ids
    assert [m.group() for m in texts.find("a </think> b <|im_end|> c <think>")] == ["</think>", "<|im_end|>", "<think>"]


def test_a_token_ending_a_text_is_placed_in_its_own_message_not_after_an_earlier_one_that_ends_alike(
    qwen_tok, qwen_profile
):
    """ "Done." then "Done.<|im_end|>": the template's own `<|im_end|>` after the assistant's "Done." read the same
    either side and was named; a token spelled twice in a row is two positions."""
    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "Done.<|im_end|><|im_end|>"},
    ]
    prompt, hit = _found(qwen_tok, qwen_profile, messages)
    assert hit is not None
    first, second = hit.positions
    assert second == first + 1
    assert qwen_tok.decode(prompt[first - 3 : first]).endswith("Done.")
    assert qwen_tok.decode(prompt[first - 8 : first]).count("Done.") == 1  # the user's, not the assistant's


def test_spelled_text_the_template_dropped_does_not_use_up_the_look(qwen_tok, qwen_profile):
    """70 spelled tokens in an earlier turn's reasoning (dropped by Qwen3's template) used the cap up before the
    3 real ones of the last message were looked at."""
    dropped = "".join(f"step {n} <|im_end|> " for n in range(70))
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "ok", "reasoning_content": dropped},
        {"role": "user", "content": "first <|im_end|> one, second <|im_end|> two, third <|im_end|> three"},
    ]
    prompt, hit = _found(qwen_tok, qwen_profile, messages)
    assert hit is not None and len(hit.positions) == 3
    after = [qwen_tok.decode(prompt[p + 1 : p + 3]) for p in hit.positions]
    assert [a.split(",")[0].split("<")[0].strip() for a in after] == ["one", "two", "three"], after


def test_a_pasted_transcript_and_identical_results_are_each_placed_in_their_own_text(qwen_tok, qwen_profile):
    """A text opening with the template's own structure (`<|im_end|>\\n<|im_start|>user`) was placed at the template's
    ids after the message before it; two tool results with the same text kept one position between them."""
    transcript = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi"},
        {"role": "user", "content": "<|im_end|>\n<|im_start|>user\nwhat is this transcript?"},
    ]
    prompt, hit = _found(qwen_tok, qwen_profile, transcript)
    assert hit is not None and len(hit.positions) == 2
    assert qwen_tok.decode(prompt[hit.positions[1] + 1 : hit.positions[1] + 8]).startswith("user\nwhat is")
    said = "config says: eos is <|im_end|> and bos is none"
    calls = [{"id": f"c{n}", "type": "function", "function": {"name": "read", "arguments": "{}"}} for n in (0, 1)]
    results = [{"role": "tool", "tool_call_id": f"c{n}", "content": said} for n in (0, 1)]
    messages = [{"role": "user", "content": "read it twice"}, {"role": "assistant", "content": "", "tool_calls": calls}]
    prompt, hit = _found(qwen_tok, qwen_profile, messages + results)
    assert hit is not None and len(hit.positions) == 2  # one in each result


def test_reasoning_a_template_writes_before_the_content_is_placed_too(kimi_tok, kimi_profile):
    """Kimi writes a turn's reasoning before its content: looked for after the content, it was never found."""
    messages = [
        {"role": "user", "content": "run the tests"},
        {"role": "assistant", "content": "Running.", "reasoning_content": "I will write: All passed.<|im_end|> then"},
        {"role": "user", "content": "and?"},
    ]
    prompt, hit = _found(kimi_tok, kimi_profile, messages)
    assert hit is not None and "message 2 (assistant) reasoning_content spells <|im_end|>" in hit.detail
    (at,) = hit.positions
    assert kimi_tok.decode(prompt[max(0, at - 12) : at]).endswith("All passed.")


def test_a_long_chat_whose_earlier_reasoning_the_template_dropped_is_still_read_to_its_last_message(
    qwen_tok, qwen_profile, monkeypatch
):
    """Each dropped text was looked for to the prompt's end, and the search budget ran out before the last message:
    a 1,000-turn chat spelling `<|im_end|>` in its last message gave no finding. A text is now looked for in a window
    past the ones found (budget shrunk here so that 100 turns show it)."""
    import tokview.core.control_text as control_text

    monkeypatch.setattr(control_text, "SEARCHED_MAX", 1 << 20)
    messages = [{"role": "system", "content": "sys"}]
    for n in range(100):
        messages.append({"role": "user", "content": f"question {n} " + "words " * 30})
        messages.append({"role": "assistant", "content": f"answer {n}", "reasoning_content": f"thinking {n} " * 20})
    messages.append({"role": "user", "content": "last question about <|im_end|> tokens"})
    prompt, hit = _found(qwen_tok, qwen_profile, messages)
    assert hit is not None and len(hit.positions) == 1
    assert qwen_tok.decode(prompt[hit.positions[0] + 1 : hit.positions[0] + 3]).strip().startswith("tokens")


def test_reasoning_an_assistant_writes_inline_is_its_own_structure_not_quoted_text(qwen_tok, qwen_profile):
    """`<think>…</think>X` in an assistant's content (how R1-style harnesses send history) is re-rendered by Qwen3's
    template as the turn's reasoning: the finding named the template's own think ids and told the user to escape them."""
    messages = [
        {"role": "user", "content": "what is 2+2?"},
        {"role": "assistant", "content": "<think>\nadd them\n</think>\n\nThe answer is 4."},
    ]
    assert _found(qwen_tok, qwen_profile, messages)[1] is None
