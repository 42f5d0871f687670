"""An SGLang output that echoes the prompt's tail, with every text in `reasoning`.

Reproduced as a curator found it: the simulator with `prompt-prefix-bug` and `parser-all-reasoning`, a batch,
then `show`: only the echoed prompt ids are hidden (this parser's `reasoning` shows even the delimiters and the
stop); "Okay, let me…" is kept, as the text holds it. Before, 90 ids were reported hidden."""

from __future__ import annotations

import json
from pathlib import Path

from tokview.cli import main
from tokview.sim import SimConfig, start_simulator

ROOT = Path(__file__).resolve().parents[1]


def test_only_the_echoed_prefix_and_the_delimiters_are_hidden(tmp_path, capsys):
    db = tmp_path / "t.duckdb"
    quirks = {"prompt-prefix-bug": True, "parser-all-reasoning": True}
    with start_simulator(SimConfig(kind="sglang", quirks=quirks)) as sim:
        prompts = str(ROOT / "sample_data" / "openai_messages.jsonl")
        code = main(["batch", prompts, "--server", sim.url, "--db", str(db), "--limit", "1", "--run", "echo"])
    assert code == 3 or code == 0
    capsys.readouterr()
    assert main(["stats", "--db", str(db), "--samples"]) == 0
    sample_id = next(w for w in capsys.readouterr().out.split() if "@" in w)
    assert main(["show", sample_id, "--db", str(db), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    codes = {f["code"]: f for f in data["findings"]}
    echoed = len(codes["output_prefix_overlap"]["positions"])
    n_prompt, output = len(data["capture"]["prompt_ids"]), data["capture"]["output_ids"]
    hidden = [p - n_prompt for p in codes["parser_hidden_ids"]["positions"]]
    assert echoed >= 3
    assert hidden == list(range(echoed))  # this parser's text shows the delimiters and stop
    assert len(output) > 60
    assert main(["show", sample_id, "--db", str(db), "--from", str(n_prompt + echoed), "--count", "3"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.split()[:1] == [str(n_prompt + echoed)]]
    assert rows
    assert rows[0].rstrip().endswith("kept")  # "Okay, let me…" is in the text


def test_with_logprobs_an_echoed_prefix_is_stored_with_its_finding_not_lost(tmp_path, capsys):
    """`--logprobs` on a server with the prompt-prefix bug: the logprobs name the generated ids only, so every answer
    was "malformed", retried and lost; stored without logprobs the same answers carry `output_prefix_overlap`. Now
    they are stored with it too, the echoed positions without a logprob, the rest aligned to their ids."""
    db = tmp_path / "l.duckdb"
    with start_simulator(SimConfig(kind="sglang", quirks={"prompt-prefix-bug": 4})) as sim:
        prompts = str(ROOT / "sample_data" / "openai_messages.jsonl")
        args = ["batch", prompts, "--server", sim.url, "--db", str(db), "--limit", "2", "--logprobs", "2"]
        assert main([*args, "--temperature", "0"]) in (0, 3)
    capsys.readouterr()
    assert main(["stats", "--db", str(db), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["samples"] == 2 and stats["failures"]["total"] == 0
    assert main(["stats", "--db", str(db), "--samples"]) == 0
    sample_id = next(w for w in capsys.readouterr().out.split() if "@" in w)
    assert main(["show", sample_id, "--db", str(db), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(next(f for f in data["findings"] if f["code"] == "output_prefix_overlap")["positions"]) == 4
    logprobs = {"logprobs": data["logprobs"]["sampled"], "top_ids": data["logprobs"]["top_ids"]}
    output = data["capture"]["output_ids"]
    assert len(logprobs["logprobs"]) == len(output)
    assert logprobs["logprobs"][:4] == [None] * 4 and None not in logprobs["logprobs"][4:]
    assert logprobs["top_ids"][:4] == [[]] * 4 and all(len(t) == 2 for t in logprobs["top_ids"][4:])


async def test_a_cumulative_stream_with_an_echoed_prefix_keeps_its_logprobs_aligned():
    """Streamed (cumulative ids), the echo made the last chunk's logprobs shorter than its ids, read as per-chunk
    slices and joined: 78 entries for 17 ids, a malformed answer retried and lost."""
    from tokview.servers import sglang as sg
    from tokview.servers.http import ServerClient

    prompt = list(range(1000, 1020))
    with start_simulator(SimConfig(kind="sglang", quirks={"prompt-prefix-bug": 5})) as sim:
        client = ServerClient(sim.url, timeout=30, concurrency=1)
        settings = {"max_new_tokens": 12, "temperature": 0.0, "top_p": 1.0, "logprobs": 2}
        whole = sg.capture_from_generate(
            await client.post_json("/generate", sg.generate_body(prompt, settings)), prompt
        )
        streamed, _ = await sg.generate_stream(client, sg.generate_body(prompt, settings, stream=True), prompt)
        await client.aclose()
    assert streamed["output_ids"] == whole["output_ids"] and streamed["output_ids"][:5] == prompt[-5:]
    assert streamed["output_logprobs"] == whole["output_logprobs"]
    assert streamed["output_logprobs"][:5] == [None] * 5 and None not in streamed["output_logprobs"][5:]
