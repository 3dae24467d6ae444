"""CPU per call of the in-process server against the `intercept` binary (docs/benchmarks.md).

Usage:
  python bench/inprocess_cpu.py --upstream URL --loadgen PATH --intercept PATH
                                [--connections 16] [--duration 10] [--warmup 2] [--rounds 3]

Each round runs the bench's JSON case (`loadgen`, closed loop, 2 KiB chat requests) twice,
against the same upstream (`bench-upstream`):
- `in-process`: an `intercept.Server` in this interpreter, one session, while a Python
  thread keeps the interpreter busy (a pure-Python loop that holds the GIL whenever it
  can). The CPU counted is that of every thread of the process but the busy one (read
  from /proc/self/task); the share of the server's threads (its event loops,
  `intercept-w<i>`, and the package's runtime, `intercept-rt`) is printed beside it.
- `binary`: `intercept serve`, one session created through its control API; the CPU
  counted is the whole process's.
Prints one line per run: requests per second and CPU microseconds per request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import threading
import time
import urllib.request

import intercept

TICK = os.sysconf("SC_CLK_TCK")


def _ticks(stat_path: str) -> int:
    with open(stat_path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def threads_cpu(skip: int) -> tuple[float, float]:
    """Seconds of CPU of this process's threads but `skip` (the busy thread), and of the
    server's threads alone (`intercept-w<i>` event loops, `intercept-rt` runtime)."""
    total = runtime = 0
    for tid in os.listdir("/proc/self/task"):
        if int(tid) == skip:
            continue
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            ticks = _ticks(f"/proc/self/task/{tid}/stat")
        except OSError:
            continue
        total += ticks
        if name.startswith(("intercept-rt", "intercept-w")):
            runtime += ticks
    return total / TICK, runtime / TICK


def process_cpu(pid: int) -> float:
    return _ticks(f"/proc/{pid}/stat") / TICK


def run_loadgen(args: argparse.Namespace, url: str, secret: str) -> dict:
    out = subprocess.run(
        [
            args.loadgen,
            "--url",
            f"{url}/chat/completions",
            "--secret",
            secret,
            "--connections",
            str(args.connections),
            "--duration",
            str(args.duration),
            "--warmup",
            str(args.warmup),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=args.duration + args.warmup + 120,
    )
    return json.loads(out.stdout)


def _requests(report: dict) -> int:
    """Successful requests of the whole run (the CPU is counted over the whole run)."""
    if report.get("errors"):
        raise RuntimeError(f"{report['errors']} failed requests: {report.get('error_kinds')}")
    return int(report["ok"])


async def in_process(args: argparse.Namespace) -> tuple[float, float, float]:
    stop = threading.Event()
    busy_tid: list[int] = []

    def busy() -> None:
        busy_tid.append(threading.get_native_id())
        x = 0
        while not stop.is_set():
            x = (x * 31 + 7) % 1_000_003

    t = threading.Thread(target=busy, daemon=True)
    t.start()
    while not busy_tid:
        time.sleep(0.001)
    try:
        async with intercept.Server() as ic:
            session = intercept.Session(id="cpu", model="policy", upstream=args.upstream)
            async with ic.acquire(session) as slot:
                env = slot.env
                loop = asyncio.get_running_loop()
                before = threads_cpu(busy_tid[0])
                t0 = time.monotonic()
                report = await loop.run_in_executor(
                    None, run_loadgen, args, env["OPENAI_BASE_URL"], env["OPENAI_API_KEY"]
                )
                wall = time.monotonic() - t0
                after = threads_cpu(busy_tid[0])
                cpu, rt = after[0] - before[0], after[1] - before[1]
    finally:
        stop.set()
        t.join()
    n = _requests(report) or 1
    return report.get("rps", n / wall), cpu / n * 1e6, rt / n * 1e6


def binary(args: argparse.Namespace) -> tuple[float, float]:
    proc = subprocess.Popen(
        [args.intercept, "serve", "--upstream", args.upstream, "--model", "policy", "--log", "warn"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline())
        req = urllib.request.Request(
            f"{ready['control_url']}/v1/sessions",
            data=json.dumps({"id": "cpu"}).encode(),
            headers={"authorization": f"Bearer {ready['token']}", "content-type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            session = json.loads(r.read())
        env = session["env"]
        before = process_cpu(proc.pid)
        t0 = time.monotonic()
        report = run_loadgen(args, env["OPENAI_BASE_URL"], env["OPENAI_API_KEY"])
        wall = time.monotonic() - t0
        cpu = process_cpu(proc.pid) - before
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    n = _requests(report) or 1
    return report.get("rps", n / wall), cpu / n * 1e6


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--upstream", required=True)
    p.add_argument("--loadgen", required=True)
    p.add_argument("--intercept", required=True)
    p.add_argument("--connections", type=int, default=16)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=0.0)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    for r in range(args.rounds):
        rps, us, rt = asyncio.run(in_process(args))
        print(
            f"round {r}: in-process  {rps:9.0f} req/s  {us:6.1f} us CPU/req "
            f"({rt:.1f} in the server's threads)",
            flush=True,
        )
        rps, us = binary(args)
        print(f"round {r}: binary      {rps:9.0f} req/s  {us:6.1f} us CPU/req", flush=True)


if __name__ == "__main__":
    main()
