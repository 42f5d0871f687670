"""gpt-oss's o200k_harmony tokenizer, built offline from js-tiktoken's ranks, against OpenAI's own code.

The ranks must hash to OpenAI's pinned o200k_base.tiktoken; the `tokenizer.json` folder tokview builds
must encode as tiktoken does with those ranks, and its chat template must render the ids
openai-harmony renders for the same conversation (openai-harmony reads the same file, offline, through
TIKTOKEN_ENCODINGS_BASE). Skipped with the reason when js-tiktoken was not fetched (.ci/run fetches it).
"""

from __future__ import annotations

import pytest

from tokview.core import gpt_oss_tokenizer as g


@pytest.fixture(scope="module")
def oss_dir():
    try:
        return g.gpt_oss_tokenizer_dir()
    except g.GptOssDataError as exc:
        pytest.skip(f"no o200k ranks on this machine (npm pack js-tiktoken into ~/.cache/tokview): {exc}")


@pytest.fixture(scope="module")
def oss_tok(oss_dir):
    from tokview.core.tokenizer import load_tokenizer

    return load_tokenizer(oss_dir)


@pytest.fixture(scope="module")
def harmony(oss_dir):
    oh = pytest.importorskip("openai_harmony", reason="openai-harmony is not installed (pip install openai-harmony)")
    import os

    before = os.environ.get("TIKTOKEN_ENCODINGS_BASE")
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(oss_dir)  # the vocabulary file, offline: no download
    try:
        yield oh, oh.load_harmony_encoding(oh.HarmonyEncodingName.HARMONY_GPT_OSS)
    finally:  # the rest of the suite sees the environment it had
        if before is None:
            os.environ.pop("TIKTOKEN_ENCODINGS_BASE", None)
        else:
            os.environ["TIKTOKEN_ENCODINGS_BASE"] = before


TEXTS = [
    "Hello, world! What's 6 times 7?",
    "  leading spaces\n\n\ttabs and\r\nnewlines   ",
    "Ünïcödé — 世界 🙂 مرحبا  12345678 don't I'LL",
    'def f(x):\n    return {"a": [1, 2.5, -3]}\n',
]


def test_the_ranks_are_openais_file_and_the_specials_sit_at_harmonys_ids(oss_dir, oss_tok):
    import hashlib

    digest = hashlib.sha256((oss_dir / "o200k_base.tiktoken").read_bytes()).hexdigest()
    assert digest == g.O200K_BASE_SHA256
    named = {"<|return|>": 200002, "<|constrain|>": 200003, "<|channel|>": 200005, "<|start|>": 200006}
    named |= {"<|end|>": 200007, "<|message|>": 200008, "<|call|>": 200012, "<|endoftext|>": 199999}
    assert {t: oss_tok.token_to_id(t) for t in named} == named
    assert oss_tok.vocab_size == g.VOCAB_SIZE


def test_encoding_matches_tiktoken_on_the_same_ranks(oss_dir, oss_tok):
    import tiktoken

    from tokview.core.kimi_tiktoken import read_tiktoken_ranks

    ranks = read_tiktoken_ranks(oss_dir / "o200k_base.tiktoken")
    specials = {text: i for i, text in g.harmony_special_tokens().items()}
    enc = tiktoken.Encoding("o200k_harmony", pat_str=g.O200K_PATTERN, mergeable_ranks=ranks, special_tokens=specials)
    for text in TEXTS:
        assert oss_tok.encode(text) == enc.encode(text), text
        assert oss_tok.decode(enc.encode(text)) == text


def test_chat_template_renders_openai_harmonys_ids(oss_tok, harmony):
    oh, enc = harmony
    tool = {
        "name": "get_weather",
        "description": "Gets the weather.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city"},
                "unit": {"type": "string", "enum": ["c", "f"]},
            },
            "required": ["city"],
        },
    }
    system = oh.SystemContent.new().with_conversation_start_date("2025-06-28")
    system = system.with_reasoning_effort(oh.ReasoningEffort.LOW)
    developer = oh.DeveloperContent.new().with_instructions("Be brief.")
    developer = developer.with_function_tools(
        [oh.ToolDescription.new(tool["name"], tool["description"], tool["parameters"])]
    )
    user_q, args, result = "Weather in Paris?", '{"city":"Paris"}', '{"t":20}'
    convo = oh.Conversation.from_messages(
        [
            oh.Message.from_role_and_content(oh.Role.SYSTEM, system),
            oh.Message.from_role_and_content(oh.Role.DEVELOPER, developer),
            oh.Message.from_role_and_content(oh.Role.USER, "hi"),
            oh.Message.from_role_and_content(oh.Role.ASSISTANT, "old thought").with_channel("analysis"),
            oh.Message.from_role_and_content(oh.Role.ASSISTANT, "Hello!").with_channel("final"),
            oh.Message.from_role_and_content(oh.Role.USER, user_q),
            oh.Message.from_role_and_content(oh.Role.ASSISTANT, "Need weather.").with_channel("analysis"),
            oh.Message.from_role_and_content(oh.Role.ASSISTANT, args)
            .with_channel("commentary")
            .with_recipient("functions.get_weather")
            .with_content_type("<|constrain|>json"),
            oh.Message.from_author_and_content(oh.Author.new(oh.Role.TOOL, "functions.get_weather"), result)
            .with_channel("commentary")
            .with_recipient("assistant"),
        ]
    )
    expected = enc.render_conversation_for_completion(convo, oh.Role.ASSISTANT)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "thinking": "old thought", "content": "Hello!"},
        {"role": "user", "content": user_q},
        {
            "role": "assistant",
            "thinking": "Need weather.",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": args}}],
        },
        {"role": "tool", "name": "get_weather", "content": result},
    ]
    kwargs = {
        "reasoning_effort": "low",
        "current_date": "2025-06-28",
        "tools": [{"type": "function", "function": tool}],
    }
    mine = oss_tok.render(messages, template_kwargs=kwargs)
    assert mine == expected, (oss_tok.decode(mine), enc.decode(expected))
    assert "old thought" in oss_tok.decode(mine)  # harmony keeps history analysis unless a final ends the talk
    done = [*messages[:4], {"role": "assistant", "thinking": "t", "content": "Sunny."}]
    drop = [*convo.messages[:6], oh.Message.from_role_and_content(oh.Role.ASSISTANT, "t").with_channel("analysis")]
    drop.append(oh.Message.from_role_and_content(oh.Role.ASSISTANT, "Sunny.").with_channel("final"))
    expected = enc.render_conversation(oh.Conversation.from_messages(drop))
    assert oss_tok.render(done, add_generation_prompt=False, template_kwargs=kwargs) == expected


def test_a_plain_question_renders_as_harmony_does(oss_tok, harmony):
    oh, enc = harmony
    system = oh.SystemContent.new().with_conversation_start_date("2026-01-02")
    convo = oh.Conversation.from_messages(
        [
            oh.Message.from_role_and_content(oh.Role.SYSTEM, system),
            oh.Message.from_role_and_content(oh.Role.USER, "2+2?"),
        ]
    )
    expected = enc.render_conversation_for_completion(convo, oh.Role.ASSISTANT)
    mine = oss_tok.render([{"role": "user", "content": "2+2?"}], template_kwargs={"current_date": "2026-01-02"})
    assert mine == expected
    assert mine[-2:] == [200006, oss_tok.token_to_id("assistant")]


def test_missing_ranks_are_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKVIEW_CACHE", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("TOKVIEW_JS_TIKTOKEN", raising=False)
    with pytest.raises(g.GptOssDataError, match="npm pack js-tiktoken"):
        g.gpt_oss_tokenizer_dir()
