"""What the measurement scripts of this folder share: the mock upstream, sessions made
through the `intercept serve` control API, and loadgen runs. Imported by callgrind.py and
record_cost.py (they run from any folder: each puts this folder on `sys.path`)."""
import json
import subprocess
import threading
import urllib.request


def start_upstream(rel: str) -> tuple:
    """Starts `bench-upstream --threads 1` from the release folder `rel`: (process, base URL)."""
    up = subprocess.Popen([f"{rel}/bench-upstream", "--threads", "1"], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True)
    return up, json.loads(up.stdout.readline())["base_url"]


def stop_upstream(up: subprocess.Popen) -> None:
    """Asks bench-upstream to quit and waits for it (10 s at most)."""
    up.stdin.write("quit\n")
    up.stdin.flush()
    up.wait(10)


def make_sessions(control: str, token: str, n: int, secrets: str) -> str:
    """Makes sessions `bench-0` … `bench-<n-1>` through the control API at `control`,
    writes their model secrets to the file `secrets` (loadgen's --secrets-file) and
    returns the chat completions URL their harnesses call."""
    keys, base = [], ""
    for i in range(n):
        req = urllib.request.Request(f"{control}/v1/sessions", method="POST",
                                     data=json.dumps({"id": f"bench-{i}"}).encode(),
                                     headers={"authorization": f"Bearer {token}",
                                              "content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            session = json.loads(r.read())
        keys.append(session["model_secret"])
        base = session["base_url"]
    with open(secrets, "w") as f:
        json.dump(keys, f)
    return base.rstrip("/") + "/v1/chat/completions"


def loadgen(rel: str, url: str, secrets: str, kind: str, count: int) -> None:
    """`count` calls (streamed when `kind` is "stream") at 4 connections, one thread."""
    args = [f"{rel}/loadgen", "--url", url, "--secrets-file", secrets, "--connections", "4",
            "--requests", str(count), "--duration", "600", "--threads", "1"]
    if kind == "stream":
        args.append("--stream")
    subprocess.run(args, capture_output=True, check=True)


def ready_line(proc: subprocess.Popen, timeout: float = 120.0) -> dict:
    """The first line `proc` prints, as JSON (its ready line), within `timeout` seconds;
    past it, or when `proc` ends first, it is stopped and an error raised."""
    got: list = []
    reader = threading.Thread(target=lambda: got.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not got or not got[0]:
        stop(proc)
        raise RuntimeError(f"{proc.args[0]} printed no ready line within {timeout} s")
    return json.loads(got[0])


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL if `proc` has not ended within 120 s."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
