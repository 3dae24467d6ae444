#!/usr/bin/env python3
"""What recording costs the `intercept serve` binary beyond instructions: memory per
recorded call and system calls per call.

usage: record_cost.py <release dir> <json|stream> <serve|serve-dir> [calls] [--strace]

bench-upstream answers; 64 sessions are created through the control API (traces in
memory, or also in --trace-dir); loadgen sends 200 warmup calls at 4 connections, then
<calls> (20000 by default). Between the two it reads the sidecar's resident memory
(VmRSS) and its system-call counters (/proc/<pid>/io: syscr, syscw; every thread).
Raw bytes are the request and response of each recorded call, as compact JSON, read
back from the trace files (serve-dir) or the trace API (serve). Prints one JSON line:
RSS growth per call, raw bytes per call, their ratio, read and write system calls per
call. With --strace, `strace -f -c` is attached to the sidecar for the measured calls and
its table (system calls of every thread, by name) is printed to standard error. Build first: cargo build --release -p intercept-bench -p intercept-cli --bins
"""
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import (loadgen, make_sessions, ready_line, start_upstream, stop,  # noqa: E402
                      stop_upstream)


def proc_io(pid: int) -> dict:
    out = {}
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            k, v = line.split(":")
            out[k] = int(v)
    return out


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def main() -> None:
    rel, kind, target = sys.argv[1], sys.argv[2], sys.argv[3]
    use_strace = "--strace" in sys.argv
    argv = [a for a in sys.argv if a != "--strace"]
    calls = int(argv[4]) if len(argv) > 4 else 20000
    tmp = tempfile.mkdtemp(prefix="recordcost")
    up, upstream = start_upstream(rel)
    args = [f"{rel}/intercept", "serve", "--upstream", upstream, "--model", "bench", "--log", "warn"]
    if target == "serve-dir":
        os.makedirs(f"{tmp}/traces")
        args += ["--trace-dir", f"{tmp}/traces"]
    proxy = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
    try:
        ready = ready_line(proxy)
        control, token = ready["control_url"].rstrip("/"), ready["token"]
        auth = {"authorization": f"Bearer {token}", "content-type": "application/json"}
        secrets = f"{tmp}/secrets.json"
        url = make_sessions(control, token, 64, secrets)
        loadgen(rel, url, secrets, kind, 200)
        time.sleep(0.5)
        rss0, io0 = rss_kib(proxy.pid), proc_io(proxy.pid)
        tracer = None
        if use_strace:
            tracer = subprocess.Popen(["strace", "-f", "-c", "-p", str(proxy.pid)],
                                      stderr=subprocess.PIPE, text=True)
            time.sleep(1.0)
        loadgen(rel, url, secrets, kind, calls)
        time.sleep(0.5)
        if tracer:
            tracer.send_signal(2)
            sys.stderr.write(tracer.communicate(timeout=60)[1])
        rss1, io1 = rss_kib(proxy.pid), proc_io(proxy.pid)

        raw, records = 0, 0
        for i in range(64):
            req = urllib.request.Request(f"{control}/v1/sessions/bench-{i}/trace", headers=auth)
            with urllib.request.urlopen(req, timeout=120) as r:
                trace = json.loads(r.read())
            for c in trace["calls"]:
                records += 1
                for k in ("request", "response"):
                    raw += len(json.dumps(c[k], separators=(",", ":"), ensure_ascii=False).encode())
    finally:
        stop(proxy)
        stop_upstream(up)
    per_call = (rss1 - rss0) * 1024 / calls
    raw_per_call = raw / max(records, 1)
    print(json.dumps({
        "kind": kind, "target": target, "calls": calls, "records": records,
        "rss_kib_before": rss0, "rss_kib_after": rss1,
        "rss_bytes_per_call": round(per_call), "raw_bytes_per_call": round(raw_per_call),
        "rss_over_raw": round(per_call / raw_per_call, 2) if raw_per_call else None,
        "syscr_per_call": round((io1["syscr"] - io0["syscr"]) / calls, 2),
        "syscw_per_call": round((io1["syscw"] - io0["syscw"]) / calls, 2),
    }))


if __name__ == "__main__":
    main()
