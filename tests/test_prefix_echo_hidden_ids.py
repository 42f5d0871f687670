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
