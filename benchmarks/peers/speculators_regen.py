"""Baseline: the structure of speculators' `scripts/response_regeneration/script.py`, written for this benchmark.

What it keeps of the original (vllm-project/speculators): one aiohttp ClientSession with an
unlimited TCPConnector, `--concurrency` worker coroutines fed by a bounded asyncio.Queue, a
retry wrapper with exponential backoff around each chat-completions POST (`return_token_ids`),
each answer turned into a boundary sample (input_ids = prompt + completion ids, loss_mask) and
appended as one JSONL line (flushed) per conversation, a tqdm bar, an errors file, rows streamed
through `datasets.load_dataset(..., streaming=True)` (here the local JSONL file instead of a Hub
preset). What it leaves out: speculators' own package imports and tool-call splicing (the
benchmark prompts have no tools). Needs the `bench` extra (aiohttp, datasets).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys

import aiohttp
from datasets import load_dataset
from tqdm import tqdm

RETRYABLE = {408, 409, 425, 429}


class InvalidResponse(Exception):
    pass


async def post_chat(session: aiohttp.ClientSession, endpoint: str, payload: dict, max_retries: int) -> dict:
    delay = 1.0
    for attempt in range(max_retries + 1):
        try:
            async with session.post(endpoint, json=payload) as response:
                if not response.ok:
                    body = (await response.text())[:500]
                    message = f"HTTP {response.status} from {endpoint}: {body}"
                    if response.status >= 500 or response.status in RETRYABLE:
                        raise RuntimeError(message)
                    raise InvalidResponse(message)
                return await response.json()
        except InvalidResponse:
            raise
        except Exception:
            if attempt == max_retries:
                raise
            await asyncio.sleep(delay * (1 + random.random()))
            delay *= 2
    raise AssertionError("unreachable")


def boundary_sample(data: dict, conv_id: str, index: int, prefix: list, endpoint: str, params: dict) -> tuple:
    choice = data["choices"][0]
    message = choice["message"]
    content = message.get("content")
    if not content:
        raise ValueError("empty assistant generation")
    prompt_ids = data.get("prompt_token_ids")
    completion_ids = choice.get("token_ids")
    if not prompt_ids or not completion_ids:
        raise ValueError("endpoint returned no token ids; it must support return_token_ids")
    input_ids = [*prompt_ids, *completion_ids]
    loss_mask = [0] * len(prompt_ids) + [1] * len(completion_ids)
    assistant = {"role": "assistant", "content": content}
    sample = {
        "id": f"{conv_id}_gen{index}",
        "primary_id": conv_id,
        "input_ids": input_ids,
        "loss_mask": loss_mask,
        "conversations": [*prefix, assistant],
        "metadata": {
            "finish_reason": choice.get("finish_reason"),
            "usage": data.get("usage") or {},
            "endpoint": endpoint,
            "sampling_params": params,
        },
    }
    return sample, assistant


async def worker(session, queue, args, out_fh, err_fh, progress, stats) -> None:
    while True:
        item = await queue.get()
        if item is None:
            queue.task_done()
            return
        samples: list[dict] = []
        try:
            prefix: list[dict] = []
            for turn in item["turns"]:
                prefix.append(turn)
                if turn["role"] != "user":
                    continue
                payload = {
                    "model": args.model,
                    "messages": prefix,
                    "max_tokens": args.max_tokens,
                    "return_token_ids": True,
                }
                data = await post_chat(session, args.endpoint, payload, args.max_retries)
                sample, assistant = boundary_sample(data, item["id"], len(samples), prefix, args.endpoint, {})
                samples.append(sample)
                prefix = [*prefix, assistant]
            for sample in samples:
                out_fh.write(json.dumps(sample, ensure_ascii=False) + "\n")
            out_fh.flush()
            stats["ok"] += 1
        except Exception as exc:
            err_fh.write(json.dumps({"id": item["id"], "metadata": {"error": repr(exc)}}) + "\n")
            err_fh.flush()
            stats["errors"] += 1
        finally:
            progress.set_postfix(ok=stats["ok"], errors=stats["errors"], refresh=False)
            progress.update(1)
            queue.task_done()


async def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--model", default=None)
    parser.add_argument("--input", required=True)
    parser.add_argument("--outfile", required=True)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=8192)
    parser.add_argument("--max-retries", type=int, default=3)
    args = parser.parse_args()
    if args.model is None:  # auto-detect, as the original does
        models = args.endpoint.replace("/v1/chat/completions", "/v1/models")
        async with aiohttp.ClientSession() as s, s.get(models) as r:
            args.model = (await r.json())["data"][0]["id"]
    queue: asyncio.Queue = asyncio.Queue(maxsize=args.concurrency * 4)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=90, sock_read=None)
    connector = aiohttp.TCPConnector(limit=None, force_close=False, enable_cleanup_closed=True)
    headers = {"Accept": "application/json", "Content-Type": "application/json"}
    async with aiohttp.ClientSession(timeout=timeout, connector=connector, headers=headers) as session:
        with (
            open(args.outfile, "a", encoding="utf-8") as out,
            open(args.outfile + ".errors", "a", encoding="utf-8") as err,
            tqdm(desc="Generating responses", unit="sample", file=sys.stderr, dynamic_ncols=True) as progress,
        ):
            stats = {"ok": 0, "errors": 0}
            workers = [
                asyncio.create_task(worker(session, queue, args, out, err, progress, stats))
                for _ in range(args.concurrency)
            ]
            for row in load_dataset("json", data_files=args.input, split="train", streaming=True):
                turns = [
                    {"role": m["role"], "content": m["content"]}
                    for m in row["messages"]
                    if m.get("role") in ("system", "user") and m.get("content")
                ]
                await queue.put({"id": str(row["id"]), "turns": turns})
            for _ in workers:
                await queue.put(None)
            await asyncio.gather(*workers)
    print(json.dumps(stats), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
