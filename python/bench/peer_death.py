#!/usr/bin/python3
"""When does a process see that a peer it reads from was SIGKILLed?

For each --buffer-size it starts `baton serve --memory caller` with a buffer
of that size, reads 64 MiB from it over UCX's TCP (as between hosts) with a
`baton` engine, SIGKILLs it 10 ms into the read, and reports, from the kill:
  exiting_ms   the peer's /proc/<pid>/stat shows PF_EXITING (or a zombie)
  failed_ms    the engine's batch ended (the engine saw the death)
  reaped_ms    waitpid returned: the kernel has freed the dead process's pages
A second serve, not read from, gives exiting_ms alone (a loop polling /proc).

    PYTHONPATH=build/python /usr/bin/python3 python/bench/peer_death.py [--buffer-size 16MiB 256MiB 1GiB] [--json PATH]
"""
import argparse
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import baton

ROOT = pathlib.Path(__file__).resolve().parents[2]
BATON = os.environ.get("BATON", str(ROOT / "build" / "bin" / "baton"))
PF_EXITING = 0x4


def exiting(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return True
    return fields[0] in ("Z", "X") or int(fields[6]) & PF_EXITING != 0


def serve(size):
    p = subprocess.Popen([BATON, "serve", "--buffer-size", size, "--memory", "caller", "--no-same-host-copy"],
                         stdout=subprocess.PIPE)
    line = p.stdout.readline().decode().split()
    if not line or line[0] != "address":
        p.kill()
        sys.exit(f"peer_death: baton serve --buffer-size {size} did not start")
    return p, line[1]


def watch_exiting(pid, t0, out):
    while not exiting(pid):
        pass
    out["exiting_ms"] = (time.perf_counter() - t0) * 1e3


def one(size):
    p, address = serve(size)
    engine = baton.Engine(same_host_copy=False, direct_copy_max_bytes=0)
    peer = engine.connect(address)
    length = min(64 << 20, peer.regions[0].length)
    local = engine.register(bytearray(length))
    piece = 256 << 10
    batch = engine.submit([baton.Request(op="read", local=local, local_offset=o, peer=peer, remote=peer.regions[0],
                                         remote_offset=o, length=min(piece, length - o))
                           for o in range(0, length, piece)])
    time.sleep(0.01)
    result = {"buffer_size": size, "read_bytes": length}
    t0 = time.perf_counter()
    os.kill(p.pid, signal.SIGKILL)
    watcher = threading.Thread(target=watch_exiting, args=(p.pid, t0, result))
    watcher.start()
    try:
        batch.wait(30.0)
    except Exception as e:  # the read fails: that is the point
        result["status"] = str(e)[:120]
    result["failed_ms"] = (time.perf_counter() - t0) * 1e3
    p.wait()
    result["reaped_ms"] = (time.perf_counter() - t0) * 1e3
    watcher.join()
    engine.close()
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--buffer-size", nargs="+", default=["16MiB", "256MiB", "1GiB"])
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    rows = [one(size) for size in args.buffer_size]
    print(f"{'buffer':>8} {'exiting_ms':>11} {'failed_ms':>10} {'reaped_ms':>10}")
    for r in rows:
        print(f"{r['buffer_size']:>8} {r['exiting_ms']:>11.2f} {r['failed_ms']:>10.2f} {r['reaped_ms']:>10.2f}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
