#!/usr/bin/env python3
"""Instructions per call under callgrind, the protocol of docs/benchmarks.md.

usage: callgrind.py <release dir> <json|stream|agentic> <target> [calls]

target:
  count | trace | episode   bench-proxy --threads 1 --sessions 64 --record <target>
  serve | serve-dir         the `intercept serve` binary, 64 sessions created through its
                            control API, traces in memory (serve) or also in --trace-dir

bench-upstream answers; loadgen sends 200 warmup calls at 4 connections, the counters are
zeroed, then it sends <calls> (2000 JSON, 1000 streamed by default). Prints one JSON line.
The agentic kind runs agentgen instead: a warmup wave of 16 rollouts, then one measured
wave of 16 rollouts × 40 turns (640 calls, contexts growing to ~100 KB).
Build first: cargo build --release -p intercept-bench -p intercept-cli --bins
"""
import glob
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import (loadgen, make_sessions, ready_line, start_upstream, stop,  # noqa: E402
                      stop_upstream)


def main() -> None:
    rel, kind, target = sys.argv[1], sys.argv[2], sys.argv[3]
    default = {"json": 2000, "stream": 1000, "agentic": 640}[kind]
    calls = int(sys.argv[4]) if len(sys.argv) > 4 else default
    tmp = tempfile.mkdtemp(prefix="callgrind")
    up, upstream = start_upstream(rel)
    secrets = f"{tmp}/secrets.json"
    grind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.out.%p"]
    in_process = target in ("count", "trace", "episode")
    if in_process:
        args = [f"{rel}/bench-proxy", "--upstream", upstream, "--threads", "1", "--sessions", "64",
                "--record", target, "--secrets-file", secrets]
    elif target in ("serve", "serve-dir"):
        args = [f"{rel}/intercept", "serve", "--upstream", upstream, "--model", "bench", "--log", "warn"]
        if target == "serve-dir":
            os.makedirs(f"{tmp}/traces")
            args += ["--trace-dir", f"{tmp}/traces"]
    else:
        stop_upstream(up)
        sys.exit(f"unknown target {target!r}")
    # bench-proxy stops when its standard input closes; intercept serve reads none.
    stdin = subprocess.PIPE if in_process else subprocess.DEVNULL
    proxy = subprocess.Popen(grind + args, stdin=stdin, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
    try:
        ready = ready_line(proxy)
        if in_process:
            url = ready["base_url"].rstrip("/") + "/v1/chat/completions"
        else:
            control, token = ready["control_url"].rstrip("/"), ready["token"]
            url = make_sessions(control, token, 64, secrets)
        pid = glob.glob(f"{tmp}/cg.out.*")[0].rsplit(".", 1)[1]
        if kind == "agentic":
            agentic(rel, url, secrets, 0, 5)
            subprocess.run(["callgrind_control", "-z", pid], capture_output=True, check=True)
            agentic(rel, url, secrets, 16, calls // 16)
        else:
            loadgen(rel, url, secrets, kind, 200)
            subprocess.run(["callgrind_control", "-z", pid], capture_output=True, check=True)
            loadgen(rel, url, secrets, kind, calls)
        subprocess.run(["callgrind_control", "-d", pid], capture_output=True, check=True)
    finally:
        stop(proxy)
        stop_upstream(up)
    total = 0
    for name in glob.glob(f"{tmp}/cg.out.*.1"):
        with open(name) as f:
            for line in f:
                if line.startswith(("totals:", "summary:")):
                    total = int(line.split()[1])
                    break
    print(json.dumps({"kind": kind, "target": target, "calls": calls,
                      "instructions_per_call": round(total / calls), "profile": tmp}))


def agentic(rel: str, url: str, secrets: str, first: int, turns: int) -> None:
    """One wave of 16 rollouts of `turns` turns, from rollout `first`."""
    subprocess.run([f"{rel}/agentgen", "--url", url, "--secrets-file", secrets, "--threads", "1",
                    "--sessions", "16", "--turns", str(turns), "--waves", "1",
                    "--first-rollout", str(first), "--duration", "600", "--timeout", "600"],
                   capture_output=True, check=True)


if __name__ == "__main__":
    main()
