"""What `intercept.verifiers` costs per model call next to verifiers 0.4's own interception
server, measured in one run, in-process from Python.

    python bench/verifiers_bench.py [--rollouts 32] [--turns 8] [--rounds 3]

The scripted model of `tests/vf_support.py` runs in a child process (so this process's CPU
time is the harness clients plus the interception). Each round runs, in turn: the clients
straight to the model (the baseline), through verifiers' `InterceptionServer`, and through
`intercept.verifiers.InterceptionServer`: `--rollouts` concurrent rollouts (verifiers
`RolloutSession`s acquired on the interception) of `--turns` chat turns each, the
conversation growing every turn. Reported per call: wall time and process CPU (all
threads, intercept's Rust ones included), raw and net of the baseline; and each side's
trace is checked to hold every turn.

Then time to first token of one streamed turn whose model spaces its events by
`SLOW_CHUNK` s: verifiers reads the provider stream whole before serving it; intercept
relays it.
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

from vf_support import SLOW_CHUNK, make_session  # noqa: E402

MODEL_PROCESS = """
import asyncio, sys
sys.path.insert(0, sys.argv[1])
from vf_support import ScriptedModel
async def main():
    m = await ScriptedModel.start()
    print(m.base_url, flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


def session(upstream: str, i: int) -> Any:
    return make_session(upstream, i)


async def conversation(client: httpx.AsyncClient, url: str, key: str, turns: int, i: int) -> None:
    history: list[dict[str, Any]] = [{"role": "user", "content": f"task {i} " + "lorem ipsum " * 50}]
    for t in range(turns):
        r = await client.post(url + "/chat/completions", json={"model": "m", "messages": history}, headers={"Authorization": f"Bearer {key}"})
        r.raise_for_status()
        history.append(r.json()["choices"][0]["message"])
        history.append({"role": "user", "content": f"continue {t} " + "tool output " * 40})


async def run(kind: str, upstream: str, rollouts: int, turns: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds) for `rollouts` x `turns` calls."""
    limits = httpx.Limits(max_connections=rollouts * 2, max_keepalive_connections=rollouts * 2)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        if kind == "direct":
            w0, c0 = time.perf_counter(), time.process_time()
            await asyncio.gather(*(conversation(client, upstream, "k", turns, i) for i in range(rollouts)))
            return time.perf_counter() - w0, time.process_time() - c0
        if kind == "verifiers":
            from verifiers.v1.interception import InterceptionServer

            ic: Any = InterceptionServer()
        else:
            import intercept.verifiers as iv

            ic = iv.InterceptionServer()
        sessions = [session(upstream, i) for i in range(rollouts)]
        async with ic:

            async def one(s: Any, i: int) -> None:
                async with ic.acquire(s) as (base_url, model_secret, _state):
                    await conversation(client, base_url + "/v1", model_secret, turns, i)

            w0, c0 = time.perf_counter(), time.process_time()
            await asyncio.gather(*(one(s, i) for i, s in enumerate(sessions)))
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        for s in sessions:
            assert s.trace.num_turns == turns and len(s.trace.calls) == turns, (kind, s.trace.num_turns, len(s.trace.calls))
        return wall, cpu


async def ttft(kind: str, upstream: str) -> tuple[float, float]:
    """(time to the first content event, time to the end) of one slow streamed turn."""
    if kind == "verifiers":
        from verifiers.v1.interception import InterceptionServer

        ic: Any = InterceptionServer()
    else:
        import intercept.verifiers as iv

        ic = iv.InterceptionServer()
    async with ic, httpx.AsyncClient(timeout=60) as client:
        async with ic.acquire(session(upstream, 0)) as (base_url, key, _state):
            # The harness asks for usage, so both sides get the same upstream events (intercept
            # asks for it on every streamed chat call).
            body = {"model": "m", "messages": [{"role": "user", "content": "slow please"}], "stream": True, "stream_options": {"include_usage": True}}
            t0 = time.perf_counter()
            first = None
            async with client.stream("POST", base_url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}) as r:
                async for line in r.aiter_lines():
                    if first is None and line.startswith("data:") and '"content": "r' in line.replace('"content":"r', '"content": "r'):
                        first = time.perf_counter() - t0
            return first or float("nan"), time.perf_counter() - t0


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rollouts", type=int, default=32)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    proc = subprocess.Popen([sys.executable, "-c", MODEL_PROCESS, str(HERE.parent / "tests")], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        upstream = proc.stdout.readline().strip()
        calls = args.rollouts * args.turns
        results: dict[str, list[tuple[float, float]]] = {"direct": [], "verifiers": [], "intercept": []}
        await run("intercept", upstream, 4, 2)  # warm both paths up
        await run("verifiers", upstream, 4, 2)
        for _ in range(args.rounds):
            for kind in results:
                results[kind].append(await run(kind, upstream, args.rollouts, args.turns))
        med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in results.items()}
        print(f"{args.rollouts} rollouts x {args.turns} turns = {calls} calls per run, median of {args.rounds} rounds; per call:")
        for k, (w, c) in med.items():
            print(f"  {k:10s} wall {w / calls * 1e3:7.3f} ms   cpu {c / calls * 1e3:7.3f} ms")
        (vw, vc), (iw, icpu), (dw, dc) = med["verifiers"], med["intercept"], med["direct"]
        print(f"  ratio verifiers/intercept: wall {vw / iw:.2f}x  cpu {vc / icpu:.2f}x")
        print(f"  net of the direct baseline: verifiers wall {(vw - dw) / calls * 1e3:.3f} ms cpu {(vc - dc) / calls * 1e3:.3f} ms; "
              f"intercept wall {(iw - dw) / calls * 1e3:.3f} ms cpu {(icpu - dc) / calls * 1e3:.3f} ms; "
              f"ratio wall {(vw - dw) / max(iw - dw, 1e-9):.2f}x cpu {(vc - dc) / max(icpu - dc, 1e-9):.2f}x")
        for kind in ("verifiers", "intercept"):
            first, total = await ttft(kind, upstream)
            print(f"  streamed turn, events {SLOW_CHUNK}s apart: {kind:9s} first token {first * 1e3:7.1f} ms, end {total * 1e3:7.1f} ms")
        print(json.dumps({k: v for k, v in med.items()}))
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    os.environ.setdefault("SCRIPTED_MODEL_KEY", "unused")
    asyncio.run(main())
