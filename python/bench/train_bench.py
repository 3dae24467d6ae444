"""What training through `intercept.verifiers` costs next to verifiers 0.4's own interception
server, both with verifiers' train client (`TrainClientConfig`: Qwen3's renderer, the
engine's `POST /inference/v1/generate`), measured in one run. Run by hand:

    INTERCEPT_QWEN3_TOKENIZER=/path/to/qwen3 python bench/train_bench.py \\
        [--rollouts 16] [--turns 4] [--rounds 3] [--concurrent 64]

The engine is intercept's mock (`intercept.testing`, so a wheel built with the `testing`
feature) with Qwen3's tokenizer, in a child process: this process's CPU time is the
harness clients, the interception and the train client (rendering, bridging, parsing).
Each round runs `--rollouts` concurrent rollouts (verifiers `RolloutSession`s acquired on
the interception) of `--turns` Chat Completions calls, first through verifiers'
`InterceptionServer`, then through `intercept.verifiers.InterceptionServer`. A rollout
alternates a request for a tool (the engine calls it) and the tool's result (the engine
answers with text), so every second turn bridges on tool results and every other on a new
user query; reasoning is off (`enable_thinking=False`). Reported per call: wall time and
process CPU (all threads), and their ratio; each side's trace is checked to hold every
turn with its tokens.

Then the memory of `--concurrent` rollouts in flight at once, each side in a fresh child
process: the process's resident set after its imports, and its peak while the rollouts
run (sampled every 20 ms from /proc/self/status), both sides with one renderer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

ENGINE_PROCESS = """
import asyncio, sys
from intercept.testing import MockUpstream
async def main():
    m = await MockUpstream.start(tokenizer=sys.argv[1])
    print(m.base_url, flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""

TOOLS = [{"type": "function", "function": {"name": "search", "description": "Searches the notes.", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]


def tokenizer_folder() -> str:
    folder = os.environ.get("INTERCEPT_QWEN3_TOKENIZER", "")
    if not (Path(folder) / "tokenizer.json").is_file():
        sys.exit("set INTERCEPT_QWEN3_TOKENIZER to a folder holding Qwen3's tokenizer.json and tokenizer_config.json")
    return folder


def sessions(engine: str, tokenizer: str, n: int, tag: str) -> list[Any]:
    from vf_train import make_train_session

    return [make_train_session(engine, tokenizer, f"{tag}-{i}", thinking=False) for i in range(n)]


async def conversation(client: httpx.AsyncClient, url: str, key: str, turns: int, i: int) -> None:
    """`turns` calls: ask for the tool, answer it, ask again, ..."""
    history: list[dict[str, Any]] = [{"role": "user", "content": f"task {i}: use a tool to find the notes on " + "tokens and templates " * 20}]
    for t in range(turns):
        r = await client.post(url + "/chat/completions", json={"model": "m", "messages": history, "tools": TOOLS}, headers={"Authorization": f"Bearer {key}"})
        if r.status_code != 200:
            raise RuntimeError(f"turn {t} of rollout {i}: {r.status_code} {r.text}")
        message = r.json()["choices"][0]["message"]
        history.append(message)
        if message.get("tool_calls"):
            for call in message["tool_calls"]:
                history.append({"role": "tool", "tool_call_id": call["id"], "content": f"result {t}: " + "note text " * 30})
        else:
            history.append({"role": "user", "content": f"continue {t}: use a tool again"})


def interception(kind: str) -> Any:
    if kind == "verifiers":
        from verifiers.v1.interception import InterceptionServer

        return InterceptionServer()
    import intercept.verifiers as iv

    return iv.InterceptionServer()


async def run(kind: str, engine: str, tokenizer: str, rollouts: int, turns: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds) for `rollouts` x `turns` calls."""
    limits = httpx.Limits(max_connections=rollouts * 2, max_keepalive_connections=rollouts * 2)
    batch = sessions(engine, tokenizer, rollouts, kind)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client, interception(kind) as ic:

        async def one(s: Any, i: int) -> None:
            async with ic.acquire(s) as (base_url, model_secret, _state):
                await conversation(client, base_url + "/v1", model_secret, turns, i)

        w0, c0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(one(s, i) for i, s in enumerate(batch)))
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    for s in batch:
        t = s.trace
        assert t.num_turns == turns and len(t.calls) == turns, (kind, t.num_turns, len(t.calls), [c.error for c in t.calls])
        assert all(n.token_ids is not None and len(n.token_ids) for n in t.nodes if n.sampled), kind
    return wall, cpu


def rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def memory(kind: str, engine: str, tokenizer: str, concurrent: int, turns: int) -> dict[str, Any]:
    """The resident set of this (fresh) process: after its imports, and its peak while
    `concurrent` rollouts run at once."""
    import verifiers.v1.clients.train  # noqa: F401 - imported before the baseline on both sides
    import verifiers.v1.interception  # noqa: F401

    import intercept.verifiers  # noqa: F401

    base = rss_kb()
    peak = base
    done = asyncio.Event()

    async def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, rss_kb())
            await asyncio.sleep(0.02)

    sampler = asyncio.create_task(sample())
    wall, _ = await run(kind, engine, tokenizer, concurrent, turns)
    done.set()
    await sampler
    return {"kind": kind, "base_mb": base / 1024, "peak_mb": max(peak, rss_kb()) / 1024, "wall_s": wall}


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rollouts", type=int, default=16)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrent", type=int, default=64)
    ap.add_argument("--memory", choices=["verifiers", "intercept"], help=argparse.SUPPRESS)
    ap.add_argument("--engine", help=argparse.SUPPRESS)
    args = ap.parse_args()
    tokenizer = tokenizer_folder()
    if args.memory:
        print(json.dumps(await memory(args.memory, args.engine, tokenizer, args.concurrent, args.turns)))
        return
    # Run from the bench folder: `-c` puts the working directory first on sys.path, and
    # python/ holds the package's sources without its native module.
    proc = subprocess.Popen([sys.executable, "-c", ENGINE_PROCESS, tokenizer], stdout=subprocess.PIPE, text=True, cwd=HERE)
    try:
        assert proc.stdout is not None
        engine = proc.stdout.readline().strip()
        calls = args.rollouts * args.turns
        results: dict[str, list[tuple[float, float]]] = {"verifiers": [], "intercept": []}
        for kind in results:  # warm both paths up (the renderer loads once per process)
            await run(kind, engine, tokenizer, 2, 2)
        for _ in range(args.rounds):
            for kind in results:
                results[kind].append(await run(kind, engine, tokenizer, args.rollouts, args.turns))
        med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in results.items()}
        print(f"{args.rollouts} train rollouts x {args.turns} turns = {calls} calls per run, median of {args.rounds} rounds; per call:")
        for k, (w, c) in med.items():
            print(f"  {k:10s} wall {w / calls * 1e3:7.3f} ms   cpu {c / calls * 1e3:7.3f} ms")
        (vw, vc), (iw, icpu) = med["verifiers"], med["intercept"]
        print(f"  ratio verifiers/intercept: wall {vw / iw:.2f}x  cpu {vc / icpu:.2f}x")
        mem = []
        for kind in ("verifiers", "intercept"):
            out = subprocess.run(
                [sys.executable, __file__, "--memory", kind, "--engine", engine, "--concurrent", str(args.concurrent), "--turns", str(args.turns)],
                capture_output=True, text=True, check=True,
            )
            mem.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"{args.concurrent} concurrent train rollouts x {args.turns} turns, a fresh process each:")
        for m in mem:
            print(f"  {m['kind']:10s} RSS after imports {m['base_mb']:7.1f} MB, peak {m['peak_mb']:7.1f} MB (+{m['peak_mb'] - m['base_mb']:.1f} MB), wall {m['wall_s']:.2f} s")
        v, i = mem
        print(f"  ratio verifiers/intercept: peak {v['peak_mb'] / i['peak_mb']:.2f}x, growth {(v['peak_mb'] - v['base_mb']) / max(i['peak_mb'] - i['base_mb'], 1e-9):.2f}x")
        print(json.dumps({"cpu": med, "memory": mem}))
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    os.environ.setdefault("MOCK_ENGINE_KEY", "unused")
    asyncio.run(main())
