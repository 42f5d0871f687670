"""Baseline: the structure of SpecForge's `scripts/regenerate_train_data.py`, written for this benchmark.

What it keeps of the original (sgl-project/SpecForge): a health check through one short
generation, a ThreadPoolExecutor of `concurrency × servers` threads, each request made by a
fresh `OpenAI(base_url=…)` client calling `chat.completions.create` (the original builds one per
conversation), the main thread reading the input line by line and, once a server has
`concurrency` requests waiting, polling the futures in a loop until one is done, then writing it
as one JSONL line (output / error / skipped files), a tqdm bar. What it leaves out: the GPT-OSS
reasoning-effort draw and the context-length statistics. Needs the `bench` extra (openai).
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor

from openai import OpenAI
from tqdm import tqdm


def call_server(args, address: str, data: dict, max_tokens: int | None = None) -> dict:
    client = OpenAI(base_url=f"http://{address}/v1", api_key="None")
    regenerated: list[dict] = []
    for message in data["conversations"]:
        if message["role"] == "system":
            regenerated.append(message)
        elif message["role"] == "assistant":
            continue
        elif message["role"] == "user":
            regenerated.append(message)
            try:
                resp = client.chat.completions.create(
                    model=args.model,
                    messages=regenerated,
                    max_tokens=max_tokens or args.max_tokens,
                    temperature=args.temperature,
                    stream=False,
                )
            except Exception as exc:
                data["status"], data["error"] = "error", str(exc)
                return data
            regenerated.append({"role": "assistant", "content": resp.choices[0].message.content})
    data["conversations"] = regenerated
    data["status"] = "success"
    return data


def write(regen: dict, out, err) -> None:
    (err if regen["status"] == "error" else out).write(json.dumps(regen, ensure_ascii=False) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--server-address", nargs="+", required=True)
    parser.add_argument("--input-file-path", required=True)
    parser.add_argument("--output-file-path", required=True)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--temperature", type=float, default=0.7)
    args = parser.parse_args()
    with open(args.input_file_path, encoding="utf-8") as f:
        total = sum(1 for _ in f)
    servers = [
        a
        for a in args.server_address
        if call_server(args, a, {"conversations": [{"role": "user", "content": "Hello"}]}, 1)["status"] == "success"
    ]
    if not servers:
        raise SystemExit("No server address is available")
    error_path = args.output_file_path.replace(".jsonl", "_error.jsonl")
    with (
        open(args.input_file_path, encoding="utf-8") as inp,
        open(args.output_file_path, "w") as out,
        open(error_path, "w") as err,
    ):
        executor = ThreadPoolExecutor(max_workers=args.concurrency * len(servers))
        waiting: dict[str, list] = {a: [] for a in servers}
        pbar = tqdm(total=total, desc="Processing", file=sys.stderr)
        next_server = 0
        for line in inp:
            row = json.loads(line.strip())
            data = {"id": row["id"], "conversations": row["messages"]}
            address = servers[next_server]
            next_server = (next_server + 1) % len(servers)
            while len(waiting[address]) >= args.concurrency:  # the original polls the futures
                finished = False
                for future in list(waiting[address]):
                    if future.done():
                        write(future.result(), out, err)
                        waiting[address].remove(future)
                        finished = True
                if finished:
                    break
            waiting[address].append(executor.submit(call_server, args, address, data))
            pbar.update(1)
        for futures in waiting.values():
            for future in futures:
                write(future.result(), out, err)
        executor.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
