#!/usr/bin/python3
"""Does an engine grow with peers that come and go on new addresses?

One `baton` engine reads 1 MiB (checked not zero) from each of --holders `baton
serve` processes in turn; each comes up on a new port and is SIGKILLed once
read, and the engine waits until it sees the path fail before the next
starts (as a decode server meets rescheduled prefill pods). It reports the
engine's RSS every 100 holders and its paths by state at the end: failed
paths' slots go to later connects, so one failed path should be left and
the RSS should stay flat once the TCP payload pool (at most 64 MiB) has
what the reads use.

    PYTHONPATH=build/python /usr/bin/python3 python/bench/peer_churn.py [--holders 600] [--tcp] [--json PATH]
"""
import argparse
import json
import os
import pathlib
import subprocess
import time

import numpy as np

import baton

ROOT = pathlib.Path(__file__).resolve().parents[2]
BATON = os.environ.get("BATON", str(ROOT / "build" / "bin" / "baton"))


def rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--holders", type=int, default=600)
    ap.add_argument("--tcp", action="store_true", help="over UCX's TCP (as between hosts), not the same-host copy")
    ap.add_argument("--json", help="write the figures here too")
    a = ap.parse_args()
    if a.holders < 1:
        ap.error("--holders must be at least 1")
    serve_flags = ["--no-same-host-copy", "--ucx-tls", "tcp"] if a.tcp else []
    engine = baton.Engine(same_host_copy=not a.tcp, **({"ucx_tls": "tcp"} if a.tcp else {}))
    back = engine.register(np.zeros(1 << 20, dtype=np.uint8))
    rss = {}
    started = time.monotonic()
    try:
        for i in range(1, a.holders + 1):
            holder = subprocess.Popen([BATON, "serve", "--buffer-size", "1MiB"] + serve_flags,
                                      stdout=subprocess.PIPE, text=True)
            try:
                address = holder.stdout.readline().split()[1]
                peer = engine.connect(address)
                back.buffer[:] = 0
                engine.read(local=back, peer=peer, remote=peer.regions[0], length=back.length, timeout=10)
                if not back.buffer.any():
                    raise SystemExit(f"holder {i}: the read brought nothing")
            finally:
                holder.kill()
                holder.wait()
            for _ in range(500):  # until the engine saw it go
                try:
                    engine.read(local=back, peer=peer, remote=peer.regions[0], length=4096, timeout=1)
                    time.sleep(0.01)
                except baton.Unavailable:
                    break
            else:
                raise SystemExit(f"holder {i}: its path never failed")
            if i % 100 == 0 or i in (50, a.holders):
                rss[i] = rss_kib()
                print(f"holders {i}: rss {rss[i]} KiB", flush=True)
        paths = {line.split('"')[1]: float(line.split()[-1])
                 for line in engine.metrics_text().splitlines() if line.startswith("baton_ucx_paths{")}
    finally:
        engine.close()
    result = {"holders": a.holders, "transport": "tcp" if a.tcp else "same-host copy", "rss_kib": rss,
              "paths": paths, "seconds": round(time.monotonic() - started, 1)}
    print(json.dumps(result))
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
