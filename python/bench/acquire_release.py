"""Times `acquire` + `release` of one session from Python (docs/benchmarks.md).

Usage: python bench/acquire_release.py [N]. Prints microseconds per acquire+release,
the median of 5 rounds of N (default 20000), for a fresh Session each time (the Session
construction is timed separately).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time

import intercept


async def main(n: int) -> None:
    async with intercept.Server() as ic:
        sessions = [intercept.Session(id=f"s{i}", model="m", upstream="http://127.0.0.1:9/v1") for i in range(n)]
        t0 = time.perf_counter()
        for i in range(n):
            intercept.Session(id=f"t{i}", model="m", upstream="http://127.0.0.1:9/v1")
        build = (time.perf_counter() - t0) / n * 1e6
        rounds = []
        for _ in range(5):
            sessions = [intercept.Session(id=f"s{i}", model="m", upstream="http://127.0.0.1:9/v1") for i in range(n)]
            t0 = time.perf_counter()
            for s in sessions:
                slot = await ic.acquire(s)
                await slot.release()
            rounds.append((time.perf_counter() - t0) / n * 1e6)
        ctx = []
        sessions = [intercept.Session(id=f"c{i}", model="m", upstream="http://127.0.0.1:9/v1") for i in range(n)]
        t0 = time.perf_counter()
        for s in sessions:
            async with ic.acquire(s):
                pass
        ctx.append((time.perf_counter() - t0) / n * 1e6)
    print(f"Session(): {build:.1f} us; acquire+release: median {statistics.median(rounds):.1f} us (rounds {', '.join(f'{r:.1f}' for r in rounds)}); async with acquire: {ctx[0]:.1f} us")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 20000))
