#!/usr/bin/python3
"""How long submit() itself takes for a same-host batch, and how long until
it ended: up to direct_copy_max_bytes (16 MiB) the batch is copied within
submit; above it, on the engine's copier thread, so submit returns at once.

One process, two engines (one allocates and exports the source, the other
reads it into a numpy buffer), batches of 1 MiB reads, --rounds each.

    PYTHONPATH=build/python /usr/bin/python3 python/bench/submit_blocking.py [--rounds 200] [--mib 16 32]
"""
import argparse
import time

import numpy as np

import baton

MiB = 1 << 20


def quantile(xs, q):
    return sorted(xs)[int(q * (len(xs) - 1))]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--mib", type=int, nargs="+", default=[16, 32], help="batch sizes in MiB (1..256)")
    args = ap.parse_args()
    if args.rounds < 1 or not all(1 <= m <= 256 for m in args.mib):
        ap.error("--rounds must be at least 1 and each --mib within 1..256")
    size = max(args.mib) * MiB
    with baton.Engine() as holder, baton.Engine() as engine:
        source = holder.allocate(size)
        holder.export(source)
        local = np.zeros(size, dtype=np.uint8)
        region = engine.register(local)
        peer = engine.connect(holder.address)
        for mib in args.mib:
            reqs = [baton.Request(op="read", local=region, local_offset=i * MiB, peer=peer, remote=source.handle,
                                  remote_offset=i * MiB, length=MiB) for i in range(mib)]
            submits, ends = [], []
            for _ in range(args.rounds):
                t0 = time.perf_counter()
                batch = engine.submit(reqs)
                t1 = time.perf_counter()
                batch.wait(timeout=30)
                t2 = time.perf_counter()
                if batch.status != "ok":
                    raise SystemExit(f"a {mib} MiB batch ended {batch.status}")
                batch.release()
                submits.append((t1 - t0) * 1e6)
                ends.append((t2 - t0) * 1e6)
            print(f"{mib} MiB batch: submit p50 {quantile(submits, .5):.0f} us, p99 {quantile(submits, .99):.0f} us; "
                  f"submit to ended p50 {quantile(ends, .5):.0f} us")


if __name__ == "__main__":
    main()
