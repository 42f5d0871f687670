"""`tokview sim --profile NAME|FILE` (issue 28): the simulator serves its tokenizer as a named profile (GLM-4.7 on the
GLM-layout tokenizer), and a profile whose ids are not the tokenizer's, or no profile at all, is one line."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import httpx

from tokview.cli import main

TOKVIEW = [sys.executable, "-c", "import sys; from tokview.cli import main; sys.exit(main())"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sim_serves_the_glm_tokenizer_as_the_profile_named(glm_tok_dir):
    port = _free_port()
    args = ["sim", "--port", str(port), "--tokenizer", str(glm_tok_dir), "--profile", "glm-4.7"]
    proc = subprocess.Popen(
        [*TOKVIEW, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ
    )
    try:
        banner = proc.stdout.readline()
        body = {"messages": [{"role": "user", "content": "hi"}], "return_token_ids": True}
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=30).json()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert "profile glm-4.7" in banner
    assert answer["prompt_token_ids"][-2:] == [151337, 151350], "<|assistant|><think>"
    assert answer["choices"][0]["token_ids"][-1] == 151336, "<|user|>: GLM ends a turn with the next role's header"


def test_a_profile_of_another_vocabulary_is_one_line(capsys):
    code = main(["sim", "--port", "0", "--profile", "glm-4.7"])
    err = capsys.readouterr().err.strip()
    assert code != 0
    assert err.splitlines() == [err]
    assert "151350" in err


def test_an_unknown_profile_is_one_line(capsys):
    code = main(["sim", "--port", "0", "--profile", "no-such-family"])
    err = capsys.readouterr().err.strip()
    assert code != 0
    assert err.splitlines() == [err]
    assert "no-such-family" in err
