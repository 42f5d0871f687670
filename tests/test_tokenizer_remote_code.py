"""Loading a tokenizer that ships its own code (`--trust-remote-code`), as Kimi's real one does.

The model folder here holds a `tiktoken.model` (the Kimi-layout byte vocabulary, 163584 ranks, so the
special ids land on Kimi's real ids) and our own `tokenization_kimi.py`: a slow `PreTrainedTokenizer`
over tiktoken that imports exactly what Moonshot's file imports. That proves the install carries those
imports on transformers 4, that the code only runs when asked, and that tokview's adapter shows pieces
and renders templates through such a tokenizer. Without the flag tokview reads Kimi's layout natively
(tests/test_tokenizer_kimi_tiktoken.py); other custom classes still need the flag, on both transformers
lines.
"""

from __future__ import annotations

import json
import shutil

import pytest
from facts import KIMI_CHAIN_OUTPUT

from tokview.core.tokenizer import TokenizerError, load_tokenizer

REMOTE_CODE = '''
import tiktoken
from tiktoken.load import load_tiktoken_bpe
from tokenizers import AddedToken, pre_tokenizers, Regex  # noqa: F401 (the real file imports these)
from transformers.tokenization_utils import PreTrainedTokenizer
from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode

PAT = r"""[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"""


class TikTokenTokenizer(PreTrainedTokenizer):
    vocab_files_names = {"vocab_file": "tiktoken.model"}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, vocab_file, bos_token="[BOS]", eos_token="[EOS]", unk_token=None, pad_token=None,
                 additional_special_tokens=None, added_tokens_decoder=None, **kwargs):
        ranks = load_tiktoken_bpe(vocab_file)
        names = {int(i): t.content for i, t in (added_tokens_decoder or {}).items()}
        base = len(ranks)
        self.special_tokens = {names.get(i, f"<|reserved_token_{i}|>"): i for i in range(base, base + 256)}
        self.model = tiktoken.Encoding(name="kimi-test", pat_str=PAT, mergeable_ranks=ranks,
                                       special_tokens=self.special_tokens)
        enc = bytes_to_unicode()
        self.decoder = {i: "".join(enc[b] for b in self.model.decode_single_token_bytes(i)) for i in range(base)}
        self.decoder.update({i: s for s, i in self.special_tokens.items()})
        self.encoder = {v: k for k, v in self.decoder.items()}
        self.byte_decoder = {v: k for k, v in enc.items()}
        super().__init__(bos_token=bos_token, eos_token=eos_token, unk_token=unk_token, pad_token=pad_token,
                         additional_special_tokens=additional_special_tokens, **kwargs)

    @property
    def vocab_size(self):
        return self.model.n_vocab

    def get_vocab(self):
        return dict(self.encoder)

    def _tokenize(self, text, **kwargs):
        return [self.decoder[t] for t in self.model.encode(text, allowed_special="all")]

    def _convert_token_to_id(self, token):
        return self.encoder.get(token, 0)

    def _convert_id_to_token(self, index):
        return self.decoder.get(index)

    def convert_tokens_to_string(self, tokens):
        out, buf = [], bytearray()
        for t in tokens:
            if t in self.special_tokens:
                out.append(buf.decode("utf-8", "replace") + t)
                buf = bytearray()
            else:
                buf += bytes(self.byte_decoder[c] for c in t)
        return "".join(out) + buf.decode("utf-8", "replace")
'''


TRANSFORMERS_5 = int(__import__("transformers").__version__.split(".")[0]) >= 5
# The same class with the one import transformers 5 removed replaced by tokview's copy: any folder's own
# code, not Kimi's, which tokview reads natively.
PORTABLE_CODE = (
    REMOTE_CODE.replace(
        "from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode",
        "from tokview.core.tokenizer import bytes_to_unicode",
    )
    .replace(
        "from transformers.tokenization_utils import PreTrainedTokenizer",
        "from transformers import PreTrainedTokenizer",
    )
    .replace("class TikTokenTokenizer(", "class CustomTokenizer(")
)


def _code_folder(root, kimi_tok_dir, module: str, cls: str, code: str):
    from tokview.core.kimi_layout import build_kimi_tiktoken_dir

    folder = build_kimi_tiktoken_dir(root)
    (folder / f"{module}.py").write_text(code)
    config = json.loads((kimi_tok_dir / "tokenizer_config.json").read_text())
    config.pop("tokenizer_file", None)
    config.update(
        {
            "tokenizer_class": cls,
            "auto_map": {"AutoTokenizer": [f"{module}.{cls}", None]},
            "additional_special_tokens": ["<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>"],
        }
    )
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    shutil.copy(kimi_tok_dir / "chat_template.jinja", folder / "chat_template.jinja")
    return folder


@pytest.fixture(scope="module")
def remote_code_dir(tmp_path_factory, kimi_tok_dir):
    return _code_folder(
        tmp_path_factory.mktemp("kimi-remote"), kimi_tok_dir, "tokenization_kimi", "TikTokenTokenizer", REMOTE_CODE
    )


@pytest.fixture(scope="module")
def custom_code_dir(tmp_path_factory, kimi_tok_dir):
    return _code_folder(
        tmp_path_factory.mktemp("custom-remote"), kimi_tok_dir, "tokenization_custom", "CustomTokenizer", PORTABLE_CODE
    )


def test_refuses_remote_code_without_the_flag(custom_code_dir):
    with pytest.raises(TokenizerError, match="--trust-remote-code") as info:
        load_tokenizer(custom_code_dir)
    assert info.value.needs_remote_code
    assert "tokenization_custom.py" in str(info.value)


def test_custom_code_runs_with_the_flag_on_both_transformers_lines(custom_code_dir):
    tok = load_tokenizer(custom_code_dir, trust_remote_code=True)
    assert type(tok.tok).__name__ == "CustomTokenizer"
    assert tok.loaded_by == "remote code"
    assert [tok.token_to_id(t) for t in ("<think>", "</think>", "<|im_end|>")] == [163606, 163607, 163586]
    assert tok.pieces(KIMI_CHAIN_OUTPUT[:3] + [163607]) == ["Okay", ",", " let", "</think>"]


def test_kimi_folder_without_the_flag_runs_no_code(remote_code_dir):
    tok = load_tokenizer(remote_code_dir)
    assert tok.loaded_by == "native tiktoken"
    assert type(tok.tok).__name__ == "KimiTiktokenTokenizer"


@pytest.mark.skipif(not TRANSFORMERS_5, reason="Kimi's own file runs on transformers 4")
def test_kimi_code_on_transformers_5_says_to_drop_the_flag(remote_code_dir):
    with pytest.raises(TokenizerError, match="drop --trust-remote-code"):
        load_tokenizer(remote_code_dir, trust_remote_code=True)


@pytest.mark.skipif(TRANSFORMERS_5, reason="Kimi's file imports bytes_to_unicode from gpt2, gone in transformers 5")
def test_loads_with_the_flag_and_keeps_kimi_ids(remote_code_dir):
    tok = load_tokenizer(remote_code_dir, trust_remote_code=True)
    assert type(tok.tok).__name__ == "TikTokenTokenizer"
    assert tok.loaded_by == "remote code"
    assert [tok.token_to_id(t) for t in ("<think>", "</think>", "<|im_end|>")] == [163606, 163607, 163586]
    assert tok.pieces(KIMI_CHAIN_OUTPUT[:3] + [163607]) == ["Okay", ",", " let", "</think>"]
    assert tok.is_special(163586)
    prompt = tok.render([{"role": "user", "content": "hi"}], template_kwargs={"thinking": True})
    assert prompt[-1] == 163606
    assert prompt[0] == 163587


def test_missing_directory_is_a_clear_error(tmp_path):
    with pytest.raises(TokenizerError, match="not found"):
        load_tokenizer(tmp_path / "nope")


def _evil_tokenizer(tmp_path, kimi_tok_dir):
    """A copy of the Kimi-layout folder whose config points at shipped code that leaves a marker when run."""
    folder = tmp_path / "evil-tok"
    shutil.copytree(kimi_tok_dir, folder)
    marker = tmp_path / "code-ran"
    (folder / "tokenization_evil.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
        "from transformers import PreTrainedTokenizerFast\n\n\n"
        "class EvilTokenizer(PreTrainedTokenizerFast):\n    pass\n"
    )
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": [None, "tokenization_evil.EvilTokenizer"]}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder, marker


def test_trust_remote_code_never_runs_a_folder_the_database_names(tmp_path, capsys, kimi_tok_dir, make_capture, put):
    from tokview.cli import main
    from tokview.store import Store

    folder, marker = _evil_tokenizer(tmp_path, kimi_tok_dir)
    db = tmp_path / "r.duckdb"
    with Store(db) as s:
        s.put_run("run1", profile="kimi-k2.5", tokenizer_dir=str(folder))
        put(s, "p1", make_capture())
    code = main(["export", "--db", str(db), "--out", str(tmp_path / "o.jsonl"), "--trust-remote-code"])
    err = capsys.readouterr().err
    assert not marker.exists()  # the recorded folder's code did not run
    assert code == 0
    assert (tmp_path / "o.jsonl").is_file()
    assert "Traceback" not in err  # loaded without its code
    out2 = str(tmp_path / "o2.jsonl")
    code = main(["export", "--db", str(db), "--out", out2, "--tokenizer", str(folder), "--trust-remote-code"])
    assert code == 0
    assert marker.exists()  # named on the command line: the user asked for it
