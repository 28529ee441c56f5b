#!/usr/bin/python3
"""Python overhead against the C++ engine, on the same `baton serve`.

For each case it runs `baton bench throughput` (C++) and the same loop in
Python through the `baton` module, alternately, --repeat times, and prints
the medians and their ratio:
  read4k     one 4 KiB read at a time, synchronous (engine.read): requests/s
  run4k      the same read prepared once, PreparedBatch.run() (C++ --prepared)
  batch1m    batches of 16 reads of 1 MiB (submit, wait, release): GB/s
  batch4k    batches of 16 reads of 4 KiB (submit, wait, release): requests/s
  prepared4k the same batch prepared once (Engine.prepare; C++ --prepared)

    PYTHONPATH=build/python /usr/bin/python3 python/bench/bench_python.py [--duration 3] [--repeat 3] [--json PATH]
"""
import argparse
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import time

import numpy as np

import baton

ROOT = pathlib.Path(__file__).resolve().parents[2]
BATON = pathlib.Path(os.environ.get("BATON_BUILD_DIR", ROOT / "build")) / "bin" / "baton"


def cpp(target, block, batch, seconds, prepared=False):
    out = subprocess.run([str(BATON), "bench", "throughput", "--target", target, "--op", "read", "--block-size",
                          str(block), "--batch-size", str(batch), "--duration", f"{seconds}s", "--json", "-"]
                         + (["--prepared"] if prepared else []), capture_output=True, text=True, check=True).stdout
    j = json.loads(out[out.index("{"):])
    return j["bytes"] / j["duration_s"]


def python_read4k(engine, region, peer, remote, seconds):
    n = 0
    end = time.monotonic() + seconds
    start = time.monotonic()
    while time.monotonic() < end:
        engine.read(local=region, peer=peer, remote=remote, length=4096)
        n += 1
    return n * 4096 / (time.monotonic() - start)


def python_run4k(engine, region, peer, remote, seconds):
    ready = engine.prepare([baton.Request(op="read", local=region, peer=peer, remote=remote, length=4096)])
    n = 0
    end = time.monotonic() + seconds
    start = time.monotonic()
    while time.monotonic() < end:
        ready.run()
        n += 1
    return n * 4096 / (time.monotonic() - start)


def python_batches(engine, region, peer, remote, seconds, block, prepared=False):
    reqs = [baton.Request(op="read", local=region, local_offset=i * block, peer=peer, remote=remote,
                          remote_offset=i * block, length=block) for i in range(16)]
    ready = engine.prepare(reqs) if prepared else None
    moved = 0
    end = time.monotonic() + seconds
    start = time.monotonic()
    while time.monotonic() < end:
        b = ready.submit() if prepared else engine.submit(reqs)
        b.wait()
        b.release()
        moved += 16 * block
    return moved / (time.monotonic() - start)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=3.0)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json")
    a = p.parse_args()
    serve = subprocess.Popen([str(BATON), "serve", "--buffer-size", "64MiB"], stdout=subprocess.PIPE, text=True)
    try:
        target = re.match(r"address (\S+)", serve.stdout.readline()).group(1)
        rows = {}
        with baton.Engine() as e:
            region = e.register(np.zeros(16 << 20, dtype=np.uint8))
            peer = e.connect(target)
            remote = peer.regions[0]
            cases = [("read4k", 4096, 1, False, python_read4k),
                     ("run4k", 4096, 1, True, python_run4k),
                     ("batch1m", 1 << 20, 16, False, lambda *x: python_batches(*x, 1 << 20)),
                     ("batch4k", 4096, 16, False, lambda *x: python_batches(*x, 4096)),
                     ("prepared4k", 4096, 16, True, lambda *x: python_batches(*x, 4096, prepared=True))]
            for name, block, batch, prepared, py in cases:
                c, q = [], []
                for _ in range(a.repeat):
                    c.append(cpp(target, block, batch, a.duration, prepared))
                    q.append(py(e, region, peer, remote, a.duration))
                rows[name] = {"cpp": c, "python": q, "ratio": statistics.median(q) / statistics.median(c)}
                unit, scale = ("GB/s", 1e-9) if name == "batch1m" else ("requests/s", 1 / block)
                print(f"{name}: C++ {statistics.median(c) * scale:,.3f} {unit}, Python {statistics.median(q) * scale:,.3f}"
                      f" {unit}: ratio {rows[name]['ratio']:.2f}  (runs C++ {[round(x * scale, 3) for x in c]}, "
                      f"Python {[round(x * scale, 3) for x in q]})")
        if a.json:
            pathlib.Path(a.json).write_text(json.dumps(rows, indent=2))
    finally:
        serve.terminate()
        serve.wait()


if __name__ == "__main__":
    sys.exit(main())
