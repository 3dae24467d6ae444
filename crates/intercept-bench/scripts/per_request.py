#!/usr/bin/env python3
"""What one request costs the proxy, beside nginx in the same run: system calls, context
switches, user and system CPU, per request.

usage: per_request.py <release dir> [--cases json16,json64,stream16] [--targets serve-dir,nginx]
                      [--seconds 8] [--strace-requests 20000] [--no-strace] [--no-perf]
                      [--unpinned] [--json FILE]

targets (each may be followed by @DIR: that target's binaries from another release folder,
e.g. serve-dir@target/baseline, to set two builds side by side in one run):
  serve-dir   the `intercept serve` binary with --trace-dir (as users run it)
  serve       the same without a trace folder (traces in memory)
  proxy       bench-proxy (records counted and dropped: proxying alone)
  nginx       nginx, one worker, upstream keepalive (the driver's configuration)

bench-upstream answers. With taskset (unless --unpinned) the proxy runs alone on core 0,
loadgen and the upstream on core 1. Each target serves 1000 sessions (intercept) with
2 KiB chat bodies. For each case and target, three passes of the same load:
  1. clean: loadgen for --seconds; req/s, and from /proc the proxy's user and system CPU
     (/proc/<pid>/stat of the process, nginx's master and worker) and its context
     switches (voluntary and not, /proc/<pid>/task/*/status, every thread);
  2. perf stat -e task-clock,context-switches,cpu-migrations,page-faults attached to the
     proxy for the same load (software events: what a VM without PMU gives);
  3. strace -f -c attached for --strace-requests requests: system calls per request, by
     name (strace slows the proxy, not the count of its calls).
Prints a Markdown table per case and writes every figure to --json (default
target/bench/per_request.json). Needs nginx (apt-get install nginx), strace and perf for
their columns; a column whose tool is missing is left empty.
Build first: cargo build --release -p intercept-bench -p intercept-cli --bins
"""
import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import make_sessions, ready_line, stop  # noqa: E402

CASES = {
    "json16": ("json c16", False, 16),
    "json64": ("json c64", False, 64),
    "stream16": ("stream c16", True, 16),
}
SESSIONS = 1000
HZ = os.sysconf("SC_CLK_TCK")


def pinned(core: int, args: list, unpinned: bool) -> list:
    if unpinned or not shutil.which("taskset"):
        return args
    return ["taskset", "-c", str(core)] + args


def children(pid: int) -> list:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if int(stat[stat.rfind(")") + 2:].split()[1]) == pid:
            out.append(int(entry))
    return out


def snapshot(pids: list) -> dict:
    """utime, stime (s) and context switches of every process in pids, all threads."""
    user = system = vol = invol = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        user += int(fields[11]) / HZ
        system += int(fields[12]) / HZ
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/status") as f:
                    for line in f:
                        if line.startswith("voluntary_ctxt_switches"):
                            vol += int(line.split()[1])
                        elif line.startswith("nonvoluntary_ctxt_switches"):
                            invol += int(line.split()[1])
            except OSError:
                pass
    return {"user": user, "system": system, "vol": vol, "invol": invol}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int) -> None:
    for _ in range(250):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"nothing listens on {port}")


NGINX = """worker_processes {workers};
daemon off;
master_process on;
pid {p}/nginx.pid;
error_log {p}/error.log warn;
events {{ worker_connections 20000; }}
http {{
  access_log off;
  client_body_temp_path {p}/client_body;
  proxy_temp_path {p}/proxy;
  fastcgi_temp_path {p}/fastcgi;
  uwsgi_temp_path {p}/uwsgi;
  scgi_temp_path {p}/scgi;
  keepalive_requests 1000000;
  keepalive_timeout 120s;
  client_max_body_size 0;
  client_body_buffer_size 1m;
  upstream model {{ server {up}; keepalive 256; keepalive_requests 1000000; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{ proxy_pass http://model; proxy_http_version 1.1;
      proxy_set_header Connection ""; proxy_buffering off; }}
  }}
}}
"""


class Target:
    """A proxy under measurement: its processes, its URL, its secrets file."""

    def __init__(self, spec, rel, upstream, tmp, unpinned):
        name, _, other = spec.partition("@")
        if other:
            rel = os.path.abspath(other)
        self.name, self.label, self.proc, self.pids = name, spec, None, []
        secrets = f"{tmp}/secrets-{name}.json"
        if name == "nginx":
            prefix = f"{tmp}/nginx"
            os.makedirs(prefix, exist_ok=True)
            port = free_port()
            up = upstream.split("//", 1)[1].split("/", 1)[0]
            workers = "auto" if unpinned else "1"
            with open(f"{prefix}/nginx.conf", "w") as f:
                f.write(NGINX.format(p=prefix, up=up, port=port, workers=workers))
            self.proc = subprocess.Popen(pinned(0, ["nginx", "-p", prefix, "-c", f"{prefix}/nginx.conf"],
                                                unpinned), stdin=subprocess.DEVNULL)
            wait_port(port)
            time.sleep(0.2)
            self.url = f"http://127.0.0.1:{port}/v1/chat/completions"
            with open(secrets, "w") as f:
                json.dump(["bench"], f)
            self.pids = [self.proc.pid] + children(self.proc.pid)
        elif name == "proxy":
            self.proc = subprocess.Popen(
                pinned(0, [f"{rel}/bench-proxy", "--upstream", upstream, "--record", "count",
                           "--sessions", str(SESSIONS), "--secrets-file", secrets], unpinned),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            ready = ready_line(self.proc)
            self.url = ready["base_url"].rstrip("/") + "/v1/chat/completions"
            self.pids = [self.proc.pid]
        else:
            args = [f"{rel}/intercept", "serve", "--upstream", upstream, "--model", "bench",
                    "--log", "warn"]
            if name == "serve-dir":
                traces = tempfile.mkdtemp(prefix="traces", dir=tmp)
                args += ["--trace-dir", traces]
            self.proc = subprocess.Popen(pinned(0, args, unpinned), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.PIPE, text=True)
            ready = ready_line(self.proc)
            self.url = make_sessions(ready["control_url"].rstrip("/"), ready["token"],
                                     SESSIONS, secrets)
            self.pids = [self.proc.pid]
        self.secrets = secrets

    def stop(self):
        if self.name == "nginx":
            self.proc.send_signal(signal.SIGQUIT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        elif self.name == "proxy":
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        else:
            stop(self.proc)


def loadgen(rel, target, stream, conns, seconds, requests, unpinned):
    args = [f"{rel}/loadgen", "--url", target.url, "--secrets-file", target.secrets,
            "--connections", str(conns), "--duration", str(seconds)]
    if requests:
        args += ["--requests", str(requests)]
    if stream:
        args.append("--stream")
    out = subprocess.run(pinned(1, args, unpinned), capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def ok_requests(report) -> int:
    return int(report["ok"])


def strace_table(text: str) -> dict:
    calls = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1] != "total":
            name = parts[-1]
            try:
                # % time, seconds, usecs/call, calls, [errors], syscall
                calls[name] = int(parts[3])
            except ValueError:
                continue
    return calls


def perf_table(text: str) -> dict:
    out = {}
    for line in text.splitlines():
        parts = line.split()
        for event in ("task-clock", "context-switches", "cpu-migrations", "page-faults"):
            if event in parts:
                try:
                    out[event] = float(parts[0].replace(",", ""))
                except ValueError:
                    pass
    return out


def measure(args, rel, target, case):
    label, stream, conns = CASES[case]
    loadgen(rel, target, stream, conns, 1.5, None, args.unpinned)  # warmup
    pids = target.pids
    before = snapshot(pids)
    report = loadgen(rel, target, stream, conns, args.seconds, None, args.unpinned)
    after = snapshot(pids)
    n = max(ok_requests(report), 1)
    row = {
        "case": label, "target": target.label, "requests": n,
        "rps": report["rps"],
        "p50_us": report["latency_us"]["p50"],
        "p99_us": report["latency_us"]["p99"],
        "user_us": (after["user"] - before["user"]) * 1e6 / n,
        "system_us": (after["system"] - before["system"]) * 1e6 / n,
        "vol_cs": (after["vol"] - before["vol"]) / n,
        "invol_cs": (after["invol"] - before["invol"]) / n,
    }
    row["cpu_us"] = row["user_us"] + row["system_us"]
    if not args.no_perf and shutil.which("perf"):
        perf = subprocess.Popen(["perf", "stat", "-e",
                                 "task-clock,context-switches,cpu-migrations,page-faults",
                                 "-p", ",".join(map(str, pids))],
                                stderr=subprocess.PIPE, text=True)
        time.sleep(0.3)
        rep = loadgen(rel, target, stream, conns, args.seconds, None, args.unpinned)
        perf.send_signal(signal.SIGINT)
        table = perf_table(perf.communicate(timeout=60)[1])
        m = max(ok_requests(rep), 1)
        row["perf"] = {k: v / m for k, v in table.items()}
        row["perf_task_clock_us"] = table.get("task-clock", 0.0) * 1e3 / m
        row["perf_cs"] = table.get("context-switches", 0.0) / m
    if not args.no_strace and shutil.which("strace"):
        cmd = ["strace", "-f", "-c"]
        for pid in pids:
            cmd += ["-p", str(pid)]
        tracer = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        time.sleep(1.0)
        rep = loadgen(rel, target, stream, conns, 600, args.strace_requests, args.unpinned)
        time.sleep(0.3)
        tracer.send_signal(signal.SIGINT)
        calls = strace_table(tracer.communicate(timeout=120)[1])
        m = max(ok_requests(rep), 1)
        row["syscalls"] = {k: round(v / m, 3) for k, v in sorted(calls.items(), key=lambda kv: -kv[1])}
        row["syscalls_total"] = sum(calls.values()) / m
    return row


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("rel")
    p.add_argument("--cases", default="json16,json64,stream16")
    p.add_argument("--targets", default="serve-dir,nginx")
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--strace-requests", type=int, default=20000)
    p.add_argument("--no-strace", action="store_true")
    p.add_argument("--no-perf", action="store_true")
    p.add_argument("--unpinned", action="store_true")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    rel = os.path.abspath(args.rel)
    tmp = tempfile.mkdtemp(prefix="perreq")
    up = subprocess.Popen(pinned(1, [f"{rel}/bench-upstream"], args.unpinned),
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    upstream = json.loads(up.stdout.readline())["base_url"]
    rows = []
    try:
        for case in args.cases.split(","):
            for name in args.targets.split(","):
                if name.startswith("nginx") and not shutil.which("nginx"):
                    print("nginx is not installed: skipped", file=sys.stderr)
                    continue
                target = Target(name, rel, upstream, tmp, args.unpinned)
                try:
                    row = measure(args, rel, target, case)
                finally:
                    target.stop()
                rows.append(row)
                print(json.dumps(row), file=sys.stderr)
    finally:
        up.stdin.write("quit\n")
        up.stdin.flush()
        up.wait(10)
    out = args.json or os.path.join(os.path.dirname(rel), "bench", "per_request.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(rows, f, indent=1)
    print("| case | target | req/s | user µs | system µs | CPU µs | × nginx | vol. cs | invol. cs "
          "| perf task-clock µs | syscalls | × nginx | top syscalls |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        ng = next((x for x in rows if x["case"] == r["case"] and x["target"] == "nginx"), None)
        cpu_x = f"{r['cpu_us'] / ng['cpu_us']:.2f}" if ng and ng["cpu_us"] else "-"
        sc = r.get("syscalls_total")
        sc_x = f"{sc / ng['syscalls_total']:.2f}" if ng and sc and ng.get("syscalls_total") else "-"
        top = ", ".join(f"{k} {v:.2f}" for k, v in list(r.get("syscalls", {}).items())[:6])
        print(f"| {r['case']} | {r['target']} | {r['rps']:.0f} | {r['user_us']:.1f} | "
              f"{r['system_us']:.1f} | {r['cpu_us']:.1f} | {cpu_x} | {r['vol_cs']:.3f} | "
              f"{r['invol_cs']:.3f} | {r.get('perf_task_clock_us', 0):.1f} | "
              f"{sc if sc is None else round(sc, 2)} | {sc_x} | {top} |")


if __name__ == "__main__":
    main()
