#!/usr/bin/env python3
"""What fresh memory costs on this machine, apart from intercept: the growth case's
check of its host.

usage: fresh_memory.py [GiB] [folder]

Touches GiB (8 by default) of memory two ways, one GiB at a time, and prints the
seconds each GiB took:
- anonymous memory: one byte per 4 KiB page of a fresh 1 GiB mapping, all kept;
- the page cache: 64 KiB appends to one file in <folder> (/dev/shm by default, or the
  trace folder's file system), the way a trace file grows; the file is removed at the
  end.
On bare metal every GiB costs the same. A VM whose host backs guest memory lazily (or
takes freed memory back) can be fast up to some GiB and several times slower past it;
the growth case, which fills the page cache with its trace files and the sidecar's
memory with episodes, then slows in its last seconds for that reason, and the slowdown
shows in the trace writer's system time (printed by the growth case per thread).
Stops by itself: GiB is capped at 32 and at the memory available (MemAvailable) less
1 GiB, as all of it is held at once.
"""
import mmap
import os
import sys
import time

GIB = 1 << 30


def anonymous(gib: int) -> list:
    kept, times = [], []
    for _ in range(gib):
        start = time.perf_counter()
        m = mmap.mmap(-1, GIB)
        for off in range(0, GIB, 4096):
            m[off] = 1
        kept.append(m)
        times.append(time.perf_counter() - start)
    for m in kept:
        m.close()
    return times


def page_cache(gib: int, folder: str) -> list:
    path = os.path.join(folder, f"fresh-memory-{os.getpid()}.bin")
    chunk = os.urandom(1 << 16)
    times = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
    try:
        for _ in range(gib):
            start = time.perf_counter()
            for _ in range(GIB // len(chunk)):
                os.write(fd, chunk)
            times.append(time.perf_counter() - start)
    finally:
        os.close(fd)
        os.unlink(path)
    return times


def available_gib() -> int:
    """MemAvailable of /proc/meminfo, in whole GiB (32 where it cannot be read)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) // (1 << 20)
    except OSError:
        pass
    return 32


def main() -> None:
    asked = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    gib = max(1, min(asked, 32, available_gib() - 1))
    folder = sys.argv[2] if len(sys.argv) > 2 else "/dev/shm"
    for name, times in (
        ("anonymous", anonymous(gib)),
        (f"page cache ({folder})", page_cache(gib, folder)),
    ):
        print(f"{name}: s per GiB " + " ".join(f"{t:.2f}" for t in times), flush=True)


if __name__ == "__main__":
    main()
